"""The GPUs serve-bench records in a run's manifest, read with the vendor tools (no CUDA context)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

SMI = "0, GPU-a390aa2c-a2a5, NVIDIA H200, 580.159.04, 143771\n1, GPU-bbbb, NVIDIA H200, 580.159.04, 143771\n"


def _tool(folder: Path, name: str, stdout: str) -> None:
    """A stand-in for a vendor tool on PATH that prints ``stdout``."""
    path = folder / name
    path.write_text(f"#!/bin/sh\ncat <<'END'\n{stdout}END\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_nvidia_smi_rows_follow_cuda_visible_devices():
    from mlabench.serving.gpus import nvidia_gpus

    both = nvidia_gpus(SMI, None)
    assert [g["uuid"] for g in both] == ["GPU-a390aa2c-a2a5", "GPU-bbbb"] and both[0]["memory_mib"] == 143771
    assert [g["uuid"] for g in nvidia_gpus(SMI, "1,0")] == ["GPU-bbbb", "GPU-a390aa2c-a2a5"]
    assert [g["uuid"] for g in nvidia_gpus(SMI, "GPU-a390")] == ["GPU-a390aa2c-a2a5"]  # a UUID prefix
    assert nvidia_gpus("garbage\n", None) == [] and nvidia_gpus(SMI, "7") == []
    assert nvidia_gpus(SMI, "") == []  # CUDA_VISIBLE_DEVICES="" hides every GPU


def test_rocm_smi_cards():
    from mlabench.serving.gpus import rocm_gpus

    text = json.dumps({"card0": {"Card Series": "AMD Instinct MI355X"}, "card1": {"Card series": "AMD Instinct MI355X"},
                       "system": {"Driver version": "6.4"}})
    assert rocm_gpus(text) == [{"name": "AMD Instinct MI355X"}] * 2 and rocm_gpus("not json") == []


def test_a_serve_bench_manifest_names_the_gpus_a_server_sees(tmp_path, monkeypatch):
    """serve-bench runs recorded no GPU, so a CPU serving run and an H200 one could not be told
    apart: the manifest now holds ``gpus`` (nvidia-smi's, else rocm-smi's; [] without either)."""
    from mlabench.serving.bench import write_manifest
    from mlabench.serving.config import load_config

    tools = tmp_path / "bin"
    tools.mkdir()
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}/usr/bin{os.pathsep}/bin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    config = load_config(Path(__file__).parents[2] / "configs/serve/cpu-tiny.toml")
    (tmp_path / "none").mkdir()
    write_manifest(tmp_path / "none", config, {"vllm_bin": "/nonexistent/vllm"}, resumed=False)
    assert json.loads((tmp_path / "none/manifest.json").read_text())["gpus"] == []
    _tool(tools, "nvidia-smi", SMI)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    (tmp_path / "h200").mkdir()
    write_manifest(tmp_path / "h200", config, {"vllm_bin": "/nonexistent/vllm"}, resumed=False)
    gpus = json.loads((tmp_path / "h200/manifest.json").read_text())["gpus"]
    assert gpus == [{"name": "NVIDIA H200", "uuid": "GPU-bbbb", "driver": "580.159.04", "memory_mib": 143771}]
