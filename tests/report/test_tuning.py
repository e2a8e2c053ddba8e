"""The tuning figures (f) and the graph-check figure (g): their data against the committed H200 runs
(read as plain JSON here, not through mlabench), what is skipped and why, how runs are recognised,
the figures drawn, and the report's sections."""

import json
import shutil
import sys

import pytest

from mlabench import cli
from mlabench.errors import ResultsError
from mlabench.report.figures import graph_check_data as G, style, tuning_data as T, tuning_types as TT
from mlabench.report.figures.plan import plan, write_figures
from tests.report.conftest import FIXTURES, GRAPH_CHECK, REPO, TUNE, TUNE_RUN, VALIDATE_RUN, raw_records
from tests.report.test_figures import assert_real_png

CHOSEN_B1 = [23, 69, 91, 124, 130, 253, 254, 256]  # tune.md and policy.md of the committed run
CHOSEN_B16 = [8] + [16] * 7


def test_tuning_and_validation_runs_are_their_own_kinds(tune_runs):
    assert [t.path for t in tune_runs.tune_runs] == [TUNE_RUN]
    assert [v.path for v in tune_runs.validation_runs] == [VALIDATE_RUN]
    assert tune_runs.records == [] and tune_runs.kernel_runs == []  # never mixed into the sweep figures
    assert len(tune_runs.tune_runs[0].records) == 640 and tune_runs.tune_runs[0].policy.backend == "triton-splitkv"
    assert tune_runs.validation_runs[0].policy_run_id == TUNE_RUN.name
    assert len(tune_runs.validation_runs[0].points) == 48 and tune_runs.device_name == "NVIDIA H200"


def test_the_choice_per_bucket_is_the_policys(tune_runs):
    run = tune_runs.tune_runs[0]
    choices = T.study_choices(run)
    by_batch = {b: [c for c in choices if c.study.batch == b] for b in (1, 16)}
    assert [c.chosen["num_kv_splits"] for c in by_batch[1]] == CHOSEN_B1
    assert [c.chosen["num_kv_splits"] for c in by_batch[16]] == CHOSEN_B16
    raw = raw_records(TUNE_RUN)
    for c in choices:
        mine = [r for r in raw if r["batch"] == c.study.batch and r["context_len"] == c.study.length]
        assert c.configs == c.ok == len(mine) == 40
        assert c.fastest_us == min(r["stats"]["median_us"] for r in mine)
        assert c.chosen_us == next(r["stats"]["median_us"] for r in mine if r["params"] == c.chosen)
    first = by_batch[1][0]
    assert (first.study.bucket, first.study.length, first.best_heuristic) == ("1-1024", 724, "aiter-gluon-0.1.19")
    assert (round(first.chosen_us, 2), round(first.heuristic_us, 2), round(first.speedup, 2)) == (10.51, 12.77, 1.22)
    assert [c.best_heuristic for c in by_batch[1][5:]] == ["sglang", "vllm-triton", "vllm-triton"]


def test_the_history_is_each_studys_trials_in_order_with_the_best_so_far(tune_runs):
    history = T.tuning_history(tune_runs.tune_runs[0])
    assert sorted(history) == [1, 16] and [len(history[b]) for b in (1, 16)] == [8, 8]
    raw = raw_records(TUNE_RUN)
    for batch, studies in history.items():
        for h in studies:
            mine = [r for r in raw if r["batch"] == batch and r["context_len"] == h.study.length]
            assert [t.params for t in h.trials] == [r["params"] for r in mine]
            times = [r["stats"]["median_us"] for r in mine]
            assert [t.best_so_far_us for t in h.trials] == [min(times[:i + 1]) for i in range(len(times))]
            assert sum(t.chosen for t in h.trials) == 1
    first = history[1][0].trials
    assert [(t.params["num_kv_splits"], t.heuristics) for t in first[:5]] == [
        (1, ["vllm-triton"]), (242, ["sglang"]), (12, ["aiter-gluon-0.1.19"]), (256, ["aiter-gluon-0.1.20"]),
        (16, ["rocm-buckets"])]
    assert not any(t.heuristics for t in first[5:])
    # at batch 16, 5793 tokens, three heuristics ask for 16 splits: one configuration, measured once
    assert history[16][2].trials[0].heuristics == ["vllm-triton", "aiter-gluon-0.1.19", "aiter-gluon-0.1.20"]


def test_policy_steps_against_the_heuristics(tune_runs):
    run = tune_runs.tune_runs[0]
    steps = {p.batch: p for p in T.policy_steps(run, tune_runs.validation_runs)}
    b1, b16 = steps[1], steps[16]
    at = dict(zip(b1.policy.lengths, b1.policy.splits))
    assert (at[1024], at[1025], at[131072]) == (23, 69, 256)  # steps at the bucket edges
    assert all(s == run.policy.lookup(1, n)["num_kv_splits"] for n, s in at.items())
    heur = {h.name: dict(zip(h.lengths, h.splits)) for h in b1.heuristics}
    assert sorted(heur) == ["aiter-gluon-0.1.19", "aiter-gluon-0.1.20", "rocm-buckets", "sglang", "vllm-triton"]
    # vLLM: min(next_pow2(L // 512), 2 x 132 SMs); AITER <= 0.1.19: min(256, ceil(L / 64)); ROCm buckets
    assert heur["vllm-triton"][65536] == 128 and heur["vllm-triton"][1025] == 2
    assert heur["aiter-gluon-0.1.19"][1025] == 17 and heur["aiter-gluon-0.1.19"][65536] == 256
    assert set(heur["aiter-gluon-0.1.20"].values()) == {256}
    assert heur["rocm-buckets"][4096] == 16 and heur["rocm-buckets"][4097] == 48
    assert set(dict((h.name, set(h.splits)) for h in b16.heuristics)["aiter-gluon-0.1.20"]) == {16}
    assert b1.edges == [1024, 4096, 8192, 16384, 32768, 65536, 100000, 131072]
    assert b1.fastest[0] == (724, 24) and b16.fastest[-1] == (114487, 33)
    points = json.loads((VALIDATE_RUN / "validation.json").read_text())
    assert b1.held_out_best == [(p["context_len"], p["best_params"]["num_kv_splits"]) for p in points
                                if p["batch"] == 1]
    assert T.policy_steps(run)[0].held_out_best == []  # without its validation


def test_regret_per_held_out_point(tune_runs):
    panels = {p.batch: p for p in T.validation_regret(tune_runs.validation_runs[0])}
    points = json.loads((VALIDATE_RUN / "validation.json").read_text())
    for batch, panel in panels.items():
        mine = [p for p in points if p["batch"] == batch]
        assert panel.policy.lengths == [p["context_len"] for p in mine]
        assert panel.policy.regret_pct == pytest.approx([100 * (p["policy_us"] / p["best_us"] - 1) for p in mine])
        sglang = next(c for c in panel.heuristics if c.name == "sglang")
        assert sglang.regret_pct == pytest.approx([100 * (p["heuristics"]["sglang"]["us"] / p["best_us"] - 1)
                                                   for p in mine])
    b1, b16 = panels[1], panels[16]
    # validate.md: batch 1 at 2381 tokens 17.36% (the worst), geomean 4.86%; batch 16 worst 3.74%, geomean 0.202%
    assert round(b1.policy.regret_pct[b1.policy.lengths.index(2381)], 2) == 17.36
    assert (round(b1.policy.worst_pct, 2), round(b1.policy.geomean_pct, 2)) == (17.36, 4.86)
    assert (round(b16.policy.worst_pct, 2), round(b16.policy.geomean_pct, 3)) == (3.74, 0.202)
    assert round(next(c for c in b1.heuristics if c.name == "vllm-triton").geomean_pct, 2) == 96.95
    assert b1.edges[-1] == 131072


def test_graph_check_slowdown_per_context(graph_check_runs):
    assert sorted(g.path.name for g in graph_check_runs.graph_checks) == [
        "graph_check_persistent.json", "graph_check_splitkv.json"]
    (data,) = G.graph_check_slowdown(graph_check_runs.graph_checks)
    assert data.tolerance_pct == 5.0 and data.capture == "captured at 1 token per request"
    assert data.where == "device not recorded in the file · 12 heads · page 64 · bf16"
    curves = {(b, c.subject): c for b, cs in data.curves.items() for c in cs}
    host, device = curves[(1, "triton-splitkv split_policy=host")], curves[(1, "triton-splitkv split_policy=device")]
    raw = {(r["subject"], r["batch"], r["context"]): r["slowdown_pct"]
           for r in json.loads((GRAPH_CHECK / "graph_check_splitkv.json").read_text())[0]["rows"]}
    assert host.at(100000) == raw[("triton-splitkv split_policy=host", 1, 100000)]
    assert (round(host.at(100000), 1), round(device.at(100000), 1)) == (80.2, -4.0)  # the folder's README
    assert host.flagged == [False, True, True, True, True, True] and not any(device.flagged)
    assert host.backend == "triton-splitkv" and curves[(16, "flashmla")].contexts[-1] == 131072
    assert G.where_text(["device: NVIDIA H200", "heads=8 page=16 float16; x"]) == "NVIDIA H200 · 8 heads · page 16 · fp16"


def test_a_graph_check_file_is_read_by_name_and_anything_else_refused(tmp_path, monkeypatch, capsys):
    from mlabench.report.runs import load_runs

    runs = load_runs([GRAPH_CHECK / "graph_check_splitkv.json"])
    assert [g.name for g in runs.graph_checks] == ["graph_check_splitkv"] and not runs.manifests
    with pytest.raises(ResultsError, match="not a graph-check result"):
        load_runs([TUNE_RUN / "policy.json"])
    monkeypatch.setattr(sys, "argv", ["mlabench", "plot", "--from", str(TUNE_RUN / "manifest.json")])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ") and "graph-check" in err


def _cut_tune_folder(tmp_path, policy=True, validation=True):
    """The committed tuning folder with only what a test needs: policy.json, validation.json optional."""
    out = tmp_path / "tune"
    for run in (TUNE_RUN, VALIDATE_RUN):
        dest = out / run.name
        dest.mkdir(parents=True)
        for name in ("manifest.json", "results.jsonl.gz"):
            shutil.copy(run / name, dest / name)
    if policy:
        shutil.copy(TUNE_RUN / "policy.json", out / TUNE_RUN.name / "policy.json")
    if validation:
        shutil.copy(VALIDATE_RUN / "validation.json", out / VALIDATE_RUN.name / "validation.json")
    return out


def test_an_unfinished_tuning_run_and_validation_say_what_is_missing(tmp_path):
    from mlabench.report.build import build_report
    from mlabench.report.document import to_markdown_document
    from mlabench.report.runs import load_runs

    runs = load_runs([_cut_tune_folder(tmp_path, policy=False, validation=False)])
    specs, skipped = plan(runs)
    assert [s.stem for s in specs] == ["tuning-history-b1", "tuning-history-b16"]
    why = {s.kind: s.reason for s in skipped}
    assert why["tuned-policy"].startswith(f"tuning run {TUNE_RUN.name} has no policy.json (unfinished")
    assert why["tuning-regret"] == "the validation runs given have no validation.json"
    text = to_markdown_document(build_report(runs).blocks)
    assert f"> **Missing:** tuning run {TUNE_RUN.name} has no policy.json" in text
    assert "has no validation.json (an interrupted validation)" in text
    assert "| 1 | 1-1024 | 724 | 40 | 40 | — | — | num_kv_splits=24 | 10.5 |" in text  # no choice without a policy


def test_runs_of_two_devices_are_refused(tmp_path):
    from mlabench.report.runs import load_runs
    from tests.report.conftest import H200

    folder = _cut_tune_folder(tmp_path)
    manifest = json.loads((folder / TUNE_RUN.name / "manifest.json").read_text())
    manifest["device"]["name"] = "AMD Instinct MI300X"
    (folder / TUNE_RUN.name / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ResultsError, match="runs from different devices do not compare"):
        load_runs([H200, folder])


def test_every_tuning_and_graph_check_figure_is_drawn(tune_runs, graph_check_runs, tmp_path):
    from mlabench.report.runs import Runs

    runs = Runs(tune_runs=tune_runs.tune_runs, validation_runs=tune_runs.validation_runs,
                graph_checks=graph_check_runs.graph_checks)
    kinds = ["tuned-policy", "tuning-history", "tuning-regret", "graph-check"]
    written, skipped = write_figures(runs, tmp_path, kinds, formats=("png",))
    assert not skipped and [spec.stem for spec, _ in written] == [
        "tuned-policy", "tuning-history-b1", "tuning-history-b16", "tuning-regret", "graph-check"]
    for _spec, (png,) in written:
        assert_real_png(png)


def _line_colors(fig):
    """``{label: colour}`` of ``fig``'s lines; a heuristic's label without what it says of the policy."""
    return {line.get_label().split(" (= the policy")[0]: line.get_color() for ax in fig.axes for line in ax.get_lines()}


def test_titles_units_legends_and_colours(tune_runs, graph_check_runs):
    from mlabench.report.runs import Runs

    runs = Runs(tune_runs=tune_runs.tune_runs, validation_runs=tune_runs.validation_runs,
                graph_checks=graph_check_runs.graph_checks)
    specs, _ = plan(runs, ["tuned-policy", "tuning-history", "tuning-regret", "graph-check"])
    figs = {s.stem: s.draw() for s in specs}
    where = "NVIDIA H200 · 12 heads (kimi-k3 at TP8) · page 64 · bf16 · CUDA graph replay, cold cache"
    for stem in ("tuned-policy", "tuning-history-b1"):
        assert where in figs[stem]._suptitle.get_text()
    assert "12 heads · page 64 · bf16" in figs["tuning-regret"]._suptitle.get_text()
    for fig in figs.values():  # one legend, outside the panels
        assert len(fig.legends) == 1 and not any(ax.get_legend() for ax in fig.axes)
    policy_axes = figs["tuned-policy"].axes
    assert [a.get_title() for a in policy_axes] == ["batch 1", "batch 16"]
    assert "num_kv_splits" in policy_axes[0].get_ylabel() and "tokens" in policy_axes[0].get_xlabel()
    history = [a for a in figs["tuning-history-b1"].axes if a.get_visible()]
    assert len(history) == 8 and "µs" in history[0].get_ylabel() and "trial" in history[-1].get_xlabel()
    assert history[0].get_title() == "≤ 1K (at 724)\nchose 23 splits, 10.5 µs"
    regret_axes = figs["tuning-regret"].axes
    assert "regret" in regret_axes[0].get_ylabel() and "%" in regret_axes[0].get_ylabel()
    assert regret_axes[0].get_title() == "batch 1: policy worst 17.4%, geomean 4.86%"
    assert "%" in figs["graph-check"].axes[0].get_ylabel()
    # one colour per backend and per heuristic, the same in every figure
    for stem in ("tuned-policy", "tuning-regret"):
        colors = _line_colors(figs[stem])
        assert colors["tuned policy (triton-splitkv)"] == style.backend_color("triton-splitkv")
        assert all(colors[h] == style.heuristic_color(h) for h in style.HEURISTIC_COLORS)
    colors = _line_colors(figs["graph-check"])
    assert colors["triton-splitkv split_policy=host"] == style.backend_color("triton-splitkv")
    assert colors["flashmla"] == style.backend_color("flashmla")


def test_the_report_fills_the_tuning_and_graph_check_sections(tmp_path):
    from mlabench.report.build import write_report
    from mlabench.report.runs import load_runs

    path = write_report(load_runs([TUNE, GRAPH_CHECK]), tmp_path, "markdown")
    text = path.read_text()
    assert "# mlabench report: NVIDIA H200 · kimi-k3 TP8" in text and "no tuning run among" not in text
    assert f"### Tuning run {TUNE_RUN.name}" in text and f"### Validation run {VALIDATE_RUN.name}" in text
    assert ("| 1 | 1-1024 | 724 | 40 | 40 | num_kv_splits=23 | 10.5 | num_kv_splits=24 | 10.5 | "
            "aiter-gluon-0.1.19 (num_kv_splits=12) | 12.8 | 1.22 |") in text
    assert "| 16 | 131072 | num_kv_splits=16 |" in text  # the policy, merged buckets
    assert "| 1 | 24 | 17.4 | 4.86 | 4.44 |" in text and "| all | 48 | 17.4 | 2.51 | 2.30 |" in text
    assert "| triton-splitkv split_policy=host | 1 | 100000 | 126 | 69.8 | 128 | 64 | +80.2 |" in text
    assert "| tuning | tune triton-splitkv; model kimi-k3, TP 8; batch 1, 16; 8 context buckets up to 128K" in text
    for stem in ("tuned-policy", "tuning-history-b1", "tuning-history-b16", "tuning-regret", "graph-check"):
        assert f"![{stem}](figures/{stem}.png)" in text and (tmp_path / "figures" / f"{stem}.png").stat().st_size > 10_000
    assert "> **Missing:** no kernel sweep records" in text and "- skipped latency: no kernel sweep records" in text


def test_a_manifest_without_timing_says_so(tmp_path):
    from mlabench.report.runs import load_runs
    from mlabench.report.sections import kernel_environment

    folder = _cut_tune_folder(tmp_path)
    path = folder / VALIDATE_RUN.name / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["config"]["validate"]["timing"]
    path.write_text(json.dumps(manifest))
    run = load_runs([folder / VALIDATE_RUN.name]).validation_runs[0]
    rows = dict(kernel_environment(run, run.records, "Validation run").rows)
    assert rows["timing"] == "timing settings not recorded in this run's manifest"
    assert rows["validation"].startswith(f"validate the triton-splitkv policy of {TUNE_RUN.name} at 24")


def test_plot_command_draws_a_graph_check_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["mlabench", "plot", "--from", str(GRAPH_CHECK / "graph_check_splitkv.json"),
                                      "--out", str(tmp_path), "--kind", "graph-check"])
    cli.main()
    assert capsys.readouterr().out.split() == [str(tmp_path / "graph-check.png")]
    assert_real_png(tmp_path / "graph-check.png")



def test_a_study_measured_at_several_lengths_is_shown_at_the_one_nearest_its_middle():
    from types import SimpleNamespace

    run = SimpleNamespace(studies=[{"batch": 1, "lo": 1024, "hi": 4096, "length": 2048,
                                    "lengths": [1025, 1626, 2580, 4096]},
                                   {"batch": 1, "lo": 4096, "hi": 16384, "length": 8192,
                                    "lengths": [4097, 8192, 16384]},
                                   {"batch": 16, "lo": 0, "hi": 1024, "length": 724}])  # a one-length run
    assert [(s.bucket, s.length) for s in T.studies_of(run)] == [("1025-4096", 1626), ("4097-16384", 8192),
                                                                  ("1-1024", 724)]


def test_the_trial_axis_has_whole_number_ticks():
    """A study of 12-19 trials (an H200 tuning run, batch 16) got ticks at 2.5, 7.5, ...; the whole-tiles
    run's batch-16 studies have 12-18 trials."""
    from mlabench.report.runs import load_runs

    runs = load_runs([REPO / "results/h200/tune-kimi-k3-tp8/whole-tiles-attempt/tune-kimi-k3-tp8-20261130-213908-441"])
    specs, _ = plan(runs, ["tuning-history"])
    fig = next(s for s in specs if s.stem == "tuning-history-b16").draw()
    fig.canvas.draw()
    axes = [a for a in fig.axes if a.get_visible()]
    assert len(axes) == 8
    for ax in axes:
        assert all(float(t).is_integer() for t in ax.get_xticks())


def test_regret_far_above_1000_percent_still_has_a_labelled_tick_near_it():
    """A CPU validation measured regrets of 9000-35000%; the axis's labels stopped at 1000%."""
    from mlabench.report.figures.draw import _mpl
    from mlabench.report.figures.draw_tuning import _regret_axis

    ax = _mpl().figure.Figure().subplots()
    _regret_axis(ax, 35_000)
    ticks = list(ax.get_yticks())
    assert max(ticks) == 10_000 and ticks[:6] == [0, 2, 4, 6, 8, 10]
    assert ax.get_ylim()[1] >= 35_000
    _regret_axis(ax, 300)
    assert max(ax.get_yticks()) == 200


def test_a_history_panel_names_the_rule_chosen_and_its_count_there():
    from types import SimpleNamespace

    from mlabench.report.figures.draw_tuning import _history_title
    from mlabench.report.figures.tuning_data import StudyHistory

    study = SimpleNamespace(lo=8192, hi=16384, length=10809)
    rule = StudyHistory(study, [], {"num_kv_splits": 113}, 19.1, "num_kv_splits=tiles(L,32,132)")
    assert _history_title(rule) == "8K-16K (at 10809)\nchose tiles(L,32,132) = 113 splits, 19.1 µs"
    fixed = StudyHistory(study, [], {"num_kv_splits": 16}, 80.4)
    assert _history_title(fixed) == "8K-16K (at 10809)\nchose 16 splits, 80.4 µs"


def test_the_environment_says_how_many_visits_a_sweep_took():
    from mlabench.report.runs import load_runs
    from mlabench.report.sections import kernel_environment

    folder = FIXTURES / "h200-visits-attempt"
    runs = load_runs([folder])
    assert [r.manifest.config["visits"] for r in runs.kernel_runs] == [4, 4]
    timing = dict(kernel_environment(runs.kernel_runs[0], runs.records).rows)["timing"]
    assert timing.endswith("; each point in 4 visits spread over the run, samples pooled")
    runs.kernel_runs[0].manifest.config.update(max_visits=12, visit_rel_se=0.003)  # as a run now records
    timing = dict(kernel_environment(runs.kernel_runs[0], runs.records).rows)["timing"]
    assert timing.endswith("; each point in 4 visits spread over the run (up to 12 where they disagreed, until "
                           "their mean's standard error was 0.3% or less), samples pooled")
    old = load_runs([REPO / "results/h200/kimi-k3-tp8"])  # recorded before visits: nothing said
    assert "visits" not in dict(kernel_environment(old.kernel_runs[0], old.records).rows)["timing"]


def test_the_history_shows_a_choice_far_slower_than_the_best():
    """Issue 25 item 12: a CPU tune chose 1 split at 53872 µs where the best took 13017 µs (every
    interval so wide that all tied); the y axis stopped at 3x the best, so the chosen star was off
    the figure.  The axis now reaches the chosen point, and the title says it was a tie."""
    from mlabench.report.figures.draw import _mpl
    from mlabench.report.figures.draw_tuning import _history_panel

    study = TT.Study(1, 0, 48, 48)
    trials = [TT.Trial(1, {"num_kv_splits": 1}, 53872.0, "ok", 53872.0, chosen=True),
              TT.Trial(2, {"num_kv_splits": 4}, 13017.0, "ok", 13017.0)]
    ax = _mpl().figure.Figure().subplots()
    _history_panel(ax, TT.StudyHistory(study, trials, {"num_kv_splits": 1}, 53872.0), "#1f77b4")
    low, high = ax.get_ylim()
    assert low < 13017.0 and high > 53872.0
    stars = [line for line in ax.get_lines() if line.get_marker() == "*"]
    assert [tuple(s.get_ydata()) for s in stars] == [(53872.0,)]


def test_a_choice_of_one_split_is_singular():
    """Issue 25 item 14: the history title said "chose 1 splits"."""
    from mlabench.report.figures.draw_tuning import _history_title

    h = TT.StudyHistory(TT.Study(1, 0, 48, 48), [], {"num_kv_splits": 1}, 53872.0)
    assert _history_title(h) == "≤ 48 (at 48)\nchose 1 split, 53900 µs"


def _display_y(line):
    """Where ``line``'s points land on the canvas, vertically (pixels)."""
    return [round(y, 3) for _x, y in line.get_transform().transform(line.get_xydata())]


def test_a_heuristic_that_coincides_with_the_policy_or_another_stays_visible():
    """The policy's regret line was drawn over the heuristics': where a heuristic ran the policy's
    time (0% beside it at batch 16 of the committed triton-splitkv validation), its line was hidden,
    and two heuristics of the same times hid one another."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from mlabench.report.figures.draw_tuning import policy_steps, regret

    lengths = [1024, 4096, 16384]
    policy = TT.RegretCurve("policy", lengths, [0.0, 2.0, 0.0], [16, 16, 16], 2.0, 0.6)
    same = [TT.RegretCurve(n, lengths, [0.0, 5.0, 0.0], [16, 8, 16], 5.0, 1.6) for n in ("aiter-gluon-0.1.19", "sglang")]
    panel = TT.RegretPanel(16, policy, same, [4096])
    assert TT.same_as_policy([panel, panel]) == {"aiter-gluon-0.1.19": (4, 6), "sglang": (4, 6)}
    steps = TT.PolicySteps(16, TT.SplitSteps("policy", lengths, [16, 16, 16]),
                          [TT.SplitSteps(n, lengths, [16, 16, 16]) for n in ("vllm-triton", "sglang")], [4096], [])
    for fig in (regret([panel], "gluon-splitkv", "t", "w"), policy_steps([steps], "gluon-splitkv", "t", "w")):
        FigureCanvasAgg(fig).draw()
        lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
        mine = lines["tuned policy (gluon-splitkv)"]
        others = [line for label, line in lines.items() if label.split(" ")[0] in ("aiter-gluon-0.1.19", "sglang",
                                                                                  "vllm-triton")]
        assert len(others) == 2 and all(line.get_zorder() > mine.get_zorder() for line in others)
        assert _display_y(others[0]) != _display_y(others[1])  # side by side, not one over the other
    labels = [t.get_text() for t in fig.legends[0].get_texts()] + \
        [t.get_text() for t in regret([panel], "gluon-splitkv", "t", "w").legends[0].get_texts()]
    assert "sglang (= the policy at 2 of 3 points)" in labels


def test_a_policy_exported_again_after_its_validation_is_not_shown_as_the_validated_one(tmp_path):
    """``tune --export RUN --combine geomean`` rewrites RUN's policy.json after a validation of the
    old one; the report showed the new policy's table beside the old one's regret, as if validated."""
    from mlabench.report.build import build_report
    from mlabench.report.document import to_markdown_document
    from mlabench.report.runs import load_runs

    folder = _cut_tune_folder(tmp_path)
    assert "Another policy" not in to_markdown_document(build_report(load_runs([folder])).blocks)
    path = folder / TUNE_RUN.name / "policy.json"
    policy = json.loads(path.read_text())
    policy["batches"][0]["entries"][-1]["params"]["num_kv_splits"] = 7  # batch 1, the longest bucket
    path.write_text(json.dumps(policy))
    text = to_markdown_document(build_report(load_runs([folder])).blocks)
    note = next(line for line in text.splitlines() if line.startswith("Another policy: "))
    assert f"{path} is not the policy this run validated: it launches other parameters at " in note
    assert "num_kv_splits=7" in note and "exported again since (`tune --export`)" in note
