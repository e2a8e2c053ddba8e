"""The CLI end to end through Typer's runner, and every user error path: one line, non-zero exit."""

import json
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from mlabench import cli
from mlabench.cli.app import GROUPS
from mlabench.sweep.config import default_sweep_config


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
    rows = {r["backend"]: r for r in json.loads(result.stdout)[0]["rows"]}  # the one --json structure
    assert {"reference", "torch-splitkv", "triton-splitkv", "triton-persistent", "flashmla",
            "aiter-asm", "aiter-gluon"} <= set(rows)
    assert rows["reference"]["available"] is True
    assert not rows["aiter-asm"]["available"] and "ROCm" in rows["aiter-asm"]["reason / parameters"]


def test_backends_fits_80_columns():
    """Issue 25 item 14: ``mlabench backends`` printed 86-column lines at 80 columns."""
    result = CliRunner().invoke(cli.app, ["backends"], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    assert max(len(line) for line in result.stdout.splitlines()) <= 80, result.stdout
    assert "yes; params:" in result.stdout and "no: needs ROCm" in result.stdout


def test_backends_params_lists_every_parameter_even_where_unavailable():
    """``--params``: a backend that cannot run here still shows what can be set (gluon-splitkv's
    fused_merge on this CPU machine), with its values, default and whether tune searches it."""
    from mlabench.backends import backend_names, get_backend

    result = CliRunner().invoke(cli.app, ["backends", "--params", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)[1]["rows"]
    assert {(r["backend"], r["parameter"]) for r in rows} == {
        (n, p.name) for n in backend_names() for p in get_backend(n).params}
    fused = next(r for r in rows if r["parameter"] == "fused_merge")
    assert (fused["values"], fused["default"], fused["tuned"]) == ("0-1", "per shape", "no")
    assert "batch 16" in fused["what it does"]
    splits = next(r for r in rows if (r["backend"], r["parameter"]) == ("torch-splitkv", "num_kv_splits"))
    assert (splits["values"], splits["tuned"]) == ("1-512", "yes")


def test_rich_output_takes_brackets_literally(monkeypatch):
    """The params table's title keeps "[params]"; a progress label with "[/x]" in it (a path) is
    no Rich markup (it raised MarkupError)."""
    from rich.console import Console

    from mlabench.cli import output

    result = CliRunner().invoke(cli.app, ["backends", "--params"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "a sweep config's [params] table" in result.stdout, result.output
    console = Console(record=True, width=80)
    monkeypatch.setattr(output, "err", console)
    with output.progress_bar("check") as update:
        update(1, 2, "cfg[/x] a")
    assert "cfg[/x] a" in console.export_text()


def test_check_passes_for_kimi_k3_tp8():
    result = CliRunner().invoke(cli.app, ["check", "--model", "kimi-k3", "--tp", "8", "--backend",
                                          "torch-splitkv", "--splits", "1,3,300", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)[0]["rows"]
    seed_case = [r for r in rows if "L=4096 p64" in r["shape"] and "B=1" in r["shape"]]
    assert len(seed_case) == 3 and all("[1,12,512]" in r["shape"] for r in seed_case)
    assert all(r["verdict"] == "pass" and r["finite"] and r["rel RMSE"] < 0.0078 and r["rel max err"] < 0.0625
               for r in rows)
    assert "random, needles, peaky, flat" in json.loads(result.stdout)[0]["notes"][0]
    # issue 25 item 7: the scale in use and where it came from
    assert "softmax scale 0.072169 = (128 + 64) ** -0.5 (no rope scaling) from the vLLM ROCm" in \
        json.loads(result.stdout)[0]["notes"][-1]


def test_check_fails_with_exit_1_on_a_wrong_backend(monkeypatch, capsys):
    from mlabench.backends import torch_reference as reference

    real = reference.mla_decode_splitkv_torch
    monkeypatch.setattr(reference, "mla_decode_splitkv_torch", lambda *a, **k: real(*a, **k).mul_(1.1))
    code, out, err = run(["check", "--heads", "12", "--backend", "torch-splitkv", "--splits", "2",
                          "--context", "64", "--markdown"], monkeypatch, capsys)
    assert code == 1 and "FAIL" in out and "1 of 1 checks failed" in err
    assert "relative RMSE" in out and "limit 0.0078" in out


def test_check_names_the_needle_a_backend_drops(monkeypatch, capsys):
    """A split-KV that loses each request's last token: the failing row says which needle it lost."""
    from mlabench.backends import torch_reference as reference

    real = reference.mla_decode_splitkv_torch

    def short_by_one(q, kv, bt, lens, *a, **k):
        return real(q, kv, bt, lens - 1, *a, **k)

    monkeypatch.setattr(reference, "mla_decode_splitkv_torch", short_by_one)
    code, out, err = run(["check", "--heads", "12", "--backend", "torch-splitkv", "--splits", "2",
                          "--context", "640", "--json"], monkeypatch, capsys)
    (row,) = json.loads(out)[0]["rows"]
    assert code == 1 and row["verdict"].startswith("FAIL: needles inputs: relative RMSE")
    assert "request 0 token 639 (last token of split 2/2, last token of page 9, last valid token)" in row["verdict"]
    assert "missing" in row["verdict"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's default sweep; a GPU's is the full Kimi K3 "
                    "sweep (minutes)")
def test_default_sweep_runs_on_cpu_and_says_so(tmp_path, monkeypatch, capsys):
    from mlabench.measure.timing import TimingConfig
    from mlabench.sweep import config

    real = config.default_sweep_config

    def quicker(device=None):
        return real(device).model_copy(update={"timing": TimingConfig(warmup_iters=0, min_samples=3,
                                                                      max_samples=3)})

    monkeypatch.setattr(config, "default_sweep_config", quicker)
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
    (["sweep", "--config", "no-such-sweep"], "sweep config not found"),
    # found by a new user: accepted before, with exit 0 (an empty item skipped, an infinite budget
    # recorded as null, a head count that allocated for 34 s and then failed the check)
    (["sweep", "--heads", "12", "--context", "256,,512"], "--context has an empty item"),
    (["sweep", "--heads", "12", "--context", "256", "--budget-s", "inf"], "'--budget-s': must be a finite number"),
    (["tune", "--backend", "torch-splitkv", "--budget-s", "nan"], "'--budget-s': must be a finite number"),
    (["tune", "--validate", "results/h200/deploy/qo1/tune-kimi-k3-tp8-20261201-152425-462/policy.json",
      "--lengths", "0"], "needs --lengths >= 1 (or 0 with --context), got 0"),
    # it read "got None, 600, 512": --lengths not given, and the 512 the policy's, not the user's
    (["tune", "--validate", "results/h200/deploy/qo1/tune-kimi-k3-tp8-20261201-152425-462/policy.json",
      "--min-context", "200000"], "needs 1 <= --min-context < --max-context, got --min-context 200000 and "
                                  "--max-context 131072 (the policy's)"),
    (["check", "--heads", "100000", "--context", "256"], "num_heads: must be 1..256"),
    (["check", "--heads", "12", "--rtol", "0.1"], "--rtol needs --atol"),
    (["plot", "--from", "results/h200/deploy/kimi-k3-tp8/kimi-k3-tp8-gluon-flashmla-20261201-183956-973",
      "--kind", ""], "--kind is empty"),
])
def test_bad_input_gives_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, message):
    code, out, err = run([*args, *(["--results-dir", str(tmp_path)] if args[0] == "sweep" else [])],
                         monkeypatch, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert not list(tmp_path.iterdir())  # nothing half-written


@pytest.mark.parametrize("args, who", [
    (["check", "--backend", "reference"], "which reference does not take"),
    (["check", "--backend", "reference", "--backend", "flashmla"], "which none of reference, flashmla takes"),
    (["sweep", "--backend", "reference,flashmla"], "which none of reference, flashmla takes"),
    (["compare", "--backend", "reference"], "which reference does not take"),
])
def test_splits_for_backends_without_num_kv_splits_is_refused(tmp_path, monkeypatch, capsys, args, who):
    """A fresh user's nit: ``check --backend reference --splits 4`` passed without a word about the
    split counts it ignored.  Refused in one line before anything runs (flashmla, not available on
    a CPU, is refused for its --splits first: the flags are judged before the machine)."""
    where = ["--results-dir", str(tmp_path)] if args[0] != "check" else []
    code, out, err = run([*args, "--heads", "4", "--context", "64", "--splits", "4", *where], monkeypatch, capsys)
    assert code == 2 and not out and not list(tmp_path.iterdir()), err
    (line,) = err.strip().splitlines()
    assert line.startswith(f"error: --splits sets num_kv_splits, {who}") and "leave --splits out" in line


@pytest.mark.parametrize("command", ["check", "sweep"])
def test_cannot_run_here_gives_one_line_and_exit_3(tmp_path, monkeypatch, capsys, command):
    """Exit 3, not 2, when the input is fine but this machine cannot run it: a backend that is not
    available here (aiter-asm without ROCm, flashmla without Hopper; whichever one is missing here)."""
    from mlabench.backends import backend_names, get_backend

    missing = next((n for n in backend_names() if not get_backend(n).available()[0]), None)
    if missing is None:
        pytest.skip("every backend is available here")
    extra = ["--results-dir", str(tmp_path)] if command == "sweep" else []
    code, out, err = run([command, "--heads", "12", "--context", "64", "--backend", missing, *extra],
                         monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 3 and not out, err
    assert len(lines) == 1 and lines[0].startswith(f"error: backend {missing} is not available here")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("given", ["no-such-sweep", "configs/sweeps/nope.toml", "{tmp}/nope.toml"])
def test_a_missing_sweep_config_names_the_shipped_ones_by_path_or_by_name(given, tmp_path, monkeypatch, capsys):
    """Whether named as a path (here or elsewhere) or by name, a missing config lists what ships."""
    monkeypatch.chdir(tmp_path)  # a relative path from outside the checkout
    code, out, err = run(["sweep", "--config", given.format(tmp=tmp_path), "--results-dir", str(tmp_path / "r")],
                         monkeypatch, capsys)
    shipped = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "configs/sweeps").glob("*.toml"))
    assert code == 2 and not out and not (tmp_path / "r").exists()
    assert err.startswith("error: sweep config not found: ") and err.count("\n") == 1
    assert err.endswith(f"(known: {', '.join(shipped)})\n")


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
    # a fresh user's review: a changed --visits named the recorded --max-visits the user never gave,
    # and --results-dir beside --resume was ignored
    code, _, err = run(["sweep", "--resume", str(run_dir), "--visits", "3"], monkeypatch, capsys)
    assert code == 2 and "recorded with another sweep configuration" in err and "visits" in err, err
    code, _, err = run(["sweep", "--resume", str(run_dir), "--results-dir", str(tmp_path / "x")], monkeypatch, capsys)
    assert code == 2 and err.strip() == "error: --results-dir: --resume continues in the run's own folder; leave it out"


def test_resuming_an_archived_run_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    """A finished run, gzipped: --resume says so in one line, exits 2, and leaves every file as it was
    (it once re-measured the sentinel into sentinel.jsonl and rewrote the manifest and the CSV)."""
    import gzip

    args = ["sweep", "--heads", "12", "--backend", "torch-splitkv", "--batch", "1", "--context", "32",
            "--splits", "1,2", "--page-size", "16", "--budget-s", "0.05", "--results-dir", str(tmp_path)]
    code, _, err = run(args, monkeypatch, capsys)
    assert code == 0, err
    (run_dir,) = list(tmp_path.iterdir())
    (run_dir / "results.jsonl.gz").write_bytes(gzip.compress((run_dir / "results.jsonl").read_bytes()))
    (run_dir / "results.jsonl").unlink()
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    code, out, err = run(["sweep", "--resume", str(run_dir)], monkeypatch, capsys)
    assert code == 2 and not out
    assert err.strip().splitlines() == [f"error: {run_dir} is archived (results.jsonl.gz): gunzip it to add to it"]
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before


def test_compare_from_recorded_runs(tmp_path, monkeypatch, capsys):
    code, _, err = run(["sweep", "--heads", "12", "--backend", "torch-splitkv", "--batch", "1",
                        "--context", "32", "--splits", "1,2", "--page-size", "16", "--budget-s", "0.05",
                        "--results-dir", str(tmp_path)], monkeypatch, capsys)
    assert code == 0, err
    (run_dir,) = list(tmp_path.iterdir())
    code, out, err = run(["compare", "--from", str(run_dir), "--json"], monkeypatch, capsys)
    # a fresh user's nit: a table of dash columns came before the error; now the error alone, exit 1
    assert code == 1 and not out and err == ("error: nothing to compare: compare needs a padded persistent "
                                             "backend with correct records; these runs have torch-splitkv\n"), err


@pytest.mark.parametrize("args, message", [
    (["check", "--tp", "abc"], "error: invalid value for '--tp': Input should be a valid integer, unable to parse "
                               "string as an integer (mlabench check --help)"),
    (["check", "--bogus"], "error: no such option: --bogus (mlabench check --help)"),
    (["frobnicate"], "error: no such command 'frobnicate'. (mlabench --help)"),
    (["sweep", "--order", "bogus"], "error: invalid value for '--order': 'bogus' is not one of 'grid', 'shuffled', "
                                    "'interleaved'. (mlabench sweep --help)"),
    (["report"], "error: missing option '--from'. (mlabench report --help)"),
])
def test_usage_mistakes_are_one_line_and_exit_2_without_traceback(monkeypatch, capsys, args, message):
    """Issue 25: click's usage errors came as four lines, some with pydantic's "Value error," prefix."""
    code, _, err = run(args, monkeypatch, capsys)
    assert code == 2 and err == message + "\n"


@pytest.mark.parametrize("args, message", [
    (["tune", "--backend", "triton-splitkv", "--backend", "torch-splitkv"],
     "error: --backend given 2 times (triton-splitkv, torch-splitkv); it takes one value (the last would win)"),
    (["tune", "--heads", "4", "--heads=6"], "error: --heads given 2 times (4, 6); it takes one value (the last would win)"),
    (["sweep", "--order", "grid", "--order=shuffled"],
     "error: --order given 2 times (grid, shuffled); it takes one value (the last would win)"),
])
def test_an_option_of_one_value_given_twice_is_refused(monkeypatch, capsys, args, message):
    """A fresh user's review: tune --backend a --backend b --heads 4 --heads 6 tuned b with 6 heads
    without a word (click keeps the last), where --backend a,b and --heads 4,6 are refused."""
    code, _, err = run(args, monkeypatch, capsys)
    assert code == 2 and err == message + "\n"


def test_options_that_take_several_values_may_repeat(monkeypatch, capsys):
    import typer

    from mlabench.cli.app import repeated_option

    app = typer.main.get_command(cli.app)
    assert repeated_option(app, ["check", "--backend", "a", "--backend", "b"]) == ""  # check --backend is repeatable
    assert repeated_option(app, ["report", "--from", "a", "--from", "b", "--", "--out", "x", "--out", "y"]) == ""
    assert repeated_option(app, ["report", "--from", "a", "--out", "x", "--out", "y"]).startswith("--out given 2 times")


def test_version(monkeypatch, capsys):
    code, out, _ = run(["--version"], monkeypatch, capsys)
    assert code == 0 and out.startswith("mlabench ")


H200_SWEEP = str(Path(__file__).resolve().parents[2] / "results" / "h200" / "kimi-k3-tp8")


@pytest.mark.parametrize("args, message", [
    (["check", "--heads", "0"], "heads must be > 0"),
    (["check", "--heads", "12", "--batch", "0", "--context", "100"], "error: --batch takes values > 0, got 0"),
    (["check", "--heads", "12", "--batch", "2", "--context", "100,200"],
     "error: --batch needs exactly one --context length, got 2 ("),
    (["check", "--heads", "12", "--batch", "5"], "error: --batch needs exactly one --context length, got 0 ("),
    (["check", "--heads", "12", "--page-size", "32"], "error: --page-size takes 1, 16, 64, got 32"),
    (["check", "--heads", "12", "--atol", "nan"], "--atol must be a finite number > 0"),
    (["check", "--heads", "12", "--json", "--markdown"], "choose one of --json and --markdown"),
    (["sweep", "--context", "4096", "--splits", "513"], "num_kv_splits must be <= 512"),
    (["sweep", "--page-size", "32"], "error: --page-size takes 1, 16, 64, got 32"),
    (["sweep", "--budget-s", "0"], "'--budget-s': must be a finite number of seconds > 0, got 0.0"),
    (["compare", "--from", "nowhere"], "no run folder (results.jsonl, manifest.json)"),
    # with --from, a length or batch <= 0 read "no recorded point matches --context -5", exit 1
    (["compare", "--from", H200_SWEEP, "--context", "-5"], "context length must be > 0, got -5"),
    (["compare", "--from", H200_SWEEP, "--batch", "0"], "batch must be > 0, got 0"),
    (["compare", "--from", H200_SWEEP, "--qo-len", "0"], "--qo-len must be > 0, got 0"),
])
def test_more_bad_input(tmp_path, monkeypatch, capsys, args, message):
    code, _, err = run([*args, *(["--results-dir", str(tmp_path)] if args[0] == "sweep" else [])],
                       monkeypatch, capsys)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err
    assert not list(tmp_path.iterdir())


def test_a_flag_changes_the_default_sweep_and_keeps_its_model(tmp_path, monkeypatch, capsys):
    code, out, err = run(["sweep", "--context", "48", "--batch", "1", "--splits", "2", "--budget-s", "0.05",
                          "--results-dir", str(tmp_path), "--json"], monkeypatch, capsys)
    assert code == 0, err
    rows = json.loads(out)[0]["rows"]
    assert {(r["batch"], r["context"]) for r in rows} == {(1, 48)}
    if not torch.cuda.is_available():  # a CPU's default sweep has one backend: torch-splitkv
        assert [r["best params"] for r in rows] == ["num_kv_splits=2"]
    (run_dir,) = list(tmp_path.iterdir())
    cfg = json.loads((run_dir / "manifest.json").read_text())["config"]
    default = default_sweep_config()  # page 16 on a CPU, 64 on a GPU
    assert cfg["model"] == "kimi-k3" and cfg["tp"] == 8 and cfg["page_size"] == default.page_size


def test_heads_axis_from_the_cli(tmp_path, monkeypatch, capsys):
    code, out, err = run(["sweep", "--heads", "8,12", "--batch", "1", "--context", "32", "--splits", "1",
                          "--budget-s", "0.05", "--results-dir", str(tmp_path), "--json"], monkeypatch, capsys)
    assert code == 0, err
    (run_dir,) = list(tmp_path.iterdir())
    from mlabench.records.store import ResultStore

    heads_by_backend: dict[str, list[int]] = {}
    for r in ResultStore(run_dir).records():  # one backend on a CPU, the GPU kernels on a GPU
        heads_by_backend.setdefault(r.backend, []).append(r.num_heads)
    assert heads_by_backend and all(sorted(h) == [8, 12] for h in heads_by_backend.values())


def test_compare_from_filters_and_refuses_mixed_devices(tmp_path, monkeypatch, capsys):
    args = ["sweep", "--heads", "12", "--backend", "torch-splitkv", "--batch", "1,2", "--context", "32",
            "--splits", "1", "--budget-s", "0.05", "--results-dir", str(tmp_path / "a")]
    assert run(args, monkeypatch, capsys)[0] == 0
    code, out, err = run(["compare", "--from", str(tmp_path / "a"), "--batch", "2", "--json"], monkeypatch, capsys)
    assert code == 1 and not out and "padded persistent" in err, err  # split-KV only: the error alone, exit 1
    code, out, err = run(["compare", "--from", str(tmp_path / "a"), "--batch", "3"], monkeypatch, capsys)
    assert code == 1 and "--batch 3: the runs hold backends torch-splitkv; batch 1, 2" in err  # a parent folder works
    (run_dir,) = list((tmp_path / "a").iterdir())
    other = tmp_path / "b" / run_dir.name
    other.mkdir(parents=True)
    (other / "results.jsonl").write_text((run_dir / "results.jsonl").read_text())
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["device"]["name"] = f"not {manifest['device']['name']}"  # another device, wherever this runs
    manifest["run_id"] += "-elsewhere"  # another run, not a copy of this one
    (other / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = run(["compare", "--from", str(run_dir), "--from", str(other)], monkeypatch, capsys)
    assert code == 2 and "different devices" in err


def test_ctrl_c_says_how_to_resume(tmp_path, monkeypatch, capsys):
    from mlabench.bench import shape_bench as point

    calls = {"n": 0}
    real = point.ShapeBench.run

    def interrupt_second_point(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:  # the sentinel, the first point, then Ctrl-C
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(point.ShapeBench, "run", interrupt_second_point)
    code, _, err = run(["sweep", "--heads", "12", "--backend", "torch-splitkv", "--batch", "1", "--context", "32",
                        "--splits", "1,2", "--budget-s", "0.05", "--results-dir", str(tmp_path)], monkeypatch, capsys)
    (run_dir,) = list(tmp_path.iterdir())
    assert code == 130 and f"continue with: mlabench sweep --resume {run_dir}" in err
    monkeypatch.setattr(point.ShapeBench, "run", real)
    code, _, err = run(["sweep", "--resume", str(run_dir)], monkeypatch, capsys)
    assert code == 0 and "1 of 2 points already recorded" in err


def test_every_command_takes_format_and_the_same_json_structure(monkeypatch, capsys):
    code, out, err = run(["backends", "--format", "csv"], monkeypatch, capsys)
    assert code == 0 and out.startswith("backend,family,available,reason / parameters,summary\n"), err
    code, out, err = run(["check", "--heads", "12", "--backend", "torch-splitkv", "--splits", "2",
                          "--context", "40", "--format", "json"], monkeypatch, capsys)
    assert code == 0, err
    (table,) = json.loads(out)
    assert set(table) == {"title", "columns", "rows", "notes"} and table["rows"][0]["verdict"] == "pass"
    code, _, err = run(["check", "--heads", "12", "--format", "csv", "--markdown"], monkeypatch, capsys)
    assert code == 2 and "contradicts --markdown" in err


def test_importing_the_cli_loads_neither_optuna_nor_matplotlib_nor_torch():
    import subprocess

    code = ("import sys, mlabench.cli; loaded = {'optuna', 'matplotlib', 'torch'} & set(sys.modules); "
            "assert not loaded, loaded")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_optuna_and_matplotlib_come_through_extras(monkeypatch):
    from mlabench import extras
    from mlabench.errors import DependencyError

    assert extras.optuna().__name__ == "optuna" and extras.pyplot().__name__ == "matplotlib.pyplot"
    monkeypatch.setitem(sys.modules, "no_such_dep_for_mlabench", None)
    with pytest.raises(DependencyError, match="no_such_dep_for_mlabench not installed"):
        extras.require("no_such_dep_for_mlabench")


IMPOSSIBLE = [
    (["check", "--context", "1000000000000"], "context length must be <= 2,147,483,647"),
    (["check", "--context", "4096", "--batch", "1000000000"], "B=1000000000 H=12 L=4096"),
    (["check", "--heads", "2000000000", "--context", "1"], "num_heads: must be 1..256"),
    (["sweep", "--batch", "1000000000", "--context", "4096"], "B=1000000000 H=12 L=4096"),
    (["sweep", "--context", "1000000000000"], "context length must be <= 2,147,483,647"),
    (["compare", "--batch", "1000000000", "--context", "4096"], "B=1000000000 H=12 L=4096"),
    (["tune", "--backend", "torch-splitkv", "--heads", "12", "--buckets", "4096", "--batch", "1000000000"],
     "cannot be one decode step"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args, message", IMPOSSIBLE, ids=[" ".join(a) for a, _ in IMPOSSIBLE])
def test_impossible_sizes_are_refused_from_their_numbers(tmp_path, monkeypatch, capsys, args, message):
    """Issue 8 item 8: a billion requests or a trillion tokens is one error line and exit 2 from
    every command, judged before any per-request tuple or tensor exists (so it is also quick)."""
    code, out, err = run([*args, *(["--results-dir", str(tmp_path)] if args[0] != "check" else [])],
                         monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    assert out == "" and not list(tmp_path.iterdir())


@pytest.mark.parametrize("command", [c for g in GROUPS for c in g.COMMANDS])
def test_help_shows_what_to_write_not_python_types(command, monkeypatch, capsys):
    """Issue 8 item 11: no ``--json <bool>`` or ``--backend <list[str]>`` in any help."""
    import re

    code, out, _ = run([command, "--help"], monkeypatch, capsys)
    assert code == 0 and "Usage:" in out
    options = [line for line in out.splitlines() if line.strip().startswith("-")]
    assert options and not [line for line in options if re.search(r"<(str|int|float|bool|path|list)", line)]


def test_lists_take_commas_everywhere(monkeypatch, capsys):
    from mlabench.cli.options import name_list

    assert name_list(["a,b", "c", " d , "]) == ["a", "b", "c", "d"] and name_list(None) is None
    run_dir = str(Path(__file__).parents[2] / "results" / "h200" / "kimi-k3-tp8")
    both = run(["compare", "--from", run_dir, "--backend", "flashmla,triton-splitkv", "--json"], monkeypatch, capsys)
    repeated = run(["compare", "--from", run_dir, "--backend", "flashmla", "--backend", "triton-splitkv", "--json"],
                   monkeypatch, capsys)
    assert both[0] == 0 and both == repeated
    rows = json.loads(both[1])[0]["rows"]
    assert {r["persistent"] for r in rows} == {"flashmla"} and {r["split-KV"] for r in rows} == {"triton-splitkv"}


def test_check_shows_progress_and_compare_refuses_a_sweep_of_one_path_before_measuring(tmp_path, monkeypatch, capsys):
    """A new user's `compare --backend torch-splitkv` measured its sweep, wrote a run folder, and only then
    said there was nothing to compare: now one line, exit 2, nothing measured or written."""
    code, _, err = run(["check", "--backend", "torch-splitkv", "--splits", "1,2", "--context", "64,100"],
                       monkeypatch, capsys)
    assert code == 0 and "checked" in err and "2/2" in err
    code, out, err = run(["compare", "--backend", "torch-splitkv", "--context", "32", "--batch", "1", "--splits", "1",
                          "--page-size", "16", "--budget-s", "0.05", "--results-dir", str(tmp_path)], monkeypatch, capsys)
    assert code == 2 and not out and not list(tmp_path.iterdir()), err
    assert err.strip().splitlines() == ["error: nothing to compare: compare needs a padded persistent backend "
                                        "(aiter-asm, flashmla, triton-persistent, vllm-flashmla) beside "
                                        "torch-splitkv; add one to --backend"]


def test_compare_refuses_a_path_with_no_backend_that_runs_here():
    """The default sweep on a machine where no padded persistent backend runs (a CPU): exit 3 before
    anything is measured, naming the backends of the path and `compare --from`."""
    from mlabench.errors import BackendUnavailableError, ConfigError
    from mlabench.sweep.compare import check_both_paths_run

    families = {"flashmla": "persistent", "triton-persistent": "persistent", "torch-splitkv": "split-kv",
                "triton-splitkv": "split-kv", "reference": "reference"}
    check_both_paths_run(["flashmla", "triton-splitkv"], None, families)  # both paths: nothing to say
    with pytest.raises(BackendUnavailableError, match=r"no padded persistent backend runs on this machine "
                       r"\(flashmla, triton-persistent: `mlabench backends` says why\); `mlabench compare --from RUN`"):
        check_both_paths_run(["torch-splitkv"], None, families)
    with pytest.raises(BackendUnavailableError, match=r"no split-KV backend runs on this machine \(triton-splitkv:"):
        check_both_paths_run(["flashmla"], ["flashmla", "triton-splitkv"], families)
    with pytest.raises(ConfigError, match="needs a split-KV backend \\(torch-splitkv, triton-splitkv\\) beside flashmla"):
        check_both_paths_run(["flashmla"], ["flashmla"], families)


def test_the_sweep_reports_progress_before_its_first_point(tmp_path):
    from mlabench.measure.timing import TimingConfig
    from mlabench.sweep.config import SweepConfig
    from mlabench.sweep.run import run_sweep

    calls = []
    cfg = SweepConfig(heads=[12], backends=["torch-splitkv"], batch=[1], context_lens=[16], page_size=16,
                      params={"num_kv_splits": [1, 2]}, timing=TimingConfig(budget_s=0.05, min_samples=3))
    run_sweep(cfg, tmp_path, progress=lambda p, r, done, total: calls.append((r is None, done, total)))
    # at the start (before the sentinel is measured), then before and after each point
    assert calls == [(True, 0, 2), (True, 0, 2), (False, 1, 2), (True, 1, 2), (False, 2, 2)]


@pytest.mark.parametrize("args", [["tune", "--validate", "--help"], ["sweep", "--config", "--help"]])
def test_help_wins_over_an_option_that_takes_a_value(args, monkeypatch, capsys):
    code, out, err = run(args, monkeypatch, capsys)
    assert code == 0 and out.startswith("Usage: ") and not err


@pytest.mark.parametrize("command", ["sweep", "tune", "graph-check", "compare"])
def test_each_commands_help_describes_its_own_options_only(command, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run([command, "--help"], monkeypatch, capsys)
    text = " ".join(out.split())
    assert code == 0 and "check:" not in text and "check's" not in text
    assert ("compare --from" not in text) and (command == "compare") == ("with --from: a filter" in text)


def test_the_tune_choice_table_fits_80_columns():
    """Issue 25 item 14: not on a terminal, tune printed a 109-column table."""
    from mlabench.cli.output import print_wide
    from mlabench.cli.tune_command import choice_table
    from mlabench.tables.render import to_rich
    from mlabench.tune.choice import BucketChoice
    from rich.console import Console
    import io

    rows = [BucketChoice(b, f"{lo + 1}-{hi}", hi, [lo + 1, hi], 20 + lo % 7, lo % 5, 24, {"num_kv_splits": 16 * b}, 512,
                         123.4 * b + lo, 0.0123 * b, 120.1 * b + lo, f"aiter-gluon-0.1.{lo % 3}", 150.2 * b + hi,
                         0.25 + b, max_splits=132 - lo % 11, tie="x" * 30)
            for b in (1, 16) for lo, hi in ((0, 1024), (1024, 4096), (65536, 131072))]
    console = Console(file=io.StringIO(), width=80)
    print_wide(console, to_rich(choice_table(rows), 80))
    text = console.file.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "left out at 80 columns" in text and "batch 16, context 65537-131072: xxx" in text


@pytest.mark.parametrize("command", sorted(name for group in GROUPS for name in group.COMMANDS))
def test_help_mentions_a_sweep_config_only_where_the_command_takes_one(command):
    """Issue 25 item 14: ``check --help`` said "or the sweep config's" of --tp and --page-size."""
    text = CliRunner().invoke(cli.app, [command, "--help"], env={"COLUMNS": "200"}).output
    if "--config" not in text:
        assert "sweep config" not in text, text


def test_a_split_policy_table_too_long_for_the_kernel_is_one_line_before_any_run_folder(tmp_path, monkeypatch, capsys):
    """Issue 35 item 10: ``split_policy=device:FILE`` with 2,000,000 rows gave a Triton traceback
    after 90 s and a run folder holding only a manifest.  The table is bounded when read."""
    policy, config = tmp_path / "long.json", tmp_path / "sweep.toml"
    policy.write_text(json.dumps([[n, 1 + n % 4] for n in range(1, 5002)]))
    config.write_text('name = "long"\nheads = [12]\nbatch = [1]\ncontext_lens = [128]\nbackends = ["triton-splitkv"]\n'
                      f'[params]\nsplit_policy = ["device:{policy}"]\n')
    results = tmp_path / "results"
    code, out, err = run(["sweep", "--config", str(config), "--results-dir", str(results)], monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(
        f"error: sweep config {config}: {policy}: batch 1: 5001 rows, more than the 4096")
    assert not results.exists()


def test_no_command_prints_the_help_and_an_option_missing_its_value_names_the_command(monkeypatch, capsys):
    """``mlabench`` alone: the help as ``--help`` prints it (several lines), exit 2; ``sweep
    --batch`` with no value: one line pointing at ``sweep --help``, not the program's."""
    code, out, err = run([], monkeypatch, capsys)
    assert code == 2 and err.startswith("Usage: mlabench [OPTIONS] COMMAND") and "\n  sweep" in err
    code, out, err = run(["sweep", "--batch"], monkeypatch, capsys)
    assert code == 2 and err == "error: option '--batch' requires an argument. (mlabench sweep --help)\n"
