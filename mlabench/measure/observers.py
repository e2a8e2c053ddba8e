"""Clocks, temperature and power of the GPU, merged into each record; the driver version.

NVIDIA through nvidia-ml-py (``pynvml``), AMD through ``amdsmi`` where installed.  Every reader
returns an empty dict instead of raising: observation must never break a measurement.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from mlabench.device import current_device
from mlabench.extras import optional_import


@lru_cache(maxsize=1)
def _nvml() -> Any:
    nvml, _ = optional_import("pynvml")
    if nvml is None:
        return None
    try:
        nvml.nvmlInit()
        return nvml
    except Exception:  # noqa: BLE001 - no driver, no NVML
        return None


#: NVML's cumulative "violation" counters read into :func:`gpu_state`: nanoseconds the GPU has
#: spent, since the driver loaded, with its clocks held down by the power limit or by temperature.
_VIOLATION_COUNTERS = {"power_violation_ns": "NVML_PERF_POLICY_POWER",
                       "thermal_violation_ns": "NVML_PERF_POLICY_THERMAL"}


@lru_cache(maxsize=1)
def _nvml_handle() -> Any:
    """NVML's handle of the GPU torch calls ``cuda:0``: found by its UUID, since NVML numbers the
    GPUs of the host and ignores ``CUDA_VISIBLE_DEVICES`` (a worker given GPU 1 sees it as 0);
    NVML's GPU 0 when the UUID is not readable."""
    nvml = _nvml()
    try:
        import torch

        return nvml.nvmlDeviceGetHandleByUUID(f"GPU-{torch.cuda.get_device_properties(0).uuid}")
    except Exception:  # noqa: BLE001 - an old torch or driver: the host's first GPU
        return nvml.nvmlDeviceGetHandleByIndex(0)


def _throttle_state(nvml: Any, h: Any) -> dict[str, Any]:
    """What holds the clocks down, each item left out where the driver does not report it:
    ``clocks_event_reasons`` (NVML's bit mask now: 0x4 power cap, 0x8 hardware slowdown, 0x20
    and 0x40 thermal, 0x80 power brake), ``power_violation_ns`` and ``thermal_violation_ns``
    (cumulative, see :data:`_VIOLATION_COUNTERS`) and ``energy_mj`` (energy used since the driver
    loaded, mJ); a pair of readings gives what happened between them."""
    out: dict[str, Any] = {}
    reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    readers: dict[str, Any] = {"clocks_event_reasons": lambda: int(reasons(h))} if reasons else {}
    readers["energy_mj"] = lambda: int(nvml.nvmlDeviceGetTotalEnergyConsumption(h))
    for key, policy in _VIOLATION_COUNTERS.items():
        readers[key] = lambda p=policy: int(nvml.nvmlDeviceGetViolationStatus(h, getattr(nvml, p)).violationTime)
    for key, read in readers.items():
        try:
            out[key] = read()
        except Exception:  # noqa: BLE001 - not supported on this GPU or driver
            continue
    return out


def gpu_state() -> dict[str, Any]:
    """``{sm_clock_mhz, mem_clock_mhz, temperature_c, power_w}`` of the GPU torch calls ``cuda:0``
    now, on NVIDIA with what holds its clocks down (:func:`_throttle_state`) and ``at_s`` (the host's
    monotonic clock, s, for rates between two readings); ``{}`` when nothing is readable."""
    dev = current_device()
    if dev.kind == "cuda" and (nvml := _nvml()) is not None:
        try:
            h = _nvml_handle()
            return {
                "sm_clock_mhz": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
                "mem_clock_mhz": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM),
                "temperature_c": nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
                "power_w": nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
                **_throttle_state(nvml, h), "at_s": round(time.monotonic(), 6),
            }
        except Exception:  # noqa: BLE001
            return {}
    if dev.kind == "rocm":
        amdsmi, _ = optional_import("amdsmi")
        if amdsmi is None:
            return {}
        try:
            amdsmi.amdsmi_init()
            h = amdsmi.amdsmi_get_processor_handles()[0]
            clk = amdsmi.amdsmi_get_clock_info(h, amdsmi.AmdSmiClkType.GFX)
            return {"sm_clock_mhz": clk.get("clk"),
                    "temperature_c": amdsmi.amdsmi_get_temp_metric(
                        h, amdsmi.AmdSmiTemperatureType.HOTSPOT, amdsmi.AmdSmiTemperatureMetric.CURRENT)}
        except Exception:  # noqa: BLE001
            return {}
    return {}


def clock_now() -> dict[str, Any]:
    """``{sm_clock_mhz, power_w}`` of the GPU torch calls ``cuda:0`` now: two NVML calls, few
    enough to make while a timed replay runs; ``{}`` where NVML does not read them (CPU, AMD)."""
    if current_device().kind != "cuda" or (nvml := _nvml()) is None:
        return {}
    try:
        h = _nvml_handle()
        return {"sm_clock_mhz": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
                "power_w": nvml.nvmlDeviceGetPowerUsage(h) / 1000.0}
    except Exception:  # noqa: BLE001
        return {}


class ClockSampler:
    """The clocks a point's timed samples ran at: called once per timed GPU sample while it runs
    (:func:`mlabench.measure.timing.time_calls`' ``during``), it keeps each reading of ``read``
    (default :func:`clock_now`) that has an SM clock.

    A reading taken after the timing finds the GPU idle or ramping down, and one taken before it
    finds it idle after the checks and set-up; these are the readings of the work itself."""

    def __init__(self, read: Callable[[], dict[str, Any]] | None = None):
        self.read = read or clock_now
        self.readings: list[dict[str, Any]] = []

    def __call__(self) -> None:
        state = self.read()
        if state.get("sm_clock_mhz") is not None:
            self.readings.append(state)

    def summary(self) -> dict[str, Any]:
        """``{sm_clock_mhz, sm_clock_min_mhz, sm_clock_max_mhz, power_w, readings}``: the median,
        lowest and highest SM clock (MHz) and the median power (W, where read) over the readings;
        ``{}`` with none."""
        return clocks_summary([s["sm_clock_mhz"] for s in self.readings],
                              [s["power_w"] for s in self.readings if s.get("power_w") is not None])


def clocks_summary(clocks_mhz: Sequence[float], powers_w: Sequence[float] = ()) -> dict[str, Any]:
    """The summary :meth:`ClockSampler.summary` records, from SM clocks (MHz) and powers (W);
    ``{}`` without clocks."""
    if not clocks_mhz:
        return {}
    out: dict[str, Any] = {"sm_clock_mhz": statistics.median(clocks_mhz), "sm_clock_min_mhz": min(clocks_mhz),
                           "sm_clock_max_mhz": max(clocks_mhz), "readings": len(clocks_mhz)}
    if powers_w:
        out["power_w"] = round(statistics.median(powers_w), 3)
    return out


def pooled_clocks(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One summary from several visits' (:meth:`ClockSampler.summary` each): the median of their
    medians, the lowest and highest reading of all, the readings summed; ``{}`` when none has a
    clock."""
    known = [s for s in summaries if s.get("sm_clock_mhz") is not None]
    if not known:
        return {}
    out = clocks_summary([s["sm_clock_mhz"] for s in known],
                         [s["power_w"] for s in known if s.get("power_w") is not None])
    out.update(sm_clock_min_mhz=min(s.get("sm_clock_min_mhz", s["sm_clock_mhz"]) for s in known),
               sm_clock_max_mhz=max(s.get("sm_clock_max_mhz", s["sm_clock_mhz"]) for s in known),
               readings=sum(s.get("readings", 1) for s in known))
    return out


def driver_version() -> str:
    """GPU driver version string, ``"n/a"`` on the CPU, ``"unknown"`` when unreadable."""
    dev = current_device()
    if dev.kind == "cuda" and (nvml := _nvml()) is not None:
        try:
            v = nvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        except Exception:  # noqa: BLE001
            return "unknown"
    if dev.kind == "rocm":
        import torch

        return f"hip {torch.version.hip}"
    return "n/a"
