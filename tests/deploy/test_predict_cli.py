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
                         f"error: --predict-from {results}: a file, not a run folder"),
                        # a folder without a run under it was named without the option (a fresh user's review)
                        (["--from-run", str(serve), "--predict-from", str(tmp_path / "empty")],
                         f"error: --predict-from {tmp_path / 'empty'}: no run folder (results.jsonl, manifest.json) "
                         "here or below")):
        (tmp_path / "empty").mkdir(exist_ok=True)
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


def test_a_run_of_some_of_a_configs_variants_reads_its_own_prediction(tmp_path, monkeypatch, capsys):
    """The committed 4K repeat ran `serve-bench CONFIG --variant mlabench,fa3`: its manifest keeps the
    config's whole [prediction] (kernels for flashmla and mlabench-host too), and reading it with
    --predict-from (or report, plot) refused it: "[prediction] names variants that the run or config
    it is read with lacks: flashmla, mlabench-host (a CONFIG given with --from-run ...)", no CONFIG
    given.  The kernels of variants the run lacks are left out; a reference it lacks is still refused."""
    serving = REPO / "results/h200/serving"
    sweeps = ["--predict-from", str(serving / "sweep/kimi-k3-tp8-serving-20261204-211036-1205")]
    code, out, err = run(["serve-bench", "--from-run", str(serving / "serve-20261205T022623Z-h200-proxy"),
                          *sweeps, "--json"], monkeypatch, capsys)
    assert code == 0, err
    rows = json.loads(out)[1]["rows"]
    assert [(r["variant"], r["predicted_ms"] is not None) for r in rows] == [("mlabench", True), ("fa3", True)]
    run_dir = _serve_run(tmp_path, {**PREDICTION, "reference": "gone"})
    code, _, err = run(["serve-bench", "--from-run", str(run_dir), *sweeps], monkeypatch, capsys)
    assert code == 2 and err == "error: [prediction] reference 'gone' is no variant of the run or config it is " \
                                "read with (it has fm, ours)\n"


def test_a_report_of_a_run_at_concurrency_16_only_says_why_no_dash(tmp_path, monkeypatch, capsys):
    """Once that run's [prediction] read, the report's figure caption said "no TPOT predicted ...:
    fa3: ; mlabench: ." (the rows' empty reasons): every step predicted is above concurrency 1."""
    serving = REPO / "results/h200/serving"
    code, _, err = run(["report", "--from", str(serving / "serve-20261205T022623Z-h200-proxy"), "--from",
                        str(serving / "sweep/kimi-k3-tp8-serving-20261204-211036-1205"), "--out", str(tmp_path)],
                       monkeypatch, capsys)
    assert code == 0, err
    text = (tmp_path / "report.md").read_text()
    assert "no TPOT predicted from the sweep runs given: the run has no concurrency-1 point, and above it the " \
           "predicted step is the median ITL" in text and ": ;" not in text


def test_a_folder_holding_a_tuning_run_is_no_sweep_to_predict_from(tmp_path, monkeypatch, capsys):
    """--predict-from refused a tuning run named itself but took the folder above it: the folder has
    no manifest, so it read as a sweep, and every prediction came out empty, exit 0."""
    run_dir = _serve_run(tmp_path, PREDICTION)
    tuning = REPO / "results/h200/tune-kimi-k3-tp8/whole-tiles-attempt"
    code, out, err = run(["serve-bench", "--from-run", str(run_dir), "--predict-from", str(tuning)],
                         monkeypatch, capsys)
    assert code == 2 and not out
    assert err == f"error: --predict-from {tuning}: no sweep run here or below (only tune, validation runs)\n"


def test_sweeps_of_another_device_than_the_served_gpus_are_refused(tmp_path, monkeypatch, capsys):
    """A serve-bench run that names its GPUs (a CPU server: none) predicted from H200 sweeps read as
    if the kernel times were its own; now one line refuses it.  Its own GPU model reads."""
    run_dir = _serve_run(tmp_path, PREDICTION)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    argv = ["serve-bench", "--from-run", str(run_dir), "--predict-from", str(SWEEP), "--json"]
    (run_dir / "manifest.json").write_text(json.dumps({**manifest, "gpus": []}))
    code, out, err = run(argv, monkeypatch, capsys)
    assert code == 2 and not out and err == ("error: --predict-from: the serve-bench run served on no GPU, the kernel "
                                             "runs ran on NVIDIA H200: its TPOT does not compare with their times\n")
    (run_dir / "manifest.json").write_text(json.dumps({**manifest, "gpus": [{"name": "NVIDIA H200"}]}))
    assert run(argv, monkeypatch, capsys)[0] == 0


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
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["run_id"] += "-h16"  # another run, not a copy of the committed one
    (other / "manifest.json").write_text(json.dumps(manifest))
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


def test_a_pattern_says_which_records_it_read_and_where_several_matched(monkeypatch, capsys):
    """A fresh user's review: run 4's prediction read the qo1 policy's records at concurrency 1
    (`split_policy = "device:*"` matches any device policy) while the docs said qo1-k3, and nothing
    in the table said so; pooled sweeps of several policies gave the fastest silently."""
    s = REPO / "results/h200/serving/sweep"
    code, out, err = run(["serve-bench", "--from-run", str(REPO / "results/h200/serving/serve-20261205T180702Z-h200-proxy"),
                          "--predict-from", str(s / "kimi-k3-tp8-serving-20261205-150939-643"),
                          "--predict-from", str(s / "kimi-k3-tp8-serving-20261204-211036-1205"),
                          "--predict-from", str(s / "kimi-k3-tp8-serving-20261204-213747-742"), "--json"],
                         monkeypatch, capsys)
    assert code == 0, err
    notes = json.loads(out)[-1]["notes"]
    assert any(n.startswith("mlabench read split_policy=device:results/h200/deploy/qo1/") and "/c=1" in n
               and "/c=16" not in n for n in notes), notes
    assert any(n.startswith("mlabench read split_policy=device:") and "qo1-k3" in n and "/c=16" in n for n in notes)
    from mlabench.deploy.prediction import pattern_values

    records = records_of([SWEEP])
    kernel = KernelRef(backend="gluon-splitkv", params={"num_kv_splits": "*"})
    at = [r for r in records if kernel.matches(r, 1) and r.batch == 1 and r.context_len == 4096 and r.status == "ok"]
    fastest = min(at, key=lambda r: r.median_us)
    values = pattern_values(records, kernel, 1, 4096)                 # every split count swept, the fastest first
    assert len(values) == len({r.params["num_kv_splits"] for r in at}) > 1
    assert values[0] == f"num_kv_splits={fastest.params['num_kv_splits']}"


def test_the_prediction_holds_the_mean_tpot_whatever_stat_the_table_shows(monkeypatch, capsys):
    """A fresh user's review: with --stat p99 the prediction held the p99 TPOT at concurrency 1
    (its "step from" still said TPOT) and put (p99 TPOT - median ITL) / p99 TPOT in its prefill column
    at concurrency 16 (52.4% for mlabench at 4K, 26.5% from the mean)."""
    args = ["serve-bench", "--from-run", str(REPO / "results/h200/serving/serve-20261205T180702Z-h200-proxy"),
            "--predict-from", str(REPO / "results/h200/serving/sweep"), "--json"]
    code, out, err = run(args, monkeypatch, capsys)
    assert code == 0, err
    mean = json.loads(out)[-1]
    code, out, err = run([*args, "--stat", "p99"], monkeypatch, capsys)
    assert code == 0, err
    p99 = json.loads(out)[-1]
    assert p99["rows"] == mean["rows"]                        # measured step, TPOT and its shares: the mean's
    assert any("not the p99 TPOT of the table above" in n for n in p99["notes"])
    assert not any("p99" in n for n in mean["notes"])


def test_a_typo_in_a_kernel_of_the_prediction_is_one_line(tmp_path, monkeypatch, capsys):
    """A misspelled backend found no record: empty predictions with exit 0 (a fresh user's review)."""
    run_dir = _serve_run(tmp_path, {**PREDICTION, "kernels": {**PREDICTION["kernels"], "fm": {"backend": "flashmal"}}})
    code, _, err = run(["serve-bench", "--from-run", str(run_dir), "--predict-from", str(SWEEP)], monkeypatch, capsys)
    assert code == 2 and err.startswith("error: [prediction] kernels.fm: unknown backend 'flashmal' (known: ")
    assert err.count("\n") == 1


def test_plot_says_why_its_serving_figure_has_no_predicted_tpot(tmp_path, monkeypatch, capsys):
    """plot wrote a serving figure without dashes, exit 0, and said why only in the figure's caption,
    which plot does not print (a fresh user's review)."""
    serving = REPO / "results/h200/serving"
    code, out, err = run(["plot", "--from", str(serving / "serve-20261205T022623Z-h200-proxy"), "--from",
                          str(serving / "sweep/kimi-k3-tp8-serving-20261204-211036-1205"), "--kind", "serving-tpot",
                          "--out", str(tmp_path)], monkeypatch, capsys)
    assert code == 0, err
    assert "serving-tpot: no TPOT predicted: the run has no concurrency-1 point" in " ".join(err.split()), err
    assert out.strip().endswith("serving-tpot.png")
