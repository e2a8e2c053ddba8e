"""What the backends share: parameters, the MLA dimension check, adapter helpers, declared packages."""

from __future__ import annotations

import time

import pytest
import torch

from mlabench.backends import backend_names, get_backend
from mlabench.backends.registry import backend_packages
from mlabench.backends.base import check_mla_dims
from mlabench.backends.shared import HEAD_PADDING, NUM_KV_SPLITS, accepts_kwarg, require, timed_us
from mlabench.errors import BackendUnavailableError
from mlabench.kernels.workspace import split_workspace_bytes
from mlabench.policy.heuristics import vllm_triton_splits
from mlabench.records.provenance import library_versions
from mlabench.shapes import MLADecodeShape


def test_accepts_kwarg():
    def f(a, b=1):
        return a

    def g(a, **kw):
        return a

    assert accepts_kwarg(f, "b") is True
    assert accepts_kwarg(f, "c") is False
    assert accepts_kwarg(g, "anything") is True
    assert accepts_kwarg(len, "x") in (False, None)


def test_check_mla_dims():
    assert check_mla_dims(MLADecodeShape.create(num_heads=12, context_lens=(8,)), "X") == (True, "")
    ok, why = check_mla_dims(MLADecodeShape.create(num_heads=12, context_lens=(8,), kv_lora_rank=256),
                             "FlashMLA decode")
    assert not ok and why == "FlashMLA decode is built for kv_lora_rank 512 + rope 64, got 256 + 64"


def test_require_and_timed_us():
    assert require("math").sqrt(4) == 2
    with pytest.raises(BackendUnavailableError, match="not installed"):
        require("no_such_module_mlabench")
    result, wall_us = timed_us(torch.device("cpu"), lambda: time.sleep(0.002) or 7)
    assert result == 7 and 2000 <= wall_us < 2e6  # 2 ms, in µs


def test_shared_parameters_are_one_object():
    users = {name: get_backend(name).params for name in backend_names()}
    assert NUM_KV_SPLITS in users["torch-splitkv"] and NUM_KV_SPLITS in users["triton-splitkv"]
    assert HEAD_PADDING in users["triton-persistent"] and HEAD_PADDING in users["aiter-asm"]
    gluon_splits, = (p for p in users["aiter-gluon"] if p.name == "num_kv_splits")
    assert (gluon_splits.default, gluon_splits.high, gluon_splits.low) == (None, 256, 1)
    shape = MLADecodeShape.uniform(1, 100_000, 12)
    assert NUM_KV_SPLITS.default_for(shape) == vllm_triton_splits(shape) == 256  # capped at 2 x 132
    assert vllm_triton_splits(MLADecodeShape.uniform(1, 4096, 12)) == 8


def test_split_workspace_bytes():
    assert split_workspace_bytes(132 * 12) == 2 * 132 * 12 * (512 * 4 + 4)  # 6.5 MB at 12 heads
    assert split_workspace_bytes(10, 512, 2) == 2 * 10 * (512 * 2 + 4)
    assert split_workspace_bytes(0) == 0
    with pytest.raises(ValueError):
        split_workspace_bytes(-1)


def test_library_versions_come_from_the_backends():
    packages = backend_packages()
    assert set(packages) == {"triton", "aiter", "flash_mla", "vllm"}  # committed manifests lack vllm (added with vllm-triton-mla)
    versions = library_versions(packages)
    assert set(versions) == {"python", "torch", "cuda", "hip", "mlabench", *packages}
    assert library_versions({"nothing": ("no-such-dist-mlabench",)})["nothing"] is None
    assert "triton" not in library_versions({})


def test_cuda_module_names_the_gpu_feature_then_what_to_install(monkeypatch):
    from mlabench.backends.shared import cuda_module

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_module("json", "FA3") == (None, "needs an NVIDIA Hopper GPU (FA3) with a CUDA build of torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", None)
    mod, why = cuda_module("json", "FA3")
    assert mod is not None and why == ""
    mod, why = cuda_module("vllm_not_installed_here.x", "FA3")
    assert mod is None and "not installed" in why
