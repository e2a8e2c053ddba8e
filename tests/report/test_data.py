"""Figure data functions, without matplotlib: each returns the numbers in the fixture."""

import json
import subprocess
import sys

import pytest

from mlabench.report.figures import data as D, style
from tests.report.conftest import GRAPH_CHECK, H200, H200_RUN, REPO, SERVE, SERVE_RUN, TUNE, raw_records


def _raw_best(backend, batch, ctx, splits=None):
    """Fastest ok record of the raw fixture JSON, optionally at one split count."""
    ok = [r for r in raw_records() if r["backend"] == backend and r["batch"] == batch and r["context_len"] == ctx
          and r["status"] == "ok" and (splits is None or r["params"].get("num_kv_splits") == splits)]
    return min(ok, key=lambda r: r["stats"]["median_us"])


def test_fixture_is_cut_from_the_committed_run():
    committed = {r["key"]: r for r in raw_records(REPO / "results/h200/kimi-k3-tp8" / H200_RUN.name)}
    cut = raw_records()
    assert len(cut) == 102
    for r in cut:
        assert r["stats"]["median_us"] == committed[r["key"]]["stats"]["median_us"]
        assert r["floor_us"] == committed[r["key"]]["floor_us"]


def test_data_and_report_plans_need_no_matplotlib():
    code = f"""
import sys
sys.modules['matplotlib'] = None  # any import of matplotlib fails
import mlabench.cli
from mlabench.report.runs import load_runs
from mlabench.report.figures.plan import plan
from mlabench.report.build import build_report
from mlabench.report.document import to_markdown_document
runs = load_runs([{str(H200)!r}, {str(SERVE)!r}, {str(TUNE)!r}, {str(GRAPH_CHECK)!r}])
specs, skipped = plan(runs)
assert len(specs) == 11 and not skipped, ([s.stem for s in specs], skipped)
text = to_markdown_document(build_report(runs).blocks)
assert '## Best split count' in text
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_importing_the_cli_loads_no_matplotlib():
    code = "import sys, mlabench.cli; print('matplotlib' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.stdout.strip() == "False", done.stderr[-2000:]


def test_best_split_per_bucket(h200_runs):
    curves = D.split_sweep(h200_runs.records, "triton-splitkv")
    assert sorted(curves) == [1, 16]
    for batch, per_ctx in curves.items():
        assert [c.context_len for c in per_ctx] == [4096, 32768, 131072]
        for c in per_ctx:
            raw = _raw_best("triton-splitkv", batch, c.context_len)
            assert c.best_splits == raw["params"]["num_kv_splits"]
            assert c.best_us == raw["stats"]["median_us"]
            assert c.splits == [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256]
            assert all(us == _raw_best("triton-splitkv", batch, c.context_len, s)["stats"]["median_us"]
                       for s, us in zip(c.splits, c.median_us))
    # the best split-KV numbers of this run's compare.md (results/h200/kimi-k3-tp8/)
    best = {(b, c.context_len): (c.best_splits, round(c.best_us, 1)) for b, cs in curves.items() for c in cs}
    assert best[(1, 131072)] == (256, 71.7) and best[(1, 4096)] == (64, 14.7)
    assert best[(16, 131072)] == (16, 763.3) and best[(16, 32768)] == (16, 210.3)


def test_heatmap_is_relative_to_each_contexts_best(h200_runs):
    curves = D.split_sweep(h200_runs.records, "triton-splitkv")[1]
    heat = D.split_heatmap(curves)
    assert heat.contexts == [4096, 32768, 131072]
    for c, row, best_col in zip(curves, heat.ratio, heat.best_column):
        assert row[best_col] == 1.0 and min(row) == 1.0
        assert row[0] == pytest.approx(c.median_us[0] / c.best_us)
    assert heat.ratio[2][0] == pytest.approx(9630.1 / 71.66, rel=1e-3)  # 1 split vs 256 at 128K


def test_latency_curves_and_floor(h200_runs):
    data = D.latency_vs_context(h200_runs.records)
    assert data.copy_bandwidth_tbps == pytest.approx(4.1807, rel=1e-4) and data.timing_mode == "graph"
    for batch in (1, 16):
        names = [c.backend for c in data.curves[batch]]
        assert names == ["flashmla", "triton-persistent", "triton-splitkv"]
        for curve in data.curves[batch]:
            for p in curve.points:
                raw = _raw_best(curve.backend, batch, p.context_len)
                assert (p.median_us, p.pct_of_floor, p.params) == (raw["stats"]["median_us"], raw["pct_of_floor"],
                                                                   raw["params"])
        floors = {r["context_len"]: r["floor_us"] for r in raw_records() if r["batch"] == batch}
        assert data.floor_us[batch] == sorted(floors.items())


def test_an_incorrect_point_never_wins(h200_runs):
    records = [r.model_copy(deep=True) for r in h200_runs.records]
    fastest = min((r for r in records if r.backend == "triton-splitkv" and r.batch == 1 and r.context_len == 131072),
                  key=lambda r: r.stats.median_us)
    fastest.status = "incorrect"
    curve = D.split_sweep(records, "triton-splitkv")[1][2]
    assert curve.best_splits == 192 and curve.statuses[-1] == "incorrect" and curve.median_us[-1] is None
    assert D.split_heatmap([curve]).ratio[0][-1] is None
    latency = D.latency_vs_context(records)
    splitkv = next(c for c in latency.curves[1] if c.backend == "triton-splitkv")
    assert splitkv.points[-1].params == {"num_kv_splits": 192}


def test_persistent_vs_splitkv_speedups(h200_runs, families):
    points = D.persistent_vs_splitkv(h200_runs.records, families)
    assert len(points) == 2 * 3 * 2  # (flashmla, triton-persistent) x contexts x batches
    for p in points:
        split = _raw_best("triton-splitkv", p.batch, p.context_len)["stats"]["median_us"]
        pers = _raw_best(p.persistent, p.batch, p.context_len)["stats"]["median_us"]
        assert p.speedup == pytest.approx(split / pers) and p.split_kv == "triton-splitkv"
    by = {(p.batch, p.context_len, p.persistent): round(p.speedup, 2) for p in points}
    assert by[(16, 131072, "flashmla")] == 1.36 and by[(1, 4096, "flashmla")] == 0.59


def test_split_kv_backends_need_more_than_one_split_count(h200_runs, families):
    assert D.split_kv_backends(h200_runs.records, families) == ["triton-splitkv"]
    one = [r for r in h200_runs.records if r.params.get("num_kv_splits") in (None, 16)]
    assert D.split_kv_backends(one, families) == []


def test_serving_tpot_matches_the_serve_bench_table(serve_runs):
    data = D.serving_tpot(serve_runs.serve_runs[0])
    table = json.loads((SERVE_RUN / "table.json").read_text())
    expected = {(row["concurrency"], c["variant"]): (c["tpot_mean_ms"], c["speedup"])
                for row in table["rows"] for c in row["cells"]}
    assert {(b.concurrency, b.variant): (b.tpot_ms, b.speedup) for b in data.bars} == expected
    assert data.baseline == "running" and data.concurrencies == [1, 16] and data.variants == ["running", "launched"]
    assert "128 in / 16 out" in data.workload


def test_readable_numbers_and_one_colour_per_backend():
    assert [style.sig3(v) for v in (7361.4, 71.66, 14.734, 0.28841, 9.996, 1000.4)] == \
        ["7360", "71.7", "14.7", "0.288", "10.0", "1000"]
    assert style.speedup_text(1.3562) == "1.36×" and style.ratio_text(134.4) == "134"
    assert [style.context_text(c) for c in (4096, 100000, 131072, 777)] == ["4K", "100k", "128K", "777"]
    names = ["triton-splitkv", "triton-persistent", "flashmla", "aiter-asm", "aiter-gluon", "torch-splitkv"]
    assert len({style.backend_color(n) for n in names}) == len(names)
    from mlabench.policy.heuristics import HEURISTICS

    heuristics = {style.heuristic_color(h.name) for h in HEURISTICS}
    assert len(heuristics) == len(HEURISTICS) and not heuristics & {style.backend_color(n) for n in names}
    assert style.backend_color("some-new-backend") == style.backend_color("some-new-backend")


def test_every_registered_backend_has_a_fixed_colour_of_its_own(families):
    """gluon-splitkv took a spare colour (a hash of its name), which an unknown backend may take too."""
    from mlabench.policy.heuristics import HEURISTICS

    fixed = {name: style.BACKEND_COLORS.get(name) for name in families}
    assert None not in fixed.values(), [n for n, c in fixed.items() if c is None]
    assert len(set(fixed.values())) == len(fixed)
    others = set(style._SPARE_COLORS) | {style.heuristic_color(h.name) for h in HEURISTICS}
    assert not set(fixed.values()) & others


def test_the_heat_map_tells_a_count_not_run_from_one_that_failed():
    """A sweep need not run every count at every context: such a cell is 'not measured', not
    'not correct' (the gluon-splitkv heat map of a committed run drew both as ✗)."""
    from mlabench.report.figures.data import SplitCurve, split_heatmap

    curve = SplitCurve(4096, [8, 16, 32], [20.0, None, None], ["ok", "incorrect", "missing"], 8, 20.0)
    heat = split_heatmap([curve])
    assert heat.ratio == [[1.0, None, None]]
    assert heat.measured == [[True, True, False]]


def test_the_floor_says_whose_bandwidth_it_is_and_small_bandwidths_keep_their_digits(h200_runs):
    """Issue 25 item 14: a report over two runs drew one floor line labelled with one run's
    bandwidth, and a CPU run's 0.0037 TB/s printed as 0.00 TB/s."""
    one = D.latency_vs_context(h200_runs.records)
    assert D.floor_text(one) == "copy bandwidth (4.18 TB/s)"
    other = [r.model_copy(update={"copy_bandwidth_tbps": 4.40, "floor_us": r.floor_us * 4.1807 / 4.40})
             for r in h200_runs.records if r.floor_us]
    two = D.latency_vs_context(list(h200_runs.records) + other)
    assert D.floor_text(two) == "copy bandwidth (4.4 TB/s, the highest of the runs': 4.4, 4.18 TB/s)"
    assert two.floor_us[1][0][1] == pytest.approx(min(r.floor_us for r in other if r.batch == 1))
    assert style.tbps_text(0.0037) == "0.0037 TB/s" and style.tbps_text(4.4612) == "4.46 TB/s"


def test_serving_of_several_input_lengths_keeps_them_apart(serve_runs):
    """A run of two input lengths: the report's table has a row per (input len, concurrency) and the
    figure a bar per (input length, concurrency, variant), never an average of the lengths."""
    from mlabench.report.sections import serve_environment, serving_section

    run = serve_runs.serve_runs[0]
    conf = run.config.model_copy(update={"bench": run.config.bench.model_copy(
        update={"random_input_len": [64, 128], "num_prompts": {1: 3, 16: 16}})})
    results = [r.model_copy(update={"input_len": n, "tpot": r.tpot.model_copy(update={"mean_ms": r.tpot.mean_ms * k})})
               for n, k in ((64, 1.0), (128, 2.0)) for r in run.results]
    two = type(run)(run.path, run.manifest, conf, results)
    data = D.serving_tpot(two)
    assert data.input_lens == [64, 128]
    assert {(b.input_len, b.concurrency, b.variant): b.tpot_ms for b in data.bars} == \
        {(n, r.concurrency, r.variant): r.tpot.mean_ms * k for n, k in ((64, 1.0), (128, 2.0)) for r in run.results}
    assert "64, 128 in / 16 out" in data.workload and "3 at c=1, 16 at c=16 prompts" in data.workload
    (table,) = [b.table for b in serving_section(type(serve_runs)(serve_runs=[two]), []) if hasattr(b, "table")]
    assert table.columns[:2] == ["input len", "concurrency"] and [r[:2] for r in table.rows] == \
        [["64", "1"], ["64", "16"], ["128", "1"], ["128", "16"]]
    assert "64, 128 in / 16 out tokens, 3 at c=1, 16 at c=16 prompts" in dict(serve_environment(two).rows)["workload"]


def test_serving_bars_of_every_input_length_and_the_lengths_a_variant_does_not_run(tmp_path):
    """Issue 33: the figure of a run of 4K, 32K and 100K drew 100K only, and a variant that runs
    fewer lengths (its own bench.random_input_len) as "missing" there."""
    from mlabench.report.runs import load_runs
    from tests.report.serve_runs import LENS, TPOT_MS, write_serve_run

    data = D.serving_tpot(load_runs([write_serve_run(tmp_path)]).serve_runs[0])
    assert data.input_lens == LENS and data.variants == ["mlabench", "flashmla", "triton"]
    assert len(data.bars) == 3 * 2 * 3
    for variant, points in TPOT_MS.items():
        for (n, conc), tpot in points.items():
            bar = data.bar(variant, conc, n)
            assert bar.tpot_ms == tpot and bar.planned and bar.status == "ok"
            assert bar.speedup == pytest.approx(TPOT_MS["flashmla"][(n, conc)] / tpot)
    for conc in (1, 16):
        bar = data.bar("triton", conc, 100000)
        assert not bar.planned and bar.tpot_ms is None and bar.speedup is None


def test_serving_bars_carry_the_tpot_predicted_from_the_sweeps_given(tmp_path):
    """`plot --from SERVE_RUN --from SWEEP_RUN`: each bar the run's [prediction] covers gets the TPOT
    `serve-bench --predict-from` prints (it was only printed); a variant without a kernel gets none."""
    from mlabench.deploy.prediction import PredictionSpec, measured_step, prediction_rows
    from mlabench.records.store import records_of
    from mlabench.report.runs import load_runs
    from tests.report.serve_runs import PREDICTION, PREDICTION_SWEEP, TPOT_MS, write_serve_run

    runs = load_runs([write_serve_run(tmp_path, prediction=PREDICTION), PREDICTION_SWEEP])
    data = D.serving_tpot(runs.serve_runs[0], records=runs.records)
    measured = {(v, n, c): measured_step(c, t, None) for v, points in TPOT_MS.items() for (n, c), t in points.items()}
    rows = prediction_rows(PredictionSpec.of(PREDICTION, TPOT_MS), measured, records_of([PREDICTION_SWEEP]))
    # the synthetic run records no ITL: every step is its TPOT (with a median ITL, c=16 gets no dash)
    expected = {(r["variant"], r["input_len"], r["concurrency"]): r["predicted_ms"] for r in rows}
    assert {(b.variant, b.input_len, b.concurrency): b.predicted_ms for b in data.bars if b.planned} == expected
    assert sum(p is not None for p in expected.values()) == 12 and data.predicted_note == ""
    assert data.bar("flashmla", 1, 4096).predicted_ms == pytest.approx(8.12)  # the reference, by construction
    assert data.bar("triton", 16, 4096).predicted_ms is None
    plain = D.serving_tpot(load_runs([write_serve_run(tmp_path / "plain")]).serve_runs[0], records=runs.records)
    assert all(b.predicted_ms is None for b in plain.bars)
    assert plain.predicted_note.startswith("the serve config has no [prediction] table")
    assert D.serving_tpot(runs.serve_runs[0]).predicted_note == ""  # no sweep given: nothing to say


def test_the_serve_environment_names_the_commands_file_the_run_has(tmp_path):
    """The committed H200 serve run keeps commands.txt.gz; the report named a commands.txt that is not there."""
    import gzip

    from mlabench.report.runs import load_runs
    from mlabench.report.sections import serve_environment
    from tests.report.serve_runs import write_serve_run

    run_dir = write_serve_run(tmp_path)
    (run_dir / "commands.txt.gz").write_bytes(gzip.compress(b"vllm bench serve\n"))
    rows = dict(serve_environment(load_runs([run_dir]).serve_runs[0]).rows)
    assert rows["commands"] == str(run_dir / "commands.txt.gz")


def test_the_serve_environment_gives_the_warmups_of_each_concurrency(tmp_path, serve_runs):
    """A run of `num_warmups = { 1 = 1, 16 = 16 }` (its manifest keeps the table with string keys, as
    JSON does) reads back and says so; a recorded run of one number (`"num_warmups": 1`) still reads."""
    import json

    from mlabench.report.runs import load_runs
    from mlabench.report.sections import serve_environment
    from tests.report.serve_runs import write_serve_run

    run_dir = write_serve_run(tmp_path)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["config"]["bench"]["num_warmups"] = {"1": 1, "16": 16}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    run = load_runs([run_dir]).serve_runs[0]
    assert run.config.bench.num_warmups == {1: 1, 16: 16}
    assert "3 at c=1, 16 at c=16 prompts, 1 warm-up at c=1, 16 at c=16, request rate" in \
        dict(serve_environment(run).rows)["workload"]
    (old,) = serve_runs.serve_runs
    assert old.config.bench.num_warmups == 1 and ", 1 warm-up, " in dict(serve_environment(old).rows)["workload"]
