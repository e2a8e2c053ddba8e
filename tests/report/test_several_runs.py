"""Figures and tables of several runs read together, and of points run under a split policy, on the
committed runs of results/h200/deploy/."""

import pytest

from mlabench.report.figures import data as D, style
from mlabench.sweep.summary import sweep_summary
from tests.report.conftest import EMPTY_PROGRAMS, FUSED_MERGE, REPO


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


def test_a_backend_keeps_its_colour_across_runs_and_runs_differ_by_line_style():
    """fused-merge's runs: FlashMLA was navy in one run's curve and brown in the other's (the colour
    was looked up by the label ``backend (run id)``); now the backend's colour in every curve."""
    from matplotlib.colors import to_hex

    from mlabench.report.figures.plan import plan
    from mlabench.report.runs import load_runs

    runs = load_runs([FUSED_MERGE])
    data = D.latency_vs_context(runs.records)
    flashmla = [c for cs in data.curves.values() for c in cs if c.backend == "flashmla"]
    assert sorted(c.run for c in flashmla) == ["kimi-k3-tp8-fused-b1-20261201-212137-781",
                                               "kimi-k3-tp8-fused-b16-20261201-212254-877"]
    assert flashmla[0].label == "flashmla (kimi-k3-tp8-fused-b1-20261201-212137-781)"
    for spec in plan(runs, kinds=["latency", "pct-of-floor"])[0]:
        lines = [line for ax in spec.draw().get_axes() for line in ax.get_lines()
                 if line.get_label().split(" (")[0] in ("flashmla", "gluon-splitkv")]
        assert len(lines) == 7  # batch 1 and 16: both backends; 124, 128, 132: gluon-splitkv
        for line in lines:
            assert to_hex(line.get_color()) == style.backend_color(line.get_label().split(" (")[0]), line
        by_run = {line.get_label().split(" (")[1]: (line.get_linestyle(), line.get_marker()) for line in lines}
        assert len(set(by_run.values())) == len(by_run) == 3


def _legend_box(spec):
    """(figure, its legend, the legend's box as drawn, in pixels)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = spec.draw()
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return fig, fig.legends[0], fig.legends[0].get_window_extent(canvas.get_renderer())


def test_a_long_legend_entry_wraps_inside_a_one_panel_figure():
    """empty-programs' two batch-1 runs, % of floor figure: one panel, and the floor's entry
    naming both runs' bandwidths was wider than the figure (markers cut on the left, text on the
    right)."""
    from mlabench.report.figures.plan import plan
    from mlabench.report.runs import load_runs

    runs = load_runs(sorted(EMPTY_PROGRAMS.glob("exp-empty-ctas-*")) + sorted(EMPTY_PROGRAMS.glob("exp-policy-small-*")))
    for spec in plan(runs, kinds=["latency", "pct-of-floor"])[0]:
        fig, legend, box = _legend_box(spec)
        assert 0 <= box.x0 and box.x1 <= fig.bbox.width and 0 <= box.y0, (spec.stem, box, fig.bbox.width)
        texts = [t.get_text() for t in legend.get_texts()]
        assert any("\n" in t and "the highest of the runs'" in t for t in texts), texts


def test_a_legend_in_fewer_columns_than_entries_fits_as_matplotlib_fills_it(empty_programs):
    """All three empty-programs runs: 4 entries in 3 columns are laid out 2, 1, 1 by matplotlib;
    the fit counted 2 and 2 (two columns) and chose 3 columns, 1.4 times the figure's width."""
    from mlabench.report.figures.plan import plan

    for spec in plan(empty_programs, kinds=["latency", "pct-of-floor"])[0]:
        fig, legend, box = _legend_box(spec)
        assert len(legend.get_texts()) == 4
        assert 0 <= box.x0 and box.x1 <= fig.bbox.width and 0 <= box.y0, (spec.stem, box, fig.bbox.width)


def _tick_texts(fig):
    """Each axes' x tick labels as drawn (after layout)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    return [[t.get_text() for t in ax.get_xticklabels()] for ax in fig.get_axes()]


def test_tick_labels_show_where_the_axis_has_room_for_them():
    """fused-merge: 100k sits 1.31x below 128K, 18 points apart on a panel's axis, and was left
    blank; the split counts 128 and 132, 2 points apart, printed over each other as '1282'."""
    from mlabench.report.figures.plan import plan
    from mlabench.report.runs import load_runs

    specs = {s.kind: s for s in plan(load_runs([FUSED_MERGE]), kinds=["latency", "pct-of-floor", "split-sweep"])[0]}
    for kind in ("latency", "pct-of-floor"):
        assert _tick_texts(specs[kind].draw())[0] == ["1K", "4K", "8K", "16K", "32K", "64K", "100k", "128K"]
    # 128 (64K) and 132 (32K, 100k, 128K) are both best somewhere: they share one label
    assert _tick_texts(specs["split-sweep"].draw())[0] == ["16", "32", "64", "128/132", ""]
    assert style.thin_labels([16, 32, 64, 128, 132], list("abcde"), 1.2) == ["a", "b", "c", "", "e"]


def test_a_starred_split_count_keeps_its_tick_label_over_a_near_neighbour():
    """Where the best split count (starred) is near another count, its label shows, not the
    neighbour's, and two starred counts share one: stars at 132 under a lone '128' read as 128
    (hopper-kernel/run-72fb349, batch 1)."""
    values = [16, 32, 64, 128, 132, 264]
    assert style.thin_labels(values, list("abcdef"), 1.2) == ["a", "b", "c", "d", "", "f"]
    assert style.thin_labels(values, list("abcdef"), 1.2, prefer=[132]) == ["a", "b", "c", "", "e", "f"]
    assert style.thin_labels(values, list("abcdef"), 1.2, prefer=[128]) == ["a", "b", "c", "d", "", "f"]
    assert style.thin_labels([128, 132], ["x", "y"], 1.2, prefer=[128]) == ["x", ""]
    assert style.thin_labels(values, list("abcdef"), 1.2, prefer=[128, 132]) == ["a", "b", "c", "d/e", "", "f"]


def test_the_latency_legend_lists_curves_by_label_then_the_floor_and_the_noise_key():
    """A fresh user's review of the committed serving runs' latency figure: a run drawn only at
    batch 16 stood after "hollow: noisy point", apart from its backend's other runs."""
    from mlabench.report.figures.plan import plan
    from mlabench.report.runs import load_runs

    runs = load_runs([REPO / "results/h200/serving"])
    (spec,), _ = plan(runs, kinds=["latency"])
    _, legend, _ = _legend_box(spec)
    texts = [t.get_text().replace("\n", " ") for t in legend.get_texts()]
    curves = [t for t in texts if not t.startswith(("floor: ", "hollow: "))]
    assert curves == sorted(curves) and texts[len(curves):][0].startswith("floor: "), texts
    assert texts[-1] == "hollow: noisy point", texts
