"""The measurement engine: warm-up, graph replay, cold cache, replay length, stopping rule.

Method (design.md, "Timing method"):

- Cold cache: the caller prepares ``copies`` independent input sets whose total exceeds twice the
  L2 (see :func:`cold_cache_copies`); consecutive calls run on different copies, so no call finds
  its cache lines in L2.
- Replay length: one sample runs the calls in turn, cycling the copies, until it holds at least
  ``min_replay_us`` of work and ``min_calls_per_replay`` calls (:func:`calls_per_replay`, planned
  from one timed pilot pass), and reports its time divided by the calls it held.  The one launch
  of a replay (a few µs) is then spread over at least ``min_replay_us`` at every shape, instead of
  over however many copies the cold-cache rule chose: on an H200, triton-splitkv at batch 1, 32K
  context measured 32.0 µs per call over its 4 copies and 30.4 µs over 512 calls.
- Graph replay: on a GPU the calls of a sample are captured into one CUDA/HIP graph and a sample is
  one replay timed with device events.  Eager timing (the same loop without a graph) is kept too.
- Lead: before each sample a short device-side spin (``lead_us``, ``torch.cuda._sleep``) is queued,
  so the host has enqueued the start event and the replay before the GPU reaches them, and the
  replay's launch latency is not between the events.
- Visits: a sweep measures each point in several visits spread over the run and pools their
  samples (:mod:`mlabench.sweep.visits`), since the GPU's state changes on a scale of 0.1-1 s.
- Stopping rule: after warm-up, samples are taken until the relative half-width of the median's
  95% confidence interval is below ``target_rel_ci`` (at least ``min_samples``) or the time budget
  ends; a point that never converges is flagged ``noisy``, not dropped.
- On the CPU the same loop runs with a wall-clock timer over one pass of the copies (no launch to
  amortise), on ``cpu_threads`` torch threads (default 1): with torch's default, one thread per
  core, a CPU sweep on a loaded machine gave medians in multiples of about 4 ms, up to 170x the
  quiet machine's (issue 25); on one thread two runs agreed.  CPU times test the pipeline; they
  measure no kernel.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence

import torch
from pydantic import BaseModel, ConfigDict, Field

from mlabench.device import DeviceInfo, current_device
from mlabench.measure.stats import Stats, median_rel_ci, summarize


class TimingConfig(BaseModel):
    """Knobs of the measurement engine (TOML table ``[timing]`` of a sweep)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)  # as SweepConfig

    warmup_iters: int = Field(3, ge=0, description="Untimed samples before measuring.")
    min_samples: int = Field(10, ge=3, description="Samples always taken.")
    max_samples: int = Field(200, ge=3, description="Samples never exceeded.")
    target_rel_ci: float = Field(0.01, gt=0, description="Stop once the median's CI half-width / median is below this.")
    budget_s: float = Field(2.0, gt=0, description="Time budget per measurement, seconds.")
    graph: bool = Field(True, description="Time CUDA/HIP graph replays on a GPU.")
    eager: bool = Field(True, description="Also time eager launches on a GPU.")
    cold_cache: bool = Field(True, description="Rotate input copies to exceed 2x L2 on a GPU.")
    max_copies: int = Field(64, ge=1, description="Most input copies rotated for a cold cache.")
    min_copies: int = Field(4, ge=1, description=(
        "Fewest input copies rotated on a GPU, however large each is: every copy is its own "
        "allocation, so a point's time averages over where its buffers landed in device memory "
        "(one 4 GiB buffer read 4.50 TB/s in one process and 4.34 TB/s in the next on an H200)."))
    min_replay_us: float = Field(2000.0, ge=0, description="Least work one GPU sample holds, µs.")
    min_calls_per_replay: int = Field(1, ge=1, description="Fewest calls one GPU sample holds.")
    max_calls_per_replay: int = Field(4096, ge=1, description="Most calls one GPU sample holds.")
    lead_us: float = Field(20.0, ge=0, description=(
        "Device-side wait queued before each timed GPU sample, µs, so the sample's launch is "
        "enqueued while the GPU is still busy and its latency stays outside the events (0: none)."))
    graph_captures: int = Field(1, ge=1, le=16, description=(
        "Graphs captured per measurement, all held at once, samples taken from each in turn, each "
        "graph's median recorded: tells a speed that belongs to one capture (where a kernel's in-call "
        "buffers landed) from one that belongs to the moment.  FlashMLA's two speeds at batch 1, 8K on "
        "an H200 turned out to be the moment's: 4 graphs in one visit never disagreed "
        "(results/h200/repeatability/history-attempt/), so 1, one graph, is the default."))
    cpu_threads: int = Field(1, ge=1, description=(
        "torch threads while timing on the CPU (torch.set_num_threads), restored after; 1 keeps times "
        "repeatable on a shared machine."))
    steady_min_s: float = Field(5.0, ge=0, description="Least GPU warm-up before a sweep's first point, seconds.")
    steady_max_s: float = Field(30.0, ge=0, description="Most GPU warm-up waiting for steady clocks, seconds.")


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
    """How many input copies to rotate: ``ceil(2 * L2 / bytes_per_copy)``, at least ``min_copies``
    and at most ``max_copies`` (the caller halves it where memory is short).

    1 on the CPU, when cold_cache is off, or when the L2 size is unknown.
    """
    if not (cfg.cold_cache and device.is_gpu and device.l2_bytes > 0):
        return 1
    want = max(cfg.min_copies, math.ceil(2 * device.l2_bytes / max(1, bytes_per_copy)))
    return max(1, min(cfg.max_copies, want))


def calls_per_replay(pilot_call_us: float, copies: int, cfg: TimingConfig) -> int:
    """How many calls one GPU sample holds, cycling ``copies`` input sets.

    Enough calls for ``cfg.min_replay_us`` of work at ``pilot_call_us`` µs per call, and at least
    ``cfg.min_calls_per_replay``, rounded up to whole passes over the copies (every copy equally
    often); at most ``cfg.max_calls_per_replay`` rounded down to whole passes, never below one pass.
    """
    want = max(cfg.min_calls_per_replay, math.ceil(cfg.min_replay_us / max(pilot_call_us, 1e-3)))
    passes = min(math.ceil(want / copies), max(1, cfg.max_calls_per_replay // copies))
    return copies * passes


def _run_all(calls: Sequence[Callable[[], object]]) -> None:
    for fn in calls:
        fn()


def time_calls(calls: Sequence[Callable[[], object]], cfg: TimingConfig, *, use_graph: bool,
               device: DeviceInfo | None = None, during: Callable[[], object] | None = None) -> Stats:
    """Time ``calls`` (one per input copy) and return per-call statistics (µs).

    On a GPU one pass over ``calls`` is timed as a pilot, then each sample runs
    :func:`calls_per_replay` calls cycling the copies: captured into a graph with ``use_graph``
    (``cfg.graph_captures`` graphs, all held, the samples taking them in turn; raises RuntimeError
    if a call cannot be captured), else launched eagerly; device events time it.  On the CPU a
    sample is one pass timed with the wall clock, on ``cfg.cpu_threads`` torch threads.  The returned :class:`~mlabench.measure.stats.Stats`
    says how many calls each sample held (``calls_per_sample``), from how many graphs
    (``graph_captures``) and, with more than one, each graph's own median (``capture_medians_us``).
    ``during`` (a GPU's clock reader, :class:`~mlabench.measure.observers.ClockSampler`) is called on
    the host once per timed GPU sample while that sample runs (:func:`_event_us`), not in the
    warm-up samples nor the pilot; never on the CPU.
    """
    device = device or current_device()
    if not device.is_gpu:
        n = len(calls)

        def wall_sample() -> float:
            t0 = time.perf_counter_ns()
            _run_all(calls)
            return (time.perf_counter_ns() - t0) / 1e3 / n

        threads = torch.get_num_threads()
        torch.set_num_threads(cfg.cpu_threads)
        try:
            return run_until_stable(wall_sample, cfg).model_copy(update={"calls_per_sample": n})
        finally:
            torch.set_num_threads(threads)

    one_pass = _gpu_step(calls, use_graph)
    pilot_us = min(_event_us(one_pass) for _ in range(3)) / len(calls)
    n = calls_per_replay(pilot_us, len(calls), cfg)
    step_calls = calls if n == len(calls) else [calls[i % len(calls)] for i in range(n)]
    steps = [one_pass if n == len(calls) else _gpu_step(step_calls, use_graph)]
    steps += [_gpu_step(step_calls, use_graph) for _ in range(cfg.graph_captures - 1 if use_graph else 0)]
    torch.cuda.synchronize()
    lead_cycles = round(cfg.lead_us * spin_cycles_per_us()) if cfg.lead_us > 0 else 0
    taken: list[tuple[int, float]] = []  # (graph, µs) of every sample, warm-up ones first

    def sample() -> float:
        graph = len(taken) % len(steps)
        probe = during if len(taken) >= cfg.warmup_iters else None
        taken.append((graph, _event_us(steps[graph], lead_cycles, probe) / n))
        return taken[-1][1]

    stats = run_until_stable(sample, cfg)
    update: dict[str, object] = {"calls_per_sample": n, "graph_captures": len(steps) if use_graph else None}
    if len(steps) > 1:
        kept = taken[cfg.warmup_iters:]
        by_graph = [[us for g, us in kept if g == i] for i in range(len(steps))]
        update["capture_medians_us"] = [statistics.median(xs) for xs in by_graph if xs]
    return stats.model_copy(update=update)


def _gpu_step(calls: Sequence[Callable[[], object]], use_graph: bool) -> Callable[[], None]:
    """One replay of ``calls`` captured as a graph, or (compiled first) an eager pass over them."""
    if use_graph:
        return capture_graph(calls).replay
    _run_all(calls)  # compile / autotune outside the samples
    return lambda: _run_all(calls)


def _event_us(step: Callable[[], None], lead_cycles: int = 0, during: Callable[[], object] | None = None) -> float:
    """Device time of one ``step()``, µs, between two events on the current stream; with
    ``lead_cycles``, a spin of that many GPU clock cycles is queued before the first event.
    ``during()`` runs on the host after the step and its end event are queued and before waiting
    for them, so it reads the GPU while the step runs (the events time the device, so a host call
    there adds nothing to the time); a reading after the wait would find the GPU idle."""
    start_ev = torch.cuda.Event(enable_timing=True)
    end_ev = torch.cuda.Event(enable_timing=True)
    if lead_cycles:
        torch.cuda._sleep(lead_cycles)
    start_ev.record()
    step()
    end_ev.record()
    if during is not None:
        during()
    end_ev.synchronize()
    return start_ev.elapsed_time(end_ev) * 1e3


_SPIN_CYCLES_PER_US: dict[int, float] = {}


def spin_cycles_per_us() -> float:
    """GPU clock cycles ``torch.cuda._sleep`` spins per µs on the current device, measured once
    per process (a 1M-cycle spin timed with events, the shortest of three)."""
    dev = torch.cuda.current_device()
    if dev not in _SPIN_CYCLES_PER_US:
        _SPIN_CYCLES_PER_US[dev] = max(spin_rate_now(1_000_000) for _ in range(3))
    return _SPIN_CYCLES_PER_US[dev]


def spin_rate_now(cycles: int) -> float:
    """GPU clock cycles per µs, now: a ``torch.cuda._sleep`` spin of ``cycles`` over its time
    between device events.  The events also time the spin's launch, so short spins read low."""
    return cycles / _event_us(lambda: torch.cuda._sleep(cycles))


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
