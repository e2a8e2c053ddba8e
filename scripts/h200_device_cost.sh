#!/usr/bin/env bash
# Issue 34 items 2 and 3 on one GPU (~9 min warm with the tests, so two calls): the GPU tests, then
# what one graph with the split count in device memory costs at batch 1.
#   tests         tests/gpu (the kernels compiled: rule rows in both lookups) and the wide merge's
#                 tests of tests/kernels/test_gluon_splitkv.py on the GPU (its few-slot tiles),
#                 ~6.5 min on an H100;
#   graph-check   gluon-splitkv in device mode, batch 1, 1K-128K, against the best of 12 counts,
#                 with the pages-rule policy (qo1-k3/rule/) and with the per-sub-bucket policy as
#                 the run committed it (qo1-k3/tune-*/policy.json, 12 rows at batch 1);
#   stage-times   scripts/h200_stage_times.py: stage 1 and the merge timed apart (torch.profiler over
#                 graph replays) at 1K, 4K, 8K, host counts 16/32/132 and both policies on the
#                 device, PDL 1 and 0;
#   sweeps        the sweeps of results/h200/deploy/device-cost/ named in SWEEPS (default: lookup
#                 capacity device-cost): the lookup alone and beside empty programs; 16/32 against
#                 132 host splits; each policy looked up on the host and on the device (also
#                 grid: a grid of 128 from the host and the device, one table row and four).
# PARTS (default: all four, in that order) picks some.  Everything is written under WORK
# (default /tmp/device-cost, the sweeps' run folders in WORK/runs/) and packed into
# OUTDIR/device-cost.tar.gz (a device call brings back few files).  On an H100 the four took 9.4
# minutes: run PARTS=tests in one call and the rest in the next.
#   PARTS="graph-check stage-times sweeps" bash scripts/h200_device_cost.sh OUTDIR
set -uo pipefail
pack="${1:?usage: $0 OUTDIR}"
mkdir -p "$pack"
pack="$(cd "$pack" && pwd)"
out="${WORK:-/tmp/device-cost}"
mkdir -p "$out"
parts=" ${PARTS:-tests graph-check stage-times sweeps} "
# packed after each part too: a call cut by its limit still brings back the parts it finished
packup() { tar -czf "$pack/device-cost.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"; }
trap packup EXIT
cd "$(dirname "$0")/.."
shopt -s nullglob
wheels=(.whl/*.whl .whl/opt/*.whl)  # sgl-flash-mla; pydantic, optuna and theirs (not in the image)
shopt -u nullglob
if [ ${#wheels[@]} -gt 0 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "${wheels[@]}" || { echo "error: could not install ${wheels[*]}" >&2; exit 2; }
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" MLABENCH_E2E=0 PYTHONUNBUFFERED=1 COLUMNS=200
unset TRITON_INTERPRET CI
mlabench=(python3 -m mlabench)
deploy=results/h200/deploy
contexts=1024,4096,8192,16384,32768,65536,100000,131072

if [[ $parts == *" tests "* ]]; then
  python3 -m pytest -q -p no:cacheprovider tests/gpu > "$out/gpu_tests.txt" 2>&1
  echo "gpu tests exit code: $?" >> "$out/gpu_tests.txt"
  python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gluon_splitkv.py -k wide_merge \
    >> "$out/gpu_tests.txt" 2>&1
  echo "wide merge tests (on the GPU) exit code: $?" >> "$out/gpu_tests.txt"
  packup
fi
for name in rule rows; do
  [[ $parts == *" graph-check "* ]] || break
  policy="$deploy/qo1-k3/rule/policy.json"
  [ "$name" = rows ] && policy="$deploy/qo1-k3/tune-kimi-k3-tp8-20261205-122236-527/policy.json"
  "${mlabench[@]}" graph-check --backend gluon-splitkv --split-policy device --policy "$policy" \
    --capture-len 1 --batch 1 --context "$contexts" --splits 1,2,4,8,12,16,24,33,44,66,88,132 \
    --tolerance 0.03 --save "$out/graph_check_$name.json" --markdown \
    > "$out/graph_check_$name.md" 2> "$out/graph_check_$name.log"
  echo "graph-check exit code: $? (1: a length flagged)" >> "$out/graph_check_$name.log"
  packup
done
if [[ $parts == *" stage-times "* ]]; then
  python3 scripts/h200_stage_times.py --policy "rows=$deploy/qo1-k3/tune-kimi-k3-tp8-20261205-122236-527/policy.json" \
    --policy "rule=$deploy/qo1-k3/rule/policy.json" --out "$out/stage_times.jsonl" \
    > "$out/stage_times.md" 2> "$out/stage_times.log"
  echo "stage times exit code: $?" >> "$out/stage_times.log"
  packup
fi
[[ $parts == *" sweeps "* ]] || exit 0
for cfg in ${SWEEPS:-lookup capacity device-cost}; do
  "${mlabench[@]}" sweep --config "$deploy/device-cost/$cfg.toml" --results-dir "$out/runs" \
    --format markdown > "$out/sweep-$cfg.md" 2> "$out/sweep-$cfg.log"
  echo "sweep exit code: $?" >> "$out/sweep-$cfg.log"
  packup
done
