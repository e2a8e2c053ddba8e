"""The sentinel and drift (issue 13 item 2) with a stand-in GPU whose clock slows down for a while."""

import pytest

from mlabench.measure.stats import summarize
from mlabench.measure.steady import SteadyState
from mlabench.measure.timing import TimingConfig
from mlabench.records.record import Record
from mlabench.sweep import run as sweep_run, runner
from mlabench.sweep.config import SweepConfig
from mlabench.sweep.point import record_fields
from mlabench.sweep.run import run_sweep
from mlabench.sweep.sentinel import health_notes, read_sentinels, repeat_noise


class SlowPhaseBench:
    """Stands in for ShapeBench: each measurement (sentinel or point) ticks a stand-in clock; every
    point takes 100 µs, 3% more while the clock is in ``slow`` (the GPU's slow phase), where its
    SM clock also reads 1500 MHz instead of 1980."""

    ticks = 0
    slow = range(7, 12)

    def __init__(self, shape, timing, seed=0):
        self.shape, self.inputs = shape, [None]

    def run(self, backend, params, *, copy_bw_tbps, run_id, read_bw_tbps=None, **_):
        SlowPhaseBench.ticks += 1
        slow = SlowPhaseBench.ticks in SlowPhaseBench.slow
        us = 103.0 if slow else 100.0
        state = {"sm_clock_mhz": 1500 if slow else 1980}
        return Record(status="ok", stats=summarize([us * (1 + 1e-4 * i) for i in range(5)]), timing_mode="wall",
                      gpu_state_before=state, gpu_state=state,
                      **record_fields(backend.name, params, self.shape, run_id, copy_bw_tbps, read_bw_tbps))


@pytest.fixture
def slow_phase_run(tmp_path, monkeypatch):
    SlowPhaseBench.ticks = 0
    monkeypatch.setattr(runner, "ShapeBench", SlowPhaseBench)
    monkeypatch.setattr(sweep_run, "warm_up", lambda cfg: SteadyState(steady=True, reason="steady after 6.0 s",
                                                                  elapsed_s=6.0, sm_clock_mhz=1980, power_w=450))
    cfg = SweepConfig(name="t", heads=[12], batch=[1, 2], context_lens=[16, 40], page_size=16, order="grid",
                      backends=["torch-splitkv"], params={"num_kv_splits": [1, 2, 3]}, sentinel_every=4,
                      drift_target=0.01, timing=TimingConfig(warmup_iters=0, min_samples=3, max_samples=3))
    return run_sweep(cfg, tmp_path)


def test_the_sentinel_is_measured_at_the_start_every_n_points_and_at_the_end(slow_phase_run):
    store, recs = slow_phase_run
    sentinels = read_sentinels(store.run_dir)
    assert [s.after_points for s in sentinels] == [0, 4, 8, 12] and len(recs) == 12
    # the first backend at the smallest batch and middle context, with its default split count
    assert {(s.record.backend, s.record.batch, s.record.context_len) for s in sentinels} == {("torch-splitkv", 1, 40)}


def test_drift_is_recorded_and_the_drifting_window_named(slow_phase_run):
    store, recs = slow_phase_run
    # ticks: sentinel 1, points 2-5, sentinel 6, points 7-10 (slow), sentinel 11 (slow), points 12-15, sentinel 16
    drift = store.manifest().drift
    assert drift["drifting"] and drift["after_points"] == [0, 4, 8, 12]
    assert drift["drift"] == pytest.approx([0, 0, 0.03, 0])
    (window,) = drift["windows"]
    assert (window["from_point"], window["to_point"]) == (4, 8)
    assert window["points"] == [f"torch-splitkv num_kv_splits={r.params['num_kv_splits']} B={r.batch} "
                                f"L={r.context_len}" for r in recs[4:8]]
    notes = "\n".join(health_notes(store.manifest(), recs))
    assert "GPU warm-up: steady after 6.0 s at 1980 MHz, 450 W" in notes
    resumed = store.manifest().model_copy(update={"warmups": store.manifest().warmups * 3})
    again = [n for n in health_notes(resumed, recs) if n.startswith("GPU warm-up")]
    assert again == ["GPU warm-up (x3: the run was resumed): steady after 6.0 s at 1980 MHz, 450 W"]
    assert "DRIFTING: sentinel torch-splitkv" in notes and "drifting window (points 5-8, sentinel +3.00%)" in notes


def test_points_below_the_steady_clock_are_flagged(slow_phase_run):
    _, recs = slow_phase_run
    assert [r.clock_below_steady for r in recs] == [False] * 4 + [True] * 4 + [False] * 4
    assert "4 point(s) measured with the SM clock below its steady value" in "\n".join(
        health_notes(slow_phase_run[0].manifest(), recs))


def test_a_steady_run_is_not_flagged(tmp_path, monkeypatch):
    SlowPhaseBench.ticks, SlowPhaseBench.slow = 0, range(0)
    monkeypatch.setattr(runner, "ShapeBench", SlowPhaseBench)
    cfg = SweepConfig(name="t", heads=[12], batch=[1], context_lens=[16], page_size=16, backends=["torch-splitkv"],
                      params={"num_kv_splits": [1, 2, 3]}, sentinel_every=1)
    store, _ = run_sweep(cfg, tmp_path)
    drift = store.manifest().drift
    assert not drift["drifting"] and drift["windows"] == [] and drift["repeat_noise"] == 0
    assert not any(n.startswith("DRIFTING") for n in health_notes(store.manifest(), []))
    SlowPhaseBench.slow = range(7, 12)


def test_repeat_noise_from_successive_medians():
    assert repeat_noise([100.0, 101.0]) is None
    assert repeat_noise([100.0] * 5) == 0
    # alternating +-1%: successive log differences of about 2%, halved in square: about 1.4%
    assert repeat_noise([100.0, 102.0] * 3) == pytest.approx(0.0198 / 2 ** 0.5, rel=0.01)
    # a slow steady climb barely counts: 0.1% a step
    assert repeat_noise([100 * 1.001 ** i for i in range(10)]) == pytest.approx(0.001 / 2 ** 0.5, rel=0.01)
