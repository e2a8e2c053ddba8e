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

The read ceiling (:func:`measure_read_ceiling`) is the best of a flat ``torch.amax``, the flat
Triton streaming sum and a paged read through a shuffled block table like the decode kernels',
each over several buffers read in turn, so that it does not hang on where one buffer landed; the
manifest keeps every reading and which one won.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

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


def _settle(op: Callable[[], object], device: DeviceInfo, min_s: float, max_s: float) -> dict | None:
    """On a GPU, run ``op`` until the SM clock and the board power have held steady over the last
    two seconds, after at least ``min_s`` and at most ``max_s`` seconds
    (:func:`mlabench.measure.steady.wait_until_steady`); return what happened (the
    :class:`~mlabench.measure.steady.SteadyState` as a dict).  Nothing on the CPU (None)."""
    if not device.is_gpu or max_s <= 0:
        return None
    from mlabench.measure.observers import gpu_state
    from mlabench.measure.steady import wait_until_steady

    def burst() -> None:
        op()
        torch.cuda.synchronize()

    return wait_until_steady(burst, gpu_state, min_s, max_s).model_dump()


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


#: Buffers the read ceiling rotates through, each its own allocation, as a point's timing rotates
#: at least 4 input copies (docs/measuring.md): one buffer's placement moved the ceiling by 1-3%.
CEILING_COPIES = 4
#: Bytes of one page of the paged read: 64 tokens x 576 bf16 values, a page of the Kimi K3 /
#: DeepSeek-V3 latent cache at page size 64 (a whole number of :data:`PAGED_BLOCK` fp32 blocks).
PAGE_BYTES = 64 * 576 * 2


@dataclass(frozen=True)
class ReadCeiling:
    """The streaming read ceiling of a run and how it was found (the manifest's ``read_ceiling``).

    ``tbps``: the best reading, TB/s; ``method``: which reading that is (``amax``, ``stream`` or
    ``paged``); ``readings_tbps``: every reading taken; ``copies`` buffers of ``buffer_bytes``
    each were read in turn per timed sample; ``page_bytes``: the page of the paged read (None when
    it was not taken); ``warm_up``: the steady-state wait before the first sample (a
    :class:`~mlabench.measure.steady.SteadyState` dict; None on the CPU).
    """

    tbps: float
    method: str
    readings_tbps: dict[str, float]
    copies: int
    buffer_bytes: int
    page_bytes: int | None = None
    warm_up: dict | None = None

    def as_dict(self) -> dict[str, object]:
        """The JSON form kept in a run's manifest."""
        return asdict(self)


def measure_read_ceiling(device: DeviceInfo | None = None, size_bytes: int | None = None,
                         copies: int = CEILING_COPIES, reps: int = 20, warmup: int = 5,
                         seed: int = 0, settle_s: float = 0.5, settle_max_s: float = 30.0,
                         rounds: int = 3) -> ReadCeiling:
    """Streaming read ceiling (TB/s): the best of up to three read-only reductions, each timed over
    ``copies`` separately allocated fp32 buffers read in turn per sample (median of ``reps``
    samples after ``warmup``; bytes read only, the partial sums written are not counted):

    - ``amax``: ``torch.amax`` over each buffer, flat;
    - ``stream``: the pipelined Triton streaming sum (:func:`mlabench.kernels.stream_read.stream_sum`);
    - ``paged``: the same through a shuffled block table of :data:`PAGE_BYTES` pages
      (:func:`~mlabench.kernels.stream_read.paged_sum`), as a decode kernel reads its cache.

    The last two only on a GPU where Triton compiles (not under the interpreter).  A round's
    buffers hold 4 GiB in all on a GPU (64 MiB on the CPU; less where free memory is short), or
    ``size_bytes`` in all.  The best is taken because a ceiling that a decode kernel can beat is no
    ceiling; rotating buffers averages over where each one landed (one buffer alone moved the ceiling
    by 1-3% between processes on an H200: 4.33-4.56 TB/s, issue 27).  ``seed`` orders the pages.
    Before any sample the GPU reads until its SM clock and power hold steady over two seconds
    (at least ``settle_s``, at most ``settle_max_s`` seconds; an idle H200 sits near 375 MHz, and
    the first process on a freshly started one read 3-4% low after a fixed 0.5 s:
    results/h200/integrity/).  Each reading is the best of ``rounds`` medians, each round over a
    fresh set of ``copies`` buffers (the earlier sets stay allocated, so each round lands
    elsewhere): with one set, one process in five read 1.5-1.7% below the others.
    """
    device = device or current_device()
    copies, rounds = max(1, copies), max(1, rounds)
    unit = 2 * PAGE_BYTES  # whole pages, and whole 16 KiB blocks of the streaming sum
    total = _buffer_bytes(device, size_bytes, 4 << 30, 64 << 20, buffers=rounds)
    each = max(unit, total // copies // unit * unit)
    held: list[list[torch.Tensor]] = []
    readings: dict[str, float] = {}
    warm = None
    for r in range(rounds):
        bufs = [torch.empty(each // 4, dtype=torch.float32, device=device.torch_device).uniform_()
                for _ in range(copies)]
        held.append(bufs)
        ops = {"amax": lambda b=bufs: [torch.amax(x) for x in b],
               **_triton_read_ops(bufs, device, seed + r)}
        if r == 0:
            warm = _settle(ops["amax"], device, settle_s, settle_max_s)
        for name, op in ops.items():
            readings[name] = max(readings.get(name, 0.0), _tbps(copies * each, _median_us(op, device, reps, warmup)))
    best = max(readings, key=readings.__getitem__)
    return ReadCeiling(readings[best], best, readings, copies, each,
                       PAGE_BYTES if "paged" in readings else None, warm)


def measure_read_bandwidth_tbps(device: DeviceInfo | None = None, size_bytes: int | None = None,
                                reps: int = 20, warmup: int = 5) -> float:
    """The read ceiling's best reading in TB/s (:func:`measure_read_ceiling`), without how it was found."""
    return measure_read_ceiling(device, size_bytes, reps=reps, warmup=warmup).tbps


def _tbps(bytes_read: int, median_us: float) -> float:
    return bytes_read / (median_us * 1e-6) / 1e12


def _triton_read_ops(bufs: list[torch.Tensor], device: DeviceInfo, seed: int) -> dict[str, Callable[[], object]]:
    """``{"stream": op, "paged": op}``, each reading every buffer of ``bufs`` once per call; {} off a
    GPU or under the interpreter, and without the one that Triton fails to compile (the other
    readings then stand)."""
    from mlabench.device import triton_interpreting

    if not device.is_gpu or triton_interpreting():
        return {}
    try:
        from mlabench.kernels.stream_read import STREAM_PROGRAMS_PER_SM, paged_sum, stream_sum
    except Exception:  # noqa: BLE001 - a missing or broken Triton leaves the amax ceiling
        return {}
    partial = torch.empty(STREAM_PROGRAMS_PER_SM * max(1, device.num_sms), dtype=torch.float32, device=bufs[0].device)
    page = PAGE_BYTES // 4
    gen = torch.Generator().manual_seed(seed)
    tables = [torch.randperm(b.numel() // page, generator=gen).to(torch.int32).to(b.device) for b in bufs]
    ops = {"stream": lambda: [stream_sum(b, partial) for b in bufs],
           "paged": lambda: [paged_sum(b, t, page, partial) for b, t in zip(bufs, tables)]}
    working = {}
    for name, op in ops.items():
        try:
            op()  # compile now
            working[name] = op
        except Exception:  # noqa: BLE001 - a kernel Triton cannot compile here leaves the other readings
            continue
    return working
