"""``refresh`` of the library adapters (flashmla, aiter-asm, aiter-gluon) on the CPU, against fake
libraries whose kernels follow their metadata as the real ones do: the fake decode takes each
request's token range from the schedule it is given (FlashMLA's ``num_splits``, AITER's work
metadata, the page-size-1 ``kv_indptr``), not from ``cache_seqlens``.  Stale metadata then gives a
wrong output, as it does on a GPU (a captured flashmla call went stale: max abs error 0.09).

Each test: prepare at :data:`LENS`, run, write :data:`NEW_LENS` into ``cache_seqlens`` in place;
without ``refresh`` the output is that of the old lengths (the fake is sensitive), after it the
reference of the new ones; graph-safe calls keep their metadata tensors (a graph reads those).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

import mlabench.backends.aiter as aiter_backend
from mlabench.backends import get_backend
from mlabench.inputs import make_inputs
from mlabench.kernels.reference import mla_decode_reference
from mlabench.shapes import MLADecodeShape
from mlabench.verdict import compare_outputs
from tests.backends.fakes import csr_attention, install, module

LENS = (100, 64, 3)
NEW_LENS = (20, 99, 90)  # within the block table (100 tokens a row at page size 1)
SM_PARTS = 4


def scheduled_lens(cumulative: torch.Tensor) -> torch.Tensor:
    """Per-request lengths from a ``[B + 1]`` prefix sum (the fakes' schedule)."""
    return (cumulative[1:] - cumulative[:-1]).to(torch.int32)


def schedule_of(seqlens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A fake FlashMLA schedule: ``(tile metadata [SM_PARTS, 8], num_splits [B + 1])`` whose
    ``num_splits`` is the prefix sum of the lengths it was built for."""
    cum = torch.zeros(seqlens.numel() + 1, dtype=torch.int32)
    cum[1:] = torch.cumsum(seqlens.to(torch.int32), 0)
    return torch.zeros((SM_PARTS, 8), dtype=torch.int32), cum


def attention(q4, k_cache, block_table, lens, head_dim_v, scale):
    out, _ = mla_decode_reference(q4[:, 0], k_cache, block_table, lens, scale, head_dim_v)
    return out.to(q4.dtype).unsqueeze(1), None


@dataclasses.dataclass
class SchedMeta:
    have_initialized: bool = False
    tile_scheduler_metadata: torch.Tensor | None = None
    num_splits: torch.Tensor | None = None


def flashmla_sgl(hoist: bool):
    """sgl-flash-mla 1.0.0's surface; with ``hoist`` False, no ``get_mla_decoding_metadata``
    (the first decode call fills the FlashMLASchedMeta, as FlashMLA's newer API does)."""
    def fwd(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
            num_splits=None, softmax_scale=None, causal=False, use_legacy=False):
        sched = tile_scheduler_metadata
        if sched.num_splits is None:  # first call on this sched: schedule the current lengths
            sched.have_initialized = True
            sched.tile_scheduler_metadata, sched.num_splits = schedule_of(cache_seqlens)
        return attention(q, k_cache, block_table, scheduled_lens(sched.num_splits), head_dim_v,
                         softmax_scale)

    attrs = dict(get_mla_metadata=lambda *a, **k: (SchedMeta(), None), flash_mla_with_kvcache=fwd)
    if hoist:
        attrs["get_mla_decoding_metadata"] = lambda seqlens, rows, h_k, use_legacy=False: schedule_of(seqlens)
    return module("flash_mla", __version__="1.0.0", **attrs)


def flashmla_source_build():
    """FlashMLA built from source before its FlashMLASchedMeta API: tensors in, tensors out."""
    def fwd(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
            softmax_scale=None, causal=False):
        return attention(q, k_cache, block_table, scheduled_lens(num_splits), head_dim_v, softmax_scale)

    return module("flash_mla", get_mla_metadata=lambda seqlens, rows, h_k: schedule_of(seqlens),
                  flash_mla_with_kvcache=fwd)


def fake_aiter():
    """AITER whose persistent decode takes token ranges from its work metadata (written by
    ``get_mla_metadata_v1`` from ``kv_indptr``) and whose Gluon decode from ``seq_info``."""
    def info_v1(batch, max_seqlen_qo, heads, q_dtype, kv_dtype, is_sparse, fast_mode=True):
        return ((2, torch.uint64), (SM_PARTS + 1, torch.int32), ((batch + 1, 8), torch.int32),
                (batch + 1, torch.int32), ((batch, 2), torch.int32), (2 * SM_PARTS, torch.int32))

    def metadata_v1(qo_indptr, kv_indptr, last_page_lens, heads, heads_k, causal, meta, info_set,
                    indptr, r_indptr, r_final, r_partial, **kwargs):
        info_set[:, 0].copy_(kv_indptr)

    def decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, last_page_lens, max_seqlen_q,
                   sm_scale=None, work_info_set=None, **kwargs):
        rows = kv_buffer.view(-1, kv_buffer.shape[-1])
        o.copy_(csr_attention(q, rows, work_info_set[:, 0], kv_indices, sm_scale))

    def gluon(q_nope, q_pe, kv_c, o, page_table, seq_info, sm_scale, k_pe=None, kv_pe_offset=512,
              use_2d_view=True, min_kv_seq_len=1):
        o.copy_(csr_attention(torch.cat([q_nope, q_pe], dim=-1), kv_c, seq_info, page_table, sm_scale))

    return {"aiter": module("aiter", __version__="0.1.19", get_mla_metadata_info_v1=info_v1,
                            get_mla_metadata_v1=metadata_v1),
            "aiter.mla": module("aiter.mla", mla_decode_fwd=decode_fwd),
            "aiter.ops.triton.gluon.mla_gluon": module("aiter.ops.triton.gluon.mla_gluon",
                                                       mla_gluon=gluon)}


def metadata_tensors(call) -> list[int]:
    """Storage addresses of every tensor the prepared call's closures hold (what a graph reads)."""
    cells = [c.cell_contents for c in (call.fn.__closure__ or ())]
    found = []
    for value in cells:
        items = vars(value).values() if hasattr(value, "__dict__") else [value]
        found += [v.data_ptr() for v in items if isinstance(v, torch.Tensor)]
    return sorted(found)


def check_refresh(name: str, params: dict, page_size: int = 64) -> SimpleNamespace:
    backend = get_backend(name)
    shape = MLADecodeShape.create(num_heads=12, context_lens=LENS, page_size=page_size)
    inp = make_inputs(shape, device="cpu", seed=7)
    call = backend.prepare(inp, backend.resolve_params(shape, params))
    old = call.fn().clone()
    before = metadata_tensors(call)
    inp.cache_seqlens.copy_(torch.tensor(NEW_LENS, dtype=torch.int32))
    ref, _ = mla_decode_reference(inp.q, inp.kv_cache, inp.block_table, NEW_LENS, shape.scale)
    stale = call.fn().clone()
    assert torch.equal(stale, old) and not compare_outputs(stale, ref).passed  # the fake follows its schedule
    call.refresh_for_new_lengths()
    call.out.fill_(float("nan"))
    verdict = compare_outputs(call.fn(), ref)
    assert verdict.passed, verdict
    return SimpleNamespace(call=call, same_tensors=metadata_tensors(call) == before)


@pytest.mark.parametrize("fake", [lambda: flashmla_sgl(hoist=True), flashmla_source_build],
                         ids=["sgl-legacy-hoisted", "source-build-tensors"])
def test_flashmla_refresh_rewrites_the_schedule_in_place(monkeypatch, fake):
    install(monkeypatch, {"flash_mla": fake()})
    res = check_refresh("flashmla", {})
    assert res.call.graph_safe and res.same_tensors
    assert res.call.effective_params["metadata"] == "hoisted scheduler"


def test_flashmla_without_hoisting_refills_eagerly_and_is_not_graph_safe(monkeypatch):
    install(monkeypatch, {"flash_mla": flashmla_sgl(hoist=False)})
    res = check_refresh("flashmla", {})
    assert not res.call.graph_safe  # new tensors each refresh: a captured graph would not see them


@pytest.mark.parametrize("name", ["aiter-asm", "aiter-gluon"])
@pytest.mark.parametrize("page_size", [1, 64])
def test_aiter_refresh_rewrites_layout_and_metadata_in_place(monkeypatch, name, page_size):
    install(monkeypatch, fake_aiter())
    monkeypatch.setattr(aiter_backend, "package_version", lambda names: None)
    res = check_refresh(name, {}, page_size)
    assert res.call.graph_safe and res.call.refresh is not None
