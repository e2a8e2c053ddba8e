"""The read ceiling of a sweep (issue 27 item 1): how it was found is in the manifest, and a point
that reads faster than it raises it for the run, so no point shows more than 100% of the floor."""

import pytest

from mlabench.bench.point import record_fields
from mlabench.measure.bandwidth import ReadCeiling
from mlabench.measure.stats import summarize
from mlabench.records.record import Record
from mlabench.shapes import MLADecodeShape
from mlabench.sweep import run as sweep_run, runner
from mlabench.sweep.config import SweepConfig
from mlabench.sweep.run import run_sweep
from mlabench.sweep.sentinel import ceilings_note
from mlabench.sweep.summary import against_run_ceiling, sweep_summary

SHAPE40 = MLADecodeShape.uniform(1, 40, 12, page_size=16)
#: The measured ceiling: 40-token points at 100 µs read 75% of it, the one at 50 µs 150%.
CEILING_TBPS = SHAPE40.min_bytes_moved / 75e-6 / 1e12


class FastPointBench:
    """Stands in for ShapeBench: every call takes 100 µs, but 2 splits at 40 tokens take 50 µs."""

    #: The fast point's status: ``incorrect`` for a wrong answer that reads faster than the ceiling.
    fast_status = "ok"

    def __init__(self, shape, timing, seed=0):
        self.shape, self.inputs = shape, [None]

    def run(self, backend, params, *, copy_bw_tbps, run_id, read_bw_tbps=None, **_):
        fields = record_fields(backend.name, params, self.shape, run_id, copy_bw_tbps, read_bw_tbps)
        us = 50.0 if (params["num_kv_splits"], self.shape.max_context_len) == (2, 40) else 100.0
        fields["floor_us"] = self.shape.floor_us(read_bw_tbps)
        return Record(status=self.fast_status if us == 50.0 else "ok", stats=summarize([us] * 3), timing_mode="wall",
                      achieved_tbps=
                      self.shape.min_bytes_moved / (us * 1e-6) / 1e12, pct_of_floor=100 * fields["floor_us"] / us,
                      **fields)


def sweep_with_a_fast_point(tmp_path, monkeypatch, status="ok"):
    """The 6-point sweep whose point (2 splits, 40 tokens) reads 1.5x the ceiling with ``status``."""
    monkeypatch.setattr(FastPointBench, "fast_status", status)
    monkeypatch.setattr(runner, "ShapeBench", FastPointBench)
    found = ReadCeiling(CEILING_TBPS, "paged", {"amax": 0.9 * CEILING_TBPS, "paged": CEILING_TBPS}, 4, 1 << 20,
                        73728)
    monkeypatch.setattr(sweep_run, "measure_read_ceiling", lambda: found)
    cfg = SweepConfig(name="t", heads=[12], batch=[1], context_lens=[16, 40], page_size=16, order="grid",
                      backends=["torch-splitkv"], params={"num_kv_splits": [1, 2, 3]}, visits=1)
    return run_sweep(cfg, tmp_path)


@pytest.fixture
def raised_run(tmp_path, monkeypatch):
    return sweep_with_a_fast_point(tmp_path, monkeypatch)


def test_an_incorrect_point_faster_than_the_ceiling_neither_raises_it_nor_rebases_the_table(tmp_path, monkeypatch):
    """Issue 35 item 15: a fast wrong answer is no evidence of bandwidth.  The run keeps its
    measured ceiling, the points after it are against that one, and the summary neither re-bases
    the % of floor on it nor says the ceiling was beaten."""
    store, recs = sweep_with_a_fast_point(tmp_path, monkeypatch, "incorrect")
    wrong = next(r for r in recs if r.stats.median_us == 50.0)
    assert wrong.status == "incorrect" and wrong.achieved_tbps == pytest.approx(1.5 * CEILING_TBPS)
    m = store.manifest()
    assert m.read_bandwidth_tbps == pytest.approx(CEILING_TBPS) and "raised" not in m.read_ceiling
    assert all(r.read_bandwidth_tbps == pytest.approx(CEILING_TBPS) for r in recs)
    assert recs[5].pct_of_floor == pytest.approx(75.0)  # measured after it: the measured ceiling
    rebased, notes = against_run_ceiling(recs)
    assert notes == [] and [r.pct_of_floor for r in rebased] == [r.pct_of_floor for r in recs]
    table = sweep_summary(recs)
    pct = {row[2]: row[6] for row in table.rows}
    shape16 = MLADecodeShape.uniform(1, 16, 12, page_size=16)
    assert pct[40] == pytest.approx(75.0)  # the best correct point at 40 tokens, against the measured ceiling
    assert pct[16] == pytest.approx(100 * shape16.min_bytes_moved / (CEILING_TBPS * 1e6) / 100.0)
    assert not [n for n in table.notes if "above the measured" in n or "RAISED" in n]


def test_a_point_beating_the_ceiling_raises_it_and_no_point_reads_over_100_percent(raised_run):
    store, recs = raised_run
    fast = next(r for r in recs if r.stats.median_us == 50.0)
    m = store.manifest()
    assert m.read_bandwidth_tbps == pytest.approx(fast.achieved_tbps) == pytest.approx(1.5 * CEILING_TBPS)
    (raise_,) = m.read_ceiling["raised"]
    assert raise_["point"] == "torch-splitkv num_kv_splits=2 B=1 L=40"
    assert raise_["from_tbps"] == pytest.approx(CEILING_TBPS) and raise_["after_points"] == 4
    assert m.read_ceiling["method"] == "paged" and m.read_ceiling["readings_tbps"]["amax"] == pytest.approx(
        0.9 * CEILING_TBPS)
    assert fast.pct_of_floor == pytest.approx(100.0)
    assert max(r.pct_of_floor for r in recs) == pytest.approx(100.0)
    (after,) = recs[5:]  # measured after the raise: against the raised ceiling
    assert after.read_bandwidth_tbps == pytest.approx(1.5 * CEILING_TBPS) and after.pct_of_floor == pytest.approx(50)
    assert recs[3].read_bandwidth_tbps == pytest.approx(CEILING_TBPS) and recs[3].pct_of_floor == pytest.approx(75)


def test_the_summary_puts_every_point_against_the_raised_ceiling_and_says_so(raised_run):
    store, recs = raised_run
    table = sweep_summary(recs)
    pct = {row[2]: row[6] for row in table.rows}  # context: % floor of the best
    assert pct[40] == pytest.approx(100.0)
    # 16 tokens at 100 µs: against the raised ceiling, though measured before it was raised
    assert pct[16] == pytest.approx(100 * MLADecodeShape.uniform(1, 16, 12, page_size=16).min_bytes_moved
                                    / (1.5 * CEILING_TBPS * 1e6) / 100.0)
    note = ceilings_note(store.manifest())
    assert "best of amax" in note and "paged" in note
    assert "RAISED to" in note and "torch-splitkv num_kv_splits=2 B=1 L=40" in note


def test_a_recorded_run_with_a_point_over_100_percent_is_put_against_that_point_and_says_so(raised_run):
    from mlabench.sweep.summary import compare_table

    _, recs = raised_run
    old = []  # as a run recorded before the ceiling was raised: one point at 150% of its floor
    for r in recs:
        floor_us = r.bytes_moved / (CEILING_TBPS * 1e6)
        old.append(r.model_copy(update={"read_bandwidth_tbps": CEILING_TBPS, "floor_us": floor_us,
                                        "pct_of_floor": 100 * floor_us / r.stats.median_us}))
    assert max(r.pct_of_floor for r in old) == pytest.approx(150.0)
    for table in (sweep_summary(old), compare_table(old, {"torch-splitkv": "split-kv"})):
        (note,) = [n for n in table.notes if "above the measured read ceiling" in n]
        assert note.startswith(f"{recs[0].run_id}: torch-splitkv num_kv_splits=2 B=1 L=40 read ")
    pct = {row[2]: row[6] for row in sweep_summary(old).rows}
    assert pct[40] == pytest.approx(100.0) and max(pct.values()) == pytest.approx(100.0)
    assert not [n for n in sweep_summary(recs).notes if "above the measured" in n]  # raised as it ran: no note


def test_the_bandwidth_note_names_the_datasheet_figure_only_where_there_is_one(raised_run):
    """A CPU has no datasheet figure: the note says so rather than ``datasheet — TB/s``."""
    manifest = raised_run[0].manifest()
    unknown = ceilings_note(manifest.model_copy(update={"datasheet_bandwidth_tbps": None}))
    assert unknown.endswith("(read + write), no datasheet figure for this device") and "datasheet —" not in unknown
    known = ceilings_note(manifest.model_copy(update={"datasheet_bandwidth_tbps": 4.8}))
    assert "(read + write), datasheet 4.8" in known and known.endswith(" TB/s")
