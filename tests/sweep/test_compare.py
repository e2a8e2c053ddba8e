"""`compare --from` without the CLI: which recorded records it reads."""

from pathlib import Path

import pytest

from mlabench.errors import MissingResultError, UnknownBackendError
from mlabench.measure.timing import TimingConfig
from mlabench.backends import backend_families
from mlabench.sweep.compare import recorded_records
from mlabench.sweep.config import SweepConfig
from mlabench.sweep.run import run_sweep


def test_recorded_records_filter_by_batch_context_and_backend(tmp_path):
    cfg = SweepConfig(name="t", heads=[12], batch=[1, 2], context_lens=[16, 32], page_size=16,
                      backends=["torch-splitkv"], params={"num_kv_splits": [1]},
                      timing=TimingConfig(warmup_iters=0, min_samples=3, max_samples=3, budget_s=0.01))
    run_sweep(cfg, tmp_path)
    assert len(recorded_records([tmp_path])) == 4
    kept = recorded_records([tmp_path], batch=[2], context_lens=[32])
    assert [(r.batch, r.context_len) for r in kept] == [(2, 32)]
    with pytest.raises(MissingResultError, match="no recorded point matches --backend triton-splitkv: the runs hold "
                                                 "backends torch-splitkv; batch 1, 2; qo_len 1; context 16, 32"):
        recorded_records([tmp_path], backends=["triton-splitkv"])
    with pytest.raises(UnknownBackendError, match="cutlass"):
        recorded_records([tmp_path], backends=["cutlass"])


def test_compare_needs_both_paths_with_a_correct_record():
    """Runs holding only split-KV records (a tuning run, or --backend of one kind) or no correct
    record at all: exit 1 with the reason, not a table of dashes."""
    from pathlib import Path

    from mlabench.sweep.compare import check_comparable

    mtp = next((Path(__file__).resolve().parents[2] / "results/h200/deploy/mtp").glob("kimi-*"))
    families = backend_families()
    records = recorded_records([mtp], None, None, None, None)
    check_comparable(records, families)  # both paths ran: no error
    split_only = [r for r in records if r.backend == "gluon-splitkv"]
    with pytest.raises(MissingResultError, match="a padded persistent backend .* have gluon-splitkv$"):
        check_comparable(split_only, families)
    failed = [r.model_copy(update={"status": "incorrect"}) for r in records[:5]]
    with pytest.raises(MissingResultError, match="no correct record among the 5 read"):
        check_comparable(failed, families)
    from mlabench.records.record import CPU_RUN_NOTE
    from mlabench.sweep.summary import compare_table

    assert CPU_RUN_NOTE not in compare_table(records, families).notes
    wall = [r.model_copy(update={"timing_mode": "wall"}) for r in records]
    assert CPU_RUN_NOTE in compare_table(wall, families).notes  # a CPU run's compare says what its times are
    # a fresh user's review: both paths, but never at one point (another batch here): a table of one-sided rows
    apart = [r for r in records if r.status == "ok" and (r.batch == 1) == (families.get(r.backend) == "persistent")]
    assert {families.get(r.backend) for r in apart} == {"persistent", "split-kv"}
    with pytest.raises(MissingResultError, match=r"no point has correct records of both paths at the same batch, "
                                                 r"context and shape .*padded persistent: backends .*batch 1;.*"
                                                 r"split-KV: backends .*batch 16;"):
        check_comparable(apart, families)


def _rec(backend, heads, median_us, splits=None, page=64, dtype="bfloat16"):
    from mlabench.measure.stats import summarize
    from mlabench.records.record import Record, point_key, utc_now

    params = {"num_kv_splits": splits} if splits else {}
    shape = {"num_heads": heads, "context_lens": [4096], "page_size": page, "kv_dtype": dtype}
    return Record(key=point_key(backend, params, shape), run_id="r", backend=backend, params=params, shape=shape,
                  batch=1, num_heads=heads, context_len=4096, status="ok", stats=summarize([median_us] * 3),
                  timing_mode="wall", timestamp=utc_now())


def test_every_table_groups_by_and_shows_each_axis_the_runs_vary():
    """Issue 25 item 9: a sweep over --heads 8,12,16 gave one compare row for all three head
    counts (a persistent best and a split-KV best from different heads); every table groups by
    heads (and page size, dtype) when they vary, and says so in a column."""
    from mlabench.sweep.compare import winners_table
    from mlabench.sweep.summary import compare_table, sweep_summary

    families = backend_families()
    recs = [_rec("triton-persistent", h, 10.0 * h) for h in (8, 12, 16)]
    recs += [_rec("torch-splitkv", h, 9.0 * h, splits=s) for h in (8, 12, 16) for s in (1, 4)]
    table = compare_table(recs, families)
    assert table.columns[:3] == ["batch", "heads", "context"]
    assert [(row[1], row[5], row[10]) for row in table.rows] == [(8, 80.0, 72.0), (12, 120.0, 108.0),
                                                                 (16, 160.0, 144.0)]
    summary = sweep_summary(recs)
    assert summary.columns[:4] == ["backend", "batch", "heads", "context"]
    assert [row[:3] for row in summary.rows if row[0] == "torch-splitkv"] == [["torch-splitkv", 1, 8],
                                                                             ["torch-splitkv", 1, 12],
                                                                             ["torch-splitkv", 1, 16]]
    assert not any(n.startswith("heads=") for n in summary.notes)  # no single heads value to name
    two_pages = [_rec("torch-splitkv", 12, 5.0, 1, page=16), _rec("torch-splitkv", 12, 4.0, 1, page=64)]
    assert sweep_summary(two_pages).columns[:4] == ["backend", "batch", "page", "context"]
    assert len(sweep_summary(two_pages).rows) == 2
    mixed = [r.model_copy(update={"qo_len": 2}) for r in recs] + recs
    assert winners_table(mixed, families).columns[:3] == ["batch", "heads", "context"]
    assert len(winners_table(mixed, families).rows) == 3
    one = [r for r in recs if r.num_heads == 12]
    assert "heads" not in compare_table(one, families).columns and "heads" not in sweep_summary(one).columns


def test_two_runs_of_one_grid_are_never_pooled():
    """A new user's report over two runs of the same grid showed, per point, the faster run's time
    (and the other run's noisy flag): every table and the latency figure keep a row or a curve per
    run, with the run named."""
    from mlabench.report.figures.data import latency_vs_context
    from mlabench.sweep.summary import compare_table, sweep_summary

    a = [_rec("torch-splitkv", 12, 9.0, splits=1), _rec("triton-persistent", 12, 10.0)]
    b = [r.model_copy(update={"run_id": "s", "stats": r.stats.model_copy(update={"median_us": 20.0})})
         for r in a]
    summary = sweep_summary(a + b)
    assert summary.columns[:4] == ["backend", "batch", "run", "context"]
    assert [(row[0], row[2], row[5]) for row in summary.rows] == [
        ("torch-splitkv", "r", 9.0), ("torch-splitkv", "s", 20.0),
        ("triton-persistent", "r", 10.0), ("triton-persistent", "s", 20.0)]
    assert len(compare_table(a + b, backend_families()).rows) == 2
    curves = latency_vs_context(a + b).curves[1]
    assert sorted(c.label for c in curves) == ["torch-splitkv (r)", "torch-splitkv (s)",
                                              "triton-persistent (r)", "triton-persistent (s)"]
    assert sorted((c.backend, c.run) for c in curves)[0] == ("torch-splitkv", "r")  # its colour: the backend's
    assert [c.backend for c in latency_vs_context(a).curves[1]] == ["torch-splitkv", "triton-persistent"]


def test_compare_says_when_a_point_reads_above_its_copy_floor():
    """kimi-k3-tp8 (floor at the copy bandwidth): FlashMLA at batch 16 shows 101.3-103.1% of the
    floor, so the table says why, where docs/measuring.md says a read-ceiling run never does."""
    from mlabench.sweep.summary import compare_table

    run = Path(__file__).resolve().parents[2] / "results/h200/kimi-k3-tp8/kimi-k3-tp8-20261130-105953-511"
    notes = compare_table(recorded_records([run], batch=[16]), backend_families()).notes
    assert ("3 points read above 100% of the floor (up to 103.1%): their run put the floor at the copy "
            "bandwidth (4.18 TB/s)") in "\n".join(notes)
    notes = compare_table(recorded_records([run], batch=[1]), backend_families()).notes
    assert not any("above 100%" in n for n in notes)


def test_compare_from_a_folder_reads_the_kernel_runs_at_any_depth(tmp_path, monkeypatch, capsys):
    """`compare --from results/h200/serving` read its serve-bench runs, one level down, as kernel
    runs ("unreadable manifest") and never reached the sweep runs of `sweep/<run>`, two levels down,
    which `report --from` the same folder reads.  Kernel runs are now found at any depth, never
    inside a run folder, and serve-bench runs among them are passed over."""
    import shutil

    from tests.cli.test_cli import run
    from tests.report.serve_runs import PREDICTION_SWEEP, write_serve_run

    serving = tmp_path / "serving"
    serve = write_serve_run(serving)
    sweep = shutil.copytree(PREDICTION_SWEEP, serving / "sweep" / PREDICTION_SWEEP.name)
    (sweep / "kept" / "not-a-run-of-its-own").mkdir(parents=True)  # inside a run folder: never read
    (sweep / "kept" / "not-a-run-of-its-own" / "results.jsonl").write_text("garbled\nlines\n")
    code, out, err = run(["compare", "--from", str(serving), "--json"], monkeypatch, capsys)
    assert code == 0, err
    assert out == run(["compare", "--from", str(PREDICTION_SWEEP), "--json"], monkeypatch, capsys)[1]
    code, out, err = run(["compare", "--from", str(serve)], monkeypatch, capsys)
    assert code == 2 and not out and err == (f"error: compare --from {serve}: a serve-bench run, not a sweep, "
                                             "tune or validation run\n")
    shutil.rmtree(sweep)
    code, out, err = run(["compare", "--from", str(serving)], monkeypatch, capsys)
    assert code == 2 and not out and err == (f"error: compare --from {serving}: no sweep, tune or validation run "
                                             "here or below (only serve-bench runs)\n")


def test_compare_names_the_split_kv_variant_that_won():
    """A variant sweep (gluon-splitkv with multi_token and rows_as_m beside FlashMLA) showed only
    the best split count: which variant won was not in the table (a fresh user's run).  The
    parameters that vary within a cell get a column with the winner's values; a default that
    only differs between batch sizes (pdl) does not."""
    from mlabench.sweep.summary import compare_table

    def variant(us, batch=1, **params):
        r = _rec("gluon-splitkv", 12, us, splits=8)
        return r.model_copy(update={"params": {**r.params, **params}, "batch": batch})

    families = backend_families()
    recs = [_rec("flashmla", 12, 20.0), variant(18.0, pdl=1, multi_token=1, rows_as_m=2),
            variant(17.0, pdl=1, multi_token=1, rows_as_m=3), variant(19.0, pdl=1)]
    table = compare_table(recs, families)
    col = table.columns.index("split-KV params")
    assert table.columns[col - 1:col + 2] == ["best splits", "split-KV params", "split-KV µs"]
    assert [(row[col], row[col + 1]) for row in table.rows] == [("multi_token=1 rows_as_m=3", 17.0)]
    slow = [r.model_copy(update={"stats": r.stats.model_copy(update={"median_us": 30.0})})
            for r in recs[1:3]]
    assert compare_table([recs[0], *slow, recs[3]], families).rows[0][col] == "defaults"
    by_batch = [_rec("flashmla", 12, 20.0), variant(18.0, pdl=1),
                _rec("flashmla", 12, 20.0).model_copy(update={"batch": 16}), variant(30.0, 16, pdl=0)]
    assert "split-KV params" not in compare_table(by_batch, families).columns
    # a split-KV backend without variants gets a dash; a variant asked for but not run (absent
    # from effective_params: multi_token at one token) is no variant, nor is "16 (asked auto)"
    other = _rec("triton-splitkv", 12, 16.0, splits=8)
    rows = compare_table([*recs, other], families).rows
    assert [(row[col - 2], row[col]) for row in rows] == [("gluon-splitkv", "multi_token=1 rows_as_m=3"),
                                                           ("triton-splitkv", None)]
    ran = {"num_kv_splits": 8, "pdl": 1, "rows_per_tile": 16}
    one_token = [r.model_copy(update={"effective_params": ran,
                                      "params": {**r.params, "rows_per_tile": tile}})
                 for r, tile in zip(recs[1:], ("auto", 16, 16))]
    assert "split-KV params" not in compare_table([recs[0], *one_token], families).columns

