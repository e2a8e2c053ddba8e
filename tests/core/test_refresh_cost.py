"""The refresh cost per step lands in every measured record, beside the kernel time."""

from __future__ import annotations

from mlabench.backends import get_backend
from mlabench.bench.shape_bench import ShapeBench
from mlabench.measure.timing import TimingConfig
from mlabench.records.csv_rows import csv_row
from mlabench.shapes import MLADecodeShape

SHAPE = MLADecodeShape.create(num_heads=4, context_lens=(40, 9), page_size=16, q_dtype="float32",
                              kv_dtype="float32")
FAST = TimingConfig(warmup_iters=0, min_samples=3, max_samples=3, budget_s=0.1)


def test_refresh_cost_recorded():
    bench = ShapeBench(SHAPE, FAST, copies=1)
    ref = bench.run(get_backend("reference"), {}, copy_bw_tbps=None, run_id="t")
    split = bench.run(get_backend("torch-splitkv"), {"num_kv_splits": 2}, copy_bw_tbps=None, run_id="t")
    assert ref.status == split.status == "ok"
    assert ref.refresh_us is not None and ref.refresh_us > 0  # reads the lengths on the host
    assert split.refresh_us == 0.0  # reads them on the device only: nothing to refresh
    assert ref.stats is not None and split.stats is not None
    assert csv_row(ref)["refresh_us"] == ref.refresh_us and csv_row(split)["refresh_us"] == 0.0
