#!/usr/bin/env bash
# The seed's deployment on one NVIDIA Hopper GPU (issue 23 item 4): gluon-splitkv tuned, its policy
# read from device memory inside a graph captured at start-up, and speculative-verify shapes beside
# FlashMLA.  Kimi K3 at TP8 (12 heads, bf16, page 64).  Stages (STAGES, default all three; about
# 4 + 4 + 5 minutes on an H200, so run them in separate calls where one call is limited to 10):
#   qo1  tune gluon-splitkv at qo_len 1 over the kimi-k3-tp8 buckets, batch 1 and 16
#        (scripts/h200_tune_kimi_k3_tp8.sh: validation on held-out lengths, export), then
#        graph-check the exported policy: captured at 1 token, split_policy device (one graph, the
#        policy's count per request) and host (one count frozen at capture), batch 1 and 16,
#        contexts 1K-128K, against the call tuned for each length over a ladder of split counts;
#   qo4  the same at qo_len 4 (speculative verify of 3 draft tokens), graph-check at qo_len 4;
#   mtp  scripts/h200_qo_len.sh: check and sweep of configs/sweeps/kimi-k3-tp8-mtp.toml (qo_len
#        1, 2, 4, 8; batch 1 and 16; 4K, 32K, 100K) with FlashMLA beside the project's kernels.
# Writes OUTDIR/<stage>/: tune.md, validate.md, policy.md, timing.txt, the tuning run folder,
# graph_check_{device,host}.md/.json and their logs; mtp/: what h200_qo_len.sh writes.
#   bash scripts/h200_gluon_deploy.sh OUTDIR
# Environment: STAGES; TUNE_RUN=folder validates and graph-checks a policy tuned in an earlier call
# (with one stage); POLICY_MODES [device host]; QO4_CONTEXTS [1K-128K]; and the tune script's
# MLABENCH_TUNE_* (e.g. MLABENCH_TUNE_TRIALS, MLABENCH_TUNE_VALIDATE=0, MLABENCH_TUNE_BUCKETS).
# FLASHMLA_WHEEL=path installs FlashMLA first (no network needed).
# DEVICE_POLICY=K (issue 34): tune the policy for split_policy=device, K sub-buckets per octave
# (tune --edges-per-octave K --device-policy: the split count alone, the split ladder up to one
# wave first, pdl and num_stages at the graph's defaults; MLABENCH_TUNE_RULE defaults to off there,
# MLABENCH_TUNE_LENGTHS to 2, MLABENCH_TUNE_TRIALS to 24), validate it against the 3% target at
# batch 1 and 16 (validate.md's verdict line; exit code in timing.txt) and graph-check it in
# device mode only (POLICY_MODES; docs/tuning-device.md).  K=4 at qo_len 1: 60 studies (30 buckets
# x 2 batch sizes; ~2,900 measurements where the recorded qo1 tune made 1,888 in 250 s), ~6.5 min
# of tune, ~2.5 of validation, ~1.5 of graph-check: over two calls of at most 10 minutes, the
# second validating and graph-checking the first's run (TUNE_RUN):
#   DEVICE_POLICY=4 MLABENCH_TUNE_VALIDATE=0 POLICY_MODES=none STAGES=qo1 bash scripts/h200_gluon_deploy.sh OUT
#   DEVICE_POLICY=4 TUNE_RUN=OUT/qo1/tune-kimi-k3-tp8-... STAGES=qo1 bash scripts/h200_gluon_deploy.sh OUT
set -uo pipefail
out="${1:?usage: $0 OUTDIR}"
here="$(cd "$(dirname "$0")" && pwd)"
export COLUMNS=200 MLABENCH_E2E=0
mlabench=(python3 -m mlabench)
stage() { echo "[$(date +%H:%M:%S)] $*" >&2; }
contexts=1024,4096,8192,16384,32768,65536,100000,131072
ladder=1,2,4,8,12,16,24,33,44,66,88,132
device_flags=""
if [ -n "${DEVICE_POLICY:-}" ]; then  # a policy for split_policy=device: finer buckets, the count alone
  device_flags="--edges-per-octave $DEVICE_POLICY --device-policy"
  export MLABENCH_TUNE_RULE="${MLABENCH_TUNE_RULE:-off}" MLABENCH_TUNE_LENGTHS="${MLABENCH_TUNE_LENGTHS:-2}"
  export MLABENCH_TUNE_TRIALS="${MLABENCH_TUNE_TRIALS:-24}" POLICY_MODES="${POLICY_MODES:-device}"
fi

tune_and_check() {  # $1 qo_len, $2 contexts of the graph-check
  local dir="$out/qo$1" run="${TUNE_RUN:-}"
  mkdir -p "$dir"
  if [ -z "$run" ]; then
    stage "tune gluon-splitkv at qo_len $1"
    MLABENCH_TUNE_BACKEND=gluon-splitkv MLABENCH_TUNE_TILES=off \
      MLABENCH_TUNE_SHAPE="--config kimi-k3-tp8 --qo-len $1 $device_flags" \
      bash "$here/h200_tune_kimi_k3_tp8.sh" "$dir" 2> "$dir/stages.log"
    run="$(ls -d "$dir"/tune-kimi-* 2>/dev/null | tail -n 1)"
  elif [ "${MLABENCH_TUNE_VALIDATE:-1}" != 0 ]; then  # a run tuned in an earlier call: validate it
    read -r v_lengths v_low v_high <<< "${MLABENCH_VALIDATE_GRID:-24 1024 131072}"
    "${mlabench[@]}" tune --validate "$run/policy.json" --lengths "$v_lengths" --min-context "$v_low" \
      --max-context "$v_high" ${MLABENCH_VALIDATE_CONTEXT:+--context "$MLABENCH_VALIDATE_CONTEXT"} --budget-s 0.3 --results-dir "$dir" --markdown > "$dir/validate.md"
    echo "validate exit code: $? (1: a held-out length missed the 3% target)" >> "$dir/timing.txt"
  fi
  [ -f "$run/policy.json" ] || { echo "no policy in $dir: see $dir/stages.log" >&2; return 1; }
  for mode in ${POLICY_MODES:-device host}; do
    [ "$mode" = none ] && continue
    stage "graph-check split_policy=$mode, qo_len $1"
    "${mlabench[@]}" graph-check --backend gluon-splitkv --split-policy "$mode" --policy "$run/policy.json" \
      --qo-len "$1" --capture-len "$1" --batch 1,16 --context "$2" --splits "$ladder" --tolerance 0.03 \
      --save "$dir/graph_check_$mode.json" --markdown > "$dir/graph_check_$mode.md" \
      2> "$dir/graph_check_$mode.log"
    echo "graph-check exit code: $?" >> "$dir/graph_check_$mode.log"
  done
}

for s in ${STAGES:-qo1 qo4 mtp}; do
  case "$s" in
    qo1) tune_and_check 1 "$contexts" ;;
    qo4) tune_and_check 4 "${QO4_CONTEXTS:-$contexts}" ;;
    mtp) stage "kimi-k3-tp8-mtp"; bash "$here/h200_qo_len.sh" "$out/mtp" ;;
    *) echo "unknown stage $s (qo1, qo4, mtp)" >&2; exit 2 ;;
  esac
done
