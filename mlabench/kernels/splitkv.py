"""Split-KV (flash-decoding) MLA decode in Triton, with an explicit runtime ``num_kv_splits``.

Stage 1 runs one program per (request, split, 16-row head tile).  Each request's ``L`` tokens are
cut on the device into ``num_kv_splits`` contiguous splits of ``chunk = ceil(L / S)`` tokens
rounded up to :data:`SPLIT_ALIGN_TOKENS` (trailing splits may be short or empty), so a captured
CUDA graph stays correct when ``cache_seqlens`` change; only the split count is fixed at capture.
Each split writes an fp32 partial output (already normalised) and its log-sum-exp in base 2, empty
splits a zero partial with ``lse = -inf``.  Stage 2 merges a request's ``S`` partials
(:func:`mlabench.kernels.common.merge_partials_kernel`).  The tile loop and the merge are shared
with the persistent kernel (:mod:`mlabench.kernels.common`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlabench.kernels.common import (
    BLOCK_H, D_NOPE, LOG2E, attend_tokens, check_decode_args, launch_merge, load_q_tile,
    resolve_launch, store_partial, upcast_for_interpreter,
)
from mlabench.kernels.workspace import split_workspace_bytes

SPLIT_ALIGN_TOKENS = 16  #: split length is rounded up to this many tokens
MAX_KV_SPLITS = 512


@triton.jit(do_not_specialize=["num_splits"])  # one compilation for every split count
def _splitkv_stage1(q_ptr, kv_ptr, bt_ptr, seqlens_ptr, po_ptr, plse_ptr,
                    num_splits, num_heads, qk_scale_log2,
                    stride_qb, stride_qh, stride_kv_page, stride_kv_tok, stride_btb,
                    stride_ps, stride_ph, stride_ls,
                    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
                    SPLIT_ALIGN: tl.constexpr, UPCAST: tl.constexpr, NUM_STAGES: tl.constexpr):
    b = tl.program_id(0)
    split = tl.program_id(1)
    ht = tl.program_id(2)
    seq_len = tl.load(seqlens_ptr + b)
    chunk = tl.cdiv(tl.cdiv(seq_len, num_splits), SPLIT_ALIGN) * SPLIT_ALIGN
    tok_lo = tl.minimum(split * chunk, seq_len)
    tok_hi = tl.minimum(tok_lo + chunk, seq_len)
    q_nope, q_pe, heads = load_q_tile(q_ptr, b, ht, num_heads, stride_qb, stride_qh, UPCAST, BLOCK_H)
    acc, l_i, m_i = attend_tokens(q_nope, q_pe, kv_ptr, bt_ptr + b.to(tl.int64) * stride_btb,
                                  tok_lo, tok_hi, qk_scale_log2, stride_kv_page, stride_kv_tok,
                                  PAGE_SIZE, BLOCK_N, BLOCK_H, UPCAST, NUM_STAGES)
    store_partial(po_ptr, plse_ptr, b * num_splits + split, heads, num_heads, acc, l_i, m_i,
                  stride_ps, stride_ph, stride_ls)


def splitkv_workspace_shapes(batch: int, num_heads: int, num_kv_splits: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of the fp32 partials: ``([B * S, H, 512], [B * S, H])`` (slot = b * S + split)."""
    slots = batch * num_kv_splits
    return (slots, num_heads, D_NOPE), (slots, num_heads)


def alloc_splitkv_workspace(batch: int, num_heads: int, num_kv_splits: int,
                            device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate ``(partial_out [B*S, H, 512] fp32, partial_lse [B*S, H] fp32)`` (uninitialised:
    stage 1 writes every slot before stage 2 reads it)."""
    o_shape, l_shape = splitkv_workspace_shapes(batch, num_heads, num_kv_splits)
    return (torch.empty(o_shape, dtype=torch.float32, device=device),
            torch.empty(l_shape, dtype=torch.float32, device=device))


def splitkv_workspace_bytes(batch: int, num_heads: int, num_kv_splits: int) -> int:
    """Bytes of partials written by stage 1 and read by stage 2: ``2 * B*S*H*(512*4 + 4)``
    (:func:`mlabench.kernels.workspace.split_workspace_bytes`)."""
    return split_workspace_bytes(batch * num_kv_splits * num_heads, D_NOPE)


def mla_decode_splitkv(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                       cache_seqlens: torch.Tensor, out: torch.Tensor, num_kv_splits: int,
                       softmax_scale: float, *, partial_out: torch.Tensor | None = None,
                       partial_lse: torch.Tensor | None = None, block_n: int | None = None,
                       num_warps: int | None = None,
                       num_stages: int | None = None) -> torch.Tensor:
    """Split-KV MLA decode: ``out = softmax(q K^T * softmax_scale) V`` per request and head.

    Args:
        q: ``[B, H, 576]`` bf16/fp16/fp32, any H (rows of 16-row tiles; extra rows are masked).
        kv_cache: ``[num_pages, page_size, 1, 576]``, same dtype as q; page size any (1/16/64 tested).
        block_table: ``[B, max_pages]`` int32.  cache_seqlens: ``[B]`` int32, read on the device.
        out: ``[B, H, 512]`` in q's dtype; written in place and returned.
        num_kv_splits: splits per request, 1..512, a runtime argument (no recompilation per value).
        softmax_scale: multiplier of ``q . k``.
        partial_out / partial_lse: workspace from :func:`alloc_splitkv_workspace`
            (allocated here when None: pass them for graph capture and timing).
        block_n: tokens per tile (16, 32, 64 ...); num_warps / num_stages: Triton launch options,
            num_stages is the software-pipelining depth of the token loop; None takes
            :func:`default_launch`.

    Returns ``out``.  Raises ValueError for bad layouts, split counts or a too-small workspace.
    """
    check_decode_args(q, kv_cache, block_table, cache_seqlens, out)
    block_n, num_warps, num_stages = resolve_launch(q, block_n, num_warps, num_stages)
    if not 1 <= int(num_kv_splits) <= MAX_KV_SPLITS:
        raise ValueError(f"num_kv_splits must be in 1..{MAX_KV_SPLITS}, got {num_kv_splits}")
    batch, heads, _ = q.shape
    if partial_out is None or partial_lse is None:
        partial_out, partial_lse = alloc_splitkv_workspace(batch, heads, num_kv_splits, q.device)
    o_shape, l_shape = splitkv_workspace_shapes(batch, heads, num_kv_splits)
    if (partial_out.shape[0] < o_shape[0] or tuple(partial_out.shape[1:]) != o_shape[1:]
            or partial_lse.shape[0] < l_shape[0] or partial_lse.shape[1] != heads):
        raise ValueError(f"workspace too small for B={batch} H={heads} splits={num_kv_splits}")
    upcast = upcast_for_interpreter(q.dtype)
    grid = (batch, int(num_kv_splits), triton.cdiv(heads, BLOCK_H))
    _splitkv_stage1[grid](
        q, kv_cache, block_table, cache_seqlens, partial_out, partial_lse,
        int(num_kv_splits), heads, float(softmax_scale) * LOG2E,
        q.stride(0), q.stride(1), kv_cache.stride(0), kv_cache.stride(1), block_table.stride(0),
        partial_out.stride(0), partial_out.stride(1), partial_lse.stride(0),
        PAGE_SIZE=kv_cache.shape[1], BLOCK_N=block_n, BLOCK_H=BLOCK_H,
        SPLIT_ALIGN=SPLIT_ALIGN_TOKENS, UPCAST=upcast, NUM_STAGES=num_stages,
        num_warps=num_warps, num_stages=num_stages,
    )
    launch_merge(partial_out, partial_lse, out, cache_seqlens, cache_seqlens, int(num_kv_splits),
                 from_ranges=False)
    return out
