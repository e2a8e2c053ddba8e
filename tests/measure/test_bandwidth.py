"""The memory ceilings: read and copy bandwidth measured on the CPU, the datasheet lookup, and the
floor of a record against the read bandwidth."""

import math

import pytest

from mlabench.device import DeviceInfo
from mlabench.measure import bandwidth
from mlabench.measure.bandwidth import (
    datasheet_bandwidth_tbps, measure_copy_bandwidth_tbps, measure_read_bandwidth_tbps,
)
from mlabench.shapes import MLADecodeShape
from mlabench.sweep.point import record_fields

CPU = DeviceInfo("cpu", "cpu", "cpu", 2, 0, "cpu", 8 << 30)


def test_read_and_copy_bandwidth_measured_on_the_cpu():
    read = measure_read_bandwidth_tbps(CPU, size_bytes=16 << 20, reps=5, warmup=1)
    copy = measure_copy_bandwidth_tbps(CPU, size_bytes=16 << 20, reps=5, warmup=1)
    for tbps in (read, copy):
        assert math.isfinite(tbps) and 1e-4 < tbps < 5.0  # 0.1 GB/s .. 5 TB/s: a CPU's memory


def test_read_counts_bytes_read_once_and_copy_counts_read_plus_write(monkeypatch):
    ops = []

    def fake_median_us(op, device, reps, warmup):
        op()
        ops.append(op)
        return 1000.0  # 1 ms

    monkeypatch.setattr(bandwidth, "_median_us", fake_median_us)
    assert measure_read_bandwidth_tbps(CPU, size_bytes=8 << 20) == pytest.approx((8 << 20) / 1e-3 / 1e12)
    assert measure_copy_bandwidth_tbps(CPU, size_bytes=8 << 20) == pytest.approx(2 * (8 << 20) / 1e-3 / 1e12)
    assert len(ops) == 2


def test_the_read_reduction_times_a_full_pass_over_random_data(monkeypatch):
    import torch

    seen = {}
    real_amax = torch.amax

    def spy(t, *a, **k):
        seen["numel"], seen["zeros"] = t.numel(), bool((t == 0).all())
        return real_amax(t, *a, **k)

    monkeypatch.setattr(torch, "amax", spy)
    measure_read_bandwidth_tbps(CPU, size_bytes=4 << 20, reps=1, warmup=0)
    assert seen == {"numel": (4 << 20) // 4, "zeros": False}


@pytest.mark.parametrize("name, tbps", [("NVIDIA H200", 4.8), ("NVIDIA H100 80GB HBM3", 3.35),
                                        ("AMD Instinct MI300X", 5.3), ("AMD Instinct MI355X", 8.0),
                                        ("Intel(R) Xeon(R) CPU", None)])
def test_datasheet_bandwidth(name, tbps):
    assert datasheet_bandwidth_tbps(name) == tbps


def test_the_floor_uses_the_read_bandwidth_when_measured():
    s = MLADecodeShape.uniform(16, 131072, 12, page_size=64)
    read = record_fields("b", {}, s, "r", copy_bw_tbps=4.08, read_bw_tbps=4.34)
    assert read["floor_bandwidth"] == "read" and read["floor_us"] == pytest.approx(s.min_bytes_moved / 4.34e6)
    # FlashMLA measured 562.9 µs here on an H200: 99% of the read floor, 105% of the copy floor
    assert 100 * read["floor_us"] / 562.9 == pytest.approx(99.0, abs=0.5)
    copy = record_fields("b", {}, s, "r", copy_bw_tbps=4.08)
    assert copy["floor_bandwidth"] == "copy" and 100 * copy["floor_us"] / 562.9 == pytest.approx(105.3, abs=0.5)
