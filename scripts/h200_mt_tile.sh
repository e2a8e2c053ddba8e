#!/usr/bin/env bash
# gluon-splitkv's multi-token stage 1 (multi_token 1 and 2; docs/multi-token-tile.md) on one
# NVIDIA H200, about 10 minutes with compiles:
#   1. its GPU tests (tests/gpu/test_gluon_multi_token.py, and the device-policy and PDL graphs of
#      tests/gpu/test_gluon_splitkv.py with the variant on and off) -> gpu_tests.txt;
#   2. the sweep configs/sweeps/kimi-k3-tp8-mt-tile.toml (qo_len 1, 2, 4, 8; batch 1 and 16; 4K,
#      32K, 100K; multi_token 0, 1, 2 beside FlashMLA) -> sweep.md and the run folder;
#   3. compare -> compare.md, compare.json.
#   bash scripts/h200_mt_tile.sh OUTDIR [SWEEP_CONFIG]
# SWEEP_CONFIG: another sweep of configs/sweeps/ (kimi-k3-tp8-mt-rows: rows_as_m 0 and 2).
# FLASHMLA_WHEEL=path installs FlashMLA first (no network needed).  The sweep runs only when the
# GPU tests pass (SWEEP_ANYWAY=1 runs it regardless).
set -uo pipefail
out="${1:?usage: $0 OUTDIR [SWEEP_CONFIG]}"
config="${2:-kimi-k3-tp8-mt-tile}"
mkdir -p "$out"
export COLUMNS=200 MLABENCH_E2E=0
stage() { echo "[$(date +%H:%M:%S)] $*" >&2; }
if [[ -n "${FLASHMLA_WHEEL:-}" ]]; then
  python3 -m pip install --quiet --no-deps "$FLASHMLA_WHEEL" || echo "FlashMLA wheel not installed" >&2
fi
start=$SECONDS

stage "GPU tests"
( python3 -m pytest -q -p no:cacheprovider -rs tests/gpu/test_gluon_multi_token.py; a=$?
  python3 -m pytest -q -p no:cacheprovider -rs tests/gpu/test_gluon_splitkv.py \
    -k "pdl_prologue or device_policy"; b=$?; exit $((a | b)) ) > "$out/gpu_tests.txt" 2>&1
tests=$?
echo "gpu tests exit code: $tests" >> "$out/gpu_tests.txt"
if [[ $tests -ne 0 && "${SWEEP_ANYWAY:-0}" != 1 ]]; then
  echo "GPU tests failed: see $out/gpu_tests.txt (no sweep)" >&2; exit 1
fi

stage "sweep $config"
python3 -m mlabench sweep --config "$config" --results-dir "$out" --markdown \
  > "$out/sweep.md" 2> "$out/sweep.log" || { echo "sweep failed: see $out/sweep.log" >&2; exit 1; }
run="$(ls -d "$out/$config"-* | tail -n 1)"

stage "compare"
python3 -m mlabench compare --from "$run" --markdown > "$out/compare.md"
python3 -m mlabench compare --from "$run" --json > "$out/compare.json"
echo "wall time: $(( SECONDS - start )) s" | tee "$out/summary.txt"
