#!/usr/bin/env bash
# Whether the slow visits of heavy points are ones the GPU reports as held down (issue 13): the
# kimi-k3-tp8 sweep's heaviest points (the project's two kernels at batch 16, 32K-128K: 64 points,
# about a minute of batch-16 work; NVML read 132-522 W, median 369 W, in the committed run) timed in
# exactly 6 visits each (--max-visits too: no further visits); every visit records NVML's clocks event
# reasons, power and thermal violation counters and energy before and after its timing
# (visits.jsonl), and scripts/throttle_visits.py sets each visit's excess over its point's fastest
# visit beside them.  About 2.5 minutes on one H200:
#   bash scripts/h200_throttle_probe.sh OUTDIR
# MLABENCH_PROBE_VISITS [6] sets the visits.
set -euo pipefail
out="${1:?usage: $0 OUTDIR}"
mkdir -p "$out"
export COLUMNS=200
python3 -m mlabench sweep --config kimi-k3-tp8 --backend triton-splitkv,triton-persistent --batch 16 \
  --context 32768,65536,100000,131072 --visits "${MLABENCH_PROBE_VISITS:-6}" \
  --max-visits "${MLABENCH_PROBE_VISITS:-6}" --results-dir "$out" \
  --markdown > "$out/sweep.md"
python3 "$(dirname "$0")/throttle_visits.py" "$out"/kimi-k3-tp8-* > "$out/throttle.md"
tail -n 6 "$out/throttle.md"
