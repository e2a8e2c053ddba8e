"""The memory ceilings: read and copy bandwidth measured on the CPU, the datasheet lookup, and the
floor of a record against the read bandwidth."""

import math

import pytest

from mlabench.device import DeviceInfo
from mlabench.measure import bandwidth
from mlabench.measure.bandwidth import (
    CEILING_COPIES, PAGE_BYTES, datasheet_bandwidth_tbps, measure_copy_bandwidth_tbps, measure_read_bandwidth_tbps,
    measure_read_ceiling,
)
from mlabench.bench.point import record_fields
from mlabench.shapes import MLADecodeShape

CPU = DeviceInfo("cpu", "cpu", "cpu", 2, 0, "cpu", 8 << 30)


def test_read_and_copy_bandwidth_measured_on_the_cpu(monkeypatch):
    medians = []
    real = bandwidth._median_us

    def spy(op, device, reps, warmup):
        medians.append(real(op, device, reps, warmup))
        return medians[-1]

    monkeypatch.setattr(bandwidth, "_median_us", spy)
    ceiling = measure_read_ceiling(CPU, size_bytes=16 << 20, reps=5, warmup=1, rounds=1)
    copy = measure_copy_bandwidth_tbps(CPU, size_bytes=16 << 20, reps=5, warmup=1)
    # each figure is the bytes over the median measured, exactly (a loaded CPU read 0.4 GB/s here)
    assert ceiling.tbps == pytest.approx(ceiling.copies * ceiling.buffer_bytes / (medians[0] * 1e-6) / 1e12, rel=1e-12)
    assert copy == pytest.approx(2 * ((16 << 20) // 4 * 4) / (medians[1] * 1e-6) / 1e12, rel=1e-12)
    assert 0 < ceiling.tbps < 1.0 and 0 < copy < 1.0  # below 1 TB/s: a CPU's memory
    assert ceiling.method == "amax" and ceiling.readings_tbps == {"amax": ceiling.tbps}  # no Triton reads on a CPU
    assert ceiling.page_bytes is None and ceiling.copies == CEILING_COPIES


def test_read_counts_bytes_read_once_and_copy_counts_read_plus_write(monkeypatch):
    ops = []

    def fake_median_us(op, device, reps, warmup):
        op()
        ops.append(op)
        return 1000.0  # 1 ms

    monkeypatch.setattr(bandwidth, "_median_us", fake_median_us)
    ceiling = measure_read_ceiling(CPU, size_bytes=8 << 20, rounds=1)
    # four buffers of whole 144 KiB units (two 72 KiB pages), 8 MiB in all at most: 14 units each
    assert (ceiling.copies, ceiling.buffer_bytes) == (4, 14 * 2 * PAGE_BYTES)
    assert ceiling.tbps == pytest.approx(4 * 14 * 2 * PAGE_BYTES / 1e-3 / 1e12)
    assert len(ops) == 1
    assert measure_read_bandwidth_tbps(CPU, size_bytes=8 << 20) == ceiling.tbps
    assert measure_copy_bandwidth_tbps(CPU, size_bytes=8 << 20) == pytest.approx(2 * (8 << 20) / 1e-3 / 1e12)


def test_the_read_reduction_times_full_passes_over_several_buffers_of_random_data(monkeypatch):
    import torch

    seen = []
    real_amax = torch.amax

    def spy(t, *a, **k):
        seen.append((t.data_ptr(), t.numel(), bool((t == 0).all())))
        return real_amax(t, *a, **k)

    monkeypatch.setattr(torch, "amax", spy)
    ceiling = measure_read_ceiling(CPU, size_bytes=4 << 20, copies=4, reps=1, warmup=0, rounds=1)
    # one sample reads each of the 4 buffers once, each its own allocation, none all zeros
    assert len(seen) == 4 and len({p for p, _, _ in seen}) == 4
    assert {(n, z) for _, n, z in seen} == {(ceiling.buffer_bytes // 4, False)}


def test_the_ceiling_is_the_best_reading_and_says_which(monkeypatch):
    times_us = {"amax": 1000.0, "stream": 800.0, "paged": 900.0}
    ops = {name: (lambda name=name: name) for name in times_us}
    monkeypatch.setattr(bandwidth, "_triton_read_ops", lambda bufs, device, seed: {k: ops[k] for k in ("stream", "paged")})
    monkeypatch.setattr(bandwidth, "_median_us", lambda op, device, reps, warmup: times_us[
        op() if op in ops.values() else "amax"])
    c = measure_read_ceiling(CPU, size_bytes=4 << 20, reps=1, warmup=0)
    total = c.copies * c.buffer_bytes
    assert c.method == "stream" and c.tbps == pytest.approx(total / 800e-6 / 1e12)
    assert c.readings_tbps == pytest.approx({k: total / (us * 1e-6) / 1e12 for k, us in times_us.items()})
    assert c.page_bytes == PAGE_BYTES and c.as_dict()["method"] == "stream"


def test_each_reading_is_the_best_of_its_rounds(monkeypatch):
    """The first process on a freshly started H200 read 4% low (results/h200/integrity/): each
    reading is the fastest of ``rounds`` medians, not the first."""
    times_us = iter([1300.0, 1000.0, 1200.0])
    monkeypatch.setattr(bandwidth, "_median_us", lambda op, device, reps, warmup: next(times_us))
    c = measure_read_ceiling(CPU, size_bytes=4 << 20, reps=1, warmup=0, rounds=3)
    assert c.tbps == pytest.approx(c.copies * c.buffer_bytes / 1000e-6 / 1e12)


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


def test_a_triton_read_that_does_not_compile_leaves_the_others(monkeypatch):
    import torch

    from mlabench import device as device_module
    from mlabench.kernels import stream_read

    calls = []
    monkeypatch.setattr(device_module, "triton_interpreting", lambda: False)
    monkeypatch.setattr(stream_read, "stream_sum", lambda b, out: calls.append(b.numel()))

    def broken(*args, **kwargs):
        raise RuntimeError("triton: out of resources")

    monkeypatch.setattr(stream_read, "paged_sum", broken)
    gpu = DeviceInfo("cuda", "cuda:0", "H200", 132, 1, "sm_90", 8 << 30)
    bufs = [torch.rand(2 * PAGE_BYTES // 4) for _ in range(2)]
    ops = bandwidth._triton_read_ops(bufs, gpu, seed=0)
    assert list(ops) == ["stream"] and calls == [2 * PAGE_BYTES // 4] * 2  # compiled once over both buffers
