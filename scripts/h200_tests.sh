#!/usr/bin/env bash
# The whole test suite on one H200 (the device machine), the kernels compiled, never interpreted:
#   bash scripts/h200_tests.sh OUTDIR
#
# The machine's image has torch (CUDA), Triton, typer, rich, matplotlib and pytest-xdist but not
# pydantic or optuna: their wheels (and sgl-flash-mla's) travel in .whl/ (ignored by git; carry it)
# and are installed under /tmp/site first.  No vLLM server, PostgreSQL or chromium there: those
# tests skip, saying why (the end-to-end tests with MLABENCH_E2E=0).
#
# Four pytest runs, each writing OUTDIR/junit-<part>.xml and OUTDIR/pytest-<part>.log:
#   host    tests/serving tests/report tests/e2e tests/golden tests/tables tests/records: no GPU
#           use; started first, in the background
#   gpu     tests/core tests/cli tests/kernels tests/backends tests/checks tests/measure tests/bench
#           tests/sweep tests/policy tests/gpu but the timing tests: on the GPU,
#           spread over pytest-xdist workers (correctness, not timing, is asserted there)
#   timing  tests/gpu/test_gpu_timing.py: alone on the GPU once the gpu part is done (it compares
#           times with times; beside other workers' kernels a call took 5x as long, unevenly)
#   tune    tests/tune: alone on the GPU after that (its synthetic backends are told apart by their
#           times, which other processes' kernels would disturb)
# OUTDIR/summary.txt has each part's exit code and last line.  Exit status: 0 when all four passed.
# About 4 minutes on a warm H200 (16 CPU cores).
set -uo pipefail
out="${1:?usage: $0 OUTDIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.."

if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || { echo "error: could not install .whl/*.whl" >&2; exit 2; }
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" MLABENCH_E2E=0 PYTHONUNBUFFERED=1 COLUMNS=200
# The kernels must be compiled: no interpreter (Triton 3.6's fails on tl.range with run-time bounds
# under numpy >= 2.4 anyway), and no CI flag turning the missing PostgreSQL into a failure.
unset TRITON_INTERPRET CI

python3 - <<'PY' | tee "$out/summary.txt" || exit 2
import sys
import torch, triton
if not torch.cuda.is_available():
    sys.exit("error: torch sees no GPU: this script runs the suite on one (scripts/test.sh is for a CPU)")
print(f"{torch.cuda.get_device_name(0)}; torch {torch.__version__}, triton {triton.__version__}, "
      f"python {sys.version.split()[0]}")
PY

workers=()
python3 -c "import xdist" 2>/dev/null && workers=(-n "${MLABENCH_TEST_WORKERS:-8}")

part() {  # part NAME PYTEST-ARGS...: one pytest run, its log and junit XML in OUTDIR
  local name="$1"; shift
  python3 -m pytest -p no:cacheprovider -q -rs --durations=15 --junitxml="$out/junit-$name.xml" "$@" \
    > "$out/pytest-$name.log" 2>&1
  local code=$?
  echo "$name: exit $code: $(grep -E '(passed|failed|error)' "$out/pytest-$name.log" | tail -n 1)" >> "$out/summary.txt"
  return "$code"
}

start=$(date +%s)
part host tests/serving tests/report tests/e2e tests/golden tests/tables tests/records &
host=$!
part gpu "${workers[@]}" tests/core tests/cli tests/kernels tests/backends tests/checks tests/measure \
  tests/bench tests/sweep tests/policy tests/gpu \
  --ignore=tests/gpu/test_gpu_timing.py
gpu=$?
part timing tests/gpu/test_gpu_timing.py
timing=$?
part tune tests/tune
tune=$?
wait "$host"
host=$?
echo "total: $(( $(date +%s) - start )) s" >> "$out/summary.txt"
cat "$out/summary.txt"
[ "$host" = 0 ] && [ "$gpu" = 0 ] && [ "$timing" = 0 ] && [ "$tune" = 0 ]
