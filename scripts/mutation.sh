#!/usr/bin/env bash
# Mutation testing of mlabench's core modules with mutmut (docs/TESTING.md).
#
#   bash scripts/mutation.sh [MODULE...]      e.g.  bash scripts/mutation.sh stats serving.results
#
# MODULE is a module under mlabench/ (dotted, without "mlabench."); none: every module that
# [tool.mutmut] only_mutate in pyproject.toml names (verdict, stats, timing, measure, results,
# tables, serving.results).  mutmut runs in a fresh copy of this working tree (tracked and
# untracked-not-ignored files) under $MUTATION_DIR (default: a folder in ${TMPDIR:-/tmp}), so the
# tree itself is never touched and can be edited meanwhile.  Writes there, and prints at the end:
#   results.txt     every mutant's status, one a line
#   survivors.txt   one surviving mutant a line ("mlabench.stats.x_summarize__mutmut_11: survived")
#   survivors.diff  each survivor's change, as mutmut shows it
#   run.log         mutmut's own output
# Environment: MUTATION_JOBS (parallel mutants; default: the CPU count), MUTATION_DIR, and
# MUTATION_KEEP=1: keep an earlier run's copy and results there (run modules one after another, in
# the order that matters most, on a slow machine; the MODULEs given are re-run, none: the mutants
# not yet tested, i.e. an interrupted run resumes).  The tally per module counts every result kept.
# Exit status: mutmut's (non-zero when the clean tests fail in the copy); survivors do not fail it.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${MUTATION_DIR:-${TMPDIR:-/tmp}/mlabench-mutation}"
jobs="${MUTATION_JOBS:-$(nproc)}"

if ! python3 -c "import mutmut" 2>/dev/null; then
  echo "installing mutmut (pip install 'mutmut>=3.8,<4')" >&2
  python3 -m pip install -q 'mutmut>=3.8,<4'
fi

globs=()
for module in "$@"; do
  file="$repo/mlabench/${module//.//}.py"
  [ -f "$file" ] || { echo "error: no module mlabench.$module ($file)" >&2; exit 2; }
  globs+=("mlabench.$module.*")
done

if [ "${MUTATION_KEEP:-0}" = 1 ] && [ -d "$work/tree/mutants" ]; then
  echo "reusing $work/tree and its results (MUTATION_KEEP=1; edits since it was copied are not in it)" >&2
else
  rm -rf "$work"
  mkdir -p "$work/tree"
  (cd "$repo" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$work/tree")
fi
cd "$work/tree"
# Each mutant's tests run with -x, so the first failure ends them: run the fastest first (mutmut
# hands them over unordered), by the durations its stats phase recorded.
mkdir -p "$work/plugins"
cat > "$work/plugins/mlabench_fast_first.py" <<'PY'
import json
from pathlib import Path


def pytest_collection_modifyitems(items):
    stats = Path("mutmut-stats.json")
    if stats.exists():
        seconds = json.loads(stats.read_text()).get("duration_by_test", {})
        items.sort(key=lambda item: seconds.get(item.nodeid, float("inf")))
PY
export PYTEST_ADDOPTS="-p mlabench_fast_first${PYTEST_ADDOPTS:+ $PYTEST_ADDOPTS}"
# The copy must import its own mlabench (an editable install may point at another checkout), and
# the end-to-end tests stay off (the selection in pyproject.toml has none; a second guard); one
# thread per worker: OpenMP pools hang in forked processes, and the workers run in parallel anyway.
export PYTHONPATH="$work/tree:$work/plugins${PYTHONPATH:+:$PYTHONPATH}" MLABENCH_E2E=0 COLUMNS=200 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
start=$(date +%s)
status=0
mutmut run --max-children "$jobs" "${globs[@]}" >> "$work/run.log" 2>&1 || status=$?
elapsed=$(( $(date +%s) - start ))
if [ "$status" != 0 ]; then
  tr '\r' '\n' < "$work/run.log" | tail -n 40 >&2
  echo "error: mutmut run failed (exit $status); log: $work/run.log" >&2
  exit "$status"
fi

mutmut results --all true 2>/dev/null | sed 's/^ *//' > "$work/results.txt" || true
grep -E ': (survived|no tests|timeout|suspicious)$' "$work/results.txt" | sort > "$work/survivors.txt" || true
: > "$work/survivors.diff"
while IFS=: read -r name _; do
  mutmut show "$name" >> "$work/survivors.diff" 2>&1 || true
  echo >> "$work/survivors.diff"
done < "$work/survivors.txt"

# The last progress line: "<done>/<total>  🎉 killed 🫥 no tests  ⏰ timeout  🤔 suspicious  🙁 survived ..."
summary="$(tr '\r' '\n' < "$work/run.log" | grep -E '^[^ ]* ?[0-9]+/[0-9]+ ' | tail -n 1 | sed 's/^[^0-9]*//')"
echo "mutmut over ${*:-the core modules}: $summary (${elapsed}s, $jobs jobs)"
echo "per module (every result kept in $work):"
# "mlabench.stats.x_summarize__mutmut_11: killed" -> module "stats", status "killed"
sed -E 's/^mlabench\.(.*)\.[^.]*__mutmut_[0-9]+: /\1 /' "$work/results.txt" \
  | awk '{m=$1; $1=""; s=substr($0,2); n[m" "s]++; mods[m]=1}
         END {for (m in mods) {printf "  %-16s", m;
              split("killed|survived|timeout|suspicious|segfault|no tests|not checked", st, "|");
              for (i=1; i<=7; i++) if (n[m" "st[i]]) printf " %s %d", st[i], n[m" "st[i]]; print ""}}' | sort
echo "survivors ($(wc -l < "$work/survivors.txt")): $work/survivors.txt, their changes: $work/survivors.diff"
cat "$work/survivors.txt"
