"""What accelerator this process sees: kind, name, multiprocessor count, L2 size, free memory.

Works on NVIDIA (CUDA) and AMD (ROCm/HIP builds of torch expose the same ``torch.cuda`` API) and
falls back to the CPU.  Nothing here allocates.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

import torch


@dataclass(frozen=True)
class DeviceInfo:
    """Facts about the device the measurements run on.

    ``kind`` is ``"cuda"``, ``"rocm"`` or ``"cpu"``; ``torch_device`` the string for tensors.
    ``num_sms`` counts NVIDIA SMs or AMD CUs; ``l2_bytes`` is 0 where unknown; ``uuid`` is the
    GPU's own identity (torch's device properties), "" on the CPU or where torch does not give one.
    """

    kind: str
    torch_device: str
    name: str
    num_sms: int
    l2_bytes: int
    arch: str
    total_memory_bytes: int
    uuid: str = ""

    @property
    def is_gpu(self) -> bool:
        return self.kind != "cpu"


@lru_cache(maxsize=1)
def current_device() -> DeviceInfo:
    """The first visible GPU, or the CPU when torch sees none."""
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        is_rocm = torch.version.hip is not None
        arch = getattr(props, "gcnArchName", "") if is_rocm else f"sm_{props.major}{props.minor}"
        return DeviceInfo(
            kind="rocm" if is_rocm else "cuda",
            torch_device="cuda",
            name=props.name,
            num_sms=props.multi_processor_count,
            l2_bytes=int(getattr(props, "L2_cache_size", 0) or 0),
            arch=arch.split(":")[0],
            total_memory_bytes=props.total_memory,
            uuid=str(getattr(props, "uuid", "") or ""),
        )
    return DeviceInfo(
        kind="cpu",
        torch_device="cpu",
        name=_cpu_name(),
        num_sms=os.cpu_count() or 1,
        l2_bytes=0,
        arch="cpu",
        total_memory_bytes=_host_available_bytes(),
    )


def free_memory_bytes(device: DeviceInfo | None = None) -> int:
    """Free bytes on the device (``torch.cuda.mem_get_info``) or available host memory on CPU."""
    device = device or current_device()
    if device.is_gpu:
        free, _total = torch.cuda.mem_get_info()
        return int(free)
    return _host_available_bytes()


def _host_available_bytes() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def triton_interpreting() -> bool:
    """True when Triton kernels run in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
