"""``mlabench diff`` (issue 13 items 4 and 7) on the samples of the committed H200 run."""

import json
import math
import shutil
from pathlib import Path

import pytest

from mlabench.measure.stats import mean_rel_se, median_rel_ci, summarize
from mlabench.records.store import ResultStore
from mlabench.sweep.diff import diff_runs, diff_tables
from mlabench.sweep.sentinel import append_sentinel
from tests.cli.test_cli import run as mlabench

H200_RUN = Path(__file__).resolve().parents[2] / "results/h200/kimi-k3-tp8/kimi-k3-tp8-20261130-105953-511"


def copy_run(src: Path, dst: Path, scale: float = 1.0, keep=lambda r: True, **manifest_changes) -> Path:
    """A copy of run ``src`` with every sample multiplied by ``scale`` (statistics recomputed from
    the scaled samples), only the records ``keep`` accepts, and the manifest changed."""
    dst.mkdir(parents=True)
    manifest = ResultStore(src).manifest().model_copy(update=manifest_changes)
    (dst / "manifest.json").write_text(manifest.model_dump_json(indent=2))
    store = ResultStore(dst)
    for r in ResultStore(src).records():
        if not keep(r):
            continue
        if r.stats is not None:
            r = r.model_copy(update={"stats": summarize([scale * x for x in r.stats.samples_us])})
        store.append(r)
    return dst


def test_identical_runs_differ_nowhere(tmp_path):
    d = diff_runs(H200_RUN, copy_run(H200_RUN, tmp_path / "b"))
    assert len(d.points) == 272 and not any(p.significant for p in d.points)
    assert all(p.ratio == pytest.approx(1.0) for p in d.points) and not d.manifest_notes
    assert not (d.only_a or d.only_b or d.untimed)


def test_a_diff_of_cpu_runs_says_they_are_no_measurement(tmp_path):
    """A fresh user's review: the diff of two CPU smoke runs called points 'significantly' slower
    with none of the sweep table's CPU-run note."""
    cpu = {**ResultStore(H200_RUN).manifest().device, "kind": "cpu"}
    a = copy_run(H200_RUN, tmp_path / "a", device=cpu)
    notes = diff_tables(diff_runs(a, copy_run(a, tmp_path / "b", scale=1.05)))[0].notes
    assert any(n.startswith("CPU run: a smoke test") for n in notes)
    assert not any(n.startswith("CPU run") for n in diff_tables(diff_runs(H200_RUN, H200_RUN))[0].notes)


def test_every_sample_five_percent_slower_is_significant_everywhere(tmp_path):
    d = diff_runs(H200_RUN, copy_run(H200_RUN, tmp_path / "b", scale=1.05))
    assert len(d.points) == 272 and all(p.significant and p.ratio == pytest.approx(1.05) for p in d.points)
    faster = diff_runs(tmp_path / "b", H200_RUN)
    assert all(p.significant and p.ratio < 1 for p in faster.points)


def test_a_half_percent_shift_within_the_runs_repeat_noise_is_not_significant(tmp_path):
    """Tight samples alone call a 0.5% shift real at many points; a run whose sentinel moves by
    about 0.4% between measurements does not, while 5% stays significant."""
    shifted = copy_run(H200_RUN, tmp_path / "shift", scale=1.005)
    tight = diff_runs(H200_RUN, shifted)
    assert sum(p.significant for p in tight.points) > 27  # over 10% of points from samples alone
    a, b = copy_run(H200_RUN, tmp_path / "a"), shifted
    for run, scale in ((a, 1.0), (b, 1.005)):
        sentinel = ResultStore(run).records()[0]
        for i, wiggle in enumerate([1.0, 1.004, 0.998, 1.003, 0.999, 1.004]):
            stats = summarize([wiggle * x for x in sentinel.stats.samples_us])
            append_sentinel(run, 20 * i, sentinel.model_copy(update={"stats": stats}))
    noisy = diff_runs(a, b)
    assert noisy.a.repeat_noise == pytest.approx(0.0035, abs=0.001)
    assert sum(p.significant for p in noisy.points) <= 0.05 * len(noisy.points)
    big = copy_run(H200_RUN, tmp_path / "big", scale=1.05)
    shutil.copy(b / "sentinel.jsonl", big / "sentinel.jsonl")
    assert all(p.significant for p in diff_runs(a, big).points)


def test_a_point_whose_visits_disagree_is_known_no_better_than_they_agree(tmp_path):
    """The visit, not the sample, is the independent draw: a 3% shift is significant for a point whose
    visits agree, not for one whose visits spread 25.0-26.7 µs (standard error of their mean 1.5%)."""
    from mlabench.sweep.diff import compare_point, median_se

    rec = ResultStore(H200_RUN).records()[0]
    samples = [25.0 + 0.01 * (i % 5) for i in range(40)]
    agree = rec.model_copy(update={"stats": summarize(samples), "visit_medians_us": [25.0, 25.005, 25.002, 25.004]})
    spread = agree.model_copy(update={"visit_medians_us": [25.0, 26.7, 25.1, 26.6]})
    assert median_se(agree) == pytest.approx(median_rel_ci(samples) / 1.959964)  # the samples' is larger
    assert median_se(spread) == pytest.approx(mean_rel_se([25.0, 26.7, 25.1, 26.6]))
    slower = lambda r: r.model_copy(update={"stats": summarize([1.03 * x for x in samples])})  # noqa: E731
    assert compare_point(agree, slower(agree), None, None).significant
    assert not compare_point(spread, slower(spread), None, None).significant


def test_runs_on_two_gpus_of_one_model_are_said_to_differ(tmp_path):
    """Two physical GPUs of one model, told apart by the UUIDs the manifests recorded; runs recorded
    before the UUID was (none, as the committed run) say nothing about it."""
    device = ResultStore(H200_RUN).manifest().device
    a = copy_run(H200_RUN, tmp_path / "a", device={**device, "uuid": "GPU-aaaa"})
    b = copy_run(H200_RUN, tmp_path / "b", device={**device, "uuid": "GPU-bbbb"})
    notes = diff_runs(a, b).manifest_notes
    assert len(notes) == 1 and notes[0].startswith("different GPUs of one model (GPU-aaaa vs GPU-bbbb)")
    assert not diff_runs(H200_RUN, b).manifest_notes
    assert [n[:31] for n in diff_runs(a, a).manifest_notes] == ["A and B are the same run folder"]


def test_a_run_without_a_recorded_revision_is_never_said_to_match(tmp_path):
    """A fresh user's review: two copies of different code run without .git both recorded
    ``mlabench-0.1.0``, and diff said they had the same revision."""
    a = copy_run(H200_RUN, tmp_path / "a", git_revision="mlabench-0.1.0")
    b = copy_run(H200_RUN, tmp_path / "b", git_revision="mlabench-0.1.0")
    notes = diff_runs(a, b).manifest_notes
    assert len(notes) == 1 and notes[0].startswith(
        "mlabench revision not recorded for A (mlabench-0.1.0) and B (mlabench-0.1.0)"), notes
    assert diff_runs(H200_RUN, b).manifest_notes[0].startswith("mlabench revision not recorded for B ")
    sha = ResultStore(H200_RUN).manifest().git_revision
    c = copy_run(H200_RUN, tmp_path / "c", git_revision="f" * 40)
    assert diff_runs(H200_RUN, c).manifest_notes == [f"different mlabench revisions: {sha[:12]} vs {'f' * 12}"]
    short = copy_run(H200_RUN, tmp_path / "d", git_revision="6cf2b10")  # $MLABENCH_GIT_REVISION's short id
    assert diff_runs(H200_RUN, short).manifest_notes == [f"different mlabench revisions: {sha[:12]} vs 6cf2b10"]
    full = copy_run(H200_RUN, tmp_path / "e", git_revision="6cf2b10" + "0" * 33)  # the same commit, in full
    assert diff_runs(short, full).manifest_notes == []
    assert diff_runs(short, copy_run(H200_RUN, tmp_path / "f", git_revision="6cf2b11" + "0" * 33)).manifest_notes == [
        "different mlabench revisions: 6cf2b10 vs 6cf2b1100000"]


def test_points_in_one_run_only_and_manifest_differences(tmp_path):
    b = copy_run(H200_RUN, tmp_path / "b", keep=lambda r: r.backend != "flashmla", driver="590.1",
                 versions={**ResultStore(H200_RUN).manifest().versions, "triton": "3.7.0"})
    d = diff_runs(H200_RUN, b)
    assert len(d.only_a) == 16 and {r.backend for r in d.only_a} == {"flashmla"} and not d.only_b
    assert d.manifest_notes == ["different drivers: 580.159.04 vs 590.1",
                                "different library versions: triton 3.6.0 vs 3.7.0"]
    summary, *rest = diff_tables(d)
    assert [row[0] for row in summary.rows] == ["triton-persistent", "triton-splitkv", "all"]
    assert rest[-1].title == "points not compared" and len(rest[-1].rows) == 16


def test_a_setting_or_version_one_run_lacks_is_said_to_be_not_recorded(tmp_path):
    """A note never prints a bare None: a key the older run lacks is "not recorded", a package
    recorded as None is "not installed"."""
    m = ResultStore(H200_RUN).manifest()
    timing = {k: v for k, v in m.config["timing"].items() if k != "graph_captures"}
    a = copy_run(H200_RUN, tmp_path / "a", config={**m.config, "timing": timing},
                 versions={**m.versions, "aiter": None})
    b = copy_run(H200_RUN, tmp_path / "b", config={**m.config, "timing": {**timing, "graph_captures": 1}},
                 versions={**m.versions, "aiter": "0.1.5"})
    notes = diff_runs(a, b).manifest_notes
    assert "different timing settings: graph_captures not recorded vs 1" in notes
    assert "different library versions: aiter not installed vs 0.1.5" in notes
    assert not any("None" in n for n in notes), notes


def test_a_sweep_against_a_tuning_run_says_so_and_reads_the_tunings_timing(tmp_path):
    """A fresh user's review: ``diff SWEEP TUNE`` said the tuning run's timing and check settings
    were "not recorded" (they are, under ``config.tune``) and never that B is a tuning run."""
    m = ResultStore(H200_RUN).manifest()
    tune = {"name": "t", "timing": {**m.config["timing"], "budget_s": 0.5}, "atol": 0.01}
    b = copy_run(H200_RUN, tmp_path / "b", kind="tune", config={"tune": tune, "studies": []})
    notes = diff_runs(H200_RUN, b).manifest_notes
    assert notes[0] == ("different kinds of run: A is a sweep, B a tuning run (each times its own points under its "
                        "own settings)"), notes
    assert notes[1] == f"different timing settings: budget_s {m.config['timing']['budget_s']} vs 0.5", notes
    assert not any("not recorded" in n or "order" in n or "visit" in n for n in notes), notes
    same = copy_run(H200_RUN, tmp_path / "c", kind="tune", config={"tune": tune, "studies": []})
    assert diff_runs(b, same).manifest_notes == []
    looser = copy_run(H200_RUN, tmp_path / "d", kind="tune", config={"tune": {**tune, "atol": 0.5}, "studies": []})
    assert diff_runs(b, looser).manifest_notes == ["different check settings: atol 0.01 vs 0.5"]  # it said nothing


def test_runs_with_other_visit_settings_are_said_to_differ(tmp_path):
    """The committed run predates visits (1 visit); one recorded with 4 to 12 visits differs."""
    config = {**ResultStore(H200_RUN).manifest().config, "visits": 4, "max_visits": 12, "visit_rel_se": 0.003}
    b = copy_run(H200_RUN, tmp_path / "b", config=config)
    assert diff_runs(H200_RUN, b).manifest_notes == [
        "different visit settings: max_visits 1 vs 12, visit_rel_se none vs 0.003, visits 1 vs 4"]
    same = copy_run(H200_RUN, tmp_path / "c", config={**config, "visits": None, "max_visits": None,
                                                      "visit_rel_se": None})
    assert diff_runs(H200_RUN, same).manifest_notes == []  # unset reads as one visit


def test_geometric_mean_and_agreement_per_backend(tmp_path):
    b = copy_run(H200_RUN, tmp_path / "b", scale=1.02)
    summary = diff_tables(diff_runs(H200_RUN, b))[0]
    rows = {row[0]: dict(zip(summary.columns, row)) for row in summary.rows}
    assert rows["all"]["geomean_ratio"] == pytest.approx(1.02)
    assert rows["all"]["points_over_min"] == 246  # the points of 20 µs or more
    assert rows["all"]["within_1pct"] == 0 and rows["all"]["worst"] == pytest.approx(0.02)


def test_diff_command(tmp_path, monkeypatch, capsys):
    b = copy_run(H200_RUN, tmp_path / "b", scale=1.05)
    code, out, _ = mlabench(["diff", str(H200_RUN.parent), str(b), "--json"], monkeypatch, capsys)
    summary, points = json.loads(out)
    assert code == 0 and summary["rows"][-1]["backend"] == "all" and summary["rows"][-1]["significant_slower"] == 272
    assert len(points["rows"]) == 272 and points["rows"][0]["significant"] is True
    copy_run(H200_RUN, tmp_path / "c")
    code, _, err = mlabench(["diff", str(tmp_path), str(b)], monkeypatch, capsys)
    assert code == 2 and err.startswith("error: ") and "holds 2 runs" in err
    code, out, _ = mlabench(["diff", str(b), str(b), "--markdown"], monkeypatch, capsys)
    assert code == 0 and "0 of 272 points compared differ significantly" in out


def test_diff_of_runs_with_no_point_in_common_is_one_error_line_and_exit_1(tmp_path, monkeypatch, capsys):
    b = copy_run(H200_RUN, tmp_path / "b", keep=lambda r: r.batch == 16)
    a = copy_run(H200_RUN, tmp_path / "a", keep=lambda r: r.batch == 1 and r.backend == "flashmla")
    code, out, err = mlabench(["diff", str(a), str(b)], monkeypatch, capsys)
    assert code == 1 and not out and len(err.strip().splitlines()) == 1
    assert err.startswith("error: the two runs have no point in common: they differ in batch: A 1, B 16; A (a) "
                          "holds backends flashmla; batch 1; qo_len 1; context 1024-131072 (8 lengths); B (b) holds "
                          "backends flashmla, ")


def test_diff_of_runs_at_other_head_counts_names_the_heads(tmp_path, monkeypatch, capsys):
    """Issue 35 C12: two runs that differ only in head count said "no point in common" and described
    both runs alike (backends, batch, qo_len, context); the error names the dimension that differs."""
    from mlabench.records.record import point_key

    a = copy_run(H200_RUN, tmp_path / "a", keep=lambda r: r.backend == "flashmla")
    b = tmp_path / "b"
    b.mkdir()
    (b / "manifest.json").write_text((a / "manifest.json").read_text())
    store = ResultStore(b)
    for r in ResultStore(a).records():
        shape = {**r.shape, "num_heads": 16, "page_size": 16}
        store.append(r.model_copy(update={"num_heads": 16, "shape": shape,
                                          "key": point_key(r.backend, r.params, shape)}))
    code, out, err = mlabench(["diff", str(a), str(b)], monkeypatch, capsys)
    assert code == 1 and not out and len(err.strip().splitlines()) == 1
    assert err.startswith("error: the two runs have no point in common: they differ in heads: A 12, B 16; "
                          "page_size: A 64, B 16; A (a) holds backends flashmla; "), err


def test_diff_reads_at_80_columns_names_its_change_column_and_counts_sentinels(tmp_path):
    import io

    from rich.console import Console

    from mlabench.tables.render import to_rich

    persistent = lambda r: r.backend == "triton-persistent"  # noqa: E731
    a = copy_run(H200_RUN, tmp_path / "a", keep=persistent)
    sentinel = ResultStore(a).records()[0]
    for i in range(2):
        append_sentinel(a, 20 * i, sentinel)
    b = copy_run(H200_RUN, tmp_path / "b", scale=1.05, keep=persistent)
    summary, points = diff_tables(diff_runs(a, b))
    assert "A unknown (2 sentinel measurements; 3 needed), counted as 0, B unknown (no sentinel; 3 needed)" \
        in summary.notes[1]
    console = Console(width=80, file=io.StringIO())
    console.print(to_rich(points, 80))
    lines = [line.rstrip() for line in console.file.getvalue().splitlines()]
    assert max(map(len, lines)) <= 80
    assert any("pad=zero prog/SM=1" in line for line in lines)  # short parameter names, not squeezed
    assert "change: +5.00% (every row)" in lines and not any("B/A " in line for line in lines)
    assert points.as_dicts()[0]["ratio"] == pytest.approx(1.05)  # JSON and CSV: the ratio itself


def test_runs_of_different_versions_pair_their_points():
    """The committed kimi-k3-tp8 run predates split_policy (its records say num_kv_splits only);
    pair-3 records split_policy = ''; a run made now leaves rows_per_tile out at its default.
    The same launched configuration pairs across all three."""
    pair3 = H200_RUN.parents[1] / "repeatability/history-attempt/pair-3/runs/kimi-k3-tp8-20261201-025639-435"
    d = diff_runs(H200_RUN, pair3)
    paired = {p.a.backend for p in d.points}
    assert {"triton-splitkv", "triton-persistent"} <= paired
    triton = [p for p in d.points if p.a.backend == "triton-splitkv"]
    assert len(triton) >= 100 and all(p.a.params.get("num_kv_splits") == p.b.params.get("num_kv_splits")
                                      for p in triton)


def test_diff_of_a_run_with_itself_says_so_and_a_negative_floor_is_refused():
    from mlabench.errors import ConfigError

    d = diff_runs(H200_RUN, H200_RUN)
    assert d.manifest_notes[0].startswith("A and B are the same run folder")
    for bad in (-5, float("nan"), float("inf")):  # nan and inf read as a floor no point passes
        with pytest.raises(ConfigError, match="--min-us must be a finite number >= 0"):
            diff_tables(d, min_us=bad)


def at_us(median_us: float, visits: list[float] | None = None):
    """A record of the committed run timed at exactly ``median_us`` (20 equal samples: their own
    standard error is 0), with ``visits`` as its visits' medians."""
    rec = ResultStore(H200_RUN).records()[0]
    return rec.model_copy(update={"stats": summarize([median_us] * 20), "visit_medians_us": visits})


@pytest.mark.parametrize("term", ["A's repeat noise", "B's repeat noise", "A's median", "B's median"])
def test_the_rule_at_its_boundary_with_each_runs_uncertainty_alone(term):
    """3 combined standard errors, each of the four terms counted: with one term at 1% and the rest 0,
    a shift of 0.1% more than 3% in log is significant and 0.1% less is not (issue 27 item 3: leaving
    out B's noise, or a threshold of 4, passed every other test)."""
    from mlabench.sweep.diff import compare_point, median_se

    u = mean_rel_se([99.0, 101.0])  # the visits' standard error, relative: 1%
    assert u == pytest.approx(0.01)
    for factor, significant in ((1.001, True), (0.999, False)):
        ratio = math.exp(3.0 * u * factor)
        a = at_us(100.0, [99.0, 101.0] if term == "A's median" else None)
        b = at_us(100.0 * ratio, [99.0 * ratio, 101.0 * ratio] if term == "B's median" else None)
        assert median_se(a) + median_se(b) == pytest.approx(u if "median" in term else 0.0)
        noise_a = u if term == "A's repeat noise" else None
        noise_b = u if term == "B's repeat noise" else 0.0
        for x, y, na, nb in ((a, b, noise_a, noise_b), (b, a, noise_b, noise_a)):  # slower or faster alike
            p = compare_point(x, y, na, nb)
            assert p.significant is significant and p.z == pytest.approx(3.0 * factor)


def test_the_four_terms_add_in_quadrature():
    from mlabench.sweep.diff import compare_point

    u = 2 * 0.01  # sqrt(4 x 1%^2)
    for factor, significant in ((1.001, True), (0.999, False)):
        ratio = math.exp(3.0 * u * factor)
        a, b = at_us(100.0, [99.0, 101.0]), at_us(100.0 * ratio, [99.0 * ratio, 101.0 * ratio])
        assert compare_point(a, b, 0.01, 0.01).significant is significant
    # no uncertainty at all: any change is significant, none is not
    assert compare_point(at_us(100.0), at_us(100.01), None, None).significant
    assert not compare_point(at_us(100.0), at_us(100.0), None, None).significant


def test_runs_apart_in_softmax_scale_say_what_a_missing_scale_means(monkeypatch, capsys):
    """The committed Kimi K3 sweep (its model's scale) against the Hopper-kernel run (no model, no
    scale recorded) read "they differ in softmax_scale: A 0.0721..., B None": a bare None."""
    results = Path(__file__).resolve().parents[2] / "results/h200"
    code, _, err = mlabench(["diff", str(results / "kimi-k3-tp8"), str(results / "hopper-kernel/run-72fb349")],
                            monkeypatch, capsys)
    assert code == 1
    assert err.startswith("error: the two runs have no point in common: they differ in softmax_scale: A "
                          "0.07216878364870322, B 576 ** -0.5 (none given); "), err
