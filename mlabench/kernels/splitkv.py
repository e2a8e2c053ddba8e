"""Split-KV (flash-decoding) MLA decode in Triton, with an explicit runtime ``num_kv_splits``.

Stage 1 runs one program per (request, split, row tile).  A request's rows are its ``qo_len``
query tokens times ``H`` heads, packed token-major (:func:`mlabench.kernels.common.pack_rows`:
12 heads x 4 tokens = 48 rows), in tiles of 16, 32 or 64 rows chosen per launch
(:func:`mlabench.kernels.triton_launch.choose_rows_per_tile`: by default one 64-row tile for those 48
rows, so the split's KV tiles are loaded once for all of them, where 16-row tiles load them three
times); a causal block applies each row's own key limit inside the tile loop, every split count
alike.  Each request's ``L`` tokens are
cut on the device into ``S`` contiguous splits of ``chunk = ceil(L / S)`` tokens rounded up to
:data:`SPLIT_ALIGN_TOKENS` (trailing splits may be short or empty), so a captured CUDA graph stays
correct when ``cache_seqlens`` change.  Each split writes an fp32 partial output (already
normalised) and its log-sum-exp in base 2, empty splits a zero partial with ``lse = -inf``.
Stage 2 merges a request's ``S`` partials (:func:`mlabench.kernels.common.merge_partials_kernel`).
The tile loop and the merge are shared with the persistent kernel (:mod:`mlabench.kernels.common`).

Two ways to set ``S``:

- fixed: ``S = num_kv_splits`` for every request, a kernel argument, so a captured graph keeps
  the count of capture time;
- from a split policy in device memory (``split_policy``, an int32 ``[R, 2]`` table of
  ``(max_context_len, num_kv_splits)``, a count ``-t`` meaning ``ceil(L / t)``): each request looks
  its own ``S`` up from its length, inside both stages (:func:`mlabench.kernels.common.policy_splits`),
  so one captured graph keeps the policy's count at every length.  The grid's split axis is
  ``num_kv_splits`` (the most any request may take; counts are clamped to it) and programs past a
  request's own count exit at once.
  A compile-time switch (``POLICY_ROWS == 0``) keeps the fixed path's code as it was.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlabench.kernels.common import (
    D_NOPE, LOG2E, attend_tokens, causal_row_limits, check_decode_args, launch_merge,
    load_q_tile, pack_rows, policy_splits, resolve_launch, store_partial, upcast_for_interpreter,
)
from mlabench.kernels.triton_launch import choose_rows_per_tile, row_tiles
from mlabench.kernels.workspace import check_workspace, split_workspace_bytes, splitkv_workspace_shapes

SPLIT_ALIGN_TOKENS = 16  #: split length is rounded up to this many tokens
MAX_KV_SPLITS = 512


@triton.jit
def _split_partial(q_ptr, kv_ptr, bt_ptr, po_ptr, plse_ptr, b, split, ht, seq_len, splits, slot,
                   num_rows, heads_per_token, qk_scale_log2, stride_qb, stride_qh, stride_kv_page,
                   stride_kv_tok, stride_btb, stride_ps, stride_ph, stride_ls,
                   PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
                   SPLIT_ALIGN: tl.constexpr, UPCAST: tl.constexpr, NUM_STAGES: tl.constexpr,
                   QO_LEN: tl.constexpr, CAUSAL: tl.constexpr):
    """Split ``split`` of ``splits`` of request ``b`` (``seq_len`` tokens), row tile ``ht``: its
    partial goes to slot ``slot``."""
    chunk = tl.cdiv(tl.cdiv(seq_len, splits), SPLIT_ALIGN) * SPLIT_ALIGN
    tok_lo = tl.minimum(split * chunk, seq_len)
    tok_hi = tl.minimum(tok_lo + chunk, seq_len)
    q_nope, q_pe, rows = load_q_tile(q_ptr, b, ht, num_rows, stride_qb, stride_qh, UPCAST, BLOCK_H)
    row_lim = causal_row_limits(seq_len, rows, heads_per_token, QO_LEN)  # read only when CAUSAL
    acc, l_i, m_i = attend_tokens(q_nope, q_pe, kv_ptr, bt_ptr + b.to(tl.int64) * stride_btb,
                                  tok_lo, tok_hi, qk_scale_log2, stride_kv_page, stride_kv_tok,
                                  row_lim, PAGE_SIZE, BLOCK_N, BLOCK_H, UPCAST, NUM_STAGES, CAUSAL)
    store_partial(po_ptr, plse_ptr, slot, rows, num_rows, acc, l_i, m_i,
                  stride_ps, stride_ph, stride_ls)


@triton.jit(do_not_specialize=["num_splits"])  # one compilation for every split count
def _splitkv_stage1(q_ptr, kv_ptr, bt_ptr, seqlens_ptr, policy_ptr, po_ptr, plse_ptr,
                    num_splits, num_rows, heads_per_token, qk_scale_log2,
                    stride_qb, stride_qh, stride_kv_page, stride_kv_tok, stride_btb,
                    stride_ps, stride_ph, stride_ls,
                    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
                    SPLIT_ALIGN: tl.constexpr, UPCAST: tl.constexpr, NUM_STAGES: tl.constexpr,
                    POLICY_ROWS: tl.constexpr, QO_LEN: tl.constexpr, CAUSAL: tl.constexpr):
    b = tl.program_id(0)
    split = tl.program_id(1)
    ht = tl.program_id(2)
    seq_len = tl.load(seqlens_ptr + b)
    slot = b * num_splits + split
    if POLICY_ROWS > 0:  # the request's own count; programs past it have nothing to do
        own = policy_splits(seq_len, policy_ptr, num_splits, POLICY_ROWS)
        if split < own:
            _split_partial(q_ptr, kv_ptr, bt_ptr, po_ptr, plse_ptr, b, split, ht, seq_len, own,
                           slot, num_rows, heads_per_token, qk_scale_log2, stride_qb, stride_qh,
                           stride_kv_page, stride_kv_tok, stride_btb, stride_ps, stride_ph, stride_ls,
                           PAGE_SIZE, BLOCK_N, BLOCK_H, SPLIT_ALIGN, UPCAST, NUM_STAGES, QO_LEN, CAUSAL)
    else:
        _split_partial(q_ptr, kv_ptr, bt_ptr, po_ptr, plse_ptr, b, split, ht, seq_len, num_splits,
                       slot, num_rows, heads_per_token, qk_scale_log2, stride_qb, stride_qh,
                       stride_kv_page, stride_kv_tok, stride_btb, stride_ps, stride_ph, stride_ls,
                       PAGE_SIZE, BLOCK_N, BLOCK_H, SPLIT_ALIGN, UPCAST, NUM_STAGES, QO_LEN, CAUSAL)


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


def checked_splitkv_args(q, kv_cache, block_table, cache_seqlens, out, num_kv_splits, partial_out,
                         partial_lse, split_policy, qo_len, q_rope=None):
    """Every argument check of a split-KV launch (:func:`mla_decode_splitkv`, and
    :func:`mlabench.kernels.gluon_splitkv.mla_decode_gluon_splitkv`), ValueError naming what is
    wrong; returns ``(q_rows, rope_rows, out_rows, partial_out, partial_lse)``: q, its RoPE
    columns and out as packed rows ``[B, qo_len * H, D]`` and the workspace (allocated when None).
    ``rope_rows`` is ``q_rows[..., 512:]`` for a 576-wide q, else the packed ``q_rope``
    (:func:`mlabench.kernels.common.check_decode_args` describes the halves)."""
    check_decode_args(q, kv_cache, block_table, cache_seqlens, out, qo_len, q_rope)
    if not 1 <= num_kv_splits <= MAX_KV_SPLITS:
        raise ValueError(f"num_kv_splits must be in 1..{MAX_KV_SPLITS}, got {num_kv_splits}")
    batch, rows = block_table.shape[0], qo_len * q.shape[1]
    if partial_out is None or partial_lse is None:
        partial_out, partial_lse = alloc_splitkv_workspace(batch, rows, num_kv_splits, q.device)
    check_workspace(partial_out, partial_lse, batch, rows, num_kv_splits)
    check_policy_table(split_policy, q.device)
    if q_rope is None:
        q_rows = pack_rows(q, batch, qo_len)
        rope_rows = q_rows[..., D_NOPE:]
    else:
        try:
            q_rows, rope_rows = pack_rows(q, batch, qo_len), pack_rows(q_rope, batch, qo_len)
        except ValueError:
            raise ValueError(
                f"q_rope with qo_len {qo_len}: each query half must have a token stride of H x "
                f"its head stride (packed row t*H+h at one row stride), got q strides {q.stride()}, "
                f"q_rope {q_rope.stride()}; halves with other strides work at qo_len 1 only "
                "(else pass one [B*qo_len, H, 576] q)") from None
    return q_rows, rope_rows, pack_rows(out, batch, qo_len), partial_out, partial_lse


def mla_decode_splitkv(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                       cache_seqlens: torch.Tensor, out: torch.Tensor, num_kv_splits: int,
                       softmax_scale: float, *, partial_out: torch.Tensor | None = None,
                       partial_lse: torch.Tensor | None = None, block_n: int | None = None,
                       num_warps: int | None = None, num_stages: int | None = None,
                       split_policy: torch.Tensor | None = None, qo_len: int = 1,
                       causal: bool = True, stage1_only: bool = False,
                       rows_per_tile: int | None = None) -> torch.Tensor:
    """Split-KV MLA decode: ``out = softmax(q K^T * softmax_scale) V`` per query token and head.

    Args:
        q: ``[B * qo_len, H, 576]`` bf16/fp16/fp32, any H; a request's ``qo_len * H`` rows are
            packed into ``rows_per_tile``-row tiles (extra rows are masked).
        kv_cache: ``[num_pages, page_size, 1, 576]``, same dtype as q; page size any (1/16/64 tested).
        block_table: ``[B, max_pages]`` int32.  cache_seqlens: ``[B]`` int32, read on the device.
        out: ``[B * qo_len, H, 512]`` in q's dtype; written in place and returned.
        num_kv_splits: splits per request, 1..512, a runtime argument (no recompilation per value);
            with ``split_policy`` the most splits a request may take (the grid's split axis).
        softmax_scale: multiplier of ``q . k``.
        partial_out / partial_lse: from :func:`alloc_splitkv_workspace` (None: allocated here).
        block_n, num_warps, num_stages: tokens per tile (a power of two >= 16) and Triton launch
            options (None: :func:`mlabench.kernels.common.default_launch` for the row tile).
        split_policy: None, or the int32 ``[R, 2]`` table of
            :meth:`mlabench.policy.device_table.SplitPolicy.device_table` on q's device: request
            ``b`` runs ``min(lookup(cache_seqlens[b]), num_kv_splits)`` splits (looked up there).
        qo_len, causal: query tokens per request; causal: each sees the prefix and the block up
            to itself (:func:`mlabench.kernels.common.causal_row_limits`), else all the cache.
        stage1_only: stage 1 alone (partials written, ``out`` untouched), to time it or pair it
            with another merge (:func:`mlabench.kernels.wide_merge.wide_merge`).
        rows_per_tile: 16, 32 or 64 rows of a request per program, each tile streaming the
            split's cache once (None: :func:`mlabench.kernels.triton_launch.choose_rows_per_tile`).

    Returns ``out``.  Raises ValueError for bad layouts, split counts, row tiles, policy tables or
    a too-small workspace (``[B * S, qo_len * H, 512]`` partials, whatever the row tile).
    """
    batch, heads = block_table.shape[0], q.shape[1]
    rows = qo_len * heads
    tile = choose_rows_per_tile(rows, rows_per_tile)
    block_n, num_warps, num_stages = resolve_launch(q, block_n, num_warps, num_stages, tile)
    q_rows, _, out_rows, partial_out, partial_lse = checked_splitkv_args(
        q, kv_cache, block_table, cache_seqlens, out, int(num_kv_splits), partial_out, partial_lse,
        split_policy, qo_len)
    policy_rows = 0 if split_policy is None else split_policy.shape[0]
    policy = cache_seqlens if split_policy is None else split_policy  # not read when policy_rows == 0
    upcast = upcast_for_interpreter(q.dtype)
    grid = (batch, int(num_kv_splits), row_tiles(rows, tile))
    _splitkv_stage1[grid](
        q_rows, kv_cache, block_table, cache_seqlens, policy, partial_out, partial_lse,
        int(num_kv_splits), rows, heads, float(softmax_scale) * LOG2E,
        q_rows.stride(0), q_rows.stride(1), kv_cache.stride(0), kv_cache.stride(1),
        block_table.stride(0), partial_out.stride(0), partial_out.stride(1), partial_lse.stride(0),
        PAGE_SIZE=kv_cache.shape[1], BLOCK_N=block_n, BLOCK_H=tile,
        SPLIT_ALIGN=SPLIT_ALIGN_TOKENS, UPCAST=upcast, NUM_STAGES=num_stages, POLICY_ROWS=policy_rows,
        QO_LEN=qo_len, CAUSAL=causal and qo_len > 1, num_warps=num_warps, num_stages=num_stages,
    )
    if stage1_only:
        return out
    launch_merge(partial_out, partial_lse, out_rows, cache_seqlens, cache_seqlens, int(num_kv_splits),
                 from_ranges=False, seqlens=cache_seqlens, policy=split_policy)
    return out


def check_policy_table(table: torch.Tensor | None, device: torch.device) -> None:
    """ValueError unless ``table`` is None or an int32 ``[R, 2]`` tensor on ``device`` with ``R``
    a power of two (its values are read on the device only, never here)."""
    if table is None:
        return
    rows = table.shape[0] if table.dim() == 2 else 0
    if (table.dim() != 2 or table.shape[1] != 2 or table.dtype != torch.int32 or rows < 1
            or rows & (rows - 1) or not table.is_contiguous()):
        raise ValueError("split_policy must be a contiguous int32 [R, 2] table, R a power of two, "
                         f"got {tuple(table.shape)} {table.dtype}")
    if table.device != device:
        raise ValueError(f"split_policy is on {table.device}, q on {device}")
