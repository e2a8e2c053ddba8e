"""Fixtures of the tuner tests: the test-only backends, tiny timing, a throwaway PostgreSQL."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from mlabench.measure.timing import TimingConfig
from mlabench.tune.worker_pool import IMPORTS_ENV


@pytest.fixture(scope="package", autouse=True)
def fake_backends():
    """Register the test backends for this package only (workers import them through the env)."""
    from tests.tune import fake_backends as fb

    fb.register_all()
    old = os.environ.get(IMPORTS_ENV)
    os.environ[IMPORTS_ENV] = fb.MODULE
    yield fb
    fb.unregister_all()
    if old is None:
        os.environ.pop(IMPORTS_ENV, None)
    else:
        os.environ[IMPORTS_ENV] = old


@pytest.fixture
def tiny_timing() -> TimingConfig:
    """Few samples, one input copy: the synthetic backends have no cache to keep cold, and on a GPU
    the default 64 copies would each pay ``TEST_TUNE_PREPARE_S`` in ``prepare``."""
    return TimingConfig(budget_s=0.02, min_samples=3, max_samples=15, warmup_iters=1, target_rel_ci=0.05,
                        eager=False, cold_cache=False)


def _skip_or_fail(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must run the PostgreSQL tests: scripts/test.sh installs it)")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def postgres_url():
    """A throwaway PostgreSQL cluster under a temp dir (Debian's ``postgresql`` package), started
    as an unprivileged user when running as root (postgres refuses root), stopped at the end."""
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not bins:
        _skip_or_fail("PostgreSQL is not installed (apt-get install postgresql)")
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        _skip_or_fail("psycopg2 is not installed (pip install psycopg2-binary)")
    bindir = Path(bins[-1]).parent
    root = Path(tempfile.mkdtemp(prefix="mlabench-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, user="nobody")
        as_user = ["runuser", "-u", "nobody", "--"]
    port = _free_port()
    data = root / "data"
    ctl = [*as_user, str(bindir / "pg_ctl"), "-D", str(data)]
    try:
        subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"],
                       check=True, capture_output=True, timeout=120)
        subprocess.run([*ctl, "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1", "-l",
                        str(root / "log"), "-w", "start"], check=True, capture_output=True, timeout=120)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        shutil.rmtree(root, ignore_errors=True)
        _skip_or_fail(f"could not start a PostgreSQL cluster: {exc}")
    yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
    subprocess.run([*ctl, "-m", "immediate", "stop"], capture_output=True, timeout=60)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def new_database(postgres_url):
    """A function making a new, empty database in the throwaway cluster and returning its URL
    (every one dropped at the end)."""
    import uuid

    import psycopg2

    dsn = postgres_url.replace("postgresql+psycopg2://", "postgresql://")
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    made: list[str] = []

    def make() -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
        made.append(name)
        return postgres_url.rsplit("/", 1)[0] + "/" + name

    yield make
    with conn.cursor() as cur:
        for name in made:
            cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    conn.close()


@pytest.fixture
def fresh_database(new_database):
    """The URL of a new, empty database in the throwaway cluster."""
    return new_database()
