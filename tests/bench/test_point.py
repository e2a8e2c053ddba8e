"""What one point is, below the sweep and the tuner (issue 36 item 2): :mod:`mlabench.bench.point`
holds :class:`Point`, the record fields and ``DEFAULT_CHECK_HEADS`` without torch, so the tuner's
configuration reads its default heads without importing the sweep."""

from __future__ import annotations

from mlabench.bench.point import DEFAULT_CHECK_HEADS, Point, failed_record
from mlabench.records.record import point_key
from mlabench.shapes import MLADecodeShape
from tests.imports import modules_loaded_by


def test_a_point_is_keyed_as_its_records_are():
    shape = MLADecodeShape.create(num_heads=DEFAULT_CHECK_HEADS, context_lens=(4096,), page_size=64)
    point = Point("torch-splitkv", {"num_kv_splits": 4}, shape)
    rec = failed_record(point.backend, point.params, shape, "r", 4.0, "inputs could not be created")
    assert point.key == point_key("torch-splitkv", {"num_kv_splits": 4}, shape.key()) == rec.key
    assert DEFAULT_CHECK_HEADS == 12  # Kimi K3's 96 heads at TP8


def test_what_a_point_is_needs_neither_torch_nor_the_sweep():
    assert not {"torch", "mlabench.sweep"} & modules_loaded_by("import mlabench.bench.point")
    assert not {m for m in modules_loaded_by("import mlabench.tune.space") if m.startswith("mlabench.sweep")}
