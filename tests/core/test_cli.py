"""The CLI end to end through Typer's runner, and every user error path: one line, non-zero exit."""

import json
import sys

import pytest
from typer.testing import CliRunner

from mlabench import cli


def run(args, monkeypatch, capsys):
    """Run ``mlabench ARGS`` through ``cli.main`` (the console script), return (code, out, err)."""
    monkeypatch.setattr(sys, "argv", ["mlabench", *args])
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_backends_lists_every_backend_with_a_reason():
    result = CliRunner().invoke(cli.app, ["backends", "--json"])
    assert result.exit_code == 0
    rows = {r["backend"]: r for r in json.loads(result.stdout)}
    assert {"reference", "torch-splitkv", "triton-splitkv", "triton-persistent", "flashmla",
            "aiter-asm", "aiter-gluon"} <= set(rows)
    assert rows["reference"]["available"] is True
    assert not rows["aiter-asm"]["available"] and "ROCm" in rows["aiter-asm"]["reason / parameters"]


def test_check_passes_for_kimi_k3_tp8():
    result = CliRunner().invoke(cli.app, ["check", "--model", "kimi-k3", "--tp", "8", "--backend",
                                          "torch-splitkv", "--splits", "1,3,300", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)[0]["rows"]
    seed_case = [r for r in rows if "L=4096 p64" in r["shape"] and "B=1" in r["shape"]]
    assert len(seed_case) == 3 and all("[1,12,512]" in r["shape"] for r in seed_case)
    assert all(r["verdict"] == "pass" and r["finite"] and r["max abs err"] < 1e-2 for r in rows)


def test_check_fails_with_exit_1_on_a_wrong_backend(monkeypatch, capsys):
    from mlabench.backends import reference

    real = reference.mla_decode_splitkv_torch
    monkeypatch.setattr(reference, "mla_decode_splitkv_torch", lambda *a, **k: real(*a, **k).mul_(1.1))
    code, out, err = run(["check", "--heads", "12", "--backend", "torch-splitkv", "--splits", "2",
                          "--context", "64", "--markdown"], monkeypatch, capsys)
    assert code == 1 and "FAIL" in out and "1 of 1 checks failed" in err


def test_default_sweep_runs_on_cpu_and_says_so(tmp_path, monkeypatch, capsys):
    from mlabench import sweep
    from mlabench.timing import TimingConfig

    real = sweep.default_sweep_config

    def quicker(device=None):
        return real(device).model_copy(update={"timing": TimingConfig(warmup_iters=0, min_samples=3,
                                                                      max_samples=3)})

    monkeypatch.setattr(sweep, "default_sweep_config", quicker)
    code, out, err = run(["sweep", "--results-dir", str(tmp_path), "--json"], monkeypatch, capsys)
    assert code == 0, err
    assert "No GPU found: running a small CPU sweep" in err
    rows = json.loads(out)[0]["rows"]
    assert {(r["batch"], r["context"]) for r in rows} == {(1, 256), (1, 1024), (2, 256), (2, 1024)}
    (run_dir,) = list(tmp_path.iterdir())
    assert {p.name for p in run_dir.iterdir()} >= {"manifest.json", "results.jsonl", "results.csv"}


@pytest.mark.parametrize("args, message", [
    (["check", "--model", "kimi-k9"], "unknown model 'kimi-k9'"),
    (["check", "--model", "kimi-k3", "--tp", "5"], "96 heads are not divisible by tp=5"),
    (["check", "--heads", "12", "--backend", "cutlass"], "unknown backend 'cutlass'"),
    (["check", "--heads", "12", "--context", "0"], "context length must be > 0"),
    (["check", "--heads", "12", "--splits", "0"], "--splits must be > 0"),
    (["check", "--heads", "12", "--splits", "4,x"], "--splits takes comma-separated integers"),
    (["sweep", "--heads", "12", "--context", "-4"], "context length must be > 0"),
    (["sweep", "--heads", "12", "--splits", "-1"], "--splits must be > 0"),
    (["sweep", "--heads", "12", "--backend", "aiter-asm"], "aiter-asm is not available here"),
    (["sweep", "--config", "no-such-sweep"], "sweep config not found"),
])
def test_bad_input_gives_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, message):
    code, out, err = run([*args, *(["--results-dir", str(tmp_path)] if args[0] == "sweep" else [])],
                         monkeypatch, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_malformed_toml_writes_nothing(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("batch = [1, 16\n")
    out_dir = tmp_path / "results"
    code, _, err = run(["sweep", "--config", str(bad), "--results-dir", str(out_dir)], monkeypatch, capsys)
    assert code == 2 and "malformed TOML" in err and len(err.strip().splitlines()) == 1
    assert not out_dir.exists()


def test_kv_cache_larger_than_free_memory_is_refused_before_allocating(tmp_path, monkeypatch, capsys):
    import mlabench.inputs as inputs

    monkeypatch.setattr(inputs, "free_memory_bytes", lambda device=None: 64 * 2**20)
    code, _, err = run(["sweep", "--heads", "12", "--backend", "torch-splitkv", "--batch", "16",
                        "--context", "131072", "--results-dir", str(tmp_path)], monkeypatch, capsys)
    assert code == 2 and "GiB free" in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_resume_from_cli(tmp_path, monkeypatch, capsys):
    args = ["sweep", "--heads", "12", "--backend", "torch-splitkv", "--batch", "1", "--context", "32",
            "--splits", "1,2", "--page-size", "16", "--budget-s", "0.05", "--results-dir", str(tmp_path), "--json"]
    code, _, err = run(args, monkeypatch, capsys)
    assert code == 0, err
    (run_dir,) = list(tmp_path.iterdir())
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    (run_dir / "results.jsonl").write_text(lines[0] + "\n")  # as if stopped after the first point
    code, out, err = run(["sweep", "--resume", str(run_dir), "--json"], monkeypatch, capsys)
    assert code == 0, err
    assert len((run_dir / "results.jsonl").read_text().splitlines()) == 2
    assert json.loads(out)[0]["rows"][0]["best params"].startswith("num_kv_splits=")


def test_compare_from_recorded_runs(tmp_path, monkeypatch, capsys):
    code, _, err = run(["sweep", "--heads", "12", "--backend", "torch-splitkv", "--batch", "1",
                        "--context", "32", "--splits", "1,2", "--page-size", "16", "--budget-s", "0.05",
                        "--results-dir", str(tmp_path)], monkeypatch, capsys)
    assert code == 0, err
    (run_dir,) = list(tmp_path.iterdir())
    code, out, err = run(["compare", "--from", str(run_dir), "--json"], monkeypatch, capsys)
    assert code == 0, err
    (row,) = json.loads(out)[0]["rows"]
    assert row["split-KV"] == "torch-splitkv" and row["best splits"] in (1, 2) and row["persistent"] is None
