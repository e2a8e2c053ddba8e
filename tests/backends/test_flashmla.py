"""flashmla on the CPU: API detection, argument shapes, and prepare() driving fake flash_mla modules
shaped like sgl-flash-mla 1.0.0 (legacy flag) and like a pre-2026-09-30 source build."""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

import pytest
import torch

from mlabench.backends import get_backend
from mlabench.backends.flashmla import (
    flashmla_split_starts,
    API_LEGACY_FLAG,
    API_STUB,
    API_TENSOR_METADATA,
    flashmla_api,
    flashmla_query,
    flashmla_workspace_bytes,
    metadata_args,
    split_stats,
)
from mlabench.inputs import SPARE_PAGES, make_inputs
from mlabench.kernels.reference import mla_decode_reference
from mlabench.shapes import MLADecodeShape
from tests.backends.fakes import Recorder, install, module

SM_PARTS = 6


def _attention(q4, k_cache, block_table, cache_seqlens, head_dim_v, scale, causal=False):
    """FlashMLA's outputs: ``out [B, s_q, H, Dv]`` and ``lse [B, H, s_q]``; with ``causal`` query
    token ``i`` of ``s_q`` sees the first ``L - s_q + i + 1`` keys (FlashMLA's bottom-right mask)."""
    batch, s_q, heads, dim = q4.shape
    out, lse = mla_decode_reference(q4.reshape(batch * s_q, heads, dim), k_cache, block_table,
                                    cache_seqlens, scale, head_dim_v, qo_len=s_q, causal=causal)
    return (out.to(q4.dtype).view(batch, s_q, heads, head_dim_v),
            lse.view(batch, s_q, heads).transpose(1, 2))


@dataclasses.dataclass
class SchedMeta:
    tile_scheduler_metadata: torch.Tensor | None = None
    num_splits: torch.Tensor | None = None


def fake_sgl(monkeypatch):
    """Like sgl-flash-mla 1.0.0: empty sched from get_mla_metadata, hoisting via the decoding op."""
    def get_mla_metadata(*args, **kwargs):
        return SchedMeta(), None

    def get_mla_decoding_metadata(seqlens_k, num_q_tokens_per_head_k, h_k, h_q=None,
                                  is_fp8_kvcache=False, topk=None, use_legacy=False):
        n = seqlens_k.numel()
        return (torch.zeros((SM_PARTS, 8), dtype=torch.int32),
                torch.arange(0, 2 * (n + 1), 2, dtype=torch.int32))

    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                               tile_scheduler_metadata, num_splits=None, softmax_scale=None,
                               causal=False, is_fp8_kvcache=None, indices=None,
                               use_legacy=False):
        assert use_legacy and num_splits is None
        return _attention(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal)

    fakes = SimpleNamespace(meta=Recorder(get_mla_metadata), hoist=Recorder(get_mla_decoding_metadata),
                            fwd=Recorder(flash_mla_with_kvcache))
    install(monkeypatch, {"flash_mla": module(
        "flash_mla", __version__="1.0.0", get_mla_metadata=fakes.meta,
        get_mla_decoding_metadata=fakes.hoist, flash_mla_with_kvcache=fakes.fwd,
        has_legacy=lambda: True)})
    return fakes


def shape_of(heads=12, lens=(100, 64, 3), page_size=64, dtype="bfloat16", qo_len=1, causal=True):
    return MLADecodeShape.create(num_heads=heads, context_lens=lens, page_size=page_size,
                                 q_dtype=dtype, kv_dtype=dtype, qo_len=qo_len, causal=causal)


def test_api_detection():
    def fwd_legacy(q, k, bt, sl, dv, meta, num_splits=None, softmax_scale=None, causal=False,
                   use_legacy=False):
        return q

    def fwd_old(q, k, bt, sl, dv, meta, num_splits, softmax_scale=None, causal=False):
        return q

    meta = lambda *a: None  # noqa: E731
    assert flashmla_api(SimpleNamespace()) == API_STUB  # the 6 kB PyPI flash-mla stub
    assert flashmla_api(SimpleNamespace(flash_mla_with_kvcache=fwd_old)) == API_STUB
    assert flashmla_api(SimpleNamespace(get_mla_metadata=meta, flash_mla_with_kvcache=fwd_legacy)) == API_LEGACY_FLAG
    assert flashmla_api(SimpleNamespace(get_mla_metadata=meta, flash_mla_with_kvcache=fwd_old)) == API_TENSOR_METADATA


def test_argument_shapes():
    q = torch.randn(3, 12, 576)
    q4 = flashmla_query(q)
    assert q4.shape == (3, 1, 12, 576) and q4.data_ptr() == q.data_ptr()
    with pytest.raises(ValueError):
        flashmla_query(q[0])
    q = torch.randn(8, 12, 576)  # 2 requests x 4 query tokens
    q4 = flashmla_query(q, 4)
    assert q4.shape == (2, 4, 12, 576) and torch.equal(q4[1, 2], q[6])
    with pytest.raises(ValueError):
        flashmla_query(q, 3)
    seqlens, rows, kv_heads = metadata_args(torch.tensor([5, 7]), 12)
    assert seqlens.dtype == torch.int32 and (rows, kv_heads) == (12, 1)
    with pytest.raises(ValueError):
        metadata_args(torch.tensor([5]), 12, num_kv_heads=5)


def test_split_stats_and_workspace():
    stats = split_stats(torch.zeros((132, 8), dtype=torch.int32), torch.tensor([0, 3, 5, 9]))
    assert stats == {"num_sm_parts": 132, "num_splits_total": 9, "num_splits_max": 4, "num_splits_min": 2}
    assert split_stats(None, None) == {}
    assert flashmla_workspace_bytes(2, 12, 132) == 2 * 134 * 12 * (512 * 4 + 4)


def test_split_starts_from_the_scheduler_metadata():
    """Rows (begin_idx, begin_seqlen, end_idx, end_seqlen, ...): partition 1 starts inside request 0
    and runs into request 1, partition 2 starts at token 64 of request 1, partition 3 is idle."""
    rows = [[0, 0, 0, 128], [0, 128, 1, 64], [1, 64, 1, 100], [2, 0, 2, 0]]
    tile = torch.tensor([r + [0] * 4 for r in rows], dtype=torch.int32)
    assert flashmla_split_starts(tile, batch=2) == [[0, 128], [0, 64]]
    assert flashmla_split_starts(None, batch=2) is None


def test_supports():
    b = get_backend("flashmla")
    assert b.supports(shape_of()) == (True, "")
    ok, reason = b.supports(shape_of(page_size=16))
    assert not ok and "page size 64" in reason
    assert not b.supports(shape_of(dtype="float32"))[0]
    assert b.supports(shape_of(dtype="float16"))[0]
    assert not b.supports(shape_of(heads=256))[0]
    assert b.supports(shape_of(qo_len=8, lens=(100, 64, 8))) == (True, "")  # 96 rows of one KV head
    ok, reason = b.supports(shape_of(heads=32, qo_len=8, lens=(100, 64, 8)))
    assert not ok and "at most 128 query rows" in reason and "256" in reason
    assert b.params == ()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU reason")
def test_unavailable_without_gpu():
    ok, reason = get_backend("flashmla").available()
    assert not ok and "NVIDIA Hopper GPU (SM90)" in reason


def test_unavailable_reasons_on_a_gpu(monkeypatch):
    b = get_backend("flashmla")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (10, 0))
    assert b.available() == (False, "needs an NVIDIA Hopper GPU (SM90); found sm_100")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    install(monkeypatch, {"flash_mla": module("flash_mla")})  # the PyPI stub
    ok, reason = b.available()
    assert not ok and "sgl-flash-mla" in reason
    fake_sgl(monkeypatch)
    assert b.available() == (True, "")


def test_prepare_sgl_legacy(monkeypatch):
    fakes = fake_sgl(monkeypatch)
    hoist = fakes.hoist.impl
    fakes.hoist.impl = lambda *a, **k: time.sleep(0.002) or hoist(*a, **k)  # the scheduler takes 2 ms
    b = get_backend("flashmla")
    inp = make_inputs(shape_of(), device="cpu", seed=4)
    s = inp.shape
    call = b.prepare(inp, b.resolve_params(s))
    (h_args, h_kw), = fakes.hoist.calls
    assert h_args[0].tolist() == [100, 64, 3] and h_args[0].dtype == torch.int32
    assert h_args[1:] == (12, 1) and h_kw == {"use_legacy": True}
    assert fakes.fwd.calls == [] and torch.isnan(call.out).all()
    assert 2000 <= call.setup_us["metadata_us"] < 2e6  # the scheduler's 2 ms, in µs

    out = call.fn()
    (args, kw), = fakes.fwd.calls
    q4, k_cache, block_table, seqlens, head_dim_v, sched, num_splits = args
    assert q4.shape == (3, 1, 12, 576) and k_cache is inp.kv_cache
    assert k_cache.shape == (s.num_pages + SPARE_PAGES, 64, 1, 576)
    assert block_table.dtype == torch.int32 and seqlens.dtype == torch.int32
    assert head_dim_v == 512 and num_splits is None
    assert sched.tile_scheduler_metadata.shape == (SM_PARTS, 8)
    assert kw == {"softmax_scale": s.scale, "causal": False, "use_legacy": True}
    assert out is call.out and out.shape == (3, 12, 512)
    ref, _ = mla_decode_reference(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens, s.scale)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    eff = call.effective_params
    assert eff["api"] == API_LEGACY_FLAG and eff["num_sm_parts"] == SM_PARTS
    assert eff["num_splits_total"] == 6 and eff["metadata"] == "hoisted scheduler"
    assert call.workspace_bytes == flashmla_workspace_bytes(3, 12, SM_PARTS)


def test_prepare_tensor_metadata_build(monkeypatch):
    tile = torch.ones((SM_PARTS, 8), dtype=torch.int32)
    splits = torch.tensor([0, 1, 4], dtype=torch.int32)

    def get_mla_metadata(cache_seqlens, num_heads_per_head_k, num_heads_k):
        return tile, splits

    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                               tile_scheduler_metadata, num_splits, softmax_scale=None,
                               causal=False):
        return _attention(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale)

    meta, fwd = Recorder(get_mla_metadata), Recorder(flash_mla_with_kvcache)
    install(monkeypatch, {"flash_mla": module("flash_mla", get_mla_metadata=meta,
                                              flash_mla_with_kvcache=fwd)})
    b = get_backend("flashmla")
    inp = make_inputs(shape_of(heads=16, lens=(200, 65), dtype="float16"), device="cpu")
    call = b.prepare(inp, {})
    assert meta.calls[0][0][1:] == (16, 1)
    call.fn()
    (args, kw), = fwd.calls
    assert args[5] is tile and args[6] is splits and "use_legacy" not in kw
    ref, _ = mla_decode_reference(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens, inp.shape.scale)
    torch.testing.assert_close(call.out.float(), ref, atol=2e-2, rtol=2e-2)
    assert call.effective_params["num_splits_max"] == 3 and call.effective_params["api"] == API_TENSOR_METADATA


def test_prepare_without_hoisting_fills_metadata_with_a_first_call(monkeypatch):
    fakes = fake_sgl(monkeypatch)
    import sys

    del sys.modules["flash_mla"].get_mla_decoding_metadata

    def fill(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
             num_splits=None, softmax_scale=None, causal=False, use_legacy=False):
        tile_scheduler_metadata.tile_scheduler_metadata = torch.zeros((4, 8), dtype=torch.int32)
        tile_scheduler_metadata.num_splits = torch.tensor([0, 2], dtype=torch.int32)
        return _attention(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale)

    fakes.fwd.impl = fill
    b = get_backend("flashmla")
    inp = make_inputs(shape_of(lens=(70,)), device="cpu")
    call = b.prepare(inp, {})
    assert len(fakes.fwd.calls) == 1  # the filling call happened in prepare
    assert call.effective_params["num_sm_parts"] == 4
    assert "first decode call" in call.effective_params["metadata"]


@pytest.mark.parametrize("causal", [True, False])
def test_prepare_multi_token(monkeypatch, causal):
    """s_q = qo_len: q viewed [B, 4, H, 576], the scheduler told 4 x 12 query rows per KV head,
    the shape's mask passed as causal, the [B, 4, H, 512] output written token-major."""
    fakes = fake_sgl(monkeypatch)
    b = get_backend("flashmla")
    inp = make_inputs(shape_of(lens=(100, 64, 5), qo_len=4, causal=causal), device="cpu", seed=6)
    s = inp.shape
    call = b.prepare(inp, b.resolve_params(s))
    (h_args, _), = fakes.hoist.calls
    assert h_args[1:] == (48, 1)
    out = call.fn()
    (args, kw), = fakes.fwd.calls
    assert args[0].shape == (3, 4, 12, 576) and kw["causal"] is causal
    assert out is call.out and out.shape == (12, 12, 512)
    ref, _ = mla_decode_reference(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens, s.scale,
                                  qo_len=4, causal=causal)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    assert call.workspace_bytes == flashmla_workspace_bytes(3, 12, SM_PARTS, qo_len=4)
