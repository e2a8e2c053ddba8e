"""The triton-splitkv and triton-persistent backends through the backend contract (compiled on a
GPU, in Triton's interpreter without one)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from mlabench.backends import get_backend
from mlabench.backends.triton import NO_GPU_REASON
from mlabench.bench.shape_bench import ShapeBench
from mlabench.errors import ConfigError
from mlabench.kernels.splitkv_torch import split_starts
from mlabench.shapes import MLADecodeShape
from tests.kernels.helpers import TOL, make_case, max_err, reference


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
    assert call.effective_params == {"num_kv_splits": 3, "rows_per_tile": 16}
    assert call.workspace_bytes == 2 * 2 * 3 * 12 * (512 * 4 + 4)


def policy_call(tmp_path, mode: str):
    """triton-splitkv on lengths (33, 70) with the policy ``<= 40: 2 splits, else 5``."""
    path = tmp_path / "policy.json"
    path.write_text("[[40, 2], [1000, 5]]")
    inp, ref = make_case(12, (33, 70), 16)
    be = get_backend("triton-splitkv")
    return inp, ref, path, be.prepare(inp, be.resolve_params(inp.shape, {"split_policy": f"{mode}:{path}"}))


def test_splitkv_backend_device_policy(tmp_path):
    """Each request its own count, looked up on the device; the grid holds the largest."""
    _inp, ref, path, call = policy_call(tmp_path, "device")
    assert max_err(call.fn(), ref) < TOL["float16"]
    assert call.refresh is None  # nothing depends on the lengths outside the kernel
    assert call.effective_params == {"num_kv_splits": 5, "rows_per_tile": 16, "split_policy": "device",
                                     "policy_source": str(path)}
    assert call.workspace_bytes == 2 * (2 + 5) * 12 * (512 * 4 + 4)  # the counts the requests run


def test_splitkv_backend_host_policy_follows_refresh(tmp_path):
    """One count per step from the longest context, chosen on the host when refresh runs."""
    inp, _ref, _path, call = policy_call(tmp_path, "host")
    assert call.effective_params["num_kv_splits"] == 5
    inp.cache_seqlens.copy_(torch.tensor([10, 30], dtype=torch.int32))
    call.refresh_for_new_lengths()
    assert call.effective_params["num_kv_splits"] == 2
    call.out.fill_(float("nan"))
    assert max_err(call.fn(), reference(inp, inp.q)) < TOL["float16"]


def test_splitkv_backend_heuristic_policy_and_bad_values():
    inp, ref = make_case(12, (33, 1100), 16)
    be = get_backend("triton-splitkv")
    call = be.prepare(inp, be.resolve_params(inp.shape, {"split_policy": "device"}))
    assert max_err(call.fn(), ref) < TOL["float16"]
    assert call.effective_params["policy_source"] == "vllm heuristic"
    for bad, match in (("sideways", "split_policy must be"), ("device:/no/such.json", "not found")):
        with pytest.raises(ConfigError, match=match):
            be.prepare(inp, be.resolve_params(inp.shape, {"split_policy": bad}))


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


@pytest.fixture(scope="module")
def bench():
    """Copy 0 poisoned (NaN in every unread slot), checked on every input set."""
    shape = MLADecodeShape.create(num_heads=12, context_lens=(1, 70, 300), page_size=16, q_dtype="float16",
                                  kv_dtype="float16")
    return ShapeBench(shape, seed=5, copies=1)


@pytest.mark.parametrize("splits", [1, 3, 40])  # 40: more splits than the 70-token request fills
def test_splitkv_passes_every_input_set_at_every_split_count(bench, splits):
    call, v = bench.check(get_backend("triton-splitkv"), {"num_kv_splits": splits})
    assert v.passed and set(v.by_input_set) == {"random", "needles", "peaky", "flat"}, v
    assert call.split_starts == split_starts(bench.shape.context_lens, splits, 16)


def test_persistent_passes_every_input_set(bench):
    call, v = bench.check(get_backend("triton-persistent"), {"head_padding": "repeat", "programs_per_sm": 3})
    assert v.passed, v
    assert call.split_starts[2] != [0]  # the 300-token request is cut over several programs


def test_a_parameter_added_later_stays_out_of_the_key_at_its_default():
    """rows_per_tile came after runs were recorded: at its default (16) it is not among the
    resolved params, so those runs' records still pair with new ones; asked otherwise, it is."""
    shape = MLADecodeShape.create(num_heads=12, context_lens=(64,), qo_len=4)
    backend = get_backend("triton-splitkv")
    assert "rows_per_tile" not in backend.resolve_params(shape, {"num_kv_splits": 2})
    assert "rows_per_tile" not in backend.resolve_params(shape, {"rows_per_tile": 16})
    assert backend.resolve_params(shape, {"rows_per_tile": "auto"})["rows_per_tile"] == "auto"
