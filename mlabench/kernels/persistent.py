"""Persistent MLA decode in Triton: a grid sized to the GPU walks a balanced work list.

The grid is ``(num_programs, row tiles)`` with ``num_programs`` a multiple of the SM/CU count
chosen by the caller.  Program ``p`` owns the global tokens ``[p*C, (p+1)*C)`` of the work list
(:mod:`mlabench.kernels.worklist`), walks the requests it overlaps and writes one fp32 partial per
non-empty (program, request) segment into slot ``p + i``; the shared merge kernel
(:func:`mlabench.kernels.common.merge_partials_kernel`) then merges each request's slot range.
Every program reads about the same number of KV bytes whatever the mix of lengths, which is the
point of the persistent "tile scheduler" of FlashMLA's decode on Hopper (its ``get_mla_metadata``
cuts the batch's tokens over a grid of one part per SM).

A request's ``qo_len x H`` query rows are packed token-major
(:func:`mlabench.kernels.common.pack_rows`) into tiles of 16, 32 or 64 rows
(:func:`mlabench.kernels.triton_launch.choose_rows_per_tile`; the grid's tile axis holds
``ceil(qo_len * H / rows_per_tile)`` of them, each streaming the program's tokens once); rows past
``qo_len * H`` in the last tile are masked (zero query, never stored), so the query needs no head
padding.  Servers pad one token's 12 heads to 16 (:mod:`mlabench.kernels.padding`), which the
``triton-persistent`` backend does at qo_len 1: every padded row is then computed and written as a
real one.  A causal block masks each row at its own key limit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlabench.kernels.common import (
    D_NOPE, LOG2E, attend_tokens, causal_row_limits, check_decode_args, launch_merge,
    load_q_tile, pack_rows, resolve_launch, store_partial, upcast_for_interpreter,
)
from mlabench.kernels.triton_launch import choose_rows_per_tile, row_tiles
from mlabench.kernels.workspace import split_workspace_bytes
from mlabench.kernels.worklist import WorkList, build_work_list

#: Work-list chunk granularity in tokens: chunks are rounded up to this, not to block_n, so short
#: contexts still spread over the whole grid (a half-masked tile costs no extra memory traffic).
WORK_GRANULARITY_TOKENS = 16


@triton.jit
def _persistent_stage1(q_ptr, kv_ptr, bt_ptr, cu_ptr, chunk_ptr, first_req_ptr, po_ptr, plse_ptr,
                       batch, num_heads, heads_per_token, qk_scale_log2,
                       stride_qb, stride_qh, stride_kv_page, stride_kv_tok, stride_btb,
                       stride_ps, stride_ph, stride_ls,
                       PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
                       UPCAST: tl.constexpr, NUM_STAGES: tl.constexpr, QO_LEN: tl.constexpr,
                       CAUSAL: tl.constexpr):
    p = tl.program_id(0)
    ht = tl.program_id(1)
    chunk = tl.load(chunk_ptr)
    total = tl.load(cu_ptr + batch)
    pos = tl.minimum(p * chunk, total)
    hi = tl.minimum(pos + chunk, total)
    i = tl.load(first_req_ptr + p)
    while pos < hi:
        r_start = tl.load(cu_ptr + i)
        r_end = tl.load(cu_ptr + i + 1)
        seg_end = tl.minimum(r_end, hi)
        q_nope, q_pe, heads = load_q_tile(q_ptr, i, ht, num_heads, stride_qb, stride_qh, UPCAST,
                                          BLOCK_H)
        row_lim = causal_row_limits(r_end - r_start, heads, heads_per_token, QO_LEN)
        acc, l_i, m_i = attend_tokens(q_nope, q_pe, kv_ptr, bt_ptr + i.to(tl.int64) * stride_btb,
                                      pos - r_start, seg_end - r_start, qk_scale_log2,
                                      stride_kv_page, stride_kv_tok, row_lim,
                                      PAGE_SIZE, BLOCK_N, BLOCK_H, UPCAST, NUM_STAGES, CAUSAL)
        # An empty request (r_end == pos) must not write: its slot p + i may belong to another
        # program's non-empty segment.
        store_partial(po_ptr, plse_ptr, p + i, heads, tl.where(seg_end > pos, num_heads, 0),
                      acc, l_i, m_i, stride_ps, stride_ph, stride_ls)
        pos = tl.maximum(pos, seg_end)
        i += 1


def persistent_workspace_shapes(num_programs: int, batch: int,
                                padded_heads: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of the fp32 partials: ``([G + B - 1, Hp, 512], [G + B - 1, Hp])``."""
    slots = num_programs + batch - 1
    return (slots, padded_heads, D_NOPE), (slots, padded_heads)


def alloc_persistent_workspace(num_programs: int, batch: int, padded_heads: int,
                               device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate ``(partial_out, partial_lse)`` fp32 of :func:`persistent_workspace_shapes`
    (uninitialised: every slot the merge reads is written first)."""
    o_shape, l_shape = persistent_workspace_shapes(num_programs, batch, padded_heads)
    return (torch.empty(o_shape, dtype=torch.float32, device=device),
            torch.empty(l_shape, dtype=torch.float32, device=device))


def persistent_workspace_bytes(num_programs: int, batch: int, padded_heads: int) -> int:
    """Upper bound of partial bytes written then read: ``2 * (G + B - 1) * Hp * (512*4 + 4)``
    (:func:`mlabench.kernels.workspace.split_workspace_bytes`)."""
    return split_workspace_bytes((num_programs + batch - 1) * padded_heads, D_NOPE)


def mla_decode_persistent(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                          cache_seqlens: torch.Tensor, out: torch.Tensor, softmax_scale: float,
                          num_programs: int, *, work: WorkList | None = None,
                          partial_out: torch.Tensor | None = None,
                          partial_lse: torch.Tensor | None = None,
                          block_n: int | None = None, num_warps: int | None = None,
                          num_stages: int | None = None, qo_len: int = 1,
                          causal: bool = True, rows_per_tile: int | None = None) -> torch.Tensor:
    """Persistent-grid MLA decode of row tiles.

    Args:
        q: ``[B * qo_len, Hp, 576]``, bf16/fp16/fp32, any ``Hp`` (heads, padded or not: padded
            heads are computed as real ones).
        kv_cache: ``[num_pages, page_size, 1, 576]``; block_table ``[B, max_pages]`` int32;
            cache_seqlens ``[B]`` int32 (only read through ``work``).
        out: ``[B * qo_len, Hp, 512]`` in q's dtype, written in place and returned.
        softmax_scale: multiplier of ``q . k``.
        num_programs: ``G``, programs per head tile (a multiple of the SM count is sensible).
        work: a :class:`WorkList` built with the same ``num_programs`` (any granularity; built
            here with :data:`WORK_GRANULARITY_TOKENS` when None; pass it for graph capture).
        partial_out / partial_lse: workspace from :func:`alloc_persistent_workspace`.
        block_n, num_warps, num_stages: tile tokens and Triton launch options (None: the
            defaults of :func:`mlabench.kernels.common.default_launch`).
        qo_len, causal: as :func:`mlabench.kernels.splitkv.mla_decode_splitkv` takes them; the
            partials hold ``qo_len * Hp`` rows per slot.
        rows_per_tile: 16, 32 or 64 rows per program, as
            :func:`mlabench.kernels.splitkv.mla_decode_splitkv` takes it (None: the smallest that
            holds ``qo_len * Hp`` rows, at most 64; 16 for one token of up to 16 heads).

    Returns ``out``.  Raises ValueError for bad layouts or row tiles, a work list that does not
    match, or a workspace that is too small.
    """
    check_decode_args(q, kv_cache, block_table, cache_seqlens, out, qo_len)
    batch, heads_per_token = block_table.shape[0], q.shape[1]
    heads = qo_len * heads_per_token  # a request's packed rows
    tile = choose_rows_per_tile(heads, rows_per_tile)
    block_n, num_warps, num_stages = resolve_launch(q, block_n, num_warps, num_stages, tile)
    q, out_rows = pack_rows(q, batch, qo_len), pack_rows(out, batch, qo_len)
    if work is None:
        work = build_work_list(cache_seqlens, num_programs, WORK_GRANULARITY_TOKENS)
    if work.num_programs != num_programs or work.batch != batch:
        raise ValueError("work list was built for another num_programs or batch")
    if partial_out is None or partial_lse is None:
        partial_out, partial_lse = alloc_persistent_workspace(num_programs, batch, heads, q.device)
    o_shape, _ = persistent_workspace_shapes(num_programs, batch, heads)
    if partial_out.shape[0] < o_shape[0] or partial_out.shape[1] != heads or partial_lse.shape[1] != heads:
        raise ValueError(f"workspace too small for G={num_programs} B={batch} H={heads}")
    upcast = upcast_for_interpreter(q.dtype)
    _persistent_stage1[(num_programs, row_tiles(heads, tile))](
        q, kv_cache, block_table, work.cu_seqlens, work.chunk_tokens, work.prog_first_req,
        partial_out, partial_lse, batch, heads, heads_per_token, float(softmax_scale) * LOG2E,
        q.stride(0), q.stride(1), kv_cache.stride(0), kv_cache.stride(1), block_table.stride(0),
        partial_out.stride(0), partial_out.stride(1), partial_lse.stride(0),
        PAGE_SIZE=kv_cache.shape[1], BLOCK_N=block_n, BLOCK_H=tile, UPCAST=upcast,
        NUM_STAGES=num_stages, QO_LEN=qo_len, CAUSAL=causal and qo_len > 1,
        num_warps=num_warps, num_stages=num_stages,
    )
    launch_merge(partial_out, partial_lse, out_rows, work.req_slot_lo, work.req_slot_hi, 0,
                 from_ranges=True)
    return out
