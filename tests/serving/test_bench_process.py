"""serve-bench's shared bench process: every ``vllm bench serve`` of a run in one process where the
vLLM executable is a Python script, a process per command otherwise (mlabench.serving.bench_process)."""

import json
import sys
import time
from pathlib import Path

import pytest

from mlabench.errors import ConfigError, ServerError
from mlabench.serving.bench import run_serve_bench
from mlabench.serving.bench_process import WORKER_LOG, bench_process_mode, script_python
from mlabench.serving.config import load_config

from .conftest import BENCH_POLL, VLLM_CONSOLE_SCRIPT, free_port, launch_table, pid_alive


def _config(tmp_path, vllm_bin, extra="", variants=("a",)):
    cfg = tmp_path / "c.toml"
    repeats = "" if "repeats" in extra else "repeats = 2\n"
    poll = "" if "bench_poll_s" in extra else BENCH_POLL
    text = (f'baseline = "a"\nvllm_bin = "{vllm_bin}"\nmodel = "m"\n{repeats}{poll}{extra}\n'
            f'[bench]\nrandom_input_len = 64\nrandom_output_len = 8\n')
    for name in variants:
        port = free_port()
        text += (f'[[variants]]\nname = "{name}"\nbase_url = "http://127.0.0.1:{port}"\n'
                 f"{launch_table(port, 'ok', tmp_path / ('p' + name))}")
    cfg.write_text(text)
    return load_config(cfg)


def _run(tmp_path, vllm_bin, monkeypatch, extra="", variants=("a",), **env):
    pids = tmp_path / "pids"
    monkeypatch.setenv("FAKE_BENCH_PIDS", str(pids))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    said: list[str] = []
    run_dir, results = run_serve_bench(_config(tmp_path, vllm_bin, extra, variants), tmp_path / "res",
                                       progress=said.append)
    return run_dir, results, pids.read_text().split() if pids.exists() else [], said


def test_a_python_vllm_runs_every_command_of_the_run_in_one_process(tmp_path, fake_vllm_python, monkeypatch):
    run_dir, results, pids, said = _run(tmp_path, fake_vllm_python, monkeypatch)
    assert [r.status for r in results] == ["ok"] * 4  # concurrency 1 and 16, two repeats
    assert len(pids) == 4 and len(set(pids)) == 1, pids
    assert any("server's commands in one process" in line for line in said), said
    assert json.loads((run_dir / "manifest.json").read_text())["bench_process"] == "shared"
    log = (run_dir / "a-c16-r1.log").read_text()
    assert "bench serve" in log and "shared bench process" in log and "fake bench done" in log
    assert not pid_alive(int(pids[0]))  # stopped at the end of the run


def test_per_run_and_a_shell_wrapper_give_each_command_its_own_process(tmp_path, fake_vllm_python,
                                                                      fake_vllm, monkeypatch):
    run_dir, results, pids, _ = _run(tmp_path, fake_vllm_python, monkeypatch, MLABENCH_BENCH_PROCESS="per-run")
    assert [r.status for r in results] == ["ok"] * 4 and len(set(pids)) == 4
    assert json.loads((run_dir / "manifest.json").read_text())["bench_process"] == "per-run"
    (tmp_path / "pids").unlink()
    monkeypatch.delenv("MLABENCH_BENCH_PROCESS")
    run_dir, results, pids, _ = _run(tmp_path, fake_vllm, monkeypatch)  # #!/bin/sh: not a Python script
    assert [r.status for r in results] == ["ok"] * 4 and len(set(pids)) == 4
    assert json.loads((run_dir / "manifest.json").read_text())["bench_process"] == "per-run"


def test_a_python_that_cannot_import_vllm_falls_back_to_a_process_each(tmp_path, fake_vllm_python, monkeypatch):
    run_dir, results, pids, said = _run(tmp_path, fake_vllm_python, monkeypatch, FAKE_VLLM_NO_BENCH="1")
    assert [r.status for r in results] == ["ok"] * 4 and len(set(pids)) == 4
    assert any("a process per command (the shared process cannot run: ModuleNotFoundError" in s for s in said), said


def test_a_failing_command_is_its_exit_code_and_the_next_one_runs(tmp_path, fake_vllm_python, monkeypatch):
    _, results, pids, _ = _run(tmp_path, fake_vllm_python, monkeypatch, FAKE_BENCH_MODE="exit1")
    assert [r.status for r in results] == ["missing"] * 4  # no result file, as from a process
    assert all("exit code 1" in r.error and "fake failure" in r.error for r in results) and len(set(pids)) == 1


def test_a_shared_process_that_dies_fails_its_command_and_the_next_starts_a_new_one(tmp_path, fake_vllm_python,
                                                                                    monkeypatch):
    _, results, pids, said = _run(tmp_path, fake_vllm_python, monkeypatch, FAKE_BENCH_MODE="die")
    assert [r.status for r in results] == ["missing"] * 4 and all("exit code 3" in r.error for r in results)
    assert len(set(pids)) == 4 and sum("server's commands in one process" in s for s in said) == 4


def test_a_command_past_its_time_stops_the_shared_process(tmp_path, fake_vllm_python, monkeypatch):
    pidfile = tmp_path / "bench.pid"
    with pytest.raises(ServerError, match="ran past 2 s"):
        _run(tmp_path, fake_vllm_python, monkeypatch, "bench_timeout_s = 2",
             FAKE_BENCH_MODE="sleep", FAKE_BENCH_PIDFILE=str(pidfile))
    assert not pid_alive(int(pidfile.read_text()))


def test_a_command_given_up_on_does_not_run_on_and_save_a_result(tmp_path, fake_vllm_python, monkeypatch):
    with pytest.raises(ServerError, match="ran past 1 s"):  # as on Ctrl-C or a dead server
        _run(tmp_path, fake_vllm_python, monkeypatch, "bench_timeout_s = 1",
             FAKE_BENCH_MODE="slow", FAKE_BENCH_SLEEP_S="2.5")
    time.sleep(3)
    assert not list((tmp_path / "res").glob("*/a-c1-r0.json"))  # it was stopped, not let finish


def test_script_python_reads_the_interpreter_of_vllms_console_script_only(tmp_path):
    def exe(name, text):
        path = tmp_path / name
        path.write_text(text)
        path.chmod(0o755)
        return str(path)

    assert script_python(exe("a", f"#!{sys.executable}\n{VLLM_CONSOLE_SCRIPT}")) == [sys.executable]
    uv_style = ('import sys\nfrom vllm.entrypoints.cli.main import main\nif __name__ == "__main__":\n'
                '    if sys.argv[0].endswith("-script.pyw"):\n        sys.argv[0] = sys.argv[0][:-11]\n'
                '    elif sys.argv[0].endswith(".exe"):\n        sys.argv[0] = sys.argv[0][:-4]\n    sys.exit(main())\n')
    assert script_python(exe("b", f"#!/usr/bin/env python3\n{uv_style}")) == ["/usr/bin/env", "python3"]
    assert script_python(exe("c", "#!/bin/sh\nexec python3 -m vllm \"$@\"\n")) is None
    assert script_python(exe("d", "\x7fELF")) is None
    assert script_python(str(tmp_path / "missing")) is None
    # a Python wrapper of one's own: running it is not just calling vLLM's entry point
    assert script_python(exe("e", f"#!{sys.executable}\nimport os\nos.environ['X'] = '1'\n{VLLM_CONSOLE_SCRIPT}")) is None
    assert script_python(exe("g", f"#!{sys.executable}\nimport requests\n{VLLM_CONSOLE_SCRIPT}")) is None
    assert script_python(exe("f", f"#!{sys.executable}\nimport os\nos.execv('/venv/bin/vllm', ['vllm'])\n")) is None


def test_a_python_wrapper_of_vllm_runs_as_it_is(tmp_path, fake_vllm_python, monkeypatch):
    wrapper = tmp_path / "my-vllm"  # sets a variable, then calls vLLM: the shared process would skip it
    wrapper.write_text(f"#!{sys.executable}\nimport os\nos.environ['FAKE_TPOT_MS_A'] = '42'\n{VLLM_CONSOLE_SCRIPT}")
    wrapper.chmod(0o755)
    run_dir, results, pids, _ = _run(tmp_path, str(wrapper), monkeypatch)
    assert [r.status for r in results] == ["ok"] * 4 and len(set(pids)) == 4
    assert results[0].tpot.mean_ms == pytest.approx(42, rel=0.01)  # the wrapper ran
    assert json.loads((run_dir / "manifest.json").read_text())["bench_process"] == "per-run"


def test_the_mode_is_shared_or_per_run(monkeypatch):
    monkeypatch.delenv("MLABENCH_BENCH_PROCESS", raising=False)
    assert bench_process_mode() == "shared"
    monkeypatch.setenv("MLABENCH_BENCH_PROCESS", "once")
    with pytest.raises(ConfigError, match="MLABENCH_BENCH_PROCESS must be one of shared, per-run, got 'once'"):
        bench_process_mode()


def test_the_worker_log_is_in_the_run_folder(tmp_path, fake_vllm_python, monkeypatch):
    run_dir, _, _, _ = _run(tmp_path, fake_vllm_python, monkeypatch)
    assert (Path(run_dir) / WORKER_LOG).exists()


SHARED_PARENT = """
import sys
from pathlib import Path
from mlabench.serving.bench_process import BenchProcess
folder = Path(sys.argv[2])
with BenchProcess(sys.argv[1], folder, print) as runner:
    runner.run([sys.argv[1], "bench", "serve", "--metadata", "variant=a"], folder / "bench.log", 600, None, 0.05)
"""


def test_kill_9_of_serve_bench_leaves_no_shared_bench_process(tmp_path, fake_vllm_python, monkeypatch):
    import os
    import subprocess

    from tests.processes import survivors_of_sigkill

    pidfile = tmp_path / "bench.pid"
    monkeypatch.setenv("FAKE_BENCH_MODE", "sleep")
    monkeypatch.setenv("FAKE_BENCH_PIDFILE", str(pidfile))
    parent = subprocess.Popen([sys.executable, "-c", SHARED_PARENT, fake_vllm_python, str(tmp_path)],
                              cwd=Path(__file__).resolve().parents[2], env=dict(os.environ))
    deadline = time.monotonic() + 60
    while not pidfile.exists() and time.monotonic() < deadline and parent.poll() is None:
        time.sleep(0.1)
    assert pidfile.exists(), "the shared bench process did not run the command"
    time.sleep(0.2)
    assert not survivors_of_sigkill(parent, [int(pidfile.read_text())], 15)


def test_a_shared_process_killed_between_commands_is_started_again(tmp_path, fake_vllm_python, monkeypatch):
    import os
    import signal

    from mlabench.serving.bench_process import BenchProcess

    monkeypatch.setenv("FAKE_BENCH_PIDS", str(tmp_path / "pids"))
    argv = [fake_vllm_python, "bench", "serve", "--max-concurrency", "1", "--num-prompts", "1",
            "--random-input-len", "8", "--random-output-len", "2", "--backend", "vllm", "--model", "m",
            "--result-dir", str(tmp_path), "--result-filename", "r.json", "--metadata", "variant=a"]
    with BenchProcess(fake_vllm_python, tmp_path, lambda _: None) as runner:
        assert runner.run(argv, tmp_path / "1.log", 60, None, 0.05) == 0
        os.kill(int((tmp_path / "pids").read_text().split()[0]), signal.SIGKILL)
        time.sleep(0.3)
        assert runner.run(argv, tmp_path / "2.log", 60, None, 0.05) == 0
    first, second = (tmp_path / "pids").read_text().split()
    assert first != second


def test_the_h200_scripts_vllm_wrapper_gets_the_shared_process(tmp_path):
    """scripts/h200_serving.sh writes the vllm executable the H200 runs serve-bench with: it must
    read as vLLM's console script, or the every-variant run loses the time the shared process saves."""
    import re

    script = (Path(__file__).resolve().parents[2] / "scripts/h200_serving.sh").read_text()
    (body,) = re.findall(r"printf '(#!/usr/bin/env python3[^']*)' > \"\$MLABENCH_VLLM_BIN\"", script)
    exe = tmp_path / "vllm"
    exe.write_text(body.replace("\\n", "\n"))
    exe.chmod(0o755)
    assert script_python(str(exe)) == ["/usr/bin/env", "python3"]


def test_each_variant_gets_its_own_shared_process_none_alive_while_a_server_starts(tmp_path, fake_vllm_python,
                                                                                  monkeypatch):
    """A vLLM process left running could hold GPU memory the next server sizes itself by."""
    _, results, pids, _ = _run(tmp_path, fake_vllm_python, monkeypatch, variants=("a", "b"))
    assert [r.status for r in results] == ["ok"] * 8
    assert len(set(pids[:4])) == len(set(pids[4:])) == 1 and pids[0] != pids[4], pids
    assert not pid_alive(int(pids[0]))


def test_a_server_gone_when_its_last_command_ends_stops_the_run(tmp_path, fake_vllm, monkeypatch):
    """The last point of a variant whose server died as it ran (a real bench then ends fast, its
    requests refused): the result is recorded, and the run stops there instead of going on."""
    monkeypatch.setenv("FAKE_KILL_SERVER_PIDFILE", str(tmp_path / "pa"))
    with pytest.raises(ServerError, match="server exited during the benchmark"):  # polled every 5 s: the
        _run(tmp_path, fake_vllm, monkeypatch, "concurrencies = [1]\nrepeats = 1\nbench_poll_s = 5")  # run ends first
    (run,) = (tmp_path / "res").iterdir()
    assert len((run / "results.jsonl").read_text().splitlines()) == 1
