#!/usr/bin/env bash
# First run on an AMD MI300X (gfx942) or MI355X (gfx950): what the AITER backends do on this
# machine, written to one folder (and a .tar.gz of it) to send back.
#
#   bash scripts/rocm_validate.sh [OUTDIR]        # default: results/rocm-validate-<host>-<date>
#
# Steps (each one's exit code goes to OUTDIR/steps.txt; a failing step does not stop the rest):
#   1. environment.txt   torch/ROCm, the AITER distribution, rocminfo's gfx names, AITER env vars
#   2. backends.txt/.json every backend, why not where unavailable, the AITER version and rules
#   3. check-*.md/.json   the AITER and Triton backends against the fp32 reference at 12 and 16
#                         heads (batch 1 at 4096 tokens, a ragged batch, batch 16 at 8192) and 64
#                         and 128 heads (batch 1 and 64 at 1024; AITER's Gluon 64/128-head kernel
#                         needs batch % 64 == 0, so batch 1 is "unsupported" there, with the reason)
#   4. sweeps/            a short sweep at 12 heads: the library paths at their own choices, and
#                         the Triton split-KV kernel over split counts
#   5. compare.md         padded persistent vs the best split-KV, from those sweeps
#   6. graph-check-aiter.md/.json  aiter-gluon and aiter-asm captured at 1 token per request (as
#                         vLLM captures), replayed after refresh at 4K-128K, batch 1 and 8, against
#                         each prepared for the length; exit code 1 when a row is flagged (expected
#                         for aiter-gluon before AITER v0.1.20: its split count frozen at capture)
# MLABENCH_VALIDATE_BACKENDS="a b ..." replaces the backends checked and swept;
# MLABENCH_VALIDATE_SWEEP="--heads 12 --batch 1,16,64 --context 4096,32768" (the default) the sweep grid.
# Needs: mlabench installed (bash scripts/setup.sh) in a ROCm PyTorch, AITER (amd-aiter) importable.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/rocm-validate-$(hostname -s)-$(date +%Y%m%d-%H%M)}"
mkdir -p "$out/sweeps"
export COLUMNS=200
mlabench=(python3 -m mlabench)

step() {  # step NAME COMMAND...: run it, note its exit code
    local name="$1"; shift
    echo "== $name: $*" >&2
    "$@"
    local rc=$?
    echo "$name $rc" >> "$out/steps.txt"
    return 0
}

environment() (  # a subshell: its stderr joins its stdout, not the script's
    exec 2>&1
    date -u +"%Y-%m-%dT%H:%M:%SZ"
    git rev-parse HEAD 2>/dev/null || true
    python3 -c 'import torch; print("torch", torch.__version__, "hip", torch.version.hip,
"gpus", torch.cuda.device_count(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")'
    python3 -m pip show amd-aiter aiter 2>/dev/null | grep -E '^(Name|Version|Location):' || echo "no amd-aiter distribution record"
    python3 -c 'import aiter._version as v; print("aiter._version", v.__version__)' 2>/dev/null || echo "no aiter._version"
    (rocminfo 2>/dev/null | grep -oE 'gfx[0-9a-f]+' | sort | uniq -c) || echo "rocminfo not found"
    env | grep -E '^(GPU_ARCHS|AITER_|HIP_VISIBLE_DEVICES|ROCR_VISIBLE_DEVICES)=' || true
)

step environment environment > "$out/environment.txt"
step backends "${mlabench[@]}" backends > "$out/backends.txt" 2>&1
step backends-json "${mlabench[@]}" backends --json > "$out/backends.json" 2> "$out/backends.err"

# The backends to check: those of interest that are available here (a named unavailable backend
# would stop `check`; backends.txt says why the others are not).
want="${MLABENCH_VALIDATE_BACKENDS:-aiter-asm aiter-gluon triton-persistent triton-splitkv}"
mapfile -t chosen < <(python3 - "$out/backends.json" "$want" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))[0]["rows"]
want = sys.argv[2].split()
sys.stdout.write("".join(r["backend"] + "\n" for r in rows if r["backend"] in want and r["available"]))
EOF
)
backend_flags=()
for b in "${chosen[@]}"; do backend_flags+=(--backend "$b"); done
echo "checking: ${chosen[*]:-none}" >&2

if [ "${#chosen[@]}" -gt 0 ]; then
    checks=("check-12-16h:--heads 12,16"  # batch 1 x 4096 tokens, and a ragged batch (1, 100, 1024, 4097)
            "check-12-16h-batch:--heads 12,16 --batch 1,16 --context 8192"
            "check-64-128h:--heads 64,128 --batch 1,64 --context 1024")
    for spec in "${checks[@]}"; do
        name="${spec%%:*}"
        read -r -a args <<< "${spec#*:}"
        step "$name" "${mlabench[@]}" check "${args[@]}" "${backend_flags[@]}" --markdown \
            > "$out/$name.md" 2> "$out/$name.err"
        step "$name-json" "${mlabench[@]}" check "${args[@]}" "${backend_flags[@]}" --json \
            > "$out/$name.json" 2>> "$out/$name.err"
    done

    library=() splitkv=()
    for b in "${chosen[@]}"; do
        if [[ "$b" == *splitkv ]]; then splitkv+=(--backend "$b"); else library+=(--backend "$b"); fi
    done
    read -r -a grid <<< "${MLABENCH_VALIDATE_SWEEP:---heads 12 --batch 1,16,64 --context 4096,32768}"
    grid+=(--budget-s 1 --results-dir "$out/sweeps")
    # The library paths at their own choices (AITER picks the Gluon split count), then the
    # split-KV kernels over split counts: compare takes the best split for each point.
    [ "${#library[@]}" -gt 0 ] && step sweep-library "${mlabench[@]}" sweep "${grid[@]}" "${library[@]}" \
        --markdown > "$out/sweep-library.md" 2> "$out/sweep-library.err"
    [ "${#splitkv[@]}" -gt 0 ] && step sweep-splits "${mlabench[@]}" sweep "${grid[@]}" "${splitkv[@]}" \
        --splits 16,64,256 --markdown > "$out/sweep-splits.md" 2> "$out/sweep-splits.err"
    step compare "${mlabench[@]}" compare --from "$out/sweeps" --markdown > "$out/compare.md" 2> "$out/compare.err"

    aiter=()
    for b in "${chosen[@]}"; do [[ "$b" == aiter-* ]] && aiter+=(--backend "$b"); done
    [ "${#aiter[@]}" -gt 0 ] && step graph-check-aiter "${mlabench[@]}" graph-check "${aiter[@]}" \
        --batch 1,8 --context 4096,16384,32768,65536,100000,131072 --save "$out/graph-check-aiter.json" \
        --markdown > "$out/graph-check-aiter.md" 2> "$out/graph-check-aiter.err"
fi

tar czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
echo "done: $out (steps and exit codes in $out/steps.txt); please send $out.tar.gz" >&2
