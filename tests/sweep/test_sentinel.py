"""The sentinel and drift (issue 13 item 2) with a stand-in GPU whose clock slows down for a while."""

import gzip
import json
from pathlib import Path

import pytest

from mlabench.bench.point import record_fields
from mlabench.measure.stats import repeat_noise, summarize
from mlabench.measure.steady import SteadyState
from mlabench.measure.timing import TimingConfig
from mlabench.records.record import Record
from mlabench.records.side_files import SentinelMeasurement, read_sentinels
from mlabench.shapes import MLADecodeShape
from mlabench.sweep import run as sweep_run, runner
from mlabench.sweep.config import SweepConfig
from mlabench.sweep.run import run_sweep
from mlabench.sweep.sentinel import drift_of, health_notes

REPO = Path(__file__).resolve().parents[2]


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
    assert "DRIFTING: sentinel torch-splitkv" in notes and "against the median of its first 3 readings" in notes
    assert "1 drifting window(s), 4 points measured in them (points 5-8, sentinel +3.00%): their points in the " \
           "manifest's drift.windows, or with sweep --verbose" in notes
    verbose = "\n".join(health_notes(store.manifest(), recs, verbose=True))
    assert "drifting window (points 5-8, sentinel +3.00%): " + "; ".join(window["points"]) in verbose


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


def sentinel_at(after: int, us: float) -> SentinelMeasurement:
    rec = Record(status="ok", stats=summarize([us] * 3), timing_mode="wall",
                 **record_fields("torch-splitkv", {"num_kv_splits": 2}, MLADecodeShape.uniform(1, 40, 12, page_size=16),
                                 "r", 1.0))
    return SentinelMeasurement(after_points=after, record=rec)


def test_the_reference_is_the_median_of_the_first_readings_not_the_cold_first_one():
    # the first reading 2.5% slow (a cold GPU), then steady within 0.2%: no drift, no window
    d = drift_of([sentinel_at(20 * i, us) for i, us in enumerate([102.5, 100.0, 100.2, 99.9, 100.1])], [], 0.01)
    assert d.reference_us == 100.2 and d.reference_readings == 3
    assert d.drift[0] == pytest.approx(102.5 / 100.2 - 1) and d.drift[1:] == pytest.approx(
        [100.0 / 100.2 - 1, 0, 99.9 / 100.2 - 1, 100.1 / 100.2 - 1])
    assert not d.drifting and d.windows == [] and d.max_abs_drift == pytest.approx(1 - 99.9 / 100.2)
    # a real slow phase later is still caught, against the settled reference
    d = drift_of([sentinel_at(20 * i, us) for i, us in enumerate([102.5, 100.0, 100.2, 103.0, 100.1])], [], 0.01)
    assert d.drifting and [(w.from_point, w.to_point) for w in d.windows] == [(40, 60)]
    assert d.windows[0].drift == pytest.approx(103.0 / 100.2 - 1)
    # two readings: the reference is the first (as their mean it made the drift +-1% by construction);
    # three: the median of the first two, so the last is always against a reference it is not in
    d = drift_of([sentinel_at(0, 100.0), sentinel_at(20, 102.0)], [], 0.05)
    assert (d.reference_us, d.reference_readings) == (100.0, 1) and d.drift == pytest.approx([0.0, 0.02])
    d = drift_of([sentinel_at(20 * i, us) for i, us in enumerate([100.0, 102.0, 110.0])], [], 0.05)
    assert (d.reference_us, d.reference_readings) == (101.0, 2) and d.drifting


def test_forty_drifting_windows_make_one_line_and_every_kind_of_note_one_line(slow_phase_run):
    store, recs = slow_phase_run
    m = store.manifest()
    window = m.drift["windows"][0]
    drift = {**m.drift, "windows": [{**window, "from_point": 4 * i, "to_point": 4 * i + 4} for i in range(40)]}
    many = m.model_copy(update={"drift": drift})
    low = [r.model_copy(update={"clock_below_steady": True}) for r in recs]
    notes = health_notes(many, low)
    assert len(notes) == 4  # warm-up, sentinel, windows, clock
    (line,) = [n for n in notes if "drifting window" in n]
    assert line.startswith("40 drifting window(s), 160 points measured in them (points 1-4, sentinel +3.00%; "
                           "points 5-8, sentinel +3.00%; points 9-12, sentinel +3.00%; and 37 more)")
    (clock,) = [n for n in notes if "SM clock" in n]
    assert clock.startswith("12 point(s) measured with the SM clock below") and clock.endswith("; and 9 more")
    assert len(health_notes(many, low, verbose=True)) == 2 + 40 + 1


def test_sweep_prints_one_line_for_all_windows_and_each_with_verbose(slow_phase_run, monkeypatch):
    from typer.testing import CliRunner

    from mlabench.cli import app, kernel_commands

    store, recs = slow_phase_run
    m = store.manifest()
    window = m.drift["windows"][0]
    store.update_manifest(drift={**m.drift, "windows": [{**window, "from_point": 4 * i, "to_point": 4 * i + 4}
                                                        for i in range(40)]})
    monkeypatch.setattr(kernel_commands, "_run_with_progress", lambda cfg, results_dir, resume, strict: (store, recs))
    plain = CliRunner().invoke(app, ["sweep", "--json"], catch_exceptions=False)
    verbose = CliRunner().invoke(app, ["sweep", "--json", "--verbose"], catch_exceptions=False)
    assert plain.exit_code == verbose.exit_code == 0
    plain_notes, verbose_notes = (json.loads(r.stdout)[0]["notes"] for r in (plain, verbose))
    assert sum("drifting window" in n for n in plain_notes) == 1 and len(plain_notes) <= 8
    assert sum(n.startswith("drifting window (points ") for n in verbose_notes) == 40


def test_a_run_with_only_sentinel_jsonl_gz_reads_the_same_sentinels(slow_phase_run):
    """A committed run keeps its sentinel measurements gzipped (``sentinel.jsonl.gz``): they read as
    the plain file did; with both there, the plain one (a live run appends to it) is read."""
    run_dir = slow_phase_run[0].run_dir
    plain = run_dir / "sentinel.jsonl"
    before = read_sentinels(run_dir)
    assert len(before) == 4
    (run_dir / "sentinel.jsonl.gz").write_bytes(gzip.compress(plain.read_bytes()))
    assert read_sentinels(run_dir) == before
    plain.write_text(plain.read_text().splitlines(keepends=True)[0])
    assert read_sentinels(run_dir) == before[:1]
    plain.unlink()
    assert read_sentinels(run_dir) == before


def test_the_committed_runs_gzipped_sentinels_are_the_ones_their_manifests_drift_was_measured_from():
    """Every committed run's ``sentinel.jsonl.gz`` reads the timed medians its manifest's drift holds."""
    runs = sorted(p.parent for p in (REPO / "results").rglob("sentinel.jsonl.gz"))
    assert runs
    for run in runs:
        timed = [s.record.stats.median_us for s in read_sentinels(run) if s.record.status == "ok" and s.record.stats]
        assert timed == json.loads((run / "manifest.json").read_text())["drift"]["medians_us"], run
