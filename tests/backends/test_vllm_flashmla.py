"""vllm-flashmla on the CPU: prepare() driving a fake ``vllm.v1.attention.ops.flashmla`` shaped like
vLLM 0.26's wrapper of its FlashMLA build: ``get_mla_metadata`` returns an empty schedule object,
the first ``flash_mla_with_kvcache`` call on it computes the schedule (here the prefix sum of the
lengths it saw) and every later call takes each request's length from that schedule, not from
``cache_seqlens``, so a stale schedule gives a wrong output as on a GPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mlabench.backends import get_backend
from mlabench.backends.vllm_flashmla import vllm_flashmla_query
from mlabench.inputs import make_inputs
from mlabench.kernels.reference import mla_decode_reference
from mlabench.shapes import MLADecodeShape
from tests.backends.fakes import Recorder, install, module

SM_PARTS = 4


@dataclasses.dataclass
class SchedMeta:
    have_initialized: bool = False
    tile_scheduler_metadata: torch.Tensor | None = None
    num_splits: torch.Tensor | None = None


def _get_mla_metadata(*_args, **_kwargs):
    return SchedMeta(), None


def _flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                            num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False,
                            out=None):
    sched = tile_scheduler_metadata
    assert num_splits is None and causal and not is_fp8_kvcache and q.is_contiguous()
    if not sched.have_initialized:  # the "device" schedule of the first call
        sched.have_initialized = True
        cum = torch.zeros(cache_seqlens.numel() + 1, dtype=torch.int32)
        cum[1:] = torch.cumsum(cache_seqlens, 0)
        sched.tile_scheduler_metadata, sched.num_splits = torch.zeros((SM_PARTS, 8), dtype=torch.int32), cum
    lens = sched.num_splits[1:] - sched.num_splits[:-1]
    batch, s_q, heads, dim = q.shape
    o, lse = mla_decode_reference(q.reshape(batch * s_q, heads, dim), k_cache, block_table, lens,
                                  softmax_scale, head_dim_v, qo_len=s_q, causal=causal)
    o = o.to(q.dtype).view(batch, s_q, heads, head_dim_v)
    if out is not None:
        out.copy_(o)
    return (o if out is None else out), lse


@pytest.fixture
def fake_ops(monkeypatch):
    ops = module("vllm.v1.attention.ops.flashmla", get_mla_metadata=Recorder(_get_mla_metadata),
                 flash_mla_with_kvcache=Recorder(_flash_mla_with_kvcache),
                 is_flashmla_dense_supported=lambda: (True, None))
    install(monkeypatch, {"vllm": module("vllm"), "vllm.v1.attention.ops.flashmla": ops})
    return ops


def _inputs(lens, qo_len=1):
    shape = MLADecodeShape(num_heads=12, context_lens=lens, qo_len=qo_len, page_size=64,
                           q_dtype="float32", kv_dtype="float32")
    return make_inputs(shape, device="cpu")


@pytest.mark.parametrize("lens,qo_len", [((70, 5, 129), 1), ((200, 90), 4)])
def test_prepare_calls_flashmla_as_vllm_does_and_the_output_is_mla_attention(fake_ops, lens, qo_len):
    inputs = _inputs(lens, qo_len)
    call = get_backend("vllm-flashmla").prepare(inputs, {})
    assert len(fake_ops.get_mla_metadata.calls) == 1 and len(fake_ops.flash_mla_with_kvcache.calls) == 1
    args, kw = fake_ops.get_mla_metadata.calls[0]
    assert args[1:] == (qo_len * 12, 1) and kw == {"is_fp8_kvcache": False}  # s_q * H rows, one KV head
    out = call.fn()
    ref, _ = mla_decode_reference(inputs.q, inputs.kv_cache, inputs.block_table, inputs.cache_seqlens,
                                  inputs.shape.scale, qo_len=qo_len)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    assert out is call.out and "metadata_us" in call.setup_us
    assert call.effective_params["num_sm_parts"] == SM_PARTS and call.workspace_bytes > 0
    assert len(fake_ops.get_mla_metadata.calls) == 1   # fn builds no schedule: vLLM's is per step
    _, kw = fake_ops.flash_mla_with_kvcache.calls[-1]
    assert kw["q"].shape == (len(lens), qo_len, 12, 576) and kw["k_cache"].shape[-2:] == (1, 576)
    assert kw["head_dim_v"] == 512 and kw["tile_scheduler_metadata"].have_initialized


def test_fn_reads_q_anew_on_every_call(fake_ops):
    inputs = _inputs((64, 30))
    call = get_backend("vllm-flashmla").prepare(inputs, {})
    first = call.fn().clone()
    inputs.q.mul_(-1.0)
    assert not torch.allclose(call.fn(), first)


def test_refresh_rebuilds_the_schedule_in_the_tensors_fn_reads(fake_ops):
    inputs = _inputs((128, 64))
    call = get_backend("vllm-flashmla").prepare(inputs, {})
    sched = fake_ops.flash_mla_with_kvcache.calls[-1][1]["tile_scheduler_metadata"]
    splits = sched.num_splits
    inputs.cache_seqlens.copy_(torch.tensor([100, 30], dtype=torch.int32))
    stale = call.fn().clone()
    call.refresh_for_new_lengths()
    assert len(fake_ops.get_mla_metadata.calls) == 2   # refresh is the step's new schedule
    out = call.fn()
    ref, _ = mla_decode_reference(inputs.q, inputs.kv_cache, inputs.block_table, inputs.cache_seqlens,
                                  inputs.shape.scale)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(stale, ref, rtol=1e-4, atol=1e-4)
    assert sched.num_splits is splits and splits.tolist() == [0, 100, 130]  # the tensor a graph keeps


def test_query_is_the_concatenation_viewed_per_request():
    q = torch.arange(4 * 3 * 576, dtype=torch.float32).view(4, 3, 576)
    q4 = vllm_flashmla_query(q, 512, 2)
    assert q4.shape == (2, 2, 3, 576) and q4.data_ptr() != q.data_ptr() and torch.equal(q4.view_as(q), q)
    with pytest.raises(ValueError):
        vllm_flashmla_query(q, 512, 3)


def test_supports_page_size_64_bf16_and_causal_tokens():
    backend = get_backend("vllm-flashmla")
    assert backend.supports(MLADecodeShape(num_heads=12, context_lens=(100,)))[0]
    ok, why = backend.supports(MLADecodeShape(num_heads=12, context_lens=(100,), page_size=16))
    assert not ok and "page size 64" in why
    ok, why = backend.supports(MLADecodeShape(num_heads=12, context_lens=(100,), qo_len=2, causal=False))
    assert not ok and "causal" in why


def test_unavailable_without_a_gpu_says_why(fake_ops):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    ok, why = get_backend("vllm-flashmla").available()
    assert not ok and "Hopper" in why


def test_unavailable_without_vllm_names_the_module(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", None)
    install(monkeypatch, {"vllm.v1.attention.ops.flashmla": None})  # import fails
    ok, why = get_backend("vllm-flashmla").available()
    assert not ok and "vllm.v1.attention.ops.flashmla" in why


def test_unsupported_build_gives_vllms_reason(monkeypatch, fake_ops):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", None)
    fake_ops.is_flashmla_dense_supported = lambda: (False, "FlashMLA Dense is only supported on Hopper devices.")
    ok, why = get_backend("vllm-flashmla").available()
    assert not ok and "only supported on Hopper" in why
    fake_ops.is_flashmla_dense_supported = lambda: (True, None)
    assert get_backend("vllm-flashmla").available() == (True, "")
