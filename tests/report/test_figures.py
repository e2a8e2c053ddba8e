"""Every figure kind is drawn, as a valid non-empty PNG and SVG; missing data is skipped with a reason."""

import sys
import xml.etree.ElementTree as ET

import pytest

from mlabench import cli
from mlabench.report.figures.plan import KINDS, SWEEP_KINDS, plan, write_figures
from tests.report.conftest import H200, SERVE

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_real_png(path):
    """A PNG that decodes, is at least 400x200 and is not one flat colour."""
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    pixels = imread(path)
    assert pixels.shape[0] >= 200 and pixels.shape[1] >= 400
    assert pixels[..., :3].std() > 0.05
    assert (pixels[..., :3].min(axis=-1) < 0.9).mean() > 0.02  # some ink, not a blank canvas


def test_every_kind_is_drawn_as_png_and_svg(all_runs, tmp_path):
    written, skipped = write_figures(all_runs, tmp_path, formats=("png", "svg"))
    assert not skipped
    assert sorted({spec.kind for spec, _ in written}) == sorted(KINDS)
    stems = sorted(spec.stem for spec, _ in written)
    assert stems == ["graph-check", "latency-vs-context", "pct-of-floor-vs-context", "persistent-vs-splitkv",
                     "serving-tpot", "split-heatmap-triton-splitkv", "split-sweep-triton-splitkv", "tuned-policy",
                     "tuning-history-b1", "tuning-history-b16", "tuning-regret"]
    for _spec, (png, svg) in written:
        assert_real_png(png)
        root = ET.parse(svg).getroot()
        assert root.tag.endswith("svg") and len(list(root.iter())) > 100


def test_figures_without_data_are_skipped_with_a_reason(serve_runs, h200_runs):
    specs, skipped = plan(serve_runs)
    assert [s.kind for s in specs] == ["serving-tpot"]
    assert {s.kind for s in skipped} == set(KINDS) - {"serving-tpot"}
    why = {s.kind: s.reason for s in skipped}
    assert all(why[k] == "no kernel sweep records among the runs given" for k in SWEEP_KINDS)
    assert why["tuned-policy"] == why["tuning-history"] == "no tuning run (`mlabench tune`) among the runs given"
    assert why["tuning-regret"] == "no validation run (`mlabench tune --validate`) among the runs given"
    assert why["graph-check"].startswith("no graph-check result (the JSON of `mlabench graph-check --save FILE`)")
    specs, skipped = plan(h200_runs, kinds=["serving-tpot", "latency"])
    assert [s.kind for s in specs] == ["latency"]
    assert skipped[0].line() == "skipped serving-tpot: no serve-bench run with a TPOT result among the runs given"


def test_a_figure_title_says_what_and_where(h200_runs):
    specs, _ = plan(h200_runs, kinds=["latency"])
    fig = specs[0].draw()
    title = fig._suptitle.get_text()
    assert "NVIDIA H200" in title and "12 heads (kimi-k3 at TP8)" in title and "graph replay" in title
    axes = fig.get_axes()
    assert [a.get_title() for a in axes] == ["batch 1", "batch 16"]
    assert "µs" in axes[0].get_ylabel() and all("tokens" in a.get_xlabel() for a in axes)
    assert axes[1].get_ylabel() == ""  # one unit, one label (the second ran into the title: a review)
    assert "4.18 TB/s" in " ".join(t.get_text() for t in fig.legends[0].get_texts())


def test_a_figure_of_an_interrupted_run_says_so(h200_runs):
    """A fresh user's review: figures of a run cut short dropped its unmeasured columns and did not
    say the run was interrupted (the report did).  The title's second line says how many points."""
    from dataclasses import replace

    recorded = len({r.key for r in h200_runs.records})
    (run,) = h200_runs.kernel_runs
    cut = replace(h200_runs, kernel_runs=[replace(run, manifest=run.manifest.model_copy(
        update={"planned_points": recorded + 5}))])
    for kind in ("latency", "split-heatmap"):
        specs, _ = plan(cut, kinds=[kind])
        assert f"interrupted: {recorded} of {recorded + 5} points" in specs[0].draw()._suptitle.get_text()
        specs, _ = plan(h200_runs, kinds=[kind])
        assert "interrupted" not in specs[0].draw()._suptitle.get_text()
    from mlabench.report.figures.plan import _interrupted

    assert _interrupted(cut, []) == ""  # a figure of another shape group does not name the run
    assert _interrupted(cut, h200_runs.records[:1]) == f" · interrupted: {recorded} of {recorded + 5} points"


def run_cli(args, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["mlabench", *args])
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def test_plot_command(tmp_path, monkeypatch, capsys):
    code, out, err = run_cli(["plot", "--from", str(H200), "--from", str(SERVE), "--out", str(tmp_path),
                              "--kind", "split-heatmap", "--kind", "serving-tpot", "--format", "png,svg"],
                             monkeypatch, capsys)
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "serving-tpot.png", "serving-tpot.svg", "split-heatmap-triton-splitkv.png", "split-heatmap-triton-splitkv.svg"]
    assert out.split() == [str(tmp_path / n) for n in ("split-heatmap-triton-splitkv.png",
                                                        "split-heatmap-triton-splitkv.svg",
                                                        "serving-tpot.png", "serving-tpot.svg")]
    code, out, err = run_cli(["plot", "--from", str(SERVE), "--out", str(tmp_path / "twice"), "--kind", "serving-tpot",
                              "--format", "svg,svg"], monkeypatch, capsys)  # a format named twice is drawn once
    assert code == 0 and out.split() == [str(tmp_path / "twice" / "serving-tpot.svg")], err
    code, out, err = run_cli(["plot", "--from", str(SERVE), "--out", str(tmp_path / "none"), "--kind", "latency"],
                             monkeypatch, capsys)
    assert code == 1 and err.startswith("error: no figure to draw") and "no kernel sweep records" in err
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("args, message", [
    (["--kind", "bogus"], "unknown figure kind 'bogus'; known: latency"),
    (["--format", "jpg"], "figure format must be one of png, svg, got 'jpg' (plot writes figure files; its --format is their file format, not a table's)"),
])
def test_plot_command_refuses_bad_flags(args, message, tmp_path, monkeypatch, capsys):
    code, _out, err = run_cli(["plot", "--from", str(SERVE), "--out", str(tmp_path), *args], monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1 and message in err


def test_plot_command_refuses_a_folder_without_runs(tmp_path, monkeypatch, capsys):
    code, _out, err = run_cli(["plot", "--from", str(tmp_path)], monkeypatch, capsys)
    assert code == 2 and err.strip() == f"error: {tmp_path}: no run folder (results.jsonl, manifest.json) here or below"


def test_a_serve_run_with_a_missing_result_still_draws_and_says_so(tmp_path):
    import shutil

    from mlabench.report.figures import data as D
    from mlabench.report.runs import load_runs
    from tests.report.conftest import SERVE_RUN

    run = tmp_path / SERVE_RUN.name
    shutil.copytree(SERVE_RUN, run)
    lines = (run / "results.jsonl").read_text().splitlines()
    (run / "results.jsonl").write_text("\n".join(line for line in lines if '"variant":"launched","concurrency":16'
                                                 not in line) + "\n")
    runs = load_runs([run])
    bars = {(b.variant, b.concurrency): b for b in D.serving_tpot(runs.serve_runs[0]).bars}
    assert bars[("launched", 16)].tpot_ms is None and bars[("launched", 16)].status == "missing"
    written, _ = write_figures(runs, tmp_path / "figs", kinds=["serving-tpot"])
    fig_text = " ".join(t.get_text() for t in written[0][0].draw().axes[0].texts)
    assert "missing" in fig_text and "0.89×" in fig_text
    assert_real_png(written[0][1][0])
    (run / "results.jsonl").write_text("")
    skipped = {s.kind: s.reason for s in plan(load_runs([run]))[1]}
    assert skipped["serving-tpot"] == "no serve-bench run with a TPOT result among the runs given"


def test_figures_per_qo_len_name_the_token_count_and_what_they_leave_out():
    """The committed H200 multi-token run (qo_len 1, 2, 4; gluon-splitkv unsupported above 1 token): the
    one-token figure names its token count beside the others, and a backend with no correct record at a
    qo_len is named as not drawn, with its status, instead of vanishing."""
    from mlabench.report.figures import data as D
    from mlabench.report.runs import load_runs
    from tests.report.conftest import QO_LEN_RUN

    runs = load_runs([QO_LEN_RUN])
    specs, _ = plan(runs, kinds=["latency", "persistent-vs-splitkv"])
    figs = {s.stem: s for s in specs}
    assert sorted(figs) == sorted(f"{k}-h12-p64-bf16{q}" for k in ("latency-vs-context", "persistent-vs-splitkv")
                                  for q in ("", "-qo2", "-qo4"))
    one = figs["latency-vs-context-h12-p64-bf16"].draw()._suptitle.get_text()
    assert " · 1 query token · " in one and "not drawn" not in one
    two = figs["latency-vs-context-h12-p64-bf16-qo2"].draw()
    assert "2 query tokens" in two._suptitle.get_text()
    assert "not drawn: gluon-splitkv (unsupported)" in two._suptitle.get_text().replace("\n", " ")
    assert "gluon-splitkv" not in " ".join(t.get_text() for t in two.legends[0].get_texts())
    bars = figs["persistent-vs-splitkv-h12-p64-bf16-qo4"].draw()
    labels = [t.get_text() for t in bars.legends[0].get_texts()]
    assert labels[:2] == ["flashmla vs triton-splitkv", "triton-persistent vs triton-splitkv"]
    qo1 = [r for r in runs.records if r.qo_len == 1]
    assert D.backends_without_result(qo1) == {}
    assert D.backends_without_result([r for r in runs.records if r.qo_len == 2]) == {"gluon-splitkv": "unsupported"}


def test_one_panel_keeps_its_title_and_legend_inside_the_figure():
    """A sweep of one batch size draws one panel, narrower than most titles and five-column legends:
    the title wraps and the legend takes the columns that fit (they ran off both edges)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from mlabench.report.figures.draw import _dedup_legend, _panels

    fig, (ax,) = _panels(1, "MLA decode latency vs context length, best correct configuration per backend",
                         "AMD EPYC · 12 heads (kimi-k3 at TP8) · page 16 · bf16 · CPU wall clock")
    for label in ("torch-splitkv", "floor: bytes / read bandwidth (0.01 TB/s)", "hollow: noisy point",
                  "fastest split count measured at a held-out length (validation ladder)", "sglang"):
        ax.plot([1, 2], [1, 2], label=label)
    _dedup_legend(fig, [ax], loc="outside lower center", ncol=5)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    for artist in (fig._suptitle, fig.legends[0]):
        box = artist.get_window_extent(renderer)
        assert 0 <= box.x0 and box.x1 <= fig.bbox.width, (artist, box, fig.bbox.width)


def test_context_labels_too_close_to_read_are_left_blank():
    """Issue 25 item 14: on a log axis "100k" and "128K" touched; the longest length keeps its label."""
    from mlabench.report.figures.style import context_labels

    assert context_labels([1024, 4096, 100000, 131072]) == ["1K", "4K", "", "128K"]
    assert context_labels([1024, 1280, 2048, 4096]) == ["1K", "", "2K", "4K"]
    assert context_labels([1024, 4096], log=False) == ["1K", "4K"]
    assert context_labels([100000, 131072], log=False) == ["100k", "128K"]


def _one_split_at_batch_16(records):
    """The fixture's triton-splitkv records with batch 16 cut to one split count (16), as the
    committed run-72fb349 ran it."""
    return [r for r in records if r.backend == "triton-splitkv"
            and (r.batch == 1 or r.params.get("num_kv_splits") == 16)]


def test_each_split_panel_has_its_own_split_counts_and_a_one_split_panel_says_so(h200_runs):
    """A batch that ran one split count drew every other batch's counts as its columns (all '–')
    and ticks, and a column of 'best' stars over its one count."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from mlabench.report.figures import data as D, draw

    curves = D.split_sweep(_one_split_at_batch_16(h200_runs.records), "triton-splitkv")
    assert {c.splits[0] for c in curves[16]} == {16} and all(len(c.splits) == 1 for c in curves[16])
    assert curves[1][0].splits == [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256]
    sweep = draw.split_sweep(curves, "t", "w")
    heat = draw.split_heatmap({b: D.split_heatmap(cs) for b, cs in curves.items()}, "t", "w")
    for fig in (sweep, heat):
        FigureCanvasAgg(fig).draw()
        one, many = fig.get_axes()[1], fig.get_axes()[0]
        assert [t.get_text() for t in one.get_xticklabels() if t.get_text()] == ["16"]
        assert len(many.get_xticks()) == 12
        assert one.get_title() == "batch 16 (only num_kv_splits = 16 ran)" and many.get_title() == "batch 1"
    assert not [line for line in sweep.get_axes()[1].get_lines() if line.get_marker() == "*" and len(line.get_xdata())]
    cells = [t.get_text() for t in heat.get_axes()[1].texts]
    assert len(cells) == 3 and all(c.endswith(" µs") for c in cells)  # no ratio of 1.00 to the only count


def test_heads_given_beside_a_model_claim_no_tp():
    """A fresh user's review: `sweep --model kimi-k3 --heads 12` was labelled 'kimi-k3 TP1' in the
    report's title and '12 heads (kimi-k3 at TP1)' on its figures: Kimi K3 at TP1 has 96 heads."""
    from mlabench.report.figures.plan import _where_text
    from mlabench.report.figures.style import model_text, run_model

    assert run_model({"model": "kimi-k3", "tp": 8, "heads": None}) == ("kimi-k3", 8)
    assert run_model({"model": "kimi-k3", "tp": 1, "heads": [12]}) == ("kimi-k3", None)
    assert model_text("kimi-k3", 8, at=" ") == "kimi-k3 TP8" and model_text(None, 8) == ""
    assert _where_text("H200", 12, *run_model({"model": "kimi-k3", "tp": 1, "heads": [12]}), 1, True, 64, "bf16",
                       "", None).startswith("H200 · 12 heads (kimi-k3's dimensions) · page 64")
