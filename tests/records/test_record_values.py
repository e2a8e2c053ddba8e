"""A measured record's derived numbers, to the value: bytes moved, floor, bandwidth, % of floor,
and the sweep summary's columns built from records made by hand."""

import pytest
import torch

from mlabench.backends import get_backend
from mlabench.bench.shape_bench import ShapeBench
from mlabench.measure.stats import summarize
from mlabench.measure.timing import TimingConfig
from mlabench.records.record import Record, point_key, utc_now
from mlabench.shapes import MLADecodeShape
from mlabench.sweep.summary import sweep_summary

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


def test_a_point_that_ran_other_values_than_it_asked_for_is_labelled_by_what_ran():
    """gluon-splitkv asked fused_merge=1 where the grid does not fit runs the wide merge
    (effective_params fused_merge=0): tables labelled the point by the value asked for."""
    from mlabench.sweep.check import check_table
    from mlabench.sweep.summary import split_count

    asked = {"num_kv_splits": 132, "fused_merge": 1, "rows_per_tile": "16", "split_policy": "device:p.json"}
    ran = {"num_kv_splits": [8, 16, 8], "fused_merge": 0, "rows_per_tile": 16, "split_policy": "device", "pdl": 1}
    fell_back = record(132, 5.0).model_copy(update={"params": asked, "effective_params": ran})
    assert fell_back.shown_params() == {"num_kv_splits": "8-16 (asked 132)", "fused_merge": "0 (asked 1)",
                                        "rows_per_tile": "16", "split_policy": "device:p.json"}
    assert fell_back.params == asked and fell_back.key == record(132, 5.0).key  # pairing is by what was asked
    plain = record(16, 6.0).model_copy(update={"effective_params": {"num_kv_splits": 16, "fused_merge": 0}})
    assert plain.shown_params() == {"num_kv_splits": 16} and split_count(plain) == 16
    table = sweep_summary([fell_back.model_copy(update={"params": {"fused_merge": 1, "num_kv_splits": 132}})])
    assert table.rows[0][3] == "fused_merge=0 (asked 1) num_kv_splits=8-16 (asked 132)"
    assert "params: X (asked Y) is the value that ran (effective_params) where it is not the one asked for, e.g. " \
           "b fused_merge=0 (asked 1)" in table.notes
    assert not any("asked Y" in n for n in sweep_summary([plain]).notes)
    assert check_table([fell_back]).rows[0][1] == ("fused_merge=0 (asked 1) num_kv_splits=8-16 (asked 132) "
                                                   "rows_per_tile=16 split_policy=device:p.json")


def test_a_point_that_could_not_start_still_carries_its_floor():
    from mlabench.bench.point import failed_record

    shape = MLADecodeShape.create(num_heads=12, context_lens=(4096,), page_size=64)
    rec = failed_record("b", {"num_kv_splits": 4}, shape, "r", 4.0, "inputs could not be created")
    assert rec.status == "error" and rec.message == "inputs could not be created"
    assert rec.bytes_moved == 4_744_704 and rec.floor_us == pytest.approx(4_744_704 / 4.0e6)
    assert rec.stats is None and rec.achieved_tbps is None


def test_compare_table_best_splits_is_what_ran_and_a_missing_family_is_a_dash():
    from mlabench.sweep.summary import compare_table

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
    from mlabench.sweep.summary import compare_table

    rec = record(8, 4.0).model_copy(update={"floor_bandwidth": bandwidth, "floor_us": floor_us})
    note = compare_table([rec], {"b": "split-kv"}).notes[2]
    assert note == ("% floor is against the measured device-to-device copy bandwidth (read + write); a "
                    "read-mostly kernel can exceed it by a few percent" if copy else
                    "% floor is against the measured streaming read bandwidth (a large read-only reduction)")


def test_compare_table_leaves_out_a_backend_unsupported_everywhere_in_a_cell_with_a_note():
    """gluon-splitkv at qo_len 2 (results/h200/qo-len/): every record unsupported, so no row pairs
    it there; at qo_len 1, and where only some of its records are unsupported, it stays."""
    from mlabench.sweep.summary import compare_table

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


def verdict(passed: bool = True, **fields):
    from mlabench.checks.verdict import Verdict

    values = dict(passed=passed, shape_ok=True, all_finite=True, max_abs_err=0.002, rmse=0.001, cosine=1.0,
                  output_shape=[2, 12, 512], ref_rms=0.04, rel_rmse=0.025, rel_max_err=0.05,
                  rel_rmse_limit=0.0078125, rel_max_err_limit=0.0625)
    return Verdict(**{**values, **fields})


def test_check_table_rows_and_note_from_hand_made_records():
    """Title and column names (JSON and CSV carry them), the shape with each request's length, the
    verdict with its reason only where the point failed, dashes where no verdict was made."""
    from mlabench.sweep.check import check_table

    def at(status: str, lens: list[int], message: str = "", v=None) -> Record:
        shape = {"num_heads": 12, "context_lens": lens, "page_size": 16}
        return record(4, 1.0).model_copy(update={
            "status": status, "message": message, "verdict": v, "shape": shape, "batch": len(lens)})

    recs = [at("error", [64], "RuntimeError: no kernel image"),
            at("ok", [64, 64], "graph capture failed; eager time", verdict()),
            at("incorrect", [64, 17], "rel RMSE 0.5 > 0.0078", verdict(False, rel_rmse=0.5, max_abs_err=0.2))]
    table = check_table(recs, {"flashmla": "needs an sm_90 GPU"})
    assert table.title == "Correctness against the fp32 reference"
    assert table.columns == ["backend", "params", "shape", "rel RMSE", "rel max err", "max abs err", "finite",
                             "verdict"]
    assert table.rows == [
        ["b", "num_kv_splits=4", "B=1 H=12 L=64 p16", None, None, None, None, "error: RuntimeError: no kernel image"],
        ["b", "num_kv_splits=4", "B=2 H=12 L=64 p16 → [2,12,512]", 0.025, 0.05, 0.002, True, "pass"],
        ["b", "num_kv_splits=4", "B=2 H=12 L=64,17 p16 → [2,12,512]", 0.5, 0.05, 0.2, True,
         "FAIL: rel RMSE 0.5 > 0.0078"],
    ]
    assert table.notes == [
        "rel RMSE = RMSE / RMS of the reference (limit 0.00781), rel max err = max |error| / RMS of the reference "
        "(limit 0.0625), on the worst of the input sets random; unread cache slots and outputs poisoned with NaN",
        "not available here: flashmla (needs an sm_90 GPU)"]
    named = check_table([recs[1].model_copy(update={"verdict": verdict(input_set="needles")})])
    assert "on the worst of the input sets needles;" in named.notes[0]
    assert check_table(recs[:1]).notes == []  # no verdict: no limits to state


def test_sweep_summary_floor_note_and_what_a_narrow_terminal_leaves_out_first():
    """The floor note names the bandwidth the floor divides by and its value (read here, not the
    copy bandwidth the records also carry), and ``n/a`` for an unknown timing mode; at a narrow
    terminal TB/s goes first, then the split columns from the right, then ``noisy``."""
    from mlabench.tables.render import to_rich

    recs = [record(s, 10.0 / s, noisy=(s == 4)) for s in (1, 4, 16)]
    recs += [record(s, 30.0 / s).model_copy(update={"context_len": 128}) for s in (1, 4, 16)]
    recs = [r.model_copy(update={"floor_bandwidth": "read", "read_bandwidth_tbps": 4.5, "timing_mode": ""})
            for r in recs]
    table = sweep_summary(recs)
    assert table.notes[-1] == ("heads=12 page=16 bfloat16; time: median µs per call (n/a); µs @N: at N splits; "
                               "floor = bytes / measured read bandwidth 4.5 TB/s")
    caption = to_rich(table, 1).caption.plain.splitlines()
    assert caption[-1] == ("left out at 1 columns: TB/s, µs @16, µs @4, µs @1, noisy (a wider terminal, "
                           "or --format markdown / json / csv, shows them)")


def test_causal_rows_come_before_non_causal_ones():
    """At the same batch, context and qo_len, the causal row comes first (sweep and compare)."""
    from mlabench.sweep.summary import compare_table

    recs = [record(4, 2.0).model_copy(update={"qo_len": 2, "causal": causal}) for causal in (False, True)]
    assert [row[3] for row in sweep_summary(recs).rows] == [2, "2 non-causal"]
    assert [row[2] for row in compare_table(recs, {"b": "split-kv"}).rows] == [2, "2 non-causal"]


def test_the_left_out_note_lists_every_batch_and_qo_len_in_order_and_says_when_no_reason_was_recorded():
    """One unsupported record per cell (no second one to fall back on), several cells, query
    lengths in numeric order with the causal one first, no message recorded."""
    from mlabench.sweep.summary import compare_table

    cells = [(1, 1, True), (2, 1, True), (1, 2, True), (1, 2, False), (1, 31, False), (1, 31, True), (1, 1, False)]
    recs = [record(8, 4.0, status="unsupported").model_copy(update={
        "backend": "g", "batch": batch, "qo_len": qo, "causal": causal, "stats": None}) for batch, qo, causal in cells]
    table = compare_table(recs + [record(8, 4.0).model_copy(update={"backend": "s"})], {"g": "split-kv", "s": "split-kv"})
    assert table.notes[-1] == (
        "left out: g in 7 cells (batch 1, 2; context 64; qo_len 1, 1 non-causal, 2, 2 non-causal, 31, "
        "31 non-causal), where every configuration recorded is unsupported (no reason recorded)")


class Recording:
    """torch-splitkv reporting a setup step, a workspace and an extra effective param of its own,
    and noting what each ``prepare`` was given."""

    name = "recording"

    def __init__(self):
        self.inner = get_backend("torch-splitkv")
        self.prepared: list[tuple[object, dict | None]] = []

    def supports(self, shape):
        return self.inner.supports(shape)

    def prepare(self, inputs, params):
        import dataclasses

        self.prepared.append((inputs, params))
        call = self.inner.prepare(inputs, params)
        return dataclasses.replace(call, effective_params={**call.effective_params, "tile": 64},
                                   setup_us={"metadata_us": 12.5}, workspace_bytes=4096)


def test_a_record_keeps_what_the_call_reports_and_times_every_copy_on_the_read_floor(monkeypatch):
    from mlabench.checks.verdict import CheckConfig

    reads = iter(range(1, 10))  # the GPU's clocks and power, read just before and just after timing
    monkeypatch.setattr("mlabench.bench.shape_bench.gpu_state", lambda: {"read": next(reads)})
    shape = MLADecodeShape.create(num_heads=12, context_lens=(40, 17), page_size=16)
    bench, backend = ShapeBench(shape, timing=FAST, copies=3), Recording()
    rec = bench.run(backend, {"num_kv_splits": 2}, copy_bw_tbps=2.0, read_bw_tbps=3.0, run_id="t",
                    check=CheckConfig(input_sets=["random"]))
    assert rec.status == "ok" and list(rec.verdict.by_input_set) == ["random"]  # only the sets asked for
    assert (rec.effective_params, rec.setup_us, rec.workspace_bytes) == (
        {"num_kv_splits": 2, "tile": 64}, {"metadata_us": 12.5}, 4096)
    # copy 0 prepared for the check, then each other copy with the same params, all three timed
    copy = {id(x): i for i, x in enumerate(bench.inputs)}
    assert [(copy.get(id(x)), p) for x, p in backend.prepared] == [(i, {"num_kv_splits": 2}) for i in range(3)]
    assert rec.cold_cache_copies == 3
    assert (rec.gpu_state_before, rec.gpu_state) == ({"read": 1}, {"read": 2})
    assert (rec.floor_bandwidth, rec.read_bandwidth_tbps, rec.copy_bandwidth_tbps) == ("read", 3.0, 2.0)
    assert rec.floor_us == pytest.approx(rec.bytes_moved / 3.0e12 * 1e6, rel=1e-12)


def test_a_failure_on_the_elementwise_tolerance_says_so_not_the_relative_errors():
    """A correct kernel within the relative limits, failed by an ``--atol`` no bf16 output meets."""
    import re

    from mlabench.checks.verdict import CheckConfig

    shape = MLADecodeShape.create(num_heads=12, context_lens=(40,), page_size=16)
    rec = ShapeBench(shape, timing=FAST).run(get_backend("torch-splitkv"), {"num_kv_splits": 2}, copy_bw_tbps=2.0,
                                            run_id="t", check=CheckConfig(input_sets=["random"], atol=1e-9))
    assert rec.status == "incorrect" and rec.verdict.rel_rmse <= rec.verdict.rel_rmse_limit
    assert re.fullmatch(r"random inputs: max abs err [0-9.e-]+ over atol=1e-09 rtol=0", rec.message), rec.message


def test_verdict_message_names_the_relative_errors_that_failed_and_only_a_missing_needle_found():
    from mlabench.checks.verdict import Verdict
    from mlabench.bench.shape_bench import _verdict_message

    def v(rel_rmse, rel_max, missing=""):
        return Verdict(passed=False, shape_ok=True, all_finite=True, max_abs_err=0.01, rmse=0.001, cosine=1.0,
                       atol=1e-9, rtol=None, output_shape=[1, 12, 512], ref_rms=0.04, rel_rmse=rel_rmse,
                       rel_max_err=rel_max, rel_rmse_limit=0.0078125, rel_max_err_limit=0.0625,
                       input_set="needles", missing=missing)

    relative = ("needles inputs: relative RMSE {} (limit 0.00781), normalised max error {} (limit 0.0625)")
    # the relative RMSE over its limit, the max error within: the relative errors, not the atol
    assert _verdict_message(v(0.5, 0.01)) == relative.format("0.5", "0.01")
    assert _verdict_message(v(0.5, 0.01, "needle at token 7 of request 0 missing")) == \
        relative.format("0.5", "0.01") + "; needle at token 7 of request 0 missing"
    # exactly at the relative limits is within them: then only the atol can have failed it
    assert _verdict_message(v(0.0078125, 0.0625)) == "needles inputs: max abs err 0.01 over atol=1e-09 rtol=0"


def test_a_point_that_could_not_start_divides_by_the_read_bandwidth_when_measured():
    from mlabench.bench.point import failed_record

    shape = MLADecodeShape.create(num_heads=12, context_lens=(4096,), page_size=64)
    rec = failed_record("b", {}, shape, "r", 4.0, "inputs could not be created", read_bw_tbps=5.0)
    assert (rec.floor_bandwidth, rec.read_bandwidth_tbps) == ("read", 5.0)
    assert rec.floor_us == pytest.approx(4_744_704 / 5.0e6)
    copy_only = failed_record("b", {}, shape, "r", 4.0, "inputs could not be created")
    assert (copy_only.floor_bandwidth, copy_only.read_bandwidth_tbps) == ("copy", None)


def test_short_memory_halves_the_copies_until_they_and_the_reference_scratch_fit(monkeypatch):
    from mlabench.inputs import input_bytes

    shape = MLADecodeShape.create(num_heads=12, context_lens=(40,), page_size=16)
    # room for 3 input sets (with the 10% headroom) but not 5: 4 copies asked, 2 kept (+1 scratch)
    monkeypatch.setattr("mlabench.inputs.free_memory_bytes", lambda device: int(3.5 * input_bytes(shape) / 0.9))
    assert len(ShapeBench(shape, timing=FAST, copies=4).inputs) == 2


def test_refresh_cost_is_the_median_of_five_timed_refreshes(monkeypatch):
    from mlabench.backends.base import PreparedCall
    from mlabench.device import current_device
    from mlabench.bench.shape_bench import refresh_cost_us

    times = iter([50.0, 10.0, 40.0, 20.0, 30.0, 60.0, 70.0])
    monkeypatch.setattr("mlabench.bench.shape_bench.timed_us", lambda device, step: (step(), next(times)))
    call = PreparedCall(fn=lambda: None, out=torch.zeros(1), refresh=lambda: None)
    assert refresh_cost_us(call, current_device()) == 30.0  # of 10, 20, 30, 40, 50
    assert refresh_cost_us(PreparedCall(fn=lambda: None, out=torch.zeros(1)), current_device()) == 0.0


def test_copies_are_drawn_from_the_runs_seed_and_only_copy_0_is_poisoned():
    from mlabench.inputs import make_inputs

    shape = MLADecodeShape.create(num_heads=12, context_lens=(40,), page_size=16)
    bench = ShapeBench(shape, timing=FAST, seed=5, copies=3)
    assert [x.poisoned for x in bench.inputs] == [True, False, False]
    for i, x in enumerate(bench.inputs):  # seeds 5, 6, 7
        assert torch.equal(x.q, make_inputs(shape, seed=5 + i, poison=i == 0).q)


def test_needles_are_placed_once_per_split_layout():
    shape = MLADecodeShape.create(num_heads=12, context_lens=(40,), page_size=16)
    bench = ShapeBench(shape, timing=FAST)
    two, four = bench.case("needles", [[0, 20]]), bench.case("needles", [[0, 10, 20, 30]])
    assert bench.case("needles", [[0, 20]]) is two and four is not two
    assert {n.token for n in two.needles} != {n.token for n in four.needles}  # at each layout's split edges


def test_the_check_uses_the_run_seed_for_peaky_needles_and_the_backends_own_split_starts():
    import dataclasses

    from mlabench.checks.input_sets import peak_needles

    shape = MLADecodeShape.create(num_heads=12, context_lens=(40,), page_size=16)
    bench = ShapeBench(shape, timing=FAST, seed=5)
    peaky = bench.case("peaky", [[0]])
    assert peaky.needles == peak_needles(bench.inputs[0], 5) != peak_needles(bench.inputs[0], 0)

    class Reporting(Recording):  # a work-list backend: it says where its pieces of KV start
        def prepare(self, inputs, params):
            return dataclasses.replace(super().prepare(inputs, params), split_starts=[[0, 13]])

    bench.run(Reporting(), {"num_kv_splits": 2}, copy_bw_tbps=2.0, run_id="t", time_it=False)
    assert [k for k in bench.cases if k[0] == "needles"] == [("needles", ((0, 13),))]


@pytest.mark.parametrize("q_dtype, kv_dtype", [("float32", "bfloat16"), ("bfloat16", "float32")])
def test_the_check_judges_on_the_coarser_dtypes_limits_or_those_asked_for(q_dtype, kv_dtype):
    from mlabench.checks.verdict import CheckConfig, ErrorLimits

    shape = MLADecodeShape.create(num_heads=12, context_lens=(40,), page_size=16, q_dtype=q_dtype, kv_dtype=kv_dtype)
    bench, backend = ShapeBench(shape, timing=FAST), get_backend("torch-splitkv")
    only_random = CheckConfig(input_sets=["random"])
    rec = bench.run(backend, {"num_kv_splits": 2}, copy_bw_tbps=2.0, run_id="t", check=only_random, time_it=False)
    assert rec.verdict.rel_rmse_limit == ErrorLimits.for_dtypes("bfloat16").rel_rmse
    tight = bench.run(backend, {"num_kv_splits": 2}, copy_bw_tbps=2.0, run_id="t", time_it=False,
                      check=CheckConfig(input_sets=["random"], rel_rmse_limit=1e-9))
    assert tight.status == "incorrect" and tight.verdict.rel_rmse_limit == 1e-9
    # an --atol no output meets, widened by an --rtol of 100 x the reference: the rtol is applied
    loose = bench.run(backend, {"num_kv_splits": 2}, copy_bw_tbps=2.0, run_id="t", time_it=False,
                      check=CheckConfig(input_sets=["random"], atol=1e-9, rtol=100.0))
    assert loose.status == "ok" and (loose.verdict.atol, loose.verdict.rtol) == (1e-9, 100.0)


def test_a_cpu_sweep_says_it_is_a_smoke_test():
    """Issue 25 item 11: wall-clock (CPU) records get a plain note; GPU records do not."""
    said = ("CPU run: a smoke test of the pipeline, not a measurement (wall-clock times on a CPU, of PyTorch "
            "code or of Triton kernels under its interpreter; compare nothing from them)")
    assert said in sweep_summary([record(1, 3.0)]).notes
    graph = [record(1, 3.0).model_copy(update={"timing_mode": "graph"})]
    assert not any("smoke test" in n for n in sweep_summary(graph).notes)
