"""Issue 34 item 3: a device policy right between its buckets.  Finer buckets (``--edges-per-octave``),
the split count alone searched for ``split_policy=device`` (``--device-policy``), and ``tune
--validate``'s target, on a synthetic backend whose best count changes inside a coarse bucket."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from mlabench.backends import get_backend
from mlabench.tune.edges import fine_edges
from mlabench.tune.space import TuneConfig, study_space, tune_shape


def test_fine_edges_cut_between_the_given_edges_geometrically_and_again_change_nothing():
    assert fine_edges([1024, 4096], 2) == [1024, 1448, 2048, 2896, 4096]
    assert fine_edges([1024, 4096], None) == [1024, 4096] == fine_edges([1024, 4096], 1)[::2]
    kimi = [1024, 4096, 8192, 16384, 32768, 65536, 100000, 131072]
    grid = fine_edges(kimi, 4)
    assert set(kimi) <= set(grid) and grid == sorted(set(grid)) and grid[0] == 1024  # (0, 1024] is not cut
    assert len(grid) == 30 and max(b / a for a, b in zip(grid, grid[1:])) < 2 ** (1 / 4) * 1.01
    assert fine_edges(grid, 4) == grid  # a resumed or exported run refines its recorded edges again
    assert fine_edges([100, 101], 16) == [100, 101]


def test_device_policy_searches_the_split_count_only_other_parameters_at_their_defaults():
    backend = get_backend("test-launch")
    values = dict(backend="test-launch", heads=2, buckets=[64], page_size=16, tokens_per_split=None)
    shape = tune_shape({"num_heads": 2, "page_size": 16}, 1, 64)
    dims, fixed = study_space(backend, shape, TuneConfig(**values, device_policy=True), (64,))
    assert [d.name for d in dims] == ["num_kv_splits"]
    assert fixed == {"block_n": "32", "num_warps": 4, "num_stages": 2, "tile_rows": 16}
    named = TuneConfig(**values, device_policy=True, space={"num_warps": {"low": 1, "high": 8}})
    assert [d.name for d in study_space(backend, shape, named, (64,))[0]] == ["num_kv_splits", "num_warps"]
    assert len(study_space(backend, shape, TuneConfig(**values), (64,))[0]) == 4  # without it: all four


def _tune(runner, app, tmp_path, *extra: str):
    args = ["tune", "--backend", "test-steps", "--heads", "2", "--buckets", "256,1024", "--page-size", "16",
            "--lengths-per-bucket", "2", "--tokens-per-split", "off", "--device-policy", "--no-heuristics",
            "--trials", "12", "--budget-s", "0.02", "--results-dir", str(tmp_path), "--json", *extra]
    res = runner.invoke(app, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), max(tmp_path.glob("tune-*"), key=lambda p: p.stat().st_mtime)


def _validate(runner, app, tmp_path, run):
    args = ["tune", "--validate", str(run / "policy.json"), "--lengths", "4", "--seed", "5", "--budget-s", "0.02",
            "--results-dir", str(tmp_path), "--json"]
    return runner.invoke(app, args, catch_exceptions=False)


def test_finer_buckets_make_a_policy_that_a_coarse_bucket_could_not_pass_validation(tmp_path):
    """The best count falls from 10 to 3 at 512 tokens, inside the bucket (256, 1024]: its one count
    (chosen at 257 and 1024 tokens) is far off the best at the held-out lengths, and validation says
    so and exits 1; with two sub-buckets per octave (edges 362, 512, 724) each sub-bucket has one
    best count, and every held-out length gets it.  Brute force over 1-12 splits, ``pdl`` at its
    default (--device-policy), so the run measures 12 configurations a study."""
    from mlabench.cli import app

    runner = CliRunner()
    coarse_tables, coarse = _tune(runner, app, tmp_path / "coarse")
    fine_tables, fine = _tune(runner, app, tmp_path / "fine", "--edges-per-octave", "2")
    coarse_rows = [(r["max context"], r["params"]) for r in coarse_tables[1]["rows"]]
    # 6 and 7 splits tie (3x the best at one end or the other): the timing noise picks one
    assert coarse_rows[0] == (256, "num_kv_splits=10 pdl=0") and coarse_rows[1][0] == 1024
    assert coarse_rows[1][1] in ("num_kv_splits=6 pdl=0", "num_kv_splits=7 pdl=0")
    assert [(r["max context"], r["params"]) for r in fine_tables[1]["rows"]] == [
        (512, "num_kv_splits=10 pdl=0"), (1024, "num_kv_splits=3 pdl=0")]  # five buckets, merged
    assert [s["lengths"] for s in json.loads((fine / "manifest.json").read_text())["config"]["studies"]] == [
        [128, 256], [257, 362], [363, 512], [513, 724], [725, 1024]]

    res = _validate(runner, app, tmp_path / "coarse", coarse)
    assert res.exit_code == 1, res.output
    verdict = " ".join(res.stderr.split())
    assert "target not met: every held-out length within 3% of the best count measured there" in verdict
    detail = json.loads(res.stdout)[1]["rows"]
    missed = [r["context"] for r in detail if r["target"] == "miss"]
    assert missed and all(256 < n for n in missed) and f"batch 1: {', '.join(map(str, missed))}" in verdict
    assert all(r["policy splits"] in (6, 7) and r["best splits"] in (3, 10) for r in detail if r["context"] > 256)

    res = _validate(runner, app, tmp_path / "fine", fine)
    assert res.exit_code == 0, res.output
    detail = json.loads(res.stdout)[1]["rows"]
    assert [r["target"] for r in detail] == ["ok"] * 4 and any(256 < r["context"] for r in detail)
    assert all(r["policy splits"] == r["best splits"] for r in detail)
    assert any(n.startswith("target met") for n in json.loads(res.stdout)[0]["notes"])


def test_a_device_policy_study_measures_the_split_ladder_up_to_one_wave_first():
    """The recorded H200 tune never measured 8 splits at batch 16 from 16K to 64K (the best there):
    a device policy's studies enqueue the ladder up to one wave, the wave cap where the backend
    knows it, else one program per SM."""
    from mlabench.tune.run import _enqueued
    from mlabench.tune.seeded_trials import ladder_trials
    from mlabench.tune.studies import StudySpec

    steps = get_backend("test-steps")
    cfg = TuneConfig(backend="test-steps", heads=2, buckets=[64], page_size=16, tokens_per_split=None,
                     device_policy=True)
    one, sixteen = (tune_shape({"num_heads": 2, "page_size": 16}, b, 64) for b in (1, 16))
    dims = study_space(steps, one, cfg, (64,))[0]
    assert [n for n, _ in ladder_trials(steps, one, dims, 132)] == [f"ladder-{n}" for n in (1, 2, 3, 4, 6, 8, 12)]
    assert [p for _, p in ladder_trials(steps, sixteen, dims, 132)] == [{"num_kv_splits": n} for n in (1, 2, 3, 4, 6, 8)]
    trap = get_backend("test-wave-trap")  # 8 programs at once: the study's wave cap, not the SM count
    trap_dims = study_space(trap, one, TuneConfig(backend="test-wave-trap", heads=2, buckets=[64], page_size=16),
                            (32, 64))[0]  # the rule searched: a fixed count is tokens_per_split 1
    assert ladder_trials(trap, one, trap_dims, 132, max_splits=8)[-1] == (
        "ladder-8", {"num_kv_splits": 8, "tokens_per_split": 1})
    spec = StudySpec(0, 64, 64, (64,), name="s", batch=1, max_splits=None)
    names = [n for n, _ in _enqueued(steps, one, cfg, spec)]
    assert "ladder-1" in names and names.index("ladder-1") > names.index("vllm-triton")  # after the heuristics
    assert not any(n.startswith("ladder-") for n, _ in _enqueued(steps, one, cfg.model_copy(
        update={"device_policy": False}), spec))


def test_a_device_policy_study_measures_whole_page_splits_at_its_lengths():
    """At 20-33K tokens the ladder's counts seldom cut a request into splits that all own pages (at
    32769 tokens, 513 pages: 96 splits of 6 pages leave 10 empty), so --pages-rule never saw 5-6
    pages a split without empty programs; a device policy's studies also measure the counts that
    cut each of their lengths into whole splits of P0..P0+max(2, P0/2) pages, P0 the fewest one wave
    allows."""
    from mlabench.tune.run import _enqueued
    from mlabench.tune.seeded_trials import exact_page_counts, page_trials
    from mlabench.tune.studies import StudySpec

    assert exact_page_counts(513, 132) == [129, 103, 86] and exact_page_counts(17, 132) == [17, 9, 6]
    assert exact_page_counts(0, 132) == []
    assert len(exact_page_counts(2048, 132)) == 9  # P 16..24 at 128K: the best were 14-17 pages a split
    for pages in (1, 7, 513, 2048):
        assert all(-(-pages // -(-pages // n)) == n for n in exact_page_counts(pages, 132))  # no empty split
    steps = get_backend("test-steps")
    cfg = TuneConfig(backend="test-steps", heads=2, buckets=[1024], page_size=16, tokens_per_split=None,
                     device_policy=True)
    one = tune_shape({"num_heads": 2, "page_size": 16}, 1, 1000)
    dims = study_space(steps, one, cfg, (1000,))[0]  # 1-12 splits (one wave at batch 1)
    # 513 tokens: 33 pages, 3-5 a split (11, 9, 7 splits); 1000: 63 pages, 6-9 (11, 9, 8, 7); the ladder has 8
    assert page_trials(steps, one, dims, (513, 1000), 132) == [
        ("pages-11", {"num_kv_splits": 11}), ("pages-9", {"num_kv_splits": 9}), ("pages-7", {"num_kv_splits": 7})]
    spec = StudySpec(512, 1024, 1000, (513, 1000), name="s", batch=1, max_splits=12)  # the wave cap, any GPU
    names = [n for n, _ in _enqueued(steps, one, cfg, spec)]
    assert names[-3:] == ["pages-11", "pages-9", "pages-7"] and "ladder-12" in names
    assert not any(n.startswith("pages-") for n, _ in _enqueued(steps, one, cfg.model_copy(
        update={"device_policy": False}), spec))


def test_every_enqueued_trial_is_measured_even_past_trials(tmp_path):
    """With ``--trials`` below a study's enqueued trials the last ones were never run: a device
    policy at batch 1 on an H200 enqueues 4 heuristics and 15 ladder counts, and ``--trials 16`` cut
    the ladder's largest counts (96-132, the best ones past 9K tokens in the committed validation).
    Here ``--trials 2``, and every enqueued trial (the heuristics, the ladder) is measured."""
    import optuna

    from mlabench.cli import app
    from mlabench.tune.storage import open_storage

    args = ["tune", "--backend", "test-steps", "--heads", "2", "--buckets", "256", "--page-size", "16",
            "--lengths-per-bucket", "2", "--tokens-per-split", "off", "--device-policy", "--batch", "1",
            "--trials", "2", "--budget-s", "0.02", "--results-dir", str(tmp_path), "--json"]
    res = CliRunner().invoke(app, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    run = next(tmp_path.glob("tune-*"))
    storage = open_storage(None, run)
    (name,) = optuna.get_all_study_names(storage)
    seeded = [t for t in optuna.load_study(study_name=name, storage=storage).trials if "enqueued_as" in t.user_attrs]
    assert len({t.params["num_kv_splits"] for t in seeded}) > 2  # more than --trials
    assert all(t.state.name == "COMPLETE" for t in seeded), [(t.user_attrs, t.state.name) for t in seeded]


def test_enqueued_trials_that_launch_alike_count_once_towards_the_target(tmp_path):
    """Below 64 tokens ``aiter-gluon-0.1.19`` (at most 256 splits of 64 tokens) launches 1 split at
    every length, as ``vllm-triton`` does: with ``--trials 2`` the study measured every enqueued
    trial and stopped at 3 distinct launches, but its target counted 4 enqueued parameter sets, so
    the run ended with "studies are not finished" (exit 2) and the live table showed 3/4."""
    from mlabench.cli import app

    args = ["tune", "--backend", "test-steps", "--heads", "2", "--buckets", "64", "--page-size", "16",
            "--lengths-per-bucket", "2", "--batch", "1", "--trials", "2", "--budget-s", "0.02",
            "--results-dir", str(tmp_path), "--json"]
    res = CliRunner().invoke(app, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)[0]["rows"]
    assert row["trials"] >= 3
