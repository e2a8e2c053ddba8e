"""Fakes for the serving tests: a stand-in server and a stand-in `vllm` executable."""

import os
import socket
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); treat it as gone
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def fake_vllm(tmp_path: Path) -> str:
    """Path of an executable that behaves like `vllm bench serve` (see fake_vllm.py)."""
    exe = tmp_path / "vllm"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {HERE / 'fake_vllm.py'} \"$@\"\n")
    exe.chmod(0o755)
    return str(exe)


def server_command(port: int, mode: str, pidfile: Path) -> list[str]:
    return [sys.executable, str(HERE / "fake_server.py"), str(port), mode, str(pidfile)]


#: Poll intervals for the stand-ins, which start and finish within a fraction of a second (the
#: defaults, 1 s for health and 0.5 s for a bench run, suit real servers).
POLL_S = 0.05
#: Top-level serve config line and [variants.launch] line that set them.
BENCH_POLL = f"bench_poll_s = {POLL_S}\n"
HEALTH_POLL = f"health_poll_s = {POLL_S}\n"


def launch_table(port: int, mode: str, pidfile: Path) -> str:
    """A ``[variants.launch]`` table starting the stand-in server, polled every :data:`POLL_S`."""
    import json

    return f"[variants.launch]\ncommand = {json.dumps(server_command(port, mode, pidfile))}\n{HEALTH_POLL}"
