"""No orphans: ``kill -9`` of the process running serve-bench ends the server it launched and the
bench process it runs (issue 25 item 6)."""

import subprocess
import sys
import time
from pathlib import Path

from tests.processes import survivors_of_sigkill

from .conftest import free_port, server_command

REPO = Path(__file__).resolve().parents[2]

PARENT = """
import sys, json
from pathlib import Path
from mlabench.serving.bench_process import run_one
from mlabench.serving.config import LaunchSpec
from mlabench.serving.lifecycle import ManagedServer
command, port, folder = json.loads(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
server = ManagedServer(LaunchSpec(command=command), f"http://127.0.0.1:{port}", folder / "server.log", poll_s=0.05)
server.start()
bench = [sys.executable, "-c", "import os, time; open(%r, 'w').write(str(os.getpid())); time.sleep(600)"
         % str(folder / "bench.pid")]
run_one(bench, folder / "bench.log", 600, server, 0.05)
"""


def test_kill_9_of_serve_bench_leaves_no_server_and_no_bench_process(tmp_path):
    import json

    port, pidfile = free_port(), tmp_path / "pids"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, json.dumps(server_command(port, "ok", pidfile)),
                               str(port), str(tmp_path)], cwd=REPO)
    deadline = time.monotonic() + 60
    while not (tmp_path / "bench.pid").exists() and time.monotonic() < deadline and parent.poll() is None:
        time.sleep(0.1)
    assert (tmp_path / "bench.pid").exists(), "the bench process did not start"
    time.sleep(0.2)  # its pid is written: it is past its preexec
    pids = [int(x) for x in pidfile.read_text().split()] + [int((tmp_path / "bench.pid").read_text())]
    left = survivors_of_sigkill(parent, pids, 15)
    assert not left, f"{len(left)} of {len(pids)} processes (server, its engine child, bench) outlived their parent"
