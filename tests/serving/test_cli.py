"""`mlabench serve-bench` / `serve-check` end to end with a stand-in server and `vllm`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlabench.serving.config import LaunchSpec
from mlabench.serving.lifecycle import ManagedServer

from .conftest import BENCH_POLL, HEALTH_POLL, POLL_S, free_port, launch_table, server_command


def run_cli(*args, env=None, cwd=None):
    e = {**os.environ, **(env or {})}
    e.pop("MLABENCH_VLLM_BIN", None)
    return subprocess.run([sys.executable, "-c", "from mlabench.cli import main; main()", *args],
                          env=e, cwd=cwd, capture_output=True, text=True, timeout=120)


def report(r):
    """The greedy check report row of ``serve-check --json``."""
    (table,) = json.loads(r.stdout)
    (row,) = table["rows"]
    return row


def two_variant_config(tmp_path, fake_vllm, port_a, port_b, extra=""):
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(
        f'baseline = "base"\nvllm_bin = "{fake_vllm}"\nmodel = "fake-model"\n{BENCH_POLL}{extra}\n'
        f'[bench]\nrandom_input_len = 64\nrandom_output_len = 8\n'
        f'[[variants]]\nname = "base"\nbase_url = "http://127.0.0.1:{port_a}"\n'
        f"{launch_table(port_a, 'ok', tmp_path / 'pa')}"
        f'[[variants]]\nname = "fast"\nbase_url = "http://127.0.0.1:{port_b}"\n'
        f"{launch_table(port_b, 'ok', tmp_path / 'pb')}"
    )
    return cfg


def test_serve_bench_table_speedup_and_files(tmp_path, fake_vllm):
    cfg = two_variant_config(tmp_path, fake_vllm, free_port(), free_port(), "repeats = 2")
    r = run_cli("serve-bench", str(cfg), "--results-dir", str(tmp_path / "res"), "--json",
                env={"FAKE_TPOT_MS_BASE": "40", "FAKE_TPOT_MS_FAST": "10"})
    assert r.returncode == 0, r.stderr
    (t,) = json.loads(r.stdout)  # one table, one row per concurrency and variant
    rows = t["rows"]
    assert all(row["status"] == "ok" for row in rows)
    assert [(row["concurrency"], row["variant"]) for row in rows] == [(1, "base"), (1, "fast"), (16, "base"),
                                                                      (16, "fast")]
    base1, fast1 = rows[0], rows[1]
    assert base1["tpot_mean_ms"] == pytest.approx(40.0) and fast1["speedup"] == pytest.approx(4.0)
    assert rows[2]["tpot_mean_ms"] == pytest.approx(40 * 1.75)
    assert fast1["completed"] == 6 and fast1["repeats"] == 2
    run = next((tmp_path / "res").iterdir())
    names = {p.name for p in run.iterdir()}
    for v in ("base", "fast"):
        for c in (1, 16):
            for rep in (0, 1):
                assert f"{v}-c{c}-r{rep}.json" in names
        assert f"server-{v}.log" in names
    assert {"manifest.json", "commands.txt", "results.jsonl", "table.md", "table.json"} <= names
    assert len((run / "results.jsonl").read_text().splitlines()) == 8
    assert json.loads((run / "table.json").read_text()) == [t]
    again = run_cli("serve-bench", "--from-run", str(run), "--markdown")
    assert again.returncode == 0 and "4.00x" in again.stdout
    # where the run comes from: the H200 runs' manifests held no revision or versions
    manifest = json.loads((run / "manifest.json").read_text())
    assert "serve-bench" in manifest["command"] and manifest["git_revision"]
    assert {"python", "torch", "vllm", "mlabench"} <= set(manifest["versions"])


@pytest.mark.parametrize("mode,said", [("fail_requests", ("2/1 FAILED_REQUESTS", "connection reset")),
                                       ("exit1", ("| missing |", "exit code 1"))])
def test_failed_or_missing_results_exit_non_zero(tmp_path, fake_vllm, mode, said):
    """Requests that failed, and a bench that exited 1 without a result: exit 1, saying which."""
    cfg = two_variant_config(tmp_path, fake_vllm, free_port(), free_port(), "concurrencies = [1]")
    r = run_cli("serve-bench", str(cfg), "--results-dir", str(tmp_path / "res"), "--markdown",
                env={"FAKE_BENCH_MODE": mode})
    assert r.returncode == 1
    assert all(words in r.stdout for words in said)


def test_user_errors_are_one_line_exit_2(tmp_path, fake_vllm):
    bad = tmp_path / "bad.toml"
    bad.write_text('baseline = "x"\n[[variants]]\nname = "a"\nbase_url = "http://127.0.0.1:1"\n')
    r = run_cli("serve-bench", str(bad))
    assert r.returncode == 2 and r.stderr.strip().startswith("error: ")
    assert "baseline 'x' is not a variant" in r.stderr and "Traceback" not in r.stderr
    down = tmp_path / "down.toml"
    down.write_text(f'baseline = "a"\n[[variants]]\nname = "a"\n'
                    f'base_url = "http://127.0.0.1:{free_port()}"\n')
    r = run_cli("serve-bench", str(down), "--results-dir", str(tmp_path / "res"))
    assert r.returncode == 2 and "no healthy server" in r.stderr
    dies = tmp_path / "dies.toml"
    port = free_port()
    dies.write_text(f'baseline = "a"\nvllm_bin = "{fake_vllm}"\n[[variants]]\nname = "a"\nbase_url = "http://127.0.0.1:{port}"\n'
                    f"{launch_table(port, 'die', tmp_path / 'p')}")
    r = run_cli("serve-bench", str(dies), "--results-dir", str(tmp_path / "res"))
    assert r.returncode == 2 and "fake engine failed to start" in r.stderr
    assert not list((tmp_path / "res").iterdir())  # nothing measured: no run folder


def test_a_variant_nobody_started_says_how_to_start_it(tmp_path):
    """A fresh user's nit: ``serve-bench cpu-tiny`` said ``[running] no healthy server``, which read
    as a status, with no word that the CPU vLLM server must be started first.  The line names the
    variant and says what to do: the shipped config's start_hint (scripts/cpu_vllm_server.sh), or
    for a variant without one, to start it or give it [variants.launch]."""
    from mlabench.serving.config import load_config

    port = free_port()
    shipped = load_config("cpu-tiny").variants[0]
    assert shipped.name == "running" and "scripts/cpu_vllm_server.sh start" in shipped.start_hint
    hinted = tmp_path / "hinted.toml"
    hinted.write_text(f'baseline = "a"\n[[variants]]\nname = "a"\nbase_url = "http://127.0.0.1:{port}"\n'
                      'start_hint = "bash start-my-server.sh"\n')
    down = f"error: variant 'a': no healthy server at http://127.0.0.1:{port} (GET /health did not answer 200); "
    for cfg, how in ((hinted, "start it first: bash start-my-server.sh"),
                     (one_variant(tmp_path, port), "start it first, or give the variant a [variants.launch] "
                                                  "table so that mlabench starts it")):
        for command in (["serve-bench"], ["serve-check", "--fixture", str(tmp_path / "fx.json"), "--save-fixture"]):
            r = run_cli(*command, str(cfg), "--results-dir", str(tmp_path / "res"))
            assert r.returncode == 2 and r.stderr == down + how + "\n", r.stderr


def one_variant(tmp_path, port, launch=None, extra=""):
    cfg = tmp_path / f"one-{len(list(tmp_path.glob('one-*')))}.toml"
    cfg.write_text(f'baseline = "a"\n{BENCH_POLL}{extra}[[variants]]\nname = "a"\nbase_url = "http://127.0.0.1:{port}"\n'
                   + (f"[variants.launch]\ncommand = {json.dumps(launch)}\n{HEALTH_POLL}" if launch else ""))
    return cfg


@pytest.mark.parametrize("case, why", [
    ("closed port", "variant 'a': no healthy server at"),
    ("no launch program", "variant 'a': cannot start server: 'no-such-server' is not an executable program"),
    ("no vllm", "cannot run vllm bench serve: '/no/vllm' is not an executable program"),
    ("no vllm to launch", "variant 'a': cannot start server: '/no/vllm' is not an executable program here (set "
                          "MLABENCH_VLLM_BIN"),
])
def test_nothing_measured_leaves_no_folder_and_one_line(tmp_path, fake_vllm, case, why):
    """Issue 8 item 9: what can fail before a run folder exists is checked first."""
    port = free_port()
    cfg = {"closed port": one_variant(tmp_path, port),
           "no launch program": one_variant(tmp_path, port, ["no-such-server", "serve"]),
           "no vllm": one_variant(tmp_path, port, server_command(port, "ok", tmp_path / "p"),
                                  'vllm_bin = "/no/vllm"\n'),
           "no vllm to launch": one_variant(tmp_path, port, ["{vllm_bin}", "serve"], 'vllm_bin = "/no/vllm"\n')}[case]
    r = run_cli("serve-bench", str(cfg), "--results-dir", str(tmp_path / "res"))
    # a missing vllm is a package missing here (exit 3); the rest the user's config or server (2)
    assert r.returncode == (3 if case.startswith("no vllm") else 2), r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
    assert r.stderr.startswith("error: ") and why in r.stderr
    assert not (tmp_path / "res").exists()
    r = run_cli("serve-check", str(cfg), "--fixture", str(tmp_path / "fx.json"), "--save-fixture",
                "--results-dir", str(tmp_path / "res"))
    if case != "no vllm":  # serve-check runs no benchmark
        assert r.returncode == (3 if case.startswith("no vllm") else 2) and len(r.stderr.strip().splitlines()) == 1
        assert why in r.stderr
        assert not (tmp_path / "res").exists()


def test_serve_check_with_a_launched_server_that_dies_leaves_no_folder(tmp_path):
    port = free_port()
    cfg = one_variant(tmp_path, port, server_command(port, "die", tmp_path / "p"))
    r = run_cli("serve-check", str(cfg), "--fixture", str(tmp_path / "fx.json"), "--save-fixture",
                "--results-dir", str(tmp_path / "res"))
    assert r.returncode == 2 and "fake engine failed to start" in r.stderr
    assert not list((tmp_path / "res").iterdir())
    # a fresh user's review: the log named at launch went with the folder; now it is kept elsewhere, and named
    kept = Path(r.stderr.split("its server logs are kept in ")[1].split()[0])
    assert "fake engine failed to start" in (kept / "server-a.log").read_text()
    import shutil
    shutil.rmtree(kept)


def test_what_was_measured_is_kept_when_a_later_variant_fails(tmp_path, fake_vllm):
    port_a, port_b = free_port(), free_port()
    cfg = two_variant_config(tmp_path, fake_vllm, port_a, port_b, "concurrencies = [1]")
    cfg.write_text(cfg.read_text().replace(json.dumps(server_command(port_b, "ok", tmp_path / "pb")),
                                           json.dumps(server_command(port_b, "die", tmp_path / "pb"))))
    r = run_cli("serve-bench", str(cfg), "--results-dir", str(tmp_path / "res"))
    assert r.returncode == 2 and "fake engine failed to start" in r.stderr
    (run,) = (tmp_path / "res").iterdir()
    assert f"partial results kept in {run}" in r.stderr.replace("\n", "")
    assert len((run / "results.jsonl").read_text().splitlines()) == 1 and (run / "table.md").exists()


def test_serve_check_zero_tokens_says_why():
    r = run_cli("serve-check", "-n", "0", "--base-url", "http://127.0.0.1:9", "--fixture", "fx.json")
    assert r.returncode == 2 and r.stderr.strip() == "error: --tokens: Input should be greater than 0"


@pytest.fixture
def server_factory(tmp_path):
    started = []

    def start(mode):
        port = free_port()
        srv = ManagedServer(LaunchSpec(command=server_command(port, mode, tmp_path / f"{mode}.pid")),
                            f"http://127.0.0.1:{port}", tmp_path / f"{mode}.log", poll_s=POLL_S)
        srv.start()
        started.append(srv)
        return srv.base_url

    yield start
    for s in started:
        s.stop()


def test_serve_check_fixture_match_tie_mismatch(tmp_path, server_factory):
    fx = str(tmp_path / "fx.json")
    ok_url = server_factory("ok")
    r = run_cli("serve-check", "--base-url", ok_url, "--fixture", fx, "--save-fixture", "-n", "8")
    assert r.returncode == 0, r.stderr
    assert json.loads(Path(fx).read_text())["token_ids"] == [5, 6, 7, 5, 6, 7, 5, 6]
    assert "Greedy fixture recorded" in r.stdout and "Greedy output check" not in r.stdout
    r = run_cli("serve-check", "--base-url", ok_url, "--fixture", fx, "-n", "16")
    assert r.returncode == 2 and r.stderr.strip().startswith("error: -n 16 asks for 16 tokens; the fixture")
    r = run_cli("serve-check", "--base-url", ok_url, "--fixture", fx, "-n", "8", "--json")
    assert r.returncode == 0 and report(r)["verdict"] == "match"
    r = run_cli("serve-check", "--base-url", server_factory("tie"), "--fixture", fx, "-n", "8",
                "--json")
    rep = report(r)
    assert r.returncode == 0 and rep["verdict"] == "near_tie_divergence"
    assert rep["first_divergence"] == 2 and rep["got_token"] == 99
    r = run_cli("serve-check", "--base-url", server_factory("tie"), "--fixture", fx, "-n", "8",
                "--strict")
    assert r.returncode == 1
    r = run_cli("serve-check", "--base-url", server_factory("wrong"), "--fixture", fx, "-n", "8",
                "--json")
    rep = report(r)
    assert r.returncode == 1 and rep["verdict"] == "mismatch" and rep["expected_token"] == 7
    r = run_cli("serve-check", "--base-url", server_factory("short"), "--fixture", fx, "-n", "8",
                "--json")
    assert r.returncode == 1 and report(r)["verdict"] == "invalid"
    r = run_cli("serve-check", "--base-url", ok_url, "--fixture", fx, "--save-fixture", "-n", "8")
    assert r.returncode == 2 and "exists" in r.stderr


@pytest.mark.parametrize("mode, shown, why", [
    ("one_token", "ERROR", "TPOT measured nothing"),
    ("truncated", "TRUNCATED", "cut short: 12 output tokens of the 24"),  # 3 prompts x 8 tokens
])
def test_a_result_that_measured_nothing_or_was_cut_short_fails(tmp_path, fake_vllm, mode, shown, why):
    """Issue 8 items 2 and 3: a failed cell with its reason and exit 1, never a 0.00x speedup."""
    cfg = two_variant_config(tmp_path, fake_vllm, free_port(), free_port(), "concurrencies = [1]")
    r = run_cli("serve-bench", str(cfg), "--results-dir", str(tmp_path / "res"), "--markdown",
                env={"FAKE_BENCH_MODE": mode})
    assert r.returncode == 1, r.stderr
    assert shown in r.stdout and why in r.stdout and "0.00x" not in r.stdout
    assert "results failed" in r.stderr


def test_a_recorded_run_is_judged_again_when_re_rendered(tmp_path):
    """A run recorded before these checks existed: --from-run shows what they find."""
    import shutil

    from mlabench.serving.results import BenchResult

    repo = Path(__file__).parents[2]
    run = tmp_path / "old-run"
    shutil.copytree(sorted((repo / "results" / "cpu-vllm").glob("serve-*"))[0], run)
    lines = (run / "results.jsonl").read_text().splitlines()
    first = BenchResult.model_validate_json(lines[0])
    lines[0] = first.model_copy(update={"total_output_tokens": 100}).model_dump_json()
    (run / "results.jsonl").write_text("\n".join(lines) + "\n")
    r = run_cli("serve-bench", "--from-run", str(run), "--json")
    assert r.returncode == 1
    rows = json.loads(r.stdout)[0]["rows"]
    assert [row["status"] for row in rows].count("truncated") == 1


def test_concurrency_takes_commas_like_every_list(tmp_path, fake_vllm):
    cfg = two_variant_config(tmp_path, fake_vllm, free_port(), free_port())
    r = run_cli("serve-bench", str(cfg), "--results-dir", str(tmp_path / "res"), "-c", "1,4", "-c", "2", "--json")
    assert r.returncode == 0, r.stderr
    assert [row["concurrency"] for row in json.loads(r.stdout)[0]["rows"]] == [1, 1, 4, 4, 2, 2]


def test_variant_runs_only_the_variants_named_and_the_run_records_them(tmp_path, fake_vllm):
    """The H200 repeats of 4K at concurrency 16 (mlabench against FA3 of a five-variant config)
    needed a hand-edited copy of the config; --variant picks them, and the run folder's config holds
    only them, so --resume runs no other."""
    cfg = two_variant_config(tmp_path, fake_vllm, free_port(), free_port(), "concurrencies = [1]")
    r = run_cli("serve-bench", str(cfg), "--results-dir", str(tmp_path / "res"), "--variant", "fast",
                "--set", "baseline=fast", "--json")
    assert r.returncode == 0, r.stderr
    assert [row["variant"] for row in json.loads(r.stdout)[0]["rows"]] == ["fast"]
    run = next((tmp_path / "res").iterdir())
    assert not (run / "server-base.log").exists()
    assert [v["name"] for v in json.loads((run / "manifest.json").read_text())["config"]["variants"]] == ["fast"]
    for args, said in [(["--variant", "fast"], "error: --variant leaves out the baseline 'base': keep it, or "
                                               "name another with --set baseline=NAME"),
                       (["--variant", "base,slow"], "error: unknown variant 'slow'; known: ['base', 'fast']")]:
        r = run_cli("serve-bench", str(cfg), "--results-dir", str(tmp_path / "res2"), *args)
        assert r.returncode == 2 and r.stderr.strip() == said, r.stderr


def test_several_input_lengths_are_benchmarked_against_one_server_start(tmp_path, fake_vllm):
    """Issue 33: contexts 4K, 32K and 100K needed three runs and three starts of every server (1-3
    minutes each on a GPU).  A list of input lengths runs each against one start per variant, with
    each concurrency's own prompt count, into ``-i<len>`` files and a row per (input len, concurrency)."""
    cfg = two_variant_config(tmp_path, fake_vllm, free_port(), free_port(), "concurrencies = [1, 4]")
    cfg.write_text(cfg.read_text().replace("random_input_len = 64\n",
                                           "random_input_len = [64, 256]\nnum_prompts = { 1 = 2, 4 = 5 }\n"))
    r = run_cli("serve-bench", str(cfg), "--results-dir", str(tmp_path / "res"), "--json",
                env={"FAKE_TPOT_MS_BASE": "40", "FAKE_TPOT_MS_FAST": "10", "FAKE_TPOT_MS_PER_1K_IN": "20"})
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("launching") == 2  # one server start per variant
    rows = json.loads(r.stdout)[0]["rows"]
    assert [(row["input_len"], row["concurrency"], row["variant"]) for row in rows] == [
        (n, c, v) for n in (64, 256) for c in (1, 4) for v in ("base", "fast")]
    for row in rows:  # TPOT of the fake: base ms x 1.05^(c-1) steps + 20 ms per 1000 input tokens
        grow, extra = 1 + 0.05 * (row["concurrency"] - 1), 20 * row["input_len"] / 1000
        assert row["tpot_mean_ms"] == pytest.approx({"base": 40, "fast": 10}[row["variant"]] * grow + extra)
        assert row["completed"] == {1: 2, 4: 5}[row["concurrency"]]
        if row["variant"] == "fast":  # speedup within the same (input len, concurrency)
            assert row["speedup"] == pytest.approx((40 * grow + extra) / (10 * grow + extra))
    (run,) = (tmp_path / "res").iterdir()
    names = {p.name for p in run.iterdir()}
    assert {f"{v}-i{n}-c{c}-r0.json" for v in ("base", "fast") for n in (64, 256) for c in (1, 4)} <= names
    assert not [n for n in names if n.endswith(".json") and "-c" in n and "-i" not in n]
    assert sorted(n for n in names if n.startswith("server-")) == ["server-base.log", "server-fast.log"]
    recorded = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    assert [(x["input_len"], x["concurrency"]) for x in recorded[:4]] == [(64, 1), (64, 4), (256, 1), (256, 4)]
    commands = [line.split() for line in (run / "commands.txt").read_text().splitlines()]
    assert [(a[a.index("--random-input-len") + 1], a[a.index("--max-concurrency") + 1], a[a.index("--num-prompts") + 1])
            for a in commands[:4]] == [("64", "1", "2"), ("64", "4", "5"), ("256", "1", "2"), ("256", "4", "5")]
    assert all("input_len=" + a[a.index("--random-input-len") + 1] in a for a in commands)
    assert json.loads((run / "table.json").read_text()) == json.loads(r.stdout)
    md = run_cli("serve-bench", "--from-run", str(run), "--markdown")
    assert md.returncode == 0 and md.stdout == (run / "table.md").read_text()
    assert "| input len | concurrency | base | fast |" in md.stdout and "| 256 | 4 | 51.12 |" in md.stdout


def test_markdown_is_a_table_per_metric_with_variants_as_columns():
    """Issue 33: ``--markdown`` printed a column per variant and metric, 32 for the H200 run of five
    variants, unreadable in a pull request.  Now a table per metric (the TPOT with speedups first), a
    column per variant; every number is still in ``--json``."""
    run = Path(__file__).parents[2] / "results/h200/serving/serve-20261204T182027Z-h200-proxy"
    r = run_cli("serve-bench", "--from-run", str(run), "--markdown")
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("|")]
    assert max(line.count(" | ") + 1 for line in rows) == 7  # input len, concurrency, five variants
    titles = [line for line in r.stdout.splitlines() if line.startswith("**")]
    assert titles == ["**mean TPOT, ms (speedup vs flashmla)**", "**mean TTFT, ms**",
                      "**median ITL, ms (the typical decode step)**", "**output tokens/s**",
                      "**requests completed/failed**"]
    assert "| 4096 | 1 | 6.34 (1.29x) | 8.16 | 6.62 (1.23x) | 6.35 (1.29x) | 10.39 (0.79x) |" in rows
    assert "| 100000 | 16 | 31.18 | 34.12 | 32.68 | not run | 80.60 |" in rows  # median ITL


def test_fewer_prompts_than_the_concurrency_is_refused(tmp_path, fake_vllm):
    """``--num-prompts 3 --max-concurrency 16`` runs only 3 requests at once: a c=16 row that is a
    c=3 measurement.  Refused before anything starts, one line, exit 2, naming both numbers."""
    cfg = two_variant_config(tmp_path, fake_vllm, free_port(), free_port())
    cfg.write_text(cfg.read_text().replace("random_output_len = 8\n", "random_output_len = 8\nnum_prompts = 3\n"))
    r = run_cli("serve-bench", str(cfg), "--results-dir", str(tmp_path / "res"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "bench.num_prompts: concurrency 16 gets 3 prompts, fewer than 16" in r.stderr
    assert not (tmp_path / "res").exists()


def test_an_old_single_length_run_reads_as_before(tmp_path):
    """A run recorded before input lengths existed (no ``input_len`` in its results, files
    ``<variant>-c<conc>-r<rep>``, an integer ``num_prompts``): ``--from-run`` prints its table
    (``table.md``, re-rendered by this command; ``table.json`` as saved then); and a recorded run
    with fewer prompts than a concurrency is still read."""
    import shutil

    repo = Path(__file__).parents[2]
    old = repo / "results" / "cpu-vllm" / "serve-20261130T105730Z-cpu-tiny"
    assert "input_len" not in (old / "results.jsonl").read_text()
    r = run_cli("serve-bench", "--from-run", str(old), "--markdown")
    assert r.returncode == 0 and "input" not in r.stdout and "| 16 | 19.63 | 14.65 (1.34x) |" in r.stdout
    assert r.stdout == (old / "table.md").read_text()
    (table,) = json.loads(run_cli("serve-bench", "--from-run", str(old), "--json").stdout)
    assert table["title"] == "TPOT by concurrency (speedup vs running, mean TPOT)"
    assert table["columns"][:2] == ["concurrency", "variant"] and "input_len" not in table["columns"]
    saved = json.loads((old / "table.json").read_text())  # the ServeTable dump of that time
    assert [(row["concurrency"], row["variant"], row["tpot_mean_ms"], row["speedup"]) for row in table["rows"]] == \
        [(r["concurrency"], c["variant"], c["tpot_mean_ms"], c["speedup"]) for r in saved["rows"] for c in r["cells"]]
    run = tmp_path / "seed-style"
    shutil.copytree(old, run)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["config"]["bench"]["num_prompts"] = 3
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert run_cli("serve-bench", "--from-run", str(run), "--json").returncode in (0, 1)  # read, not refused
    assert "error:" not in run_cli("serve-bench", "--from-run", str(run)).stderr


def test_resume_runs_only_what_the_run_lacks(tmp_path, fake_vllm):
    """An interrupted or partly failed run is continued in its own folder with its recorded config:
    only the points without an ok result run, only their servers start, and a rerun point's new
    result supersedes the failed one in the table (results.jsonl keeps both)."""
    cfg = two_variant_config(tmp_path, fake_vllm, free_port(), free_port(), "concurrencies = [1]")
    cfg.write_text(cfg.read_text().replace("random_input_len = 64\n", "random_input_len = [64, 256]\n"))
    assert run_cli("serve-bench", str(cfg), "--results-dir", str(tmp_path / "res")).returncode == 0
    (run,) = (tmp_path / "res").iterdir()
    lines = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    assert [(x["variant"], x["input_len"]) for x in lines] == [("base", 64), ("base", 256), ("fast", 64), ("fast", 256)]
    lines[0].update(status="error", error="vllm bench serve exited 1")  # base at 64 failed
    (run / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines[:3]))  # fast at 256 never ran
    r = run_cli("serve-bench", "--resume", str(run), "--json")
    assert r.returncode == 0, r.stderr
    assert "2 point(s) recorded ok; variants left: base, fast" in r.stderr and r.stderr.count("launching") == 2
    recorded = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    assert [(x["variant"], x["input_len"], x["status"]) for x in recorded[3:]] == [("base", 64, "ok"), ("fast", 256, "ok")]
    rows = json.loads(r.stdout)[0]["rows"]
    assert [(x["variant"], x["input_len"], x["status"]) for x in rows] == [
        ("base", 64, "ok"), ("fast", 64, "ok"), ("base", 256, "ok"), ("fast", 256, "ok")]
    again = run_cli("serve-bench", "--resume", str(run))
    assert again.returncode == 0 and "variants left: none" in again.stderr and "launching" not in again.stderr
    refused = run_cli("serve-bench", str(cfg), "--resume", str(run))
    assert refused.returncode == 2 and refused.stderr.startswith("error: --resume continues a run with the config it recorded")
    both = run_cli("serve-bench", "--resume", str(run), "--from-run", str(run))
    assert both.returncode == 2 and "not both" in both.stderr
    (run / "results.jsonl").unlink()  # cut short before its first point ended: every point runs
    fresh = run_cli("serve-bench", "--resume", str(run))
    assert fresh.returncode == 0 and "0 point(s) recorded ok; variants left: base, fast" in fresh.stderr


def test_resume_of_an_archived_run_is_refused_and_the_run_left_as_it_is(tmp_path):
    """The committed H200 run keeps results.jsonl gzipped: --resume would append to a new plain
    file beside it; it is refused in one line that says how to continue a copy."""
    import shutil

    src = Path(__file__).resolve().parents[2] / "results/h200/serving/serve-20261204T182027Z-h200-proxy"
    run_dir = tmp_path / src.name
    shutil.copytree(src, run_dir)
    before = sorted(p.name for p in run_dir.iterdir())
    proc = run_cli("serve-bench", "--resume", str(run_dir))
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {run_dir} is archived (results.jsonl.gz): to continue it, copy")
    assert sorted(p.name for p in run_dir.iterdir()) == before


@pytest.mark.parametrize("flags, says", [
    (["--set", "baseline=fa3"], "--from-run re-renders a saved run and runs nothing: --set would be ignored"),
    (["--variant", "fa3", "-c", "1"], "--from-run re-renders a saved run and runs nothing: --concurrency, --variant"),
    (["--repeats", "0", "--results-dir", "x"], "--from-run re-renders a saved run and runs nothing: --repeats, "
                                               "--results-dir would be ignored"),
])
def test_from_run_refuses_the_flags_it_would_ignore(flags, says):
    """A fresh user's review: `--from-run RUN --set baseline=fa3 --variant fa3 -c 1` printed the run's
    table unchanged, exit 0."""
    run = Path(__file__).resolve().parents[2] / "results/h200/serving/serve-20261205T180702Z-h200-proxy"
    r = run_cli("serve-bench", "--from-run", str(run), *flags)
    assert r.returncode == 2 and r.stderr.startswith(f"error: {says}"), r.stderr


@pytest.mark.parametrize("label", ["../escape", "a/b", ".."])
def test_a_label_that_is_no_plain_name_is_refused(tmp_path, label):
    r = run_cli("serve-bench", "configs/serve/cpu-tiny.toml", "--label", label, "--results-dir", str(tmp_path))
    assert r.returncode == 2 and "it names the run folder" in r.stderr and not list(tmp_path.iterdir())
    r = run_cli("serve-bench", "--resume", str(tmp_path), "--label", "ok")
    assert r.returncode == 2 and "leave --label and --results-dir out" in r.stderr


def test_an_unset_variable_in_a_launch_env_is_refused_before_anything_runs(tmp_path):
    """A fresh user's review: `env = { MLABENCH_SPLIT_POLICY = "$MLABENCH_SERVE_POLICY" }` unset was
    found when that variant launched, after the variants before it had been benchmarked."""
    port = free_port()
    cfg = one_variant(tmp_path, port, server_command(port, "ok", tmp_path / "p"))
    cfg.write_text(cfg.read_text() + 'env = { POLICY = "$MLABENCH_NOT_SET_IN_THIS_TEST" }\n')
    r = run_cli("serve-bench", str(cfg), "--results-dir", str(tmp_path / "res"))
    assert r.returncode == 2 and r.stderr.startswith("error: environment variable $MLABENCH_NOT_SET_IN_THIS_TEST")
    assert not (tmp_path / "res").exists() and not (tmp_path / "p").exists()
