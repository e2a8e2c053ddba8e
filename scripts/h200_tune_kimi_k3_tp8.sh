#!/usr/bin/env bash
# Tunes triton-splitkv for Kimi K3 at TP8 (12 heads, bf16, page 64) on one GPU, at batch 1 and 16
# (configs/sweeps/kimi-k3-tp8.toml) over context buckets two to an octave from 1K to 128K
# ($MLABENCH_TUNE_BUCKETS overrides them); validates the policy on held-out
# lengths; exports it.  Everything lands in OUTDIR (the tuning run folder with its study journal,
# the validation run folder, the policy as JSON / C++ header / Python module, markdown tables).
#   bash scripts/h200_tune_kimi_k3_tp8.sh OUTDIR [GPUS]
# GPUS (e.g. 0,1) tunes with one worker per GPU on the same studies (compare the wall time in
# tune.log with a one-GPU run); without it, one worker on the first GPU.
#
# Sized for about 6 minutes of H200 time (estimated from the kimi-k3-tp8 sweep: ~0.1 s per
# graph-replayed configuration without the eager pass):
#   tune:     30 studies (2 batch sizes x 15 buckets), 40 trials each (the 5 public heuristics first,
#             then TPE over num_kv_splits 1-512), at most 12 s per study: ~2-3 min.  Why two buckets
#             to an octave: with the sweep's 8 buckets (results/h200/tune-kimi-k3-tp8/first-attempt/)
#             the best count moved by up to 40% inside the 1K-4K bucket and one count per bucket
#             cost up to 17% at held-out lengths;
#   validate: 24 held-out lengths per batch size between 1K and 128K (none on a bucket edge), each
#             measuring the 21-count split ladder, the policy and the 5 heuristics (~24 configurations,
#             0.3 s timing budget each): ~2-3 min;
#   export:   seconds.
set -uo pipefail
out="${1:?usage: $0 OUTDIR [GPUS]}"
gpus=()
[ -n "${2:-}" ] && gpus=(--gpus "$2")
mkdir -p "$out"
export COLUMNS=200
mlabench=(python3 -m mlabench)
stage() { echo "[$(date +%H:%M:%S)] $*" >&2; }

stage "tune ${gpus[*]}" 2>&1 | tee "$out/tune.log"
start=$(date +%s)
buckets="${MLABENCH_TUNE_BUCKETS:-1024,1448,2048,2896,4096,5793,8192,11585,16384,23170,32768,46341,65536,92682,131072}"
"${mlabench[@]}" tune --backend triton-splitkv --config kimi-k3-tp8 --buckets "$buckets" --trials 40 --timeout 12 ${gpus[@]+"${gpus[@]}"} \
  --results-dir "$out" --markdown > "$out/tune.md" || exit
echo "tune wall time: $(( $(date +%s) - start )) s" | tee -a "$out/tune.log" >&2
run="$(ls -d "$out"/tune-kimi-k3-tp8-* | tail -n 1)"

stage "validate $run/policy.json"
"${mlabench[@]}" tune --validate "$run/policy.json" --lengths 24 --min-context 1024 --max-context 131072 \
  --budget-s 0.3 --results-dir "$out" --markdown > "$out/validate.md" || exit

stage "export"
"${mlabench[@]}" tune --export "$run" --markdown > "$out/policy.md" || exit
cp "$run/policy.json" "$run/policy.h" "$run/policy.py" "$out/"
stage "done: $out (tune.md, validate.md, policy.md, policy.json, policy.h, policy.py, run folders)"
