"""`mlabench serve-bench --from-run RUN --predict-from SWEEP`: a recorded serve run (written
here) beside the committed H200 sweep of gluon-splitkv and FlashMLA."""

import json
import shutil
from pathlib import Path

from mlabench.deploy.prediction import KernelRef, attention_us
from mlabench.records.store import records_of
from mlabench.serving.results import BenchResult, MetricStats
from tests.cli.test_cli import run

REPO = Path(__file__).resolve().parents[2]
SWEEP = REPO / "results/h200/deploy/kimi-k3-tp8/kimi-k3-tp8-gluon-flashmla-20261201-183956-973"
PREDICTION = {"layers": 61, "reference": "fm", "short_input_len": 4096,
              "kernels": {"fm": {"backend": "flashmla"},
                          "ours": {"backend": "gluon-splitkv", "params": {"num_kv_splits": 132}}}}
TPOT = {("fm", 4096): 8.0, ("fm", 100000): 10.5, ("ours", 4096): 7.0, ("ours", 100000): 7.5}


def _serve_run(tmp_path, prediction, names=("fm", "ours")):
    run_dir = tmp_path / "serve-run"
    run_dir.mkdir()
    config = {"baseline": "fm", "concurrencies": [1], "prediction": prediction,
              "bench": {"random_input_len": [4096, 100000], "random_output_len": 128},
              "variants": [{"name": name, "base_url": f"http://127.0.0.1:{k + 1}"} for k, name in enumerate(names)]}
    (run_dir / "manifest.json").write_text(json.dumps({"kind": "serve-bench", "config": config}))
    lines = [BenchResult(variant=v, concurrency=1, input_len=n, repeat=0, status="ok", completed=3,
                         failed=0, tpot=MetricStats(mean_ms=t)).model_dump_json() for (v, n), t in TPOT.items()]
    (run_dir / "results.jsonl").write_text("\n".join(lines) + "\n")
    return run_dir


def test_predicted_beside_measured(tmp_path, monkeypatch, capsys):
    run_dir = _serve_run(tmp_path, PREDICTION)
    code, out, err = run(["serve-bench", "--from-run", str(run_dir), "--predict-from", str(SWEEP), "--json"],
                         monkeypatch, capsys)
    assert code == 0, err
    serve_table, prediction = json.loads(out)
    rows = {(r["variant"], r["input_len"]): r for r in prediction["rows"]}
    records = records_of([SWEEP])
    fm_4k = attention_us(records, KernelRef(backend="flashmla"), 1, 4096)
    ours = attention_us(records, KernelRef(backend="gluon-splitkv", params={"num_kv_splits": 132}), 1, 100000)
    rest = 8.0 - 61 * fm_4k / 1000
    assert abs(rows[("fm", 4096)]["predicted_ms"] - 8.0) < 1e-9  # the reference, by construction
    assert abs(rows[("ours", 100000)]["predicted_ms"] - (rest + 61 * ours / 1000)) < 1e-9
    assert rows[("ours", 100000)]["attention_us"] == ours


def test_the_prediction_lists_variants_in_the_configs_order(tmp_path, monkeypatch, capsys):
    """A new user's config listed its own variant first; the prediction table sorted them by name."""
    run_dir = _serve_run(tmp_path, PREDICTION, names=("ours", "fm"))
    code, out, err = run(["serve-bench", "--from-run", str(run_dir), "--predict-from", str(SWEEP), "--json"],
                         monkeypatch, capsys)
    assert code == 0, err
    rows = json.loads(out)[1]["rows"]
    assert [(r["input_len"], r["variant"]) for r in rows] == [(4096, "ours"), (4096, "fm"), (100000, "ours"),
                                                              (100000, "fm")]


def test_a_run_without_a_prediction_table_is_one_line(tmp_path, monkeypatch, capsys):
    code, _out, err = run(["serve-bench", "--from-run", str(_serve_run(tmp_path, None)),
                           "--predict-from", str(SWEEP)], monkeypatch, capsys)
    assert code == 2 and err.startswith("error: the serve config has no [prediction] table") and err.count("\n") == 1


def test_a_folder_that_is_not_a_sweep_is_refused(tmp_path, monkeypatch, capsys):
    serve = _serve_run(tmp_path, PREDICTION)
    for bad, words in ((serve, "a serve-bench run, not a sweep"), (tmp_path / "none", "no such run folder")):
        code, _out, err = run(["serve-bench", "--from-run", str(serve), "--predict-from", str(bad)], monkeypatch, capsys)
        assert code == 2 and words in err and err.count("\n") == 1
    code, _out, err = run(["serve-bench", "--from-run", str(SWEEP)], monkeypatch, capsys)
    assert code == 2 and "is a sweep run, not a serve-bench run" in err


def test_a_config_that_replaces_the_recorded_prediction_says_so(tmp_path, monkeypatch, capsys):
    """A new user's plot of the same run and sweeps drew other predictions than the table of
    `serve-bench CONFIG --from-run --predict-from`: the config had replaced the recorded reference."""
    run_dir = _serve_run(tmp_path, PREDICTION)
    config = tmp_path / "other-reference.toml"
    config.write_text('baseline = "fm"\n'
                      + "".join(f'[[variants]]\nname = "{n}"\nbase_url = "http://127.0.0.1:{k + 1}"\n'
                                for k, n in enumerate(("fm", "ours")))
                      + '[prediction]\nlayers = 61\nreference = "ours"\nshort_input_len = 4096\n'
                        '[prediction.kernels]\nfm = { backend = "flashmla" }\n'
                        'ours = { backend = "gluon-splitkv", params = { num_kv_splits = 132 } }\n')
    argv = ["serve-bench", str(config), "--from-run", str(run_dir), "--predict-from", str(SWEEP), "--json"]
    code, out, err = run(argv, monkeypatch, capsys)
    assert code == 0, err
    # it named both references ("(reference mlabench) ... (reference mlabench)" where only a kernel
    # differed, as in the H200 concurrency-16 run): now it says what differs
    assert ("the config's [prediction] replaces the one the run recorded (reference fm -> ours); "
            "plot draws it given the same CONFIG, report the recorded one") in err
    assert json.loads(out)[1]["rows"][1]["error_pct"] == 0.0  # ours at 4096: the new reference
    code, _out, err = run(argv[:1] + argv[2:], monkeypatch, capsys)
    assert code == 0 and "replaces" not in err


def test_a_folder_of_runs_given_to_from_run_names_the_serve_runs_in_it(tmp_path, monkeypatch, capsys):
    """A new user gave `--from-run results/h200/serving` (the run one level down) and then the sweep
    folder: both said only "serve-bench run manifest not found"."""
    serve = _serve_run(tmp_path, PREDICTION)
    code, _out, err = run(["serve-bench", "--from-run", str(tmp_path)], monkeypatch, capsys)
    assert code == 2 and err == f"error: {tmp_path} is no run folder; give one of the serve-bench runs it holds: {serve}\n"
    code, _out, err = run(["serve-bench", "--from-run", str(SWEEP.parent)], monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1 and "holds no serve-bench run (only sweep runs)" in err


def test_from_run_names_the_serve_runs_at_any_depth(tmp_path, monkeypatch, capsys):
    """`--from-run results/h200` (its serve runs in serving/, two levels down) said only "serve-bench
    run manifest not found"; the runs to give are now found as `report --from` finds them."""
    (tmp_path / "h200" / "serving").mkdir(parents=True)
    serve = _serve_run(tmp_path / "h200" / "serving", PREDICTION)
    for argv in (["--from-run", str(tmp_path)], ["--resume", str(tmp_path)]):
        code, _out, err = run(["serve-bench", *argv], monkeypatch, capsys)
        assert code == 2 and err == (f"error: {tmp_path} is no run folder; give one of the serve-bench runs it "
                                     f"holds: {serve}\n")


def test_a_file_given_for_a_run_folder_is_named_as_a_file(tmp_path, monkeypatch, capsys):
    """`--from-run RUN/results.jsonl.gz` said "manifest is not a folder (or a part of its path is a file)"."""
    serve = _serve_run(tmp_path, PREDICTION)
    results = serve / "results.jsonl"
    for argv, words in ((["--from-run", str(results)], f"error: {results} is a file: give the run folder that holds it"),
                        (["--from-run", str(serve), "--predict-from", str(results)],
                         f"error: --predict-from {results}: a file, not a run folder")):
        code, _out, err = run(["serve-bench", *argv], monkeypatch, capsys)
        assert code == 2 and err == words + "\n"


def test_the_help_says_which_prediction_table_is_read(monkeypatch, capsys):
    """`--help` said "the config's [prediction]"; with --from-run and no CONFIG it is the recorded one."""
    code, out, _err = run(["serve-bench", "--help"], monkeypatch, capsys)
    assert code == 0 and "else the one the run recorded" in " ".join(out.split())


def test_a_cut_results_line_is_named_by_its_line(tmp_path, monkeypatch, capsys):
    """A run killed while appending a result left half a line: the error said "line 1 column 13" of
    the JSON, not which line of results.jsonl to look at."""
    serve = _serve_run(tmp_path, PREDICTION)
    with (serve / "results.jsonl").open("a") as f:
        f.write('{"variant": "fm", "concur')
    code, _out, err = run(["serve-bench", "--from-run", str(serve)], monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: {serve} is not a readable serve-bench run: results.jsonl line 5: Invalid JSON")


def test_a_config_without_a_prediction_table_is_refused_with_from_run(tmp_path, monkeypatch, capsys):
    """`serve-bench cpu-tiny --from-run H200_RUN --predict-from ...` printed the run's recorded
    prediction as if the config had given it."""
    run_dir = _serve_run(tmp_path, PREDICTION)
    config = tmp_path / "plain.toml"
    config.write_text('baseline = "fm"\n[[variants]]\nname = "fm"\nbase_url = "http://127.0.0.1:1"\n')
    code, _out, err = run(["serve-bench", str(config), "--from-run", str(run_dir), "--predict-from", str(SWEEP)],
                          monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"error: {config} has no [prediction] table")


def test_the_replaced_prediction_names_the_kernels_that_differ():
    """Same reference, another backend for one variant and a kernel the run had none for."""
    from mlabench.cli.serve_commands import replaced_prediction

    given = {**PREDICTION, "kernels": {"fm": {"backend": "vllm-flashmla"}, "ours": PREDICTION["kernels"]["ours"],
                                       "new": {"backend": "vllm-fa3-mla"}}}
    assert replaced_prediction(given, PREDICTION) == (
        "the config's [prediction] replaces the one the run recorded (fm's kernel: backend flashmla -> "
        "vllm-flashmla; new's kernel: none -> vllm-fa3-mla)")
    assert "recorded none" in replaced_prediction(given, None)



def test_a_folder_gives_the_sweep_runs_under_it_at_any_depth(tmp_path, monkeypatch, capsys):
    """`--predict-from results/h200/serving` read its serve-bench runs, one level down, as sweeps
    ("unreadable manifest") and never reached the sweep runs of `sweep/<run>`, two levels down, which
    `report --from` the same folder reads.  A folder now gives the sweep runs under it at any depth
    (never inside a run folder); the serve-bench runs beside them are passed over."""
    serving = tmp_path / "serving"
    serving.mkdir()
    run_dir = _serve_run(serving, PREDICTION)
    shutil.copytree(SWEEP, serving / "sweep" / SWEEP.name)
    argv = ["serve-bench", "--from-run", str(run_dir), "--json", "--predict-from"]
    code, out, err = run([*argv, str(serving)], monkeypatch, capsys)
    assert code == 0, err
    assert out == run([*argv, str(SWEEP)], monkeypatch, capsys)[1]
    shutil.rmtree(serving / "sweep")
    code, out, err = run([*argv, str(serving)], monkeypatch, capsys)
    assert code == 2 and not out and err == (f"error: --predict-from {serving}: no sweep run here or below "
                                             "(only serve-bench runs)\n")


def test_a_folder_of_sweeps_of_two_head_counts_is_refused_not_pooled(tmp_path, monkeypatch, capsys):
    """``--predict-from`` a folder reads every sweep under it; the committed sweep beside a copy
    recorded at 16 heads (and 10% faster): the fastest of both was taken as the served kernel's
    time, silently.  Now one error line names the shapes."""
    import gzip

    run_dir = _serve_run(tmp_path, PREDICTION)
    folder = tmp_path / "sweeps"
    shutil.copytree(SWEEP, folder / SWEEP.name)
    other = folder / "more" / (SWEEP.name + "-h16")
    shutil.copytree(SWEEP, other)
    lines = []
    for line in gzip.open(other / "results.jsonl.gz", "rt"):
        rec = json.loads(line)
        rec["num_heads"] = rec["shape"]["num_heads"] = 16
        if rec.get("stats"):
            rec["stats"]["median_us"] *= 0.9
        lines.append(json.dumps(rec) + "\n")
    with gzip.open(other / "results.jsonl.gz", "wt") as f:
        f.writelines(lines)
    code, out, err = run(["serve-bench", "--from-run", str(run_dir), "--predict-from", str(folder), "--json"],
                         monkeypatch, capsys)
    assert code != 0 and "Traceback" not in err
    line = " ".join(err.split())
    assert "hold 2 shapes (12 heads, page 64" in line and "16 heads, page 64" in line
