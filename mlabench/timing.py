"""The measurement engine: warm-up, graph replay, cold cache, stopping rule, copy bandwidth.

Method (design.md, "Timing method"):

- Cold cache: the caller prepares ``copies`` independent input sets whose total exceeds twice the
  L2 (see :func:`cold_cache_copies`); one sample runs the call once on every copy, in order, and
  reports the time divided by the number of copies, so no call finds its cache lines in L2.
- Graph replay: on a GPU all ``copies`` calls are captured into one CUDA/HIP graph and a sample is
  one replay timed with device events.  Eager timing (the same loop without a graph) is kept too.
- Stopping rule: after warm-up, samples are taken until the relative half-width of the median's
  95% confidence interval is below ``target_rel_ci`` (at least ``min_samples``) or the time budget
  ends; a point that never converges is flagged ``noisy``, not dropped.
- On the CPU the same loop runs with a wall-clock timer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import torch
from pydantic import BaseModel, ConfigDict, Field

from mlabench.device import DeviceInfo, current_device
from mlabench.stats import Stats, median_rel_ci, summarize


class TimingConfig(BaseModel):
    """Knobs of the measurement engine (TOML table ``[timing]`` of a sweep)."""

    model_config = ConfigDict(extra="forbid")

    warmup_iters: int = Field(3, ge=0, description="Untimed samples before measuring.")
    min_samples: int = Field(10, ge=3, description="Samples always taken.")
    max_samples: int = Field(200, ge=3, description="Samples never exceeded.")
    target_rel_ci: float = Field(0.01, gt=0, description="Stop once the median's CI half-width / median is below this.")
    budget_s: float = Field(2.0, gt=0, description="Time budget per measurement, seconds.")
    graph: bool = Field(True, description="Time CUDA/HIP graph replays on a GPU.")
    eager: bool = Field(True, description="Also time eager launches on a GPU.")
    cold_cache: bool = Field(True, description="Rotate input copies to exceed 2x L2 on a GPU.")
    max_copies: int = Field(64, ge=1, description="Most input copies rotated for a cold cache.")


def run_until_stable(sample_us: Callable[[], float], cfg: TimingConfig,
                     clock: Callable[[], float] = time.perf_counter) -> Stats:
    """Take samples from ``sample_us`` (each returns µs) under the stopping rule of ``cfg``.

    ``clock`` returns seconds and is injectable for tests.  Warm-up samples are discarded.
    """
    for _ in range(cfg.warmup_iters):
        sample_us()
    samples: list[float] = []
    start = clock()
    while len(samples) < cfg.max_samples:
        samples.append(sample_us())
        if len(samples) >= cfg.min_samples:
            if median_rel_ci(samples) <= cfg.target_rel_ci or clock() - start >= cfg.budget_s:
                break
    return summarize(samples, cfg.target_rel_ci)


def cold_cache_copies(bytes_per_copy: int, device: DeviceInfo, cfg: TimingConfig) -> int:
    """How many input copies to rotate: ``ceil(2 * L2 / bytes_per_copy)``, in ``[1, max_copies]``.

    1 on the CPU, when cold_cache is off, or when the L2 size is unknown.
    """
    if not (cfg.cold_cache and device.is_gpu and device.l2_bytes > 0):
        return 1
    return max(1, min(cfg.max_copies, math.ceil(2 * device.l2_bytes / max(1, bytes_per_copy))))


def _run_all(calls: Sequence[Callable[[], object]]) -> None:
    for fn in calls:
        fn()


def time_calls(calls: Sequence[Callable[[], object]], cfg: TimingConfig, *, use_graph: bool,
               device: DeviceInfo | None = None) -> Stats:
    """Time one pass over ``calls`` per sample and return per-call statistics (µs).

    On a GPU with ``use_graph`` the pass is captured into one graph (raises RuntimeError if a call
    cannot be captured); otherwise it is launched eagerly and timed with device events.  On the
    CPU a wall-clock timer is used.
    """
    device = device or current_device()
    n = len(calls)
    if not device.is_gpu:
        def wall_sample() -> float:
            t0 = time.perf_counter_ns()
            _run_all(calls)
            return (time.perf_counter_ns() - t0) / 1e3 / n

        return run_until_stable(wall_sample, cfg)

    start_ev = torch.cuda.Event(enable_timing=True)
    end_ev = torch.cuda.Event(enable_timing=True)
    if use_graph:
        graph = capture_graph(calls)
        step: Callable[[], None] = graph.replay
    else:
        _run_all(calls)  # compile / autotune outside the samples
        step = lambda: _run_all(calls)  # noqa: E731

    def event_sample() -> float:
        start_ev.record()
        step()
        end_ev.record()
        end_ev.synchronize()
        return start_ev.elapsed_time(end_ev) * 1e3 / n

    torch.cuda.synchronize()
    return run_until_stable(event_sample, cfg)


def capture_graph(calls: Sequence[Callable[[], object]]) -> torch.cuda.CUDAGraph:
    """Warm ``calls`` up on a side stream, then capture them, in order, into one graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            _run_all(calls)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _run_all(calls)
    torch.cuda.synchronize()
    return graph


def measure_copy_bandwidth_tbps(device: DeviceInfo | None = None, size_bytes: int | None = None,
                                reps: int = 20, warmup: int = 5) -> float:
    """Device-to-device copy bandwidth in TB/s, counting bytes read plus bytes written.

    Uses a 1 GiB copy on a GPU (256 MiB on the CPU) and the median of ``reps`` timed copies after
    ``warmup`` untimed ones.  This
    is the roofline ceiling against which every point's % of floor is reported (4.18 TB/s in the
    H200 run of [docs/h200.md](../docs/h200.md)).
    """
    device = device or current_device()
    size = size_bytes or (1 << 30 if device.is_gpu else 1 << 28)
    src = torch.empty(size // 4, dtype=torch.float32, device=device.torch_device).uniform_()
    dst = torch.empty_like(src)
    samples = []
    for i in range(reps + warmup):
        if device.is_gpu:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src)
            b.record()
            b.synchronize()
            us = a.elapsed_time(b) * 1e3
        else:
            t0 = time.perf_counter_ns()
            dst.copy_(src)
            us = (time.perf_counter_ns() - t0) / 1e3
        if i >= warmup:
            samples.append(us)
    samples.sort()
    median_us = samples[len(samples) // 2]
    del src, dst
    return 2 * size / (median_us * 1e-6) / 1e12
