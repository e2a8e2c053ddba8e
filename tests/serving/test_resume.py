"""`serve-bench --resume` keeps every result file: none is written over, recorded or not."""

import json

from .conftest import BENCH_POLL, free_port, launch_table
from .test_cli import run_cli


def one_variant_run(tmp_path, fake_vllm, env=None):
    """A finished one-variant run (concurrency 1, one repeat) of the stand-ins: its folder."""
    port = free_port()
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(f'baseline = "base"\nvllm_bin = "{fake_vllm}"\nmodel = "fake-model"\n{BENCH_POLL}'
                   f'concurrencies = [1]\n[bench]\nrandom_input_len = 64\nrandom_output_len = 8\n'
                   f'[[variants]]\nname = "base"\nbase_url = "http://127.0.0.1:{port}"\n'
                   f"{launch_table(port, 'ok', tmp_path / 'pid')}")
    r = run_cli("serve-bench", str(cfg), "--results-dir", str(tmp_path / "res"), env=env)
    assert r.returncode in (0, 1), r.stderr
    (run,) = (tmp_path / "res").iterdir()
    return run


def records(run):
    return [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]


def forget_last_record(run):
    """What an interrupt between a command's end and its record leaves: the result file, no line."""
    lines = (run / "results.jsonl").read_text().splitlines(keepends=True)
    (run / "results.jsonl").write_text("".join(lines[:-1]))


def test_a_result_file_without_its_record_is_kept_aside_and_the_point_runs_again(tmp_path, fake_vllm):
    """serve-bench stopped after `vllm bench serve` saved base-c1-r0.json but before recording it:
    --resume renames that file and its log (.unrecorded), says so, and runs the point again under
    the point's own name; a second such stop keeps both set-aside files."""
    run = one_variant_run(tmp_path, fake_vllm)
    first, first_log = (run / "base-c1-r0.json").read_text(), (run / "base-c1-r0.log").read_text()
    forget_last_record(run)
    r = run_cli("serve-bench", "--resume", str(run), env={"FAKE_TPOT_MS_BASE": "20"})
    assert r.returncode == 0, r.stderr
    assert "base-c1-r0.json: a result with no record" in r.stderr and "base-c1-r0.unrecorded.json" in r.stderr
    assert (run / "base-c1-r0.unrecorded.json").read_text() == first
    assert (run / "base-c1-r0.unrecorded.log").read_text() == first_log
    assert json.loads((run / "base-c1-r0.json").read_text())["mean_tpot_ms"] == 20.0
    (rec,) = records(run)
    assert (rec["status"], rec["result_file"], rec["tpot"]["mean_ms"]) == ("ok", "base-c1-r0.json", 20.0)
    second = (run / "base-c1-r0.json").read_text()
    forget_last_record(run)
    assert run_cli("serve-bench", "--resume", str(run)).returncode == 0
    assert (run / "base-c1-r0.unrecorded.json").read_text() == first
    assert (run / "base-c1-r0.unrecorded-2.json").read_text() == second
    assert [x["result_file"] for x in records(run)] == ["base-c1-r0.json"]


def test_a_failed_point_run_again_keeps_the_recorded_result_file(tmp_path, fake_vllm):
    """A recorded failed point runs again on --resume under a new name (-2), so the file its
    record names stays as it was; an unrecorded -2 is set aside in turn."""
    run = one_variant_run(tmp_path, fake_vllm, env={"FAKE_BENCH_MODE": "fail_requests"})
    failed = (run / "base-c1-r0.json").read_text()
    assert run_cli("serve-bench", "--resume", str(run)).returncode == 0
    assert (run / "base-c1-r0.json").read_text() == failed
    assert [(x["status"], x["result_file"]) for x in records(run)] == [
        ("failed_requests", "base-c1-r0.json"), ("ok", "base-c1-r0-2.json")]
    assert (run / "base-c1-r0-2.log").is_file()
    forget_last_record(run)
    assert run_cli("serve-bench", "--resume", str(run)).returncode == 0
    assert (run / "base-c1-r0.json").read_text() == failed and (run / "base-c1-r0-2.unrecorded.json").is_file()
    assert [x["result_file"] for x in records(run)] == ["base-c1-r0.json", "base-c1-r0-2.json"]
