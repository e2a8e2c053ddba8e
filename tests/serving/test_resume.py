"""`serve-bench --resume` keeps every result file: none is written over, recorded or not."""

import json
import os
import sys
from pathlib import Path

from mlabench.serving.bench import finished_points, read_run, run_serve_bench
from mlabench.serving.bench_process import vllm_version

from .conftest import BENCH_POLL, VLLM_CONSOLE_SCRIPT, free_port, launch_table
from .test_bench_process import _run
from .test_cli import run_cli


def _config_file(tmp_path, vllm_bin):
    """A one-variant serve config (concurrency 1, one repeat) of the stand-ins."""
    port = free_port()
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(f'baseline = "base"\nvllm_bin = "{vllm_bin}"\nmodel = "fake-model"\n{BENCH_POLL}'
                   f'concurrencies = [1]\n[bench]\nrandom_input_len = 64\nrandom_output_len = 8\n'
                   f'[[variants]]\nname = "base"\nbase_url = "http://127.0.0.1:{port}"\n'
                   f"{launch_table(port, 'ok', tmp_path / 'pid')}")
    return cfg


def one_variant_run(tmp_path, fake_vllm, env=None):
    """A finished run of :func:`_config_file`: its folder."""
    r = run_cli("serve-bench", str(_config_file(tmp_path, fake_vllm)), "--results-dir", str(tmp_path / "res"), env=env)
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
    (resume,) = json.loads((run / "manifest.json").read_text())["resumes"]
    assert "--resume" in resume["command"] and resume["first_result_line"] == 1
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


def test_a_resume_records_its_own_bench_process_and_where_its_results_start(tmp_path, fake_vllm_python, monkeypatch):
    """A run made with the shared bench process, resumed per run: the manifest keeps the first
    session's `bench_process` and lists the resume's own, with the results.jsonl line its results
    start at; a resume that runs nothing adds no entry, and a manifest without `resumes` reads."""
    run, _, _, _ = _run(tmp_path, fake_vllm_python, monkeypatch)  # concurrency 1 and 16, two repeats
    assert "resumes" not in json.loads((run / "manifest.json").read_text())
    forget_last_record(run)
    monkeypatch.setenv("MLABENCH_BENCH_PROCESS", "per-run")
    config, recorded = read_run(run)
    run_serve_bench(config, run.parent, run_dir=run, done=finished_points(recorded, False),
                    provenance={"command": ["mlabench", "serve-bench", "--resume", str(run)]})
    manifest = json.loads((run / "manifest.json").read_text())
    (resume,) = manifest["resumes"]
    assert manifest["bench_process"] == "shared" and resume["bench_process"] == "per-run"
    assert resume["first_result_line"] == 4 and resume["command"][-2:] == ["--resume", str(run)]
    assert resume["vllm_bin"] == fake_vllm_python and resume["started_utc"]
    assert records(run)[3]["result_file"] == "a-c16-r1.json"
    run_serve_bench(config, run.parent, run_dir=run, done=finished_points(read_run(run)[1], False))
    assert json.loads((run / "manifest.json").read_text()) == manifest


def test_the_manifest_has_the_vllm_version_of_the_executable_mlabench_runs(tmp_path, fake_vllm_python, monkeypatch):
    """vLLM installed only in the Python of the `vllm` console script (another venv): the
    manifest's versions.vllm is that install's version, read without importing vLLM; where it
    cannot be read (a shell wrapper) it is this process's, here none."""
    site = tmp_path / "fake-vllm-site"
    (site / "vllm-0.32.0.dist-info").mkdir()
    (site / "vllm-0.32.0.dist-info/METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n")
    (site / "vllm-0.32.0.dist-info/RECORD").write_text("")
    python = tmp_path / "other-venv/bin/python3"  # sees the fake vLLM; mlabench's Python does not
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}:$PYTHONPATH" exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    Path(fake_vllm_python).write_text(f"#!{python}\n{VLLM_CONSOLE_SCRIPT}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in os.environ["PYTHONPATH"].split(os.pathsep)
                                                     if p != str(site)))
    assert vllm_version(fake_vllm_python) == "0.32.0" and vllm_version(str(tmp_path / "none")) is None
    r = run_cli("serve-bench", str(_config_file(tmp_path, fake_vllm_python)), "--results-dir", str(tmp_path / "res"))
    assert r.returncode == 0, r.stderr
    (run,) = (tmp_path / "res").iterdir()
    assert json.loads((run / "manifest.json").read_text())["versions"]["vllm"] == "0.32.0"
    (site / "vllm-0.32.0.dist-info/METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.1\n")
    forget_last_record(run)
    assert run_cli("serve-bench", "--resume", str(run)).returncode == 0
    (resume,) = json.loads((run / "manifest.json").read_text())["resumes"]
    assert resume["versions"]["vllm"] == "0.32.1"


def test_a_vllm_whose_version_cannot_be_read_records_none(tmp_path, fake_vllm):
    """A shell wrapper (no console script to ask): versions.vllm is this process's (none here)."""
    assert vllm_version(fake_vllm) is None
    run = one_variant_run(tmp_path, fake_vllm)
    assert json.loads((run / "manifest.json").read_text())["versions"]["vllm"] is None


def test_a_new_run_stopped_before_its_first_record_keeps_a_written_result(tmp_path):
    """Stopped between the first command's end and its record: the folder holds that command's
    result and is kept for --resume (which sets the file aside and runs the point again); a folder
    with the manifest alone is removed."""
    from mlabench.run_files import BENCH_RESULT_GLOB, MANIFEST_FILE, RESULTS_FILE
    from mlabench.serving.bench import discard_unmeasured

    kept, empty = tmp_path / "kept", tmp_path / "empty"
    for d in (kept, empty):
        d.mkdir()
        (d / MANIFEST_FILE).write_text("{}")
    (kept / "base-c1-r0.json").write_text("{}")
    assert discard_unmeasured(kept, RESULTS_FILE, BENCH_RESULT_GLOB) and kept.is_dir()
    assert not discard_unmeasured(empty, RESULTS_FILE, BENCH_RESULT_GLOB) and not empty.exists()
