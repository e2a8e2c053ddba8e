"""A stand-in for `vllm bench serve`: writes a result JSON like vLLM 0.32.0 does.

Behaviour from the environment: FAKE_TPOT_MS_<VARIANT> (TPOT at concurrency 1, default 10; it
grows by 5% per extra concurrent request, and by FAKE_TPOT_MS_PER_1K_IN ms, default 0, per 1000
--random-input-len tokens), FAKE_BENCH_MODE = ok | fail_requests | no_result |
sleep (sleeps 600 s after writing FAKE_BENCH_PIDFILE) | slow (FAKE_BENCH_SLEEP_S s, then as ok) |
exit1 | die (os._exit(3)) | one_token (every TPOT 0, as vLLM writes when no request produced a
second token) | truncated (streams cut short: half the output
tokens).  In the other modes every request yields its full --random-output-len.  FAKE_BENCH_PIDS: a
file each run appends its process id to.  FAKE_KILL_SERVER_PIDFILE: the fake server's pid file; its
server is killed before the result is written.  Run as a script, or by the fake vLLM package of
``conftest.fake_vllm_python`` in serve-bench's shared bench process (then ``sys.argv`` is the
command's, as vLLM's entry point sees it).
"""

import json
import os
import sys
import time

args = sys.argv[1:]
assert args[:2] == ["bench", "serve"], args


def opt(name):
    return args[args.index(name) + 1]


meta = dict(kv.split("=", 1) for kv in args[args.index("--metadata") + 1:])
mode = os.environ.get("FAKE_BENCH_MODE", "ok")
if os.environ.get("FAKE_BENCH_PIDS"):  # which process ran each command
    with open(os.environ["FAKE_BENCH_PIDS"], "a") as fh:
        fh.write(f"{os.getpid()}\n")
if mode == "sleep":
    with open(os.environ["FAKE_BENCH_PIDFILE"], "w") as fh:
        fh.write(str(os.getpid()))
    time.sleep(600)
if mode == "slow":  # FAKE_BENCH_SLEEP_S seconds, then a result as in "ok"
    time.sleep(float(os.environ["FAKE_BENCH_SLEEP_S"]))
if os.environ.get("FAKE_KILL_SERVER_PIDFILE"):  # the server crashes as the run ends (its requests failed fast)
    with open(os.environ["FAKE_KILL_SERVER_PIDFILE"]) as fh:
        os.kill(int(fh.read().split()[0]), 9)
    time.sleep(0.2)
if mode == "die":  # the process ends at once, as if killed (in the shared bench process: it)
    os._exit(3)
if mode == "exit1":
    print("Traceback: fake failure", flush=True)
    sys.exit(1)
conc = int(opt("--max-concurrency"))
n = int(opt("--num-prompts"))
tpot = float(os.environ.get(f"FAKE_TPOT_MS_{meta['variant'].upper()}", "10")) * (1 + 0.05 * (conc - 1))
tpot += float(os.environ.get("FAKE_TPOT_MS_PER_1K_IN", "0")) * int(opt("--random-input-len")) / 1000
tpot = 0.0 if mode == "one_token" else tpot
failed = 1 if mode == "fail_requests" else 0
result = {
    "date": "20261130-000000", "backend": opt("--backend"), "model_id": opt("--model"),
    "num_prompts": n, "request_rate": "inf", "max_concurrency": conc, "duration": 1.0,
    "completed": n - failed, "failed": failed,
    "total_output_tokens": (n - failed) * int(opt("--random-output-len")) // (2 if mode == "truncated" else 1),
    "output_throughput": 1000.0 / tpot if tpot else 0.0, "request_throughput": 1.0,
    "errors": ["", "fake: connection reset"] if failed else [],
    **{f"{s}_tpot_ms": tpot for s in ("mean", "median", "p50")}, "p99_tpot_ms": tpot * 1.5,
    "mean_ttft_ms": 50.0, "median_ttft_ms": 50.0, "p99_ttft_ms": 60.0,
    "mean_itl_ms": tpot, "median_itl_ms": tpot, "p99_itl_ms": tpot * 2,
    **meta,
}
if mode != "no_result":
    with open(os.path.join(opt("--result-dir"), opt("--result-filename")), "w") as fh:
        json.dump(result, fh)
print("fake bench done", flush=True)
