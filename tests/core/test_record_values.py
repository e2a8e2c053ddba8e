"""A measured record's derived numbers, to the value: bytes moved, floor, bandwidth, % of floor,
and the sweep summary's columns built from records made by hand."""

import pytest
import torch

from mlabench.backends import get_backend
from mlabench.measure import ShapeBench
from mlabench.results import Record, point_key, utc_now
from mlabench.shapes import MLADecodeShape
from mlabench.stats import summarize
from mlabench.tables import sweep_summary
from mlabench.timing import TimingConfig

FAST = TimingConfig(warmup_iters=0, min_samples=3, max_samples=3, budget_s=0.01)


def test_bytes_moved_counts_all_576_latent_columns():
    # Kimi K3 at TP8, the seed shape: 4096 latent rows of 576 bf16 values, q of 12 x 576, output
    # of 12 x 512 (the value is the first 512 columns)
    s = MLADecodeShape.create(num_heads=12, context_lens=(4096,), page_size=64)
    assert s.min_bytes_moved == (4096 * 576 + 12 * 576 + 12 * 512) * 2 == 4_744_704
    ragged = MLADecodeShape.create(num_heads=16, context_lens=(1, 100), page_size=16, q_dtype="float32",
                                   kv_dtype="float32")
    assert ragged.min_bytes_moved == (101 * 576 + 2 * 16 * 576 + 2 * 16 * 512) * 4
    assert s.floor_us(4.0) == pytest.approx(4_744_704 / 4.0e12 * 1e6, rel=1e-12)


def test_a_measured_record_carries_floor_bandwidth_and_percent_of_floor():
    shape = MLADecodeShape.create(num_heads=12, context_lens=(40, 17), page_size=16)
    rec = ShapeBench(shape, timing=FAST).run(get_backend("torch-splitkv"), {"num_kv_splits": 2},
                                            copy_bw_tbps=2.0, run_id="t")
    assert rec.status == "ok" and rec.message == ""
    on_gpu = torch.cuda.is_available()
    assert rec.timing_mode == ("graph" if on_gpu else "wall") and (rec.eager_stats is not None) == on_gpu
    want_bytes = (57 * 576 + 2 * 12 * 576 + 2 * 12 * 512) * 2
    assert rec.bytes_moved == want_bytes and rec.copy_bandwidth_tbps == 2.0
    assert rec.floor_us == pytest.approx(want_bytes / 2.0e12 * 1e6, rel=1e-12)
    median_us = rec.stats.median_us
    assert rec.achieved_tbps == pytest.approx(want_bytes / (median_us * 1e-6) / 1e12, rel=1e-12)
    assert rec.pct_of_floor == pytest.approx(100 * rec.floor_us / median_us, rel=1e-12)


def record(splits: int, median_us: float, status: str = "ok", noisy: bool = False) -> Record:
    shape = {"num_heads": 12, "context_lens": [64], "page_size": 16, "kv_dtype": "bfloat16"}
    spread = [median_us * f for f in ((1.0, 0.5, 1.5) if noisy else (1.0, 1.0, 1.0))]
    return Record(key=point_key("b", {"num_kv_splits": splits}, shape), run_id="r", backend="b",
                  params={"num_kv_splits": splits}, shape=shape, batch=1, num_heads=12, context_len=64,
                  status=status, stats=summarize(spread), achieved_tbps=1000 / median_us,
                  pct_of_floor=100 / median_us, copy_bandwidth_tbps=2.0, timing_mode="wall",
                  timestamp=utc_now())


def test_sweep_summary_columns_from_hand_made_records():
    recs = [record(1, 10.0, noisy=True), record(16, 5.0), record(64, 1.0, status="incorrect"),
            record(4, 7.0), record(128, 9.0, status="error")]
    table = sweep_summary(recs)
    assert table.title == "Sweep: best configuration per backend, batch and context"
    # a column for every split count swept, in order (4 too, though it is no power of 16)
    assert table.columns == ["backend", "batch", "context", "best params", "µs", "TB/s", "% floor",
                             "µs @1 splits", "µs @4 splits", "µs @16 splits", "µs @64 splits",
                             "µs @128 splits", "not ok", "noisy"]
    # the wrong 1 µs answer at 64 splits and the failed one at 128 neither win nor fill their columns
    assert table.rows == [["b", 1, 64, "num_kv_splits=16", 5.0, 200.0, 20.0, 10.0, 7.0, 5.0, None,
                           None, "error, incorrect (2)", "1"]]
    assert any(n.startswith("1 of 5 points are noisy") for n in table.notes)
    best_noisy = sweep_summary([record(1, 3.0, noisy=True), record(16, 5.0)])
    assert best_noisy.rows[0][3] == "num_kv_splits=1" and best_noisy.rows[0][-1] == "1 incl. best"
    quiet = sweep_summary([record(1, 3.0), record(16, 5.0)])
    assert quiet.rows[0][-2:] == ["", ""] and not any("noisy" in n for n in quiet.notes)
    assert "time: median µs per call (wall)" in quiet.notes[-1]


def test_a_point_that_could_not_start_still_carries_its_floor():
    from mlabench.measure import failed_record

    shape = MLADecodeShape.create(num_heads=12, context_lens=(4096,), page_size=64)
    rec = failed_record("b", {"num_kv_splits": 4}, shape, "r", 4.0, "inputs could not be created")
    assert rec.status == "error" and rec.message == "inputs could not be created"
    assert rec.bytes_moved == 4_744_704 and rec.floor_us == pytest.approx(4_744_704 / 4.0e6)
    assert rec.stats is None and rec.achieved_tbps is None


def test_compare_table_best_splits_is_what_ran_and_a_missing_family_is_a_dash():
    from mlabench.tables import compare_table

    families = {"p": "persistent", "s": "split-kv"}
    ran_7 = record(8, 4.0).model_copy(update={"backend": "s", "effective_params": {"num_kv_splits": 7}})
    asked_16 = record(16, 6.0).model_copy(update={"backend": "s"})  # no effective value: the asked one
    persistent = record(1, 2.0).model_copy(update={"backend": "p", "params": {}, "setup_us": {"a": 1.0, "b": 2.5}})
    (row,) = compare_table([ran_7, asked_16, persistent], families).rows
    assert row == [1, 64, "p", "—", 2.0, 50.0, 3.5, "s", 7, 4.0, 25.0, 2.0]
    (row,) = compare_table([asked_16], families).rows  # no persistent backend recorded
    assert row == [1, 64, None, None, None, None, None, "s", 16, 6.0, 100 / 6.0, None]
    (row,) = compare_table([persistent], families).rows  # no split-KV backend recorded
    assert row == [1, 64, "p", "—", 2.0, 50.0, 3.5, None, None, None, None, None]


@pytest.mark.parametrize("bandwidth, floor_us, copy", [("read", 1.0, False), ("copy", 1.0, True),
                                                      ("copy", None, False)])
def test_compare_table_names_the_bandwidth_the_floor_was_measured_on(bandwidth, floor_us, copy):
    from mlabench.tables import compare_table

    rec = record(8, 4.0).model_copy(update={"floor_bandwidth": bandwidth, "floor_us": floor_us})
    note = compare_table([rec], {"b": "split-kv"}).notes[2]
    assert note == ("% floor is against the measured device-to-device copy bandwidth (read + write); a "
                    "read-mostly kernel can exceed it by a few percent" if copy else
                    "% floor is against the measured streaming read bandwidth (a large read-only reduction)")


def test_compare_table_leaves_out_a_backend_unsupported_everywhere_in_a_cell_with_a_note():
    """gluon-splitkv at qo_len 2 (results/h200/qo-len/): every record unsupported, so no row pairs
    it there; at qo_len 1, and where only some of its records are unsupported, it stays."""
    from mlabench.tables import compare_table

    families = {"p": "persistent", "s": "split-kv", "g": "split-kv"}

    def at(backend: str, qo_len: int, status: str = "ok", splits: int = 8, message: str = "") -> Record:
        return record(splits, 4.0, status=status).model_copy(update={
            "backend": backend, "qo_len": qo_len, "message": message,
            "stats": None if status == "unsupported" else record(splits, 4.0).stats})

    why = "qo_len 2: the Hopper Gluon kernel is written for one query token per request"
    recs = [at(b, q) for b in "ps" for q in (1, 2)] + [at("g", 1), at("g", 1, "unsupported", 16, "16 splits")]
    recs += [at("g", 2, "unsupported", s, why) for s in (8, 16)]
    table = compare_table(recs, families)
    pairs = [(row[2], row[3], row[8]) for row in table.rows]  # qo_len, persistent, split-KV
    assert pairs == [(1, "p", "g"), (1, "p", "s"), (2, "p", "s")]
    assert table.notes[-1] == ("left out: g in 1 cell (batch 1; context 64; qo_len 2), where every configuration "
                               f"recorded is unsupported ({why})")
    assert not any(n.startswith("left out") for n in compare_table(recs[:4], families).notes)
