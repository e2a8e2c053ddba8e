#!/usr/bin/env bash
# Whether the points two adaptive-visit runs still disagreed on keep one state for a whole process
# (issue 13): scripts/gpu_noise_sources.py on FlashMLA at batch 1, 8K and triton-persistent at
# batch 16, 128K (repeat padding, one program per SM) -- 4 input allocations x 6 repetitions, then
# 12 blocks of one graph capture against 12 fresh captures -- in 3 processes one after the other.
# About 3 minutes on an H200:
#   bash scripts/h200_process_states.sh OUTDIR
set -euo pipefail
out="${1:?usage: $0 OUTDIR}"
mkdir -p "$out"
for i in 1 2 3; do
  python3 "$(dirname "$0")/gpu_noise_sources.py" --no-amortisation --allocs 4 --reps 6 --blocks 12 \
    --point flashmla:1:8192 --point 'triton-persistent:16:131072:{"head_padding": "repeat", "programs_per_sm": 1}' \
    --out "$out/process-$i.json" > "$out/process-$i.md"
  echo "process $i: $(date +%T)"; cat "$out/process-$i.md"
done
