"""vllm-fa3-mla on the CPU: prepare() driving a fake ``vllm.vllm_flash_attn`` whose
``flash_attn_varlen_func`` computes MLA attention from exactly the pieces vLLM's FLASH_ATTN_MLA
passes (RoPE parts as q/k, latent parts as q_v/v, lengths from ``seqused_k``), so a wrong mapping
of columns, pages or lengths gives a wrong output."""

from __future__ import annotations

import pytest
import torch

from mlabench.backends import get_backend
from mlabench.backends.vllm_fa3 import VLLM_FA3_GRAPH_MAX_SPLITS, fa3_query_parts
from mlabench.inputs import make_inputs
from mlabench.kernels.reference import mla_decode_reference, visible_keys
from mlabench.shapes import MLADecodeShape
from tests.backends.fakes import Recorder, install, module


def _varlen(q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, seqused_k=None, q_v=None,
            softmax_scale=None, causal=False, block_table=None, out=None, fa_version=2,
            scheduler_metadata=None, num_splits=0, **_):
    """FA's paged varlen attention with MLA's ``q_v``: score = q.k + q_v.v over each request's
    pages (``k [pages, 64, 1, 64]``, ``v [pages, 64, 1, 512]``), output = P v; into ``out``."""
    assert fa_version == 3 and causal and scheduler_metadata is not None
    page = k.shape[1]
    res = torch.zeros(q.shape[0], q.shape[1], v.shape[-1])
    for b in range(cu_seqlens_q.numel() - 1):
        lo, hi, seq = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]), int(seqused_k[b])
        pages = block_table[b, : (seq + page - 1) // page].long()
        kk = k[pages].reshape(-1, k.shape[-1])[:seq].float()
        vv = v[pages].reshape(-1, v.shape[-1])[:seq].float()
        for t, seen in enumerate(visible_keys(seq, hi - lo, True)):
            s = (q[lo + t].float() @ kk[:seen].T + q_v[lo + t].float() @ vv[:seen].T) * softmax_scale
            res[lo + t] = torch.softmax(s, dim=-1) @ vv[:seen]
    if out is None:
        return res.to(q.dtype)
    out.copy_(res)
    return out


def _scheduler(**kw):
    return torch.tensor([kw["batch_size"], kw["num_splits"], int(kw["cache_seqlens"].sum())], dtype=torch.int32)


@pytest.fixture
def fake_fa(monkeypatch):
    fa = module("vllm.vllm_flash_attn", flash_attn_varlen_func=Recorder(_varlen),
                get_scheduler_metadata=Recorder(_scheduler), is_fa_version_supported=lambda v: v == 3)
    install(monkeypatch, {"vllm": module("vllm"), "vllm.vllm_flash_attn": fa})
    return fa


@pytest.mark.parametrize("lens,qo_len", [((70, 5, 129), 1), ((200,), 4)])
def test_prepare_calls_fa3_as_vllm_does_and_the_output_is_mla_attention(fake_fa, lens, qo_len):
    shape = MLADecodeShape(num_heads=12, context_lens=lens, qo_len=qo_len, page_size=64,
                           q_dtype="float32", kv_dtype="float32")
    inputs = make_inputs(shape, device="cpu")
    call = get_backend("vllm-fa3-mla").prepare(inputs, {"max_num_splits": VLLM_FA3_GRAPH_MAX_SPLITS})
    out = call.fn()
    ref, _ = mla_decode_reference(inputs.q, inputs.kv_cache, inputs.block_table, inputs.cache_seqlens,
                                  shape.scale, qo_len=qo_len)
    torch.testing.assert_close(out.float(), ref, rtol=1e-4, atol=1e-4)
    assert out is call.out and call.effective_params == {"max_num_splits": 32}
    (_, kw), = fake_fa.flash_attn_varlen_func.calls
    assert kw["q"].shape[-1] == 64 and kw["q_v"].shape[-1] == 512 and kw["num_splits"] == 32
    assert kw["max_seqlen_q"] == qo_len and kw["cu_seqlens_q"].tolist() == [i * qo_len for i in range(len(lens) + 1)]
    assert "metadata_us" in call.setup_us


def test_refresh_rebuilds_the_scheduler_metadata_in_place_for_new_lengths(fake_fa):
    shape = MLADecodeShape(num_heads=12, context_lens=(128, 64), q_dtype="float32", kv_dtype="float32")
    inputs = make_inputs(shape, device="cpu")
    call = get_backend("vllm-fa3-mla").prepare(inputs, {"max_num_splits": 0})
    call.fn()
    first = fake_fa.flash_attn_varlen_func.calls[-1][1]["scheduler_metadata"]
    assert first.tolist() == [2, 0, 192]
    inputs.cache_seqlens.copy_(torch.tensor([100, 30], dtype=torch.int32))
    call.refresh_for_new_lengths()
    call.fn()
    again = fake_fa.flash_attn_varlen_func.calls[-1][1]["scheduler_metadata"]
    assert again is first and again.tolist() == [2, 0, 130]   # the same buffer a graph keeps


def test_query_parts_are_views_of_the_latent_and_rope_columns():
    q = torch.arange(2 * 3 * 576, dtype=torch.float32).view(2, 3, 576)
    nope, pe = fa3_query_parts(q, 512)
    assert nope.data_ptr() == q.data_ptr() and pe.shape == (2, 3, 64) and pe.stride(-1) == 1
    assert torch.equal(pe, q[..., 512:])


def test_halves_go_to_fa3_as_they_lie_with_the_same_output(fake_fa):
    """vLLM's halves (a transposed bmm-output view and a slice) reach FA3 as q_v and q, the same
    objects, and give what the 576-wide query gives."""
    from mlabench.backends.vllm_fa3 import fa3_mla_decode
    from tests.kernels.helpers import vllm_query_halves

    shape = MLADecodeShape(num_heads=12, context_lens=(70, 129), qo_len=2, page_size=64,
                           q_dtype="float32", kv_dtype="float32")
    x = make_inputs(shape, device="cpu")
    cu_q = torch.tensor([0, 2, 4], dtype=torch.int32)
    args = (x.kv_cache, x.block_table, x.cache_seqlens, cu_q, 2, 129, shape.scale)
    halves = vllm_query_halves(x.q)
    got = fa3_mla_decode(fake_fa, halves, *args, scheduler_metadata=torch.zeros(1))
    (_, kw), = fake_fa.flash_attn_varlen_func.calls
    assert kw["q_v"] is halves[0] and kw["q"] is halves[1]
    whole = fa3_mla_decode(fake_fa, x.q, *args, scheduler_metadata=torch.zeros(1))
    assert torch.equal(got, whole)


def test_unavailable_without_a_gpu_says_why():
    ok, why = get_backend("vllm-fa3-mla").available()
    if not torch.cuda.is_available():
        assert not ok and "Hopper" in why
