#!/usr/bin/env bash
# Multi-token decode on one NVIDIA GPU (written for an H200, about 5 minutes):
# Kimi K3 at TP8 (12 heads, bf16, page 64) at qo_len 1, 2, 4 and 8 (speculative-decoding verify, MTP),
# batch 1 and 16, contexts 4K / 32K / 100K, every backend available here
# (configs/sweeps/kimi-k3-tp8-mtp.toml: triton-splitkv, triton-persistent, flashmla, gluon-splitkv).
#   1. the GPU tests of multi-token bf16 correctness (tests/gpu, -k multi_token);
#   2. check at qo_len 1, 2, 4, 8 causal and at qo_len 8 non-causal (a ragged batch whose shortest
#      request holds just the block, and the seed case), every split count of check;
#   3. the sweep, and compare: padded persistent vs best split-KV per batch, context and qo_len, and
#      which path wins at each qo_len.
# Small files only: backends.txt, gpu_tests.txt, check*.md, sweep.md, compare.md, compare.json,
# summary.txt, and the run folder (results.jsonl, results.csv, manifest.json).
#   bash scripts/h200_qo_len.sh OUTDIR
# FLASHMLA_WHEEL=path installs FlashMLA first (no network needed).
set -uo pipefail
out="${1:?usage: $0 OUTDIR}"
mkdir -p "$out"
export COLUMNS=200 MLABENCH_E2E=0
mlabench=(python3 -m mlabench)
stage() { echo "[$(date +%H:%M:%S)] $*" >&2; }
if [[ -n "${FLASHMLA_WHEEL:-}" ]]; then
  python3 -m pip install --quiet --no-deps "$FLASHMLA_WHEEL" || echo "FlashMLA wheel not installed" >&2
fi
start=$SECONDS

stage "backends and GPU tests"
"${mlabench[@]}" backends > "$out/backends.txt" 2>&1
if python3 -c "import pytest" 2>/dev/null; then
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_kernels.py -k multi_token -rs \
    > "$out/gpu_tests.txt" 2>&1
  echo "gpu tests exit code: $?" >> "$out/gpu_tests.txt"
else
  echo "pytest not installed: GPU tests not run" > "$out/gpu_tests.txt"
fi

stage "check"
backends=$("${mlabench[@]}" backends --json | python3 -c "import json, sys
want = ('triton-splitkv', 'triton-persistent', 'flashmla', 'gluon-splitkv')
rows = json.load(sys.stdin)[0]['rows']
print(','.join(r['backend'] for r in rows if r['backend'] in want and r['available']))")
echo "backends checked: $backends" > "$out/check.log"
"${mlabench[@]}" check --model kimi-k3 --tp 8 --qo-len 1,2,4,8 --backend "$backends" --markdown \
  > "$out/check.md" 2>> "$out/check.log"
echo "check exit code: $?" >> "$out/check.log"
"${mlabench[@]}" check --model kimi-k3 --tp 8 --qo-len 8 --non-causal --backend "$backends" --markdown \
  > "$out/check-non-causal.md" 2> "$out/check-non-causal.log"
echo "check --non-causal exit code: $?" >> "$out/check-non-causal.log"

stage "sweep kimi-k3-tp8-mtp"
"${mlabench[@]}" sweep --config kimi-k3-tp8-mtp --results-dir "$out" --markdown > "$out/sweep.md" \
  2> "$out/sweep.log" || { echo "sweep failed: see $out/sweep.log" >&2; exit 1; }
run="$(ls -d "$out"/kimi-k3-tp8-mtp-* | tail -n 1)"

stage "compare"
"${mlabench[@]}" compare --from "$run" --markdown > "$out/compare.md"
"${mlabench[@]}" compare --from "$run" --json > "$out/compare.json"

python3 - "$out" > "$out/summary.txt" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for name in ("check.log", "check-non-causal.log", "gpu_tests.txt"):
    lines = (out / name).read_text().splitlines() if (out / name).exists() else ["missing"]
    print(f"{name}: {lines[-1] if lines else ''}")
tables = json.loads((out / "compare.json").read_text())
winners = next((t for t in tables if t["title"].startswith("Which path wins")), None)
if winners is None:
    print("no per-qo_len table (only one qo_len recorded?)")
else:
    for row in winners["rows"]:
        cells = []
        for col in winners["columns"][2:]:
            w = row[col]
            margin = "only path ok" if w and w["margin"] is None else f"{w['margin']:.2f}x" if w else ""
            cells.append(f"{col}: {w['path']} {w['backend']} {w['us']:.1f} us {margin}" if w else f"{col}: none ok")
        print(f"B={row['batch']:<3} L={row['context']:<7} " + " | ".join(cells))
PY
echo "wall time: $(( SECONDS - start )) s" >> "$out/summary.txt"
cat "$out/summary.txt"
