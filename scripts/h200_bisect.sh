#!/usr/bin/env bash
# The batch-1 one-token time of gluon-splitkv (kimi-k3-tp8, 16K/32K/100K, 64 and 132 splits) with
# the kernels of several revisions, on one GPU in one call: which commit moved it.
#   here:       bash scripts/h200_bisect.sh prepare REV...   (git archive of mlabench/ at each
#               REV into .whl/t/<short rev>/, stamped with REV: runs of a tree from d8b69d3 on
#               record it (dirty in a copy edited by hand); older trees cannot read a stamp and
#               record mlabench-0.1.0; .whl/opt holds the pydantic and optuna wheels)
#   the device: ORDER="<short rev> ..." bash scripts/h200_bisect.sh run OUT   (carry .whl)
#               ORDER="<short rev> ..." BATCHES="1 16" bash scripts/h200_bisect.sh graph OUT   (carry .whl):
#               graph-check of the H200 qo1-k3 policy in device mode with each tree, 8 lengths x 12
#               counts (OUT/graph_check_b<batch>_<rev>.json and .log; each cut at 200 s)
# Each revision's sweep is a run folder under /tmp/bis/<i>-<rev>/, packed into OUT/bis.tgz after
# each one (a call cut by its limit keeps those done); ~20 s a revision on a warm H100.  Name the
# first revision again at the end of ORDER: the spread between its two runs is the call's noise.
set -uo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
case "${1:-}" in
  prepare)
    shift
    for rev in "$@"; do
      short="$(git rev-parse --short "$rev")" || exit 2
      rm -rf ".whl/t/$short" && mkdir -p ".whl/t/$short" && git archive "$rev" mlabench | tar -x -C ".whl/t/$short"
      python3 scripts/stamp_revision.py ".whl/t/$short" "$(git rev-parse "$rev")" > /dev/null || exit 2
      echo "$short"
    done ;;
  run|graph)
    out="${2:?usage: $0 $1 OUT}"; mkdir -p "$out"; out="$(cd "$out" && pwd)"
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/optsite .whl/opt/*.whl \
      || exit 2
    export PYTHONPATH=/tmp/optsite MLABENCH_E2E=0 PYTHONUNBUFFERED=1 COLUMNS=200 MLABENCH_CONFIGS="$root/configs"
    unset TRITON_INTERPRET CI
    if [ "$1" = graph ]; then
      pol="$root/results/h200/deploy/qo1-k3/tune-kimi-k3-tp8-20261205-122236-527/policy.json"
      for b in ${BATCHES:-1 16}; do
        for rev in ${ORDER:?set ORDER to the revisions prepared}; do
          (cd "$root/.whl/t/$rev" && timeout 200 python3 -m mlabench graph-check --backend gluon-splitkv \
             --split-policy device --policy "$pol" --capture-len 1 --batch "$b" \
             --context 1024,4096,8192,16384,32768,65536,100000,131072 --splits 1,2,4,8,12,16,24,33,44,66,88,132 \
             --json > "$out/graph_check_b${b}_$rev.json" 2> "$out/graph_check_b${b}_$rev.log")
          echo "graph-check batch $b $rev exit $?"; tail -n 2 "$out/graph_check_b${b}_$rev.log"
        done
      done
      exit 0
    fi
    w=/tmp/bis; rm -rf "$w"; mkdir -p "$w"
    cfg="$root/results/h200/deploy/kimi-k3-tp8/kimi-k3-tp8-gluon-flashmla.toml"
    i=0
    for rev in ${ORDER:?set ORDER to the revisions prepared, in the order to run them}; do
      i=$((i + 1)); d="$w/$i-$rev"; mkdir -p "$d"
      (cd "$root/.whl/t/$rev" && timeout 75 python3 -m mlabench sweep --config "$cfg" --backend gluon-splitkv \
         --batch 1 --context 16384,32768,100000 --splits 64,132 --results-dir "$d") > "$d.log" 2>&1
      echo "$i $rev exit $?"; tail -n 1 "$d.log"
      tar -czf "$out/bis.tgz" -C /tmp bis
    done ;;
  *) echo "usage: $0 prepare REV... | run OUT | graph OUT" >&2; exit 2 ;;
esac
