"""The triton-splitkv and triton-persistent backends through the backend contract (compiled on a
GPU, in Triton's interpreter without one)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from mlabench.backends import get_backend
from mlabench.backends.triton import NO_GPU_REASON
from mlabench.errors import ConfigError
from tests.kernels.helpers import TOL, make_case, max_err


def test_module_import_does_not_import_triton():
    code = "import sys, mlabench.backends.triton; print('triton' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU's interpreter switch: a GPU compiles them")
def test_available_only_when_interpreting_on_cpu(monkeypatch):
    for name in ("triton-splitkv", "triton-persistent"):
        assert get_backend(name).available() == (True, "")
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        assert get_backend(name).available() == (False, NO_GPU_REASON)
        monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_available_on_a_gpu_without_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for name in ("triton-splitkv", "triton-persistent"):
        assert get_backend(name).available() == (True, "")


def test_splitkv_backend():
    inp, ref = make_case(12, (33, 70), 16)
    be = get_backend("triton-splitkv")
    params = be.resolve_params(inp.shape, {"num_kv_splits": 3})
    call = be.prepare(inp, params)
    assert torch.isnan(call.out).all()
    res = call.fn()
    assert res is call.out and max_err(res, ref) < TOL["float16"]
    assert call.effective_params == {"num_kv_splits": 3}
    assert call.workspace_bytes == 2 * 2 * 3 * 12 * (512 * 4 + 4)


@pytest.mark.parametrize("mode", ["zero", "repeat"])
def test_persistent_backend(mode):
    inp, ref = make_case(12, (33, 70), 16)
    be = get_backend("triton-persistent")
    call = be.prepare(inp, be.resolve_params(inp.shape, {"head_padding": mode, "programs_per_sm": 2}))
    assert torch.isnan(call.out).all()
    res = call.fn()
    assert res.shape == (2, 12, 512) and max_err(res, ref) < TOL["float16"]
    assert call.effective_params["padded_heads"] == 16
    assert call.effective_params["head_padding"] == mode
    assert call.effective_params["num_programs"] % 2 == 0


def test_persistent_params_are_validated():
    be = get_backend("triton-persistent")
    inp, _ = make_case(12, (8,), 16)
    with pytest.raises(ConfigError):
        be.resolve_params(inp.shape, {"programs_per_sm": 9})
    with pytest.raises(ConfigError):
        be.resolve_params(inp.shape, {"head_padding": "mirror"})
