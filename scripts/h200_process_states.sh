#!/usr/bin/env bash
# Where the points two adaptive-visit runs still disagreed on get their speed (issue 13), with
# scripts/gpu_noise_sources.py.  First triton-persistent at batch 16, 128K (repeat padding, one
# program per SM) on inputs made afresh 8 times, without and with a random spacer allocated first
# (--reallocate): whether a fresh allocation lands elsewhere in memory.  Then that point and FlashMLA
# at batch 1, 8K -- 4 input allocations x 6 repetitions, 12 blocks of one graph capture against 12
# fresh captures -- in 3 processes one after the other: whether a state lasts a whole process.
# About 2 minutes on an H200 (REALLOC_ONLY=1: the first part only):
#   bash scripts/h200_process_states.sh OUTDIR
set -euo pipefail
out="${1:?usage: $0 OUTDIR}"
mkdir -p "$out"
persistent='triton-persistent:16:131072:{"head_padding": "repeat", "programs_per_sm": 1}'
for spacer in 0 2048; do
  python3 "$(dirname "$0")/gpu_noise_sources.py" --reallocate 8 --spacer-mib "$spacer" --point "$persistent" \
    --out "$out/realloc-$spacer.json" > "$out/realloc-$spacer.md"
  cat "$out/realloc-$spacer.md"
done
[ "${REALLOC_ONLY:-0}" = 1 ] && exit 0
for i in 1 2 3; do
  python3 "$(dirname "$0")/gpu_noise_sources.py" --no-amortisation --allocs 4 --reps 6 --blocks 12 \
    --point flashmla:1:8192 --point "$persistent" \
    --out "$out/process-$i.json" > "$out/process-$i.md"
  echo "process $i: $(date +%T)"; cat "$out/process-$i.md"
done
