"""Server lifecycle against a stand-in server: start, death at start, never healthy, escalation,
and Ctrl-C in the middle of a serve-bench run (no orphans in every case)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlabench.errors import ServerError
from mlabench.serving.config import LaunchSpec
from mlabench.serving.lifecycle import ManagedServer, is_healthy

from .conftest import BENCH_POLL, POLL_S, free_port, launch_table, pid_alive, server_command


def _pids(pidfile: Path) -> list[int]:
    return [int(x) for x in pidfile.read_text().split()]


def _spec(port, mode, pidfile, **kw) -> LaunchSpec:
    return LaunchSpec(command=server_command(port, mode, pidfile), **kw)


def test_start_healthy_then_stop_kills_group(tmp_path):
    port, pidfile = free_port(), tmp_path / "pids"
    srv = ManagedServer(_spec(port, "slow", pidfile), f"http://127.0.0.1:{port}",
                        tmp_path / "server.log", poll_s=POLL_S)
    with srv:
        assert is_healthy(f"http://127.0.0.1:{port}")
        leader, child = _pids(pidfile)
        assert pid_alive(leader) and pid_alive(child)
        assert srv.startup_s is not None and srv.startup_s >= 1.4
    assert not pid_alive(leader) and not pid_alive(child)
    assert not is_healthy(f"http://127.0.0.1:{port}")
    assert "mlabench stopped server" in (tmp_path / "server.log").read_text()


def test_server_dying_at_start_fails_fast_with_log_tail(tmp_path):
    port, pidfile = free_port(), tmp_path / "pids"
    srv = ManagedServer(_spec(port, "die", pidfile, health_timeout_s=60), f"http://127.0.0.1:{port}",
                        tmp_path / "server.log", poll_s=POLL_S)
    t0 = time.monotonic()
    with pytest.raises(ServerError) as exc:
        srv.start()
    assert time.monotonic() - t0 < 20  # fail fast, not after the 60 s health timeout
    msg = str(exc.value)
    assert "exited with code 3" in msg
    assert "fake engine failed to start" in msg  # the tail of its log


def test_never_healthy_times_out_and_leaves_nothing(tmp_path):
    port, pidfile = free_port(), tmp_path / "pids"
    srv = ManagedServer(_spec(port, "unhealthy", pidfile, health_timeout_s=2, stop_grace_s=3),
                        f"http://127.0.0.1:{port}", tmp_path / "server.log", poll_s=POLL_S)
    with pytest.raises(ServerError, match="not healthy .* after 2 s"):
        srv.start()
    leader, child = _pids(pidfile)
    assert not pid_alive(leader) and not pid_alive(child)


def test_stop_escalates_when_sigint_is_ignored(tmp_path):
    port, pidfile = free_port(), tmp_path / "pids"
    srv = ManagedServer(_spec(port, "stubborn", pidfile, stop_grace_s=1),
                        f"http://127.0.0.1:{port}", tmp_path / "server.log", poll_s=POLL_S)
    srv.start()
    leader, child = _pids(pidfile)
    t0 = time.monotonic()
    code = srv.stop()
    assert code == -signal.SIGTERM  # SIGINT ignored, SIGTERM did it
    assert 0.9 < time.monotonic() - t0 < 10
    assert not pid_alive(leader) and not pid_alive(child)


def test_refuses_to_launch_over_a_running_server(tmp_path):
    port, pidfile = free_port(), tmp_path / "pids"
    with ManagedServer(_spec(port, "ok", pidfile), f"http://127.0.0.1:{port}",
                       tmp_path / "a.log", poll_s=POLL_S):
        second = ManagedServer(_spec(port, "ok", tmp_path / "p2"), f"http://127.0.0.1:{port}",
                               tmp_path / "b.log")
        with pytest.raises(ServerError, match="already answers"):
            second.start()


def _serve_bench_with_a_sleeping_bench(tmp_path, fake_vllm, launch_extra=""):
    """Start ``mlabench serve-bench`` on a launched fake server whose bench sleeps; return
    ``(proc, leader_pid, child_pid, bench_pid)`` once the bench is running."""
    port, pidfile, bench_pidfile = free_port(), tmp_path / "pids", tmp_path / "bench.pid"
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'baseline = "a"\nconcurrencies = [1]\nvllm_bin = "{fake_vllm}"\nmodel = "m"\n{BENCH_POLL}'
        f'[[variants]]\nname = "a"\nbase_url = "http://127.0.0.1:{port}"\n'
        f"{launch_table(port, 'ok', pidfile)}"
        + launch_extra
    )
    env = {**os.environ, "FAKE_BENCH_MODE": "sleep", "FAKE_BENCH_PIDFILE": str(bench_pidfile)}
    env.pop("MLABENCH_VLLM_BIN", None)
    # Ctrl-C as a terminal delivers it: a shell running the tests as a background job starts them
    # with SIGINT ignored, which the child would inherit (and Python then installs no handler).
    proc = subprocess.Popen(
        [sys.executable, "-c", "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
         "from mlabench.cli import main; main()", "serve-bench", str(cfg), "--results-dir", str(tmp_path / "results")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 60
    while not bench_pidfile.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "bench never started"
        time.sleep(0.1)
    time.sleep(0.3)
    leader, child = _pids(pidfile)
    return proc, leader, child, int(bench_pidfile.read_text())


def test_ctrl_c_mid_run_stops_server_and_bench(tmp_path, fake_vllm):
    proc, leader, child, bench_pid = _serve_bench_with_a_sleeping_bench(tmp_path, fake_vllm,
                                                                        "stop_grace_s = 3\n")
    assert pid_alive(leader) and pid_alive(bench_pid)
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends to the foreground process
    try:
        out, errtext = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # keep what it said
        proc.kill()
        out, errtext = proc.communicate()
        pytest.fail(f"serve-bench still ran 60 s after SIGINT; stdout:\n{out}\nstderr:\n{errtext}")
    assert proc.returncode == 130 and "aborted" in errtext, errtext
    for pid in (leader, child, bench_pid):
        assert not pid_alive(pid), f"process {pid} survived Ctrl-C"
    # stopped during the first benchmark: nothing was measured, so no run folder is left
    assert "partial results kept" not in errtext and not list((tmp_path / "results").iterdir())


def test_server_dying_mid_bench_fails_fast_and_cleans_up(tmp_path, fake_vllm):
    proc, leader, child, bench_pid = _serve_bench_with_a_sleeping_bench(tmp_path, fake_vllm)
    os.kill(leader, signal.SIGKILL)  # the server crashes while the benchmark runs
    _, errtext = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "server exited during the benchmark" in errtext and "fake server starting" in errtext
    assert not pid_alive(bench_pid) and not pid_alive(child)


def test_prompt_text_file_and_repeat(tmp_path, monkeypatch):
    from mlabench.errors import ConfigError
    from mlabench.serving.config import CheckParams, prompt_text

    assert prompt_text(CheckParams(prompt="ab ", prompt_repeat=3)) == "ab ab ab "
    (tmp_path / "p.txt").write_text("long context. ")
    monkeypatch.setenv("MLB_PROMPT_DIR", str(tmp_path))
    assert prompt_text(CheckParams(prompt_file="$MLB_PROMPT_DIR/p.txt", prompt_repeat=2)) == \
        "long context. long context. "
    with pytest.raises(ConfigError, match="check.prompt_file not found"):
        prompt_text(CheckParams(prompt_file=str(tmp_path / "none.txt")))


def test_poll_intervals_are_parameters(tmp_path, fake_vllm, monkeypatch):
    """Issue 15 item 5: health polls (``[launch] health_poll_s``) and bench polls
    (``bench_poll_s``) come from the config, so the tests run on short ones."""
    from mlabench.serving import bench, bench_process
    from mlabench.serving.config import load_config

    port, seen = free_port(), {}
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'baseline = "a"\nconcurrencies = [1]\nvllm_bin = "{fake_vllm}"\nmodel = "m"\n'
                   f'bench_poll_s = 0.03\n[[variants]]\nname = "a"\nbase_url = "http://127.0.0.1:{port}"\n'
                   f"{launch_table(port, 'slow', tmp_path / 'p')}".replace(f"health_poll_s = {POLL_S}",
                                                                          "health_poll_s = 0.02"))
    real_run_one, real_wait = bench_process.run_one, ManagedServer._wait_healthy
    monkeypatch.setattr(bench_process, "run_one", lambda *a, **k: seen.setdefault("bench", k["poll_s"]) and real_run_one(*a, **k))
    monkeypatch.setattr(ManagedServer, "_wait_healthy",
                        lambda self, t0: seen.setdefault("health", self.poll_s) and real_wait(self, t0))
    _, results = bench.run_serve_bench(load_config(cfg), tmp_path / "res")
    assert seen == {"bench": 0.03, "health": 0.02} and [r.status for r in results] == ["ok"]
    assert ManagedServer(_spec(port, "ok", tmp_path / "q"), "http://x", tmp_path / "l").poll_s == 1.0  # real servers
