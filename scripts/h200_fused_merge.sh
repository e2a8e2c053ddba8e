#!/usr/bin/env bash
# The merge inside gluon-splitkv's stage 1 (fused_merge) on one H200 (about 4 minutes; FlashMLA's wheel
# installed for the comparison): the kimi-k3-tp8 grid with fused_merge 0 and 1 in one run per
# batch size, FlashMLA beside them, and the idle-SM check of the all-SM change (124, 128 and 132
# one-split requests: does a 129th-132nd busy SM add read bandwidth?).
#   bash scripts/h200_fused_merge.sh OUTDIR
# Writes OUTDIR/sweep-{b1,b16,idle-sms}.md (the sweep tables) and one run folder per config.
set -uo pipefail
out="${1:?usage: $0 OUTDIR}"
cd "$(dirname "$0")/.."
mkdir -p "$out"
export COLUMNS=200 PYTHONUNBUFFERED=1
cfg=results/h200/deploy/fused-merge
for c in b1 b16; do
  python3 -m mlabench sweep --config "$cfg/fused-$c.toml" --results-dir "$out" --markdown \
    > "$out/sweep-$c.md" || exit 2
done
python3 -m mlabench sweep --config "$cfg/idle-sms.toml" --results-dir "$out" --markdown \
  > "$out/sweep-idle-sms.md" || exit 2
