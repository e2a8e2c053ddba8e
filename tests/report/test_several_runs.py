"""Figures and tables of several runs read together, and of points run under a split policy, on the
committed runs of results/h200/deploy/."""

import pytest

from mlabench.report.figures import data as D
from mlabench.sweep.summary import sweep_summary
from tests.report.conftest import EMPTY_PROGRAMS


@pytest.fixture(scope="module")
def empty_programs():
    from mlabench.report.runs import load_runs

    return load_runs([EMPTY_PROGRAMS])


def _run(runs, prefix):
    return [r for r in runs.records if r.run_id.startswith(prefix)]


def test_a_split_policy_point_is_placed_at_the_count_it_ran(empty_programs):
    """A point under ``split_policy=host:...`` asked for 64 splits at 4K and ran the policy's 32 (its
    ``effective_params``): the split figures and the best-split table put it at 32, never at 64."""
    policy = _run(empty_programs, "exp-policy-small")
    at_4k = next(c for c in D.split_sweep(policy, "gluon-splitkv")[1] if c.context_len == 4096)
    assert at_4k.splits == [16, 32, 128]  # host: 16 at 1K, 32 at 4K; device: the grid of the largest, 128
    assert at_4k.best_splits == 32 and at_4k.best_us == pytest.approx(8.2398, rel=1e-4)
    assert at_4k.statuses == ["missing", "ok", "ok"]
    table = sweep_summary(policy)
    assert [c for c in table.columns if c.startswith("µs @")] == ["µs @16 splits", "µs @32 splits", "µs @128 splits"]
    row = next(r for r in table.rows if r[table.columns.index("context")] == 4096)
    assert "num_kv_splits=32 " in row[table.columns.index("best params")]
    assert row[table.columns.index("µs @32 splits")] == pytest.approx(8.2398, rel=1e-4)


def test_a_point_without_a_policy_keeps_the_count_it_asked_for(empty_programs):
    plain = _run(empty_programs, "exp-empty-ctas")
    assert D.split_sweep(plain, "gluon-splitkv")[1][0].splits == [16, 128]
    assert all(r.params["num_kv_splits"] == r.effective_params["num_kv_splits"] for r in plain)


def test_runs_read_together_get_split_figures_of_their_own(empty_programs):
    """docs/report.md: records of several runs are never pooled. A folder of two runs gave one
    split-sweep and one heat map with both runs' points in each context's line; now a figure per run,
    each holding that run's points only and naming it."""
    from mlabench.report.figures.plan import plan

    specs, _ = plan(empty_programs, kinds=["split-sweep", "split-heatmap"])
    runs = sorted({r.run_id for r in empty_programs.records})
    expected = [f"{kind}-gluon-splitkv-{run}" for kind in ("split-heatmap", "split-sweep") for run in runs]
    assert sorted(s.stem for s in specs) == expected
    for spec in specs:
        run = next(r for r in runs if spec.stem.endswith(r))
        _data, title, where = spec.draw.args
        assert where.endswith(f" · run {run}") and spec.caption.startswith(f"gluon-splitkv (run {run}): ")
        if spec.kind == "split-sweep":
            mine = [r for r in empty_programs.records if r.run_id == run]
            assert spec.draw.args[0] == D.split_sweep(mine, "gluon-splitkv")
    assert D.runs_apart(_run(empty_programs, "exp-empty-ctas")) == [("", _run(empty_programs, "exp-empty-ctas"))]
