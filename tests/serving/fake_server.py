"""A stand-in for `vllm serve` in lifecycle tests: python fake_server.py PORT MODE PIDFILE.

MODE: ok (healthy), die (exit 3 at once), unhealthy (/health 503 forever),
stubborn (healthy, ignores SIGINT, so stop must escalate), slow (healthy after 1.5 s);
SIGTERM stops the child and exits, as vLLM stops its engine;
for POST /v1/completions: ok answers ids 5,6,7,5,... (at position 2, 99 a runner-up 0.01 nats
behind 7); tie swaps the two there, wrong answers 99 with a top-2 gap of 2.0 nats; short answers
one token less than asked.
It also starts a child process in its group, to check that the whole group is stopped.
"""

import http.server
import json
import os
import signal
import subprocess
import sys
import time

port, mode, pidfile = int(sys.argv[1]), sys.argv[2], sys.argv[3]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(pidfile, "w") as fh:
    fh.write(f"{os.getpid()} {child.pid}\n")
print(f"fake server starting, mode {mode}", flush=True)
if mode == "die":
    print("RuntimeError: fake engine failed to start", flush=True)
    child.kill()
    sys.exit(3)
if mode == "stubborn":
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _terminate(_sig, _frame):
    """Like vLLM on SIGTERM: stop the engine child, then end by the signal."""
    child.kill()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


signal.signal(signal.SIGTERM, _terminate)
if mode == "slow":
    time.sleep(1.5)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            self.send_response(503 if mode == "unhealthy" else 200)
            self.end_headers()
        elif self.path == "/v1/models":
            body = json.dumps({"data": [{"id": "fake-model"}]}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_response(404)
            self.end_headers()

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = req["max_tokens"] - (1 if mode == "short" else 0)
        ids = [5 + i % 3 for i in range(n)]
        gaps, second = [1.0] * n, [1] * n
        if n > 2:  # position 2: 7 and 99 nearly tied (ok, tie), or 99 sure of itself (wrong)
            gaps[2], second[2] = 0.01, 99
        if mode in ("tie", "wrong") and n > 2:
            ids[2], gaps[2], second[2] = 99, (0.01 if mode == "tie" else 2.0), (7 if mode == "tie" else 1)
        lp = {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": [-0.1] * n,
              "top_logprobs": [{f"token_id:{t}": -0.1, f"token_id:{u}": -0.1 - g}
                               for t, u, g in zip(ids, second, gaps)]}
        body = json.dumps({"model": "fake-model", "choices": [
            {"text": "", "logprobs": lp, "finish_reason": "length"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
