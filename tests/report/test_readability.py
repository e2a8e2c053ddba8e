"""What a reader sees (issue 35 item 17): the graph-check figures of results/h200/deploy (files named
by what differs, a slowdown axis that keeps 3-30% readable beside 6000%, labels apart), and the
labels of hatched bars in persistent-vs-splitkv."""

from __future__ import annotations

from mlabench.report.figures import graph_check_data as G
from mlabench.report.figures.plan import plan
from mlabench.report.runs import load_runs
from tests.report.conftest import QO_LEN_RUN, REPO

DEPLOY = REPO / "results/h200/deploy"


def _boxes_overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_deploy_graph_checks_are_named_by_what_differs_on_a_readable_axis_with_labels_apart():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    runs = load_runs([DEPLOY / "qo1", DEPLOY / "qo4"])
    specs, _ = plan(runs, ["graph-check"])
    assert [s.stem for s in specs] == ["graph-check-qo1", "graph-check-qo4"]   # not graph-check-1, -2
    figs = {s.stem: s.draw() for s in specs}
    qo1 = figs["graph-check-qo1"].axes
    assert qo1[0].get_yscale() == "symlog" and "log scale above" in qo1[0].get_ylabel()   # up to +6440%
    assert figs["graph-check-qo4"].axes[0].get_yscale() == "linear"                       # up to +30%
    canvas = FigureCanvasAgg(figs["graph-check-qo1"])
    canvas.draw()
    renderer = canvas.get_renderer()
    for ax in qo1:
        labels = [t for t in ax.texts if t.get_text().endswith("%")]
        assert len(labels) >= 10
        boxes = [t.get_window_extent(renderer) for t in labels]
        touching = [(labels[i].get_text(), labels[j].get_text()) for i in range(len(boxes))
                    for j in range(i + 1, len(boxes)) if _boxes_overlap(boxes[i], boxes[j])]
        assert not touching, touching


def test_figure_stems_and_label_sides():
    def curve(subject, contexts, pct):
        return G.SlowdownCurve(subject, subject, contexts, pct, [None] * len(pct), [None] * len(pct),
                               [None] * len(pct), [True] * len(pct))

    def data(**facets):
        return G.GraphCheckData({}, 3.0, "", "", facets=facets)

    assert G.figure_stems([data(qo="qo1")]) == ["graph-check"]
    assert G.figure_stems([data(qo="qo1", heads="h12"), data(qo="qo4", heads="h12")]) == [
        "graph-check-qo1", "graph-check-qo4"]
    assert G.figure_stems([data(heads="h12"), data(heads="h12")]) == ["graph-check-1", "graph-check-2"]
    host = curve("host", [1024, 65536, 100000, 131072], [287.0, 5158.0, 6156.0, 6440.0])
    device = curve("device", [1024], [38.0])
    # the lower of two labels at 1K goes below; along a curve, close lengths take turns
    assert G.label_below([host, device]) == {("device", 1024), ("host", 100000)}


def test_labels_on_hatched_bars_are_dark_on_a_white_patch():
    """White bold text over black hatching was hard to read (results/h200/qo-len/figures)."""
    from matplotlib.colors import to_rgb

    runs = load_runs([QO_LEN_RUN])
    spec = next(s for s in plan(runs, ["persistent-vs-splitkv"])[0] if s.stem.endswith("bf16"))
    fig = spec.draw()
    checked = 0
    for ax in fig.axes:
        assert len(ax.patches) == len(ax.texts)
        for bar, label in zip(ax.patches, ax.texts):  # bar_label labels the bars in the order drawn
            assert label.get_text() == f"{bar.get_height():.2f}"
            if bar.get_hatch():
                assert to_rgb(label.get_color()) == (0, 0, 0) and label.get_bbox_patch() is not None
                checked += 1
            else:
                assert to_rgb(label.get_color()) == (1, 1, 1)   # white on a solid bar reads well
    assert checked >= 12


def test_a_serve_run_of_several_input_lengths_gets_a_panel_per_length_and_concurrency(tmp_path, monkeypatch, capsys):
    """Issue 33: a run of 4K, 32K and 100K at concurrency 1 and 16 was drawn at 100K only, on one
    axis (c=1's 7 ms beside c=16's 345 ms), and a variant that does not run 100K as "missing".  Now:
    a panel per (concurrency, input length) on its own axis, every bar labelled with TPOT and
    speedup, "not run" where the variant's config leaves the length out; labels apart and inside."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from tests.report.serve_runs import write_serve_run
    from tests.report.test_figures import assert_real_png, run_cli

    run = write_serve_run(tmp_path, drop=(("mlabench", 32768, 16),))
    code, out, err = run_cli(["plot", "--from", str(run), "--kind", "serving-tpot"], monkeypatch, capsys)
    assert code == 0, err
    assert out.split() == [str(run / "figures" / "serving-tpot.png")]
    assert_real_png(run / "figures" / "serving-tpot.png")
    (spec,), _ = plan(load_runs([run]), ["serving-tpot"])
    fig = spec.draw()
    assert "by input length and concurrency" in fig._suptitle.get_text()
    axes = fig.axes
    assert [a.get_title() for a in axes] == [f"{n} input tokens, concurrency {c}" for c in (1, 16)
                                             for n in (4096, 32768, 100000)]
    texts = {a.get_title(): [t.get_text() for t in a.texts] for a in axes}
    assert texts["4096 input tokens, concurrency 1"] == ["6.31 ms\n1.29×", "8.12 ms\nbaseline", "10.4 ms\n0.78×"]
    assert texts["100000 input tokens, concurrency 16"] == ["345 ms\n1.01×", "347 ms\nbaseline", "not run"]
    assert texts["32768 input tokens, concurrency 16"][0] == "missing"
    assert axes[5].get_ylim()[1] > 300 > 20 > axes[2].get_ylim()[1]  # c=16 at 100K does not flatten c=1
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    for ax in axes:
        frame = ax.get_window_extent(renderer)
        boxes = [t.get_window_extent(renderer) for t in ax.texts]
        assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1 for b in boxes)
        assert not [(i, j) for i in range(len(boxes)) for j in range(i + 1, len(boxes))
                    if _boxes_overlap(boxes[i], boxes[j])], ax.get_title()


def test_plot_of_a_serve_run_and_its_kernel_sweeps_draws_the_predicted_tpot(tmp_path, monkeypatch, capsys):
    """`plot --from SERVE_RUN --from SWEEP_RUN`: black dashes at the predicted TPOT, `pred` in the
    labels, the caption says what they are; without [prediction] the caption says why none."""
    from tests.report.serve_runs import PREDICTION, PREDICTION_SWEEP, write_serve_run
    from tests.report.test_figures import assert_real_png, run_cli

    run = write_serve_run(tmp_path, prediction=PREDICTION)
    code, out, err = run_cli(["plot", "--from", str(run), "--from", str(PREDICTION_SWEEP), "--kind", "serving-tpot",
                              "--out", str(tmp_path / "figs")], monkeypatch, capsys)
    assert code == 0 and out.split() == [str(tmp_path / "figs" / "serving-tpot.png")], err
    assert_real_png(tmp_path / "figs" / "serving-tpot.png")
    (spec,), _ = plan(load_runs([run, PREDICTION_SWEEP]), ["serving-tpot"])
    assert "dashed: TPOT predicted from the sweep runs given" in spec.caption
    fig = spec.draw()
    first = fig.axes[0]
    assert [t.get_text() for t in first.texts] == ["6.31 ms\n1.29×\npred 7.14", "8.12 ms\nbaseline\npred 8.12",
                                                   "10.4 ms\n0.78×"]
    assert len(first.collections) == 2 and "black dashes: TPOT predicted" in fig.get_supxlabel()
    # a new user's dashes disagreed with `serve-bench CONFIG --from-run --predict-from` (another
    # reference) and nothing said which [prediction] drew them
    assert "non-attention time from flashmla, the run's recorded [prediction]" in " ".join(fig.get_supxlabel().split())
    assert "recorded [prediction] (non-attention time from flashmla at its short input length)" in spec.caption
    (plain,), _ = plan(load_runs([write_serve_run(tmp_path / "plain"), PREDICTION_SWEEP]), ["serving-tpot"])
    assert "no TPOT predicted from the sweep runs given: the serve config has no [prediction] table" in plain.caption


def _config_with_reference(path, reference):
    """A serve config of the synthetic run's variants whose [prediction] takes ``reference``."""
    from tests.report.serve_runs import TPOT_MS

    path.write_text('baseline = "flashmla"\n' + "".join(
        f'[[variants]]\nname = "{n}"\nbase_url = "http://127.0.0.1:{8100 + k}"\n' for k, n in enumerate(TPOT_MS))
        + f'[prediction]\nlayers = 61\nreference = "{reference}"\nshort_input_len = 4096\n[prediction.kernels]\n'
        'flashmla = { backend = "flashmla" }\nmlabench = { backend = "gluon-splitkv", by_concurrency = '
        '{ 1 = { num_kv_splits = 132 }, 16 = { num_kv_splits = 16 } } }\n')
    return path


def test_plot_takes_a_configs_prediction_as_serve_bench_does(tmp_path, monkeypatch, capsys):
    """Issue 33: `plot` drew only the run's recorded [prediction], so the README's prediction table
    (`serve-bench CONFIG --from-run RUN --predict-from ...`, the config's reference) had no figure.
    `plot CONFIG --from RUN --from SWEEP` draws the config's, says so, and refuses what serve-bench refuses."""
    from tests.report.serve_runs import PREDICTION, PREDICTION_SWEEP, write_serve_run
    from tests.report.test_figures import run_cli

    run = write_serve_run(tmp_path, prediction=PREDICTION)
    config = _config_with_reference(tmp_path / "ours.toml", "mlabench")
    code, out, err = run_cli(["plot", str(config), "--from", str(run), "--from", str(PREDICTION_SWEEP),
                              "--kind", "serving-tpot", "--out", str(tmp_path / "figs")], monkeypatch, capsys)
    assert code == 0 and out.split() == [str(tmp_path / "figs" / "serving-tpot.png")], err
    # it named the reference of both, the same where only a kernel differed: now it says what differs
    assert f"{run.name}: the config's [prediction] replaces the one the run recorded (reference flashmla -> " \
           "mlabench" in err
    runs = load_runs([run, PREDICTION_SWEEP])
    runs.prediction = (_config_prediction_table(config), f"the [prediction] of {config}")
    (spec,), _ = plan(runs, ["serving-tpot"])
    fig = spec.draw()
    assert fig.axes[0].texts[0].get_text() == "6.31 ms\n1.29×\npred 6.31"  # mlabench, the reference now
    assert f"non-attention time from mlabench, the [prediction] of {config})" in " ".join(fig.get_supxlabel().split())
    assert f"by the [prediction] of {config} (non-attention time from mlabench" in spec.caption
    for argv, said in (([str(config), "--from", str(run)], "error: no sweep run given: with plot a CONFIG only "
                        "gives the [prediction] that predicts TPOT from sweep runs; add --from SWEEP_RUN"),
                       ([str(REPO / "configs/serve/cpu-tiny.toml"), "--from", str(run), "--from", str(PREDICTION_SWEEP)],
                        "cpu-tiny.toml has no [prediction] table"),
                       ([str(config), "--from", str(PREDICTION_SWEEP)], "a CONFIG gives the [prediction] of "
                        "serve-bench runs, and --from gives none")):
        code, _out, err = run_cli(["plot", *argv, "--out", str(tmp_path / "no")], monkeypatch, capsys)
        assert code == 2 and err.startswith("error: ") and said in err and err.count("\n") == 1, err


def _config_prediction_table(path):
    from mlabench.serving.config import load_config

    return load_config(path).prediction


def test_a_bar_has_no_speedup_label_where_the_baseline_has_no_tpot(tmp_path):
    """Issue 33: run 2's figure labelled mlabench at concurrency 1 "—", a speedup over a baseline
    that was never run there; its own bar already says "not run" (or its status)."""
    from tests.report.serve_runs import write_serve_run

    run = write_serve_run(tmp_path, drop=(("flashmla", 100000, 1),))
    (spec,), _ = plan(load_runs([run]), ["serving-tpot"])
    panel = spec.draw().axes[2]  # concurrency 1, 100000 input tokens
    assert panel.get_title() == "100000 input tokens, concurrency 1"
    assert [t.get_text() for t in panel.texts] == ["7.64 ms", "missing", "not run"]
    assert [t.get_text() for t in spec.draw().axes[0].texts][0] == "6.31 ms\n1.29×"  # the baseline ran there


H200_SERVING = REPO / "results/h200/serving"


def test_the_serving_footer_fits_the_figure_and_says_why_bars_have_no_dash(tmp_path):
    """A new user's `plot CONFIG --from RUN --from SWEEP...` of the committed H200 runs: the footer
    naming a long CONFIG path ran off both PNG edges, and nothing said why most bars had no dash
    (concurrency 16: the step is the median ITL; mlabench-host: no host sweep point).  The config's
    host counts are qo1-k3's (96 and 8 splits), which run 2's session's sweeps (qo1: 108 and 16) lack;
    mlabench's policy by a pattern, as the config of run 2's time named it (the run records no launch env)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    text = (REPO / "configs/serve/h200-kimi-k3-tp8-proxy-c16.toml").read_text()
    config = tmp_path / "a-serve-config-in-a-folder-with-a-long-name" / "h200-kimi-k3-tp8-proxy-c16.toml"
    config.parent.mkdir()
    config.write_text(text.replace("device:{env:MLABENCH_SPLIT_POLICY}", "device:*"))
    sweeps = sorted((H200_SERVING / "sweep").glob("kimi-k3-tp8-serving*-20261204-*"))
    assert len(sweeps) == 3, sweeps
    runs = load_runs([H200_SERVING / "serve-20261204T211104Z-h200-proxy", *sweeps])
    runs.prediction = (_config_prediction_table(config), f"the [prediction] of {config}")
    (spec,), _ = plan(runs, ["serving-tpot"])
    fig = spec.draw()
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    box, width = fig._supxlabel.get_window_extent(canvas.get_renderer()), fig.bbox.width
    assert 0 <= box.x0 and box.x1 <= width, (box, width)
    footer = " ".join(fig.get_supxlabel().split())
    assert str(config) in footer.replace("/ ", "/")
    assert "no dash: above concurrency 1 (the predicted step there is the median ITL, not the TPOT drawn); " \
           "mlabench-host at 4096, 32768, 100000 in (no sweep record)" in footer
