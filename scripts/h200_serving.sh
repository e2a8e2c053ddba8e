#!/usr/bin/env bash
# TPOT of mlabench's gluon-splitkv inside vLLM 0.26 on one H200, against vLLM's own MLA decode
# backends (results/h200/serving/): the Kimi K3 TP8 proxy served with dummy weights, every variant
# of configs/serve/h200-kimi-k3-tp8-proxy.toml at 4K, 32K and 100K tokens in, concurrency 1 and 16,
# plus the microbenchmarks the TPOT prediction reads (configs/sweeps/kimi-k3-tp8-serving.toml).
# Offline: vLLM comes from the slim bundle of ../shared/gpu-vllm built into .gpuserve/ (its README).
# Stages, each one `run` call on the device machine (it keeps /tmp only while warm, so make them
# back to back), from the repository root:
#   install-vllm           carry .gpuserve/vllm, .gpuserve/install.sh, .gpuserve/tools
#   install-deps OUT       carry .gpuserve/deps, .gpuserve/install.sh, .gpuserve/tools, .whl
#                          (sgl_flash_mla for the FlashMLA microbenchmark) and .mlabench-revision.json
#                          (`python3 scripts/stamp_revision.py` here first: the device's copy of the
#                          tree has no .git of this checkout, so its runs record the stamped
#                          revision); then mlabench itself (editable, no deps: its
#                          vllm.general_plugins entry point), the proxy models, the GPU tests
#                          (GPU_TESTS; their output in check/gpu-tests.txt) and the greedy check on
#                          the tiny proxy (OUT/check.tar.gz), the sweeps (OUT/sweep.tar.gz), and
#                          serve-bench started in the background (its own session: it outlives the
#                          call, not the machine)
#   tune OUT               (optional, with install-vllm in the same call; carry .whl/opt: the cp312
#                          wheels of optuna, pydantic and what they need that the GPU image lacks:
#                          colorlog, pydantic_core, annotated_types, typing_inspection,
#                          typing_extensions; not sqlalchemy and alembic, which only --storage URLs
#                          need, the tune's journal does not: 4.5 MB with them would pass the 64 MiB
#                          with .gpuserve/vllm) a device policy for gluon-splitkv tuned on this machine
#                          (scripts/h200_gluon_deploy.sh with DEVICE_POLICY [3] sub-buckets per
#                          octave: at batch 1 the best count of the committed validation doubles
#                          between 3734 and 5161 tokens, 1.38x apart; validated, also at the
#                          served contexts 4160, 32832 and 100064; docs/tuning-device.md) into
#                          /tmp/tune and
#                          OUT/tune.tar.gz: serve it with POLICY=$(ls /tmp/tune/qo1/tune-*/policy.json).
#                          On an H200 (results/h200/deploy/qo1-k3/) the tune took 264 s and its
#                          validation (54 points) about 7 minutes: one call of 10 cannot hold both,
#                          so run MLABENCH_TUNE_VALIDATE=0 tune OUT, then, on the still warm machine,
#                          TUNE_RUN=$(ls -d /tmp/tune/qo1/tune-*) tune OUT (validation only)
#   wait OUT [SECONDS]     wait for serve-bench (at most SECONDS, default 560), then copy its run
#                          folder and log to OUT/serve.tar.gz (also while it still runs: a call
#                          that cannot wait to the end still takes what is measured)
# $OUT brings back at most 8 files, so each stage packs its folders.  About 5.5 minutes a variant of
# the full config (16 prompts of 100K tokens to prefill at concurrency 16 dominate): all five, the
# smoke and the sweeps took 28 of one session's 30 device minutes (install 1, smoke and sweeps 4.5,
# serving 21.5, in one install-deps call and three wait calls), when each vllm bench serve was a
# new process spending 15-20 s on imports: with one shared bench process (docs/serving.md) expect
# about 1.7 minutes less a variant (not yet measured), so the full config should fit one session
# with SKIP_SWEEP=1 (the prediction then reads sweeps of another session).  SERVE_CONFIG runs another config,
# SKIP_SMOKE=1 and SKIP_SWEEP=1 leave those parts out of a second session; SWEEP_SET adds arguments
# to the served kernels' sweep ("--backend gluon-splitkv": only mlabench's, when the policy changed).
# RESUME=results/serve-<time>-h200-proxy (carried) continues that run in a new session
# (serve-bench --resume): the points it lacks, the servers they need.
# Environment: VSITE (/tmp/vsite), POLICY (the committed tuned policy), GPU_TESTS (the pytest
# paths install-deps runs first, default tests/gpu/test_served_decode.py), SERVE_CONFIG, SERVE_SET
# (extra serve-bench arguments, e.g. "--set bench.random_output_len=16" for a quick try, or
# "--variant mlabench,fa3 --set baseline=fa3 --set bench.random_input_len=4096 -c 16 --repeats 3"),
# MLABENCH_GIT_REVISION (<sha> or <sha>-dirty: overrides the stamp).
set -uo pipefail
stage="${1:?usage: $0 install-vllm | tune OUT | install-deps OUT | wait OUT [SECONDS]}"
export VSITE="${VSITE:-/tmp/vsite}"
export PYTHONPATH="$VSITE${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
       TOKENIZERS_PARALLELISM=false VLLM_USE_FLASHINFER_SAMPLER=0 COLUMNS=200 PYTHONUNBUFFERED=1
export MLABENCH_SERVE_POLICY="${POLICY:-$PWD/results/h200/deploy/qo1-k3/tune-kimi-k3-tp8-20261205-122236-527/policy.json}"
export MLABENCH_PROXY_MODEL_DIR=/tmp/models/kimi-k3-tp8-proxy MLABENCH_TINY_PROXY_DIR=/tmp/models/tiny-mla-12h
export MLABENCH_VLLM_BIN=/tmp/vllm-bin/vllm
config="${SERVE_CONFIG:-configs/serve/h200-kimi-k3-tp8-proxy.toml}"
work=/tmp/serving   # serve-bench's results root and log, kept between calls while the machine is warm
ts() { echo "[$(date +%H:%M:%S)] $*" >&2; }

case "$stage" in
  install-vllm)
    bash .gpuserve/install.sh vllm ;;
  tune)
    out="${2:?usage: $0 tune OUT}"; mkdir -p "$out"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/optsite .whl/opt/*.whl || exit 1
    # optuna only, not vLLM's site (the tune imports no vLLM: install-vllm may run beside it)
    PYTHONPATH=/tmp/optsite DEVICE_POLICY="${DEVICE_POLICY:-3}" STAGES=qo1 \
      MLABENCH_VALIDATE_CONTEXT="${MLABENCH_VALIDATE_CONTEXT:-4160,32832,100064}" \
      POLICY_MODES="${POLICY_MODES:-none}" bash scripts/h200_gluon_deploy.sh /tmp/tune
    cat /tmp/tune/qo1/timing.txt; tail -n 3 /tmp/tune/qo1/validate.md 2>/dev/null
    tar -czf "$out/tune.tar.gz" -C /tmp tune
    ls /tmp/tune/qo1/tune-*/policy.json ;;
  install-deps)
    out="${2:?usage: $0 install-deps OUT}"; mkdir -p "$out/sweep" "$work"
    bash .gpuserve/install.sh deps || exit 1
    if ls .whl/*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --no-compile --target "$VSITE" .whl/*.whl || exit 1
    fi
    ts "mlabench (editable, no dependencies) for its vllm.general_plugins entry point"
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
    mkdir -p /tmp/vllm-bin
    # a Python script (not a shell wrapper), so serve-bench runs every vllm bench serve of a run in
    # one process that imports vLLM once (docs/serving.md, "Which vllm"); with the main-module guard:
    # vLLM starts its engine core by spawn, which imports this script again (without the guard the
    # child ran `vllm serve` anew and every server failed: "Engine core initialization failed")
    printf '#!/usr/bin/env python3\nimport sys\nfrom vllm.entrypoints.cli.main import main\nif __name__ == "__main__":\n    sys.exit(main())\n' > "$MLABENCH_VLLM_BIN"
    chmod +x "$MLABENCH_VLLM_BIN"
    python3 -c "from importlib.metadata import entry_points as e; print([p.value for p in e(group='vllm.general_plugins')])"
    rm -rf "$MLABENCH_PROXY_MODEL_DIR" "$MLABENCH_TINY_PROXY_DIR"
    python3 -c "from mlabench.deploy.proxy_model import kimi_k3_tp8_proxy as p, tiny_proxy as t, write_model_folder as w; print(w(p(), '$MLABENCH_PROXY_MODEL_DIR'), w(t(), '$MLABENCH_TINY_PROXY_DIR'))" || exit 1
    if [ "${SKIP_SMOKE:-0}" != 1 ]; then
    ts "GPU tests: ${GPU_TESTS:=tests/gpu/test_served_decode.py} (all of them in OUT/check/gpu-tests.txt)"
    mkdir -p "$out/check"
    # shellcheck disable=SC2086
    python3 -m pytest -q -p no:cacheprovider $GPU_TESTS > "$out/check/gpu-tests.txt" 2>&1
    tail -n 15 "$out/check/gpu-tests.txt"
    ts "smoke: the tiny proxy served by FLASHMLA (greedy fixture), then by the plugin (greedy check)"
    python3 -m mlabench serve-check configs/serve/h200-tiny-proxy.toml --variant flashmla --results-dir "$out/check" \
      --fixture "$out/check/greedy-tiny-flashmla.json" --save-fixture 2>&1 | tail -n 15
    python3 -m mlabench serve-check configs/serve/h200-tiny-proxy.toml --variant mlabench --results-dir "$out/check" \
      --fixture "$out/check/greedy-tiny-flashmla.json" --json > "$out/check/check-mlabench.json" 2> "$out/check/check-mlabench.log"
    rc=$?; cat "$out/check/check-mlabench.json"; tail -n 5 "$out/check/check-mlabench.log"
    grep -h "mlabench" "$out"/check/check-*/server-*.log 2>/dev/null | tail -n 5
    if [ "$rc" -gt 1 ]; then
      ts "the plugin's server did not serve (exit $rc): not starting the full run"
      tail -n 80 "$out"/check/check-*mlabench*/server-*.log 2>/dev/null
      tar -czf "$out/check.tar.gz" -C "$out" check && rm -rf "$out/check"; exit 1
    fi
    tar -czf "$out/check.tar.gz" -C "$out" check && rm -rf "$out/check"
    fi
    if [ "${SKIP_SWEEP:-0}" != 1 ]; then
    ts "microbenchmarks of the served kernels (prediction input)"
    # the served policy, and in host mode the counts its graphs freeze (the longest context at capture)
    host_splits="$(python3 -c "from mlabench.policy.device_table import load_split_policy as l; p = l('$MLABENCH_SERVE_POLICY'); print(','.join(str(p.lookup(b, 110000)) for b in (1, 16)))")"
    # shellcheck disable=SC2086
    python3 -m mlabench sweep --config configs/sweeps/kimi-k3-tp8-serving.toml --results-dir "$out/sweep" \
      --param "split_policy=device:$MLABENCH_SERVE_POLICY" ${SWEEP_SET:-} 2>&1
    python3 -m mlabench sweep --config configs/sweeps/kimi-k3-tp8-serving-host.toml --results-dir "$out/sweep" \
      --splits "$host_splits" 2>&1
    tar -czf "$out/sweep.tar.gz" -C "$out" sweep && rm -rf "$out/sweep"
    fi
    ts "serve-bench in the background (log: $work/serve-bench.log)"
    # shellcheck disable=SC2086
    if [ -n "${RESUME:-}" ] && [ -n "${SERVE_SET:-}" ]; then
      echo "RESUME runs the config the run recorded: no SERVE_SET with it" >&2; exit 2
    fi
    if [ -n "${RESUME:-}" ]; then  # a run folder of an earlier session, carried: run what it lacks
      mkdir -p "$work" && cp -r "$RESUME" "$work/" && what=(--resume "$work/$(basename "$RESUME")")
    else
      # the GPU in the run folder's name: h200-proxy, or h100-proxy where an H100 came for the H200
      gpu="$(python3 -c "import torch; n = torch.cuda.get_device_name().split(); print((n[1] if len(n) > 1 else n[0]).lower())")"
      what=("$config" --results-dir "$work" --label "${gpu:-gpu}-proxy")
    fi
    # shellcheck disable=SC2086
    setsid nohup python3 -m mlabench serve-bench "${what[@]}" ${SERVE_SET:-} \
      > "$work/serve-bench.log" 2>&1 < /dev/null &
    echo $! > "$work/serve-bench.pid"
    sleep 100; tail -n 30 "$work/serve-bench.log"; tail -n 40 "$work"/serve-*/server-*.log 2>/dev/null | grep -E "mlabench|Error|error|CUSTOM|backend" | tail -n 20 ;;
  wait)
    out="${2:?usage: $0 wait OUT [SECONDS]}"; limit="${3:-560}"; mkdir -p "$out"
    pid="$(cat "$work/serve-bench.pid")"; t=0
    while kill -0 "$pid" 2>/dev/null && (( t < limit )); do sleep 10; t=$((t + 10)); done
    kill -0 "$pid" 2>/dev/null && ts "serve-bench still running after ${limit}s" || ts "serve-bench done"
    tail -n 60 "$work/serve-bench.log"
    run="$(ls -d "$work"/serve-2* 2>/dev/null | tail -n 1)"  # serve-<UTC time>-<label>, not serve-bench.*
    [ -n "$run" ] && tar -czf "$out/serve.tar.gz" -C "$work" "$(basename "$run")" serve-bench.log ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
