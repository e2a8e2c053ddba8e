"""The GPUs a vLLM server started by serve-bench would see, for the run's manifest.

serve-bench never touches CUDA or HIP itself: a context made in its process would take GPU memory
that the server sizes its KV cache against.  :func:`visible_gpus` asks the vendor's command-line
tool instead (``nvidia-smi``, else ``rocm-smi``), so a TPOT table says which GPU served it and a
report can tell a CPU serving run from a GPU one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterable
from typing import Any

#: What ``nvidia-smi --query-gpu`` is asked for, in this order (``--format=csv,noheader,nounits``).
NVIDIA_FIELDS = ("index", "uuid", "name", "driver_version", "memory.total")
TOOL_TIMEOUT_S = 10.0


def _run(argv: list[str]) -> str | None:
    """The tool's stdout, or None when it is not installed, fails or hangs."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout if res.returncode == 0 else None


def nvidia_gpus(csv_text: str, visible: str | None) -> list[dict[str, Any]]:
    """Parse ``nvidia-smi --query-gpu=index,uuid,name,driver_version,memory.total
    --format=csv,noheader,nounits`` output into ``{"name", "uuid", "driver", "memory_mib"}`` per GPU,
    keeping those ``visible`` names (``CUDA_VISIBLE_DEVICES``: indices or UUIDs, in its order; None:
    all; empty, as CUDA reads it: none).  Malformed lines are skipped."""
    rows = {}
    for line in csv_text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(NVIDIA_FIELDS):
            continue
        index, uuid, name, driver, memory = cells
        rows[index] = {"name": name, "uuid": uuid, "driver": driver,
                       "memory_mib": int(memory) if memory.isdigit() else None}
    if visible is None:
        return list(rows.values())
    by_uuid = {r["uuid"]: r for r in rows.values()}
    picked = [rows.get(v) or by_uuid.get(v) or next((r for u, r in by_uuid.items() if u.startswith(v)), None)
              for v in (s.strip() for s in visible.split(",")) if v]
    return [r for r in picked if r is not None]


def rocm_gpus(json_text: str) -> list[dict[str, Any]]:
    """Parse ``rocm-smi --showproductname --json`` into ``{"name"}`` per card (its ``Card Series``
    or ``Card series``); [] when it is not that JSON."""
    try:
        data = json.loads(json_text)
    except ValueError:
        return []
    cards = [v for k, v in sorted(data.items()) if k.startswith("card") and isinstance(v, dict)] \
        if isinstance(data, dict) else []
    return [{"name": c.get("Card Series") or c.get("Card series") or c.get("Card SKU")} for c in cards]


def visible_gpus() -> list[dict[str, Any]]:
    """The GPUs of this machine that a server started from here would see (NVIDIA: those of
    ``CUDA_VISIBLE_DEVICES``; AMD: every card ``rocm-smi`` lists), each ``{"name", ...}``; [] on a
    machine without either tool (a CPU server).  Never raises: a manifest is written either way."""
    text = _run(["nvidia-smi", f"--query-gpu={','.join(NVIDIA_FIELDS)}", "--format=csv,noheader,nounits"])
    if text is not None:
        return nvidia_gpus(text, os.environ.get("CUDA_VISIBLE_DEVICES"))
    text = _run(["rocm-smi", "--showproductname", "--json"])
    return rocm_gpus(text) if text is not None else []


def serving_device_mismatch(gpus: Any, kernel_devices: Iterable[dict[str, Any]]) -> str | None:
    """Why a serve-bench run whose manifest recorded ``gpus`` (:func:`visible_gpus`) does not compare
    with kernel runs on ``kernel_devices`` (their manifests' ``device``: ``name`` and ``kind``,
    ``cuda``, ``hip`` or ``cpu``): another GPU model, or no GPU beside GPU kernel runs; None when
    it compares, or when it cannot be told (``gpus`` not a list: a run recorded before serve-bench
    named its GPUs; no kernel runs)."""
    kernel = {str(d.get("name")): str(d.get("kind")) for d in kernel_devices}
    if not kernel or not isinstance(gpus, list):
        return None
    served = sorted({str(g.get("name")) for g in gpus if isinstance(g, dict)}) or ["no GPU"]
    if gpus and set(served) <= set(kernel) or not gpus and set(kernel.values()) == {"cpu"}:
        return None
    return f"served on {', '.join(served)}, the kernel runs ran on {', '.join(sorted(kernel))}"
