"""Bring the GPU to a steady state before the first timed point, and flag points measured below it.

An idle GPU sits at a low clock (an H200 read about 375 MHz before a run) and ramps up under load;
two runs of one sweep a minute apart disagreed by up to 4%, the first slower at almost every point
that differed.  So before a sweep measures anything it streams memory (``torch.amax`` over a large
buffer, like a decode kernel) and reads the SM clock and power through the management library
(:func:`mlabench.measure.observers.gpu_state`) until, over the last ``window_s`` seconds, the clock moved by
at most ``clock_tol`` and the power by at most ``power_tol`` of their medians, or until
``steady_max_s`` passes.  The outcome goes into the run's manifest; each point then records the
clocks just before and after its timing and while its timed samples ran, and :func:`below_steady`
flags one whose SM clock read below the steady value.  The reader, the load and the clock are parameters, so the logic runs in
tests with stand-ins.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from mlabench.device import DeviceInfo, current_device
from mlabench.measure.observers import gpu_state
from mlabench.measure.timing import TimingConfig

#: Readings over this many seconds must agree for the GPU to count as steady.
WINDOW_S = 2.0
#: Largest spread (max - min) of the SM clock over the window, as a fraction of its median.
CLOCK_TOL = 0.01
#: Largest spread of the board power over the window, as a fraction of its median.
POWER_TOL = 0.05


class SteadyState(BaseModel):
    """The outcome of the warm-up before a sweep (one per session in the manifest's ``warmups``)."""

    model_config = ConfigDict(extra="forbid")

    steady: bool | None = Field(description="True: clocks and power settled; False: the time limit passed; "
                                            "None: not tried (CPU) or clocks unreadable.")
    reason: str = Field(description="What happened, in words.")
    elapsed_s: float = Field(0.0, description="Seconds of load run.")
    readings: int = Field(0, description="Clock readings taken.")
    sm_clock_mhz: float | None = Field(None, description="Median SM clock over the last window, MHz.")
    power_w: float | None = Field(None, description="Median board power over the last window, W.")
    temperature_c: float | None = Field(None, description="Temperature at the end, °C.")


def _median(values: list[Any]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return statistics.median(known) if known else None


def _settled(values: list[float], tol: float) -> bool:
    mid = statistics.median(values)
    return mid > 0 and (max(values) - min(values)) <= tol * mid


def is_steady(window: list[dict[str, Any]], clock_tol: float = CLOCK_TOL, power_tol: float = POWER_TOL) -> bool:
    """True when the readings of ``window`` (``gpu_state()`` dicts, at least 3) show a settled SM
    clock and, where power is read, a settled power."""
    clocks = [s["sm_clock_mhz"] for s in window if s.get("sm_clock_mhz") is not None]
    powers = [s["power_w"] for s in window if s.get("power_w") is not None]
    if len(clocks) < 3 or not _settled(clocks, clock_tol):
        return False
    return len(powers) < 3 or _settled(powers, power_tol)


def wait_until_steady(work: Callable[[], None], read_state: Callable[[], dict[str, Any]], min_s: float,
                      max_s: float, clock: Callable[[], float] = time.monotonic,
                      window_s: float = WINDOW_S) -> SteadyState:
    """Run ``work()`` (a short burst of load) and ``read_state()`` in turn until the readings of
    the last ``window_s`` seconds are steady (:func:`is_steady`) after at least ``min_s`` seconds,
    or until ``max_s`` seconds pass.  ``clock`` returns seconds.
    """
    start = clock()
    readings: list[tuple[float, dict[str, Any]]] = []
    while True:
        work()
        now, state = clock(), read_state()
        if state.get("sm_clock_mhz") is not None:
            readings.append((now, state))
        elapsed = now - start
        window = [s for t, s in readings if t >= now - window_s]
        done = elapsed >= max(min_s, window_s) and is_steady(window)
        if done or elapsed >= max_s:
            break
    last = window or [s for _, s in readings[-3:]]
    result = dict(elapsed_s=round(elapsed, 3), readings=len(readings),
                  sm_clock_mhz=_median([s.get("sm_clock_mhz") for s in last]),
                  power_w=_median([s.get("power_w") for s in last]),
                  temperature_c=last[-1].get("temperature_c") if last else None)
    if not readings:
        return SteadyState(steady=None, reason=f"clocks not readable; ran {elapsed:.1f} s of load", **result)
    if done:
        return SteadyState(steady=True, reason=f"steady after {elapsed:.1f} s", **result)
    return SteadyState(steady=False, reason=f"not steady after {elapsed:.1f} s (the time limit)", **result)


def below_steady(before: dict[str, Any], after: dict[str, Any], steady_mhz: float | None,
                 tol: float = CLOCK_TOL, during: dict[str, Any] | None = None) -> bool | None:
    """True when the SM clock a point's timed samples ran at is more than ``tol`` below
    ``steady_mhz``: the median of the readings ``during`` them
    (:meth:`~mlabench.measure.observers.ClockSampler.summary`) where there are some, else the
    lower of the readings just ``before`` and ``after`` the timing (which can find the GPU idle:
    a false alarm is possible, a missed one is not); None when the steady clock or every reading
    is unknown."""
    if during and during.get("sm_clock_mhz") is not None:
        clocks = [during["sm_clock_mhz"]]
    else:
        clocks = [s["sm_clock_mhz"] for s in (before, after) if s.get("sm_clock_mhz") is not None]
    if not steady_mhz or not clocks:
        return None
    return min(clocks) < (1 - tol) * steady_mhz


def memory_load(device: DeviceInfo, size_bytes: int = 1 << 30, reductions: int = 100) -> Callable[[], None]:
    """A burst of streaming reads (``reductions`` x ``torch.amax`` over ``size_bytes`` of random
    fp32, about 25 ms on an H200), synchronised, as a zero-argument callable."""
    buf = torch.empty(size_bytes // 4, dtype=torch.float32, device=device.torch_device).uniform_()

    def burst() -> None:
        for _ in range(reductions):
            torch.amax(buf)
        torch.cuda.synchronize()

    return burst


def warm_up(cfg: TimingConfig, device: DeviceInfo | None = None) -> SteadyState:
    """Warm the GPU up to a steady state (:func:`wait_until_steady` over :func:`memory_load` and
    :func:`~mlabench.measure.observers.gpu_state`); on the CPU nothing is run."""
    device = device or current_device()
    if not device.is_gpu:
        return SteadyState(steady=None, reason="no GPU: no warm-up")
    return wait_until_steady(memory_load(device), gpu_state, cfg.steady_min_s, cfg.steady_max_s)
