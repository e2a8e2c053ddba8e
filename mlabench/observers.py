"""Clocks, temperature and power of the GPU, merged into each record; the driver version.

NVIDIA through nvidia-ml-py (``pynvml``), AMD through ``amdsmi`` where installed.  Every reader
returns an empty dict instead of raising: observation must never break a measurement.
"""

from __future__ import annotations

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


def gpu_state() -> dict[str, Any]:
    """``{sm_clock_mhz, mem_clock_mhz, temperature_c, power_w}`` of GPU 0 now, or ``{}``."""
    dev = current_device()
    if dev.kind == "cuda" and (nvml := _nvml()) is not None:
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(0)
            return {
                "sm_clock_mhz": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
                "mem_clock_mhz": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM),
                "temperature_c": nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
                "power_w": nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
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
