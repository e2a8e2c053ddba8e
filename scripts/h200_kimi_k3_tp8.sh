#!/usr/bin/env bash
# Reproduces results/h200/kimi-k3-tp8/ on one GPU: backends, check, the kimi-k3-tp8 sweep and the
# padded-persistent vs split-KV comparison, each as markdown, plus the run folder.
#   bash scripts/h200_kimi_k3_tp8.sh OUTDIR
set -uo pipefail
out="${1:?usage: $0 OUTDIR}"
mkdir -p "$out"
export COLUMNS=200
mlabench=(python3 -m mlabench)
"${mlabench[@]}" backends > "$out/backends.txt"
"${mlabench[@]}" check --model kimi-k3 --tp 8 --markdown > "$out/check.md"
echo "check exit code: $?" >&2
"${mlabench[@]}" sweep --config configs/sweeps/kimi-k3-tp8.toml --results-dir "$out" --markdown > "$out/sweep.md" || exit
run="$(ls -d "$out"/kimi-k3-tp8-* | tail -n 1)"
"${mlabench[@]}" compare --from "$run" --markdown > "$out/compare.md"
