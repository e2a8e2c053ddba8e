"""The memory ceilings a run is judged against: streaming read, copy, and the datasheet figure.

A decode call reads the latent cache and writes a tiny output, so its floor is bytes over the
*read* bandwidth: the faster of two large read-only reductions over a buffer many times the L2
(``torch.amax``, and on a GPU with Triton the pipelined streaming sum of
:mod:`mlabench.kernels.stream_read`), timed with device events.  The device-to-device copy counts bytes read plus bytes written and
comes out lower on HBM (read and write traffic share the bus and turn it around), so a read-mostly
kernel could show more than 100% against it: on one NVIDIA H200 the copy gave 4.08 TB/s and the
read 4.34 TB/s, and FlashMLA at batch 16, 128K context reached 105% of the copy floor but 99% of
the read floor.  Both are measured once per run and kept in the manifest beside the vendor's
datasheet figure, which no measurement reaches.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from mlabench.device import DeviceInfo, current_device, free_memory_bytes

#: Peak memory bandwidth by the vendors' datasheets, TB/s, keyed by a lower-case piece of the name
#: torch reports (the first key found in the name counts, so longer, more specific keys come first).
DATASHEET_TBPS: dict[str, float] = {
    "h100 80gb hbm3": 3.35,  # H100 SXM5
    "h100 nvl": 3.9,
    "h100 pcie": 2.0,
    "h200": 4.8,
    "b200": 8.0,
    "a100-sxm4-80gb": 2.039,
    "mi300x": 5.3,
    "mi325x": 6.0,
    "mi355x": 8.0,
}


def datasheet_bandwidth_tbps(device_name: str) -> float | None:
    """The datasheet memory bandwidth of a device named ``device_name`` (TB/s), None if unknown."""
    name = device_name.lower()
    return next((tbps for key, tbps in DATASHEET_TBPS.items() if key in name), None)


def _median_us(op: Callable[[], object], device: DeviceInfo, reps: int, warmup: int) -> float:
    """Median time of ``op`` in µs: device events on a GPU, the wall clock on the CPU."""
    samples = []
    for i in range(reps + warmup):
        if device.is_gpu:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            op()
            b.record()
            b.synchronize()
            us = a.elapsed_time(b) * 1e3
        else:
            t0 = time.perf_counter_ns()
            op()
            us = (time.perf_counter_ns() - t0) / 1e3
        if i >= warmup:
            samples.append(us)
    return statistics.median(samples)


def _buffer_bytes(device: DeviceInfo, size_bytes: int | None, gpu_bytes: int, cpu_bytes: int,
                  buffers: int) -> int:
    """``size_bytes``, or the default size capped at an eighth of free memory per buffer."""
    if size_bytes:
        return size_bytes
    want = gpu_bytes if device.is_gpu else cpu_bytes
    return max(1 << 20, min(want, free_memory_bytes(device) // (8 * buffers)))


def measure_copy_bandwidth_tbps(device: DeviceInfo | None = None, size_bytes: int | None = None,
                                reps: int = 20, warmup: int = 5) -> float:
    """Device-to-device copy bandwidth in TB/s, counting bytes read plus bytes written.

    Copies 1 GiB of fp32 on a GPU (256 MiB on the CPU; less where free memory is short), median of
    ``reps`` timed copies after ``warmup`` untimed ones.
    """
    device = device or current_device()
    size = _buffer_bytes(device, size_bytes, 1 << 30, 1 << 28, buffers=2) // 4 * 4
    src = torch.empty(size // 4, dtype=torch.float32, device=device.torch_device).uniform_()
    dst = torch.empty_like(src)
    median_us = _median_us(lambda: dst.copy_(src), device, reps, warmup)
    del src, dst
    return 2 * size / (median_us * 1e-6) / 1e12


def measure_read_bandwidth_tbps(device: DeviceInfo | None = None, size_bytes: int | None = None,
                                reps: int = 20, warmup: int = 5) -> float:
    """Streaming read bandwidth in TB/s: the faster of ``torch.amax`` and (on a GPU where Triton
    compiles) a pipelined Triton streaming sum over one large fp32 buffer, bytes read only.

    4 GiB on a GPU (64 MiB on the CPU; less where free memory is short), filled with random values
    (never zeros), median of ``reps`` timed reductions after ``warmup`` untimed ones.  The outputs
    (one element, or 4 bytes per program) are not counted.  This is the ceiling of every point's
    floor; the faster reduction is taken because a ceiling that a decode kernel can beat is no
    ceiling (on an H200 ``torch.amax`` read 4.16-4.41 TB/s, the Triton sum 4.49-4.61 TB/s and the
    Hopper decode kernel 4.41-4.47 TB/s: docs/PERFORMANCE.md).
    """
    device = device or current_device()
    size = _buffer_bytes(device, size_bytes, 4 << 30, 64 << 20, buffers=1) // 4 * 4
    src = torch.empty(size // 4, dtype=torch.float32, device=device.torch_device).uniform_()
    best_us = _median_us(lambda: torch.amax(src), device, reps, warmup)
    stream = _triton_stream_op(src, device)
    if stream is not None:
        best_us = min(best_us, _median_us(stream, device, reps, warmup))
    del src
    return size / (best_us * 1e-6) / 1e12


def _triton_stream_op(src: torch.Tensor, device: DeviceInfo) -> Callable[[], object] | None:
    """The Triton streaming sum over ``src`` as a zero-argument call, or None off a GPU, under the
    interpreter, or where Triton fails to compile it (the amax figure then stands alone)."""
    from mlabench.device import triton_interpreting

    if not device.is_gpu or triton_interpreting():
        return None
    try:
        from mlabench.kernels.stream_read import STREAM_PROGRAMS_PER_SM, stream_sum

        partial = torch.empty(STREAM_PROGRAMS_PER_SM * max(1, device.num_sms), dtype=torch.float32,
                              device=src.device)
        stream_sum(src, partial)
        return lambda: stream_sum(src, partial)
    except Exception:  # noqa: BLE001 - a missing or broken Triton leaves the amax ceiling
        return None
