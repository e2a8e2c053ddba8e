"""Points measured in several visits spread over the run, samples pooled (issue 13, mlabench.sweep.visits)."""

import json
import statistics

import pytest

from mlabench.errors import Interrupted
from mlabench.measure.stats import summarize
from mlabench.measure.timing import TimingConfig
from mlabench.records.record import Record
from mlabench.records.store import ResultStore
from mlabench.sweep.config import SweepConfig
from mlabench.sweep.run import run_sweep
from mlabench.sweep.visits import (
    VISITS_FILE, pooled_record, read_visits, settled, visit_order, visits_rel_se, wants_more,
)

TIMING = TimingConfig(warmup_iters=0, min_samples=3, max_samples=3, budget_s=0.01)


def config(visits=3, **kw):
    """A 4-point CPU sweep; the visits are exactly ``visits`` unless ``max_visits`` is given (CPU
    timings disagree from visit to visit, so the further visits are tested with stand-in times)."""
    base = dict(name="v", heads=[12], batch=[1], context_lens=[16, 40], page_size=16, backends=["torch-splitkv"],
                params={"num_kv_splits": [1, 2]}, sentinel_every=0, visits=visits, max_visits=visits, timing=TIMING)
    return SweepConfig(**{**base, **kw})


def record(samples, *, key="k", clock_low=None, bytes_moved=4_000_000, floor_us=1.0):
    return Record(key=key, run_id="r", backend="b", params={}, shape={}, batch=1, num_heads=12, context_len=16,
                  status="ok", stats=summarize(samples).model_copy(update={"calls_per_sample": 8, "graph_captures": 2}),
                  bytes_moved=bytes_moved, floor_us=floor_us, clock_below_steady=clock_low,
                  gpu_state={"sm_clock_mhz": len(samples)}, timestamp="t")


def test_even_visits_run_backwards():
    assert visit_order([1, 2, 3], 1) == [1, 2, 3] == visit_order([1, 2, 3], 3)
    assert visit_order([1, 2, 3], 2) == [3, 2, 1] == visit_order([1, 2, 3], 4)


def test_pooled_record_takes_every_visits_samples():
    visits = [record([10.0, 10.1, 10.2]), record([11.0, 11.1, 11.2, 11.3], clock_low=True),
              record([10.5, 10.6, 10.7], clock_low=False)]
    out = pooled_record(visits, target_rel_ci=0.5)
    pooled = [10.0, 10.1, 10.2, 11.0, 11.1, 11.2, 11.3, 10.5, 10.6, 10.7]
    assert out.stats.samples_us == pooled and out.stats.n == 10
    assert out.stats.median_us == statistics.median(pooled) == pytest.approx(10.65)
    assert out.visit_medians_us == pytest.approx([10.1, 11.15, 10.6])
    assert out.stats.calls_per_sample == 8 and not out.stats.noisy  # against the target given
    assert out.stats.graph_captures == 2  # the first visit's
    assert out.achieved_tbps == pytest.approx(4_000_000 / 10.65e-6 / 1e12)
    assert out.pct_of_floor == pytest.approx(100 / 10.65)
    assert out.clock_below_steady is True and out.gpu_state == {"sm_clock_mhz": 3}  # the last visit's
    assert pooled_record(visits, target_rel_ci=1e-6).stats.noisy
    assert out.stats.capture_medians_us is None  # no visit had them


def test_pooled_record_pools_the_clocks_read_while_each_visit_was_timed():
    visits = [record([10.0, 10.1, 10.2]).model_copy(update={"gpu_state_during": during})
              for during in ({"sm_clock_mhz": 1980, "sm_clock_min_mhz": 1965, "sm_clock_max_mhz": 1980, "readings": 3},
                             {"sm_clock_mhz": 1500, "sm_clock_min_mhz": 1500, "sm_clock_max_mhz": 1500, "readings": 4},
                             {})]
    assert pooled_record(visits).gpu_state_during == {
        "sm_clock_mhz": 1740.0, "sm_clock_min_mhz": 1500, "sm_clock_max_mhz": 1980, "readings": 7}


def test_pooled_record_keeps_every_visits_graph_medians_in_turn():
    a, b = record([10.0, 10.2, 10.4, 10.6]), record([11.0, 11.2, 11.4, 11.6])
    a.stats.capture_medians_us, b.stats.capture_medians_us = [10.1, 10.5], [11.1, 11.5]
    assert pooled_record([a, b]).stats.capture_medians_us == [10.1, 10.5, 11.1, 11.5]


def test_one_visit_or_an_untimed_first_visit_is_kept_as_is():
    one = record([1.0, 2.0, 3.0])
    assert pooled_record([one]) is one
    failed = one.model_copy(update={"status": "error", "stats": None})
    assert pooled_record([failed, one]) is failed
    assert not wants_more([failed]) and wants_more([one]) and not wants_more([])
    with pytest.raises(ValueError):
        pooled_record([])


def test_a_sweep_times_each_point_in_every_visit_and_checks_it_once(tmp_path, monkeypatch):
    from mlabench.bench import shape_bench as point

    real, verify_flags = point.ShapeBench.run, []

    def spy(self, backend, params, **kw):
        verify_flags.append(kw.get("verify", True))
        return real(self, backend, params, **kw)

    monkeypatch.setattr(point.ShapeBench, "run", spy)
    store, recs = run_sweep(config(visits=3), tmp_path)
    assert len(recs) == 4 and all(r.status == "ok" for r in recs)
    assert verify_flags.count(True) == 4 + 2 and verify_flags.count(False) == 8  # + 2 sentinels
    visits = read_visits(store.run_dir)
    for r in recs:
        assert len(visits[r.key]) == 3 and r.visit_medians_us == [v.stats.median_us for v in visits[r.key]]
        assert r.stats.n == 9 and r.verdict is not None and r.verdict.passed
        assert visits[r.key][1].verdict is None and visits[r.key][2].verdict is None
    lines = [json.loads(x) for x in (store.run_dir / VISITS_FILE).read_text().splitlines()]
    order = [line["record"]["key"] for line in lines]
    assert order[4:8] == order[:4][::-1] and order[8:] == order[:4]  # the second visit runs backwards


def test_an_interrupted_visited_sweep_resumes_the_missing_visits_only(tmp_path):
    seen = []

    def stop(point, record, done, total):
        assert total == 12
        if record is not None:
            seen.append(point.key)
        if done == 6:
            raise KeyboardInterrupt

    # the visits measured are said, so that "0 points recorded" does not read as nothing kept
    with pytest.raises(Interrupted, match=r"0 of 4 points recorded \(6 visits measured of 12 planned\) in "):
        run_sweep(config(visits=3), tmp_path, progress=stop)
    (run_dir,) = tmp_path.iterdir()
    assert sum(len(v) for v in read_visits(run_dir).values()) == 6 and not ResultStore(run_dir).records()
    said = []
    _, recs = run_sweep(config(visits=3), tmp_path, resume=run_dir, warn=said.append)
    assert said == [f"resuming {run_dir}: 0 of 4 points already recorded (6 visits measured of 12 planned)"]
    visits = read_visits(run_dir)
    assert len(recs) == 4 and all(len(visits[r.key]) == 3 and len(r.visit_medians_us) == 3 for r in recs)
    assert sum(len(v) for v in visits.values()) == 12  # nothing measured twice


def test_a_point_that_fails_is_recorded_after_its_first_visit(tmp_path, monkeypatch):
    from mlabench.backends import torch_reference as reference

    monkeypatch.setattr(reference.TorchSplitKVBackend, "supports", lambda self, s: (False, "not here"))
    _, recs = run_sweep(config(visits=3), tmp_path)
    assert len(recs) == 4 and {r.status for r in recs} == {"unsupported"}
    assert all(r.visit_medians_us is None for r in recs)


def test_the_cpu_default_is_one_visit(tmp_path):
    store, recs = run_sweep(config(visits=None), tmp_path)
    assert len(recs) == 4 and all(r.visit_medians_us is None for r in recs)
    assert not (store.run_dir / VISITS_FILE).exists()


def test_a_visit_runs_sentinel_counts_visits_and_its_windows_name_them(tmp_path):
    from mlabench.records.side_files import read_sentinels

    store, _ = run_sweep(config(visits=3, sentinel_every=4, drift_target=1e-9), tmp_path)
    assert [s.after_points for s in read_sentinels(store.run_dir)] == [0, 4, 8, 12]  # of 12 visits
    drift = store.manifest().drift
    assert drift["after_points"] == [0, 4, 8, 12] and drift["windows"]  # CPU timings always move
    for w in drift["windows"]:
        assert w["to_point"] - w["from_point"] == 4 and len(w["points"]) == 4
    from mlabench.sweep.sentinel import health_notes

    windows = [n for n in health_notes(store.manifest(), store.records(), verbose=True)
               if n.startswith("drifting window")]
    assert windows and all(n.startswith("drifting window (visits ") for n in windows)  # they index visits


def test_visits_rel_se_and_settled():
    steady = [record([10.0] * 3), record([10.0] * 3), record([10.0] * 3)]
    split = [record([10.0] * 3), record([11.0] * 3), record([10.0] * 3), record([11.0] * 3)]
    assert visits_rel_se(steady) == 0.0 and visits_rel_se(steady[:1]) is None
    # medians 10, 11, 10, 11: sd 0.5774 / sqrt(4) / mean 10.5
    assert visits_rel_se(split) == pytest.approx(0.57735 / 2 / 10.5, rel=1e-4)
    assert not settled([], 3, 9, 0.003) and not settled(steady[:2], 3, 9, 0.003)  # planned visits first
    assert settled(steady, 3, 9, 0.003)
    assert not settled(split, 3, 9, 0.003) and settled(split, 3, 9, 0.03)  # 2.7% against the limit
    assert settled(split, 3, 4, 0.003)  # at the most visits
    failed = steady[0].model_copy(update={"status": "error", "stats": None})
    assert settled([failed], 3, 9, 0.003)  # recorded at its first visit


def test_points_whose_visits_disagree_are_visited_again_up_to_max_visits(tmp_path, monkeypatch):
    """Stand-in times: the point at 40 tokens with 2 splits alternates 10 and 11 µs from visit to
    visit, the others read 10 µs every time; 3 visits planned, at most 7."""
    from mlabench.sweep.runner import SweepRunner

    real, calls = SweepRunner._measure, []

    def fake(self, p, cache, verify=True):
        rec = real(self, p, cache, verify)
        calls.append(p.key)
        noisy = p.shape.max_context_len == 40 and p.params["num_kv_splits"] == 2
        us = 10.0 + (calls.count(p.key) % 2 if noisy else 0.0)
        return rec.model_copy(update={"stats": summarize([us] * 3).model_copy(update={"calls_per_sample": 1})})

    monkeypatch.setattr(SweepRunner, "_measure", fake)
    totals = []
    store, recs = run_sweep(config(visits=3, max_visits=7), tmp_path,
                            progress=lambda p, r, done, total: totals.append((done, total)))
    visits = read_visits(store.run_dir)
    counts = {r.context_len * 10 + r.params["num_kv_splits"]: len(visits[r.key]) for r in recs}
    assert counts == {161: 3, 162: 3, 401: 3, 402: 7}
    noisy = next(r for r in recs if r.context_len == 40 and r.params["num_kv_splits"] == 2)
    assert noisy.visit_medians_us == [11.0, 10.0, 11.0, 10.0, 11.0, 10.0, 11.0]
    assert totals[-1] == (16, 16)  # 12 planned + 4 further visits; the total grew as they were planned
    assert [json.loads(x)["visit"] for x in (store.run_dir / VISITS_FILE).read_text().splitlines()][12:] == [4, 5, 6, 7]
    from mlabench.sweep.sentinel import health_notes, unsettled

    assert unsettled(store.manifest(), recs) == [noisy]  # at 7 visits, standard error 2.1% of the mean
    (note,) = [n for n in health_notes(store.manifest(), recs) if "still disagreed" in n]
    assert note.startswith("1 point(s) whose visits still disagreed at 7 visits (standard error of the mean of "
                           "their medians over 0.3%): torch-splitkv ")
    assert unsettled(store.manifest().model_copy(update={"config": {**store.manifest().config, "max_visits": 3}}),
                     recs) == []  # no further visits: nothing to say


def test_an_interrupted_further_visit_resumes_without_repeating(tmp_path, monkeypatch):
    from mlabench.sweep.runner import SweepRunner

    real = SweepRunner._measure
    medians = iter([10.0, 11.0] * 50)

    def fake(self, p, cache, verify=True):
        rec = real(self, p, cache, verify)
        us = next(medians) if p.shape.max_context_len == 40 and p.params["num_kv_splits"] == 2 else 10.0
        return rec.model_copy(update={"stats": summarize([us] * 3).model_copy(update={"calls_per_sample": 1})})

    def stop(point, record, done, total):
        if done == 14:
            raise KeyboardInterrupt

    monkeypatch.setattr(SweepRunner, "_measure", fake)
    with pytest.raises(Interrupted, match=r"3 of 4 points recorded \(14 visits measured of 12 to 28 planned\)"):
        run_sweep(config(visits=3, max_visits=7), tmp_path, progress=stop)
    (run_dir,) = tmp_path.iterdir()
    _, recs = run_sweep(config(visits=3, max_visits=7), tmp_path, resume=run_dir)
    visits = read_visits(run_dir)
    assert len(recs) == 4 and sorted(len(v) for v in visits.values()) == [3, 3, 3, 7]
    assert [v for v in (json.loads(x)["visit"] for x in (run_dir / VISITS_FILE).read_text().splitlines())
            ][12:] == [4, 5, 6, 7]  # each further visit once


def test_max_visits_below_visits_is_refused(tmp_path):
    from mlabench.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--max-visits 2 is below --visits 3"):
        run_sweep(config(visits=3, max_visits=2), tmp_path)
    with pytest.raises(ConfigError, match=r"--max-visits 5 needs --visits 2 or more"):
        run_sweep(config(visits=1, max_visits=5), tmp_path)
    with pytest.raises(ConfigError, match=r"--max-visits 5 needs --visits 2 or more"):
        run_sweep(config(visits=None, max_visits=5), tmp_path)  # the CPU's default is one visit
    assert not list(tmp_path.iterdir())


def test_a_run_recorded_before_max_visits_resumes_with_exactly_its_visits():
    from pathlib import Path

    from mlabench.sweep.config import recorded_config

    runs = Path(__file__).resolve().parents[2] / "tests/report/fixtures/h200-visits-attempt"
    for run in sorted(runs.iterdir()):
        assert "max_visits" not in ResultStore(run).manifest().config
        cfg = recorded_config(ResultStore(run))
        assert (cfg.visits, cfg.max_visits) == (4, 4)
