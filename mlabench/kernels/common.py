"""Triton building blocks shared by the split-KV and the persistent MLA decode kernels.

- Rows: the kernels work on a request's query rows, ``qo_len x H`` of them packed token-major
  (row ``r`` is head ``r % H`` of query token ``r // H``; 12 heads x 4 tokens = 48 rows), cut into
  tiles of 16, 32 or 64 rows chosen per launch (:mod:`mlabench.kernels.triton_launch`: the smallest
  that holds a request's rows, so one 64-row tile streams the cache once for 4 tokens of 12 heads,
  and one token of up to 16 heads keeps the 16-row tile of before).  :func:`pack_rows` views
  ``[B * qo_len, H, D]`` as ``[B, qo_len * H, D]``; with one token a row is a head, as before.
- :func:`load_q_tile`: one request's row tile of q, split into the 512-column latent
  ("nope") block and the 64-column RoPE block.
- :func:`attend_tokens`: online softmax over a token range of one request.  The 576-wide key is
  read once per tile as those two blocks; V is the nope block of the same loaded tile.  Under
  ``CAUSAL`` (a compile-time switch, off for one query token, so that code is unchanged) each row
  also stops at its own key limit (:func:`causal_row_limits`).
- :func:`store_partial`: a normalised fp32 partial output and its base-2 log-sum-exp.
- :func:`merge_partials_kernel` (launched by :func:`launch_merge`): merges a request's partials
  with weights ``2^(lse_s - max lse)`` (Dao et al., "Flash-Decoding for long-context inference",
  2023).  Empty partials carry ``lse = -inf`` and weight 0; both divisions are guarded, so 0/0 and
  0 x NaN never happen (a first version of the split-KV kernel returned NaN for empty splits).
- Launch defaults per row tile (:func:`default_launch`, :func:`resolve_launch`), the layout check of the
  wrappers' arguments, and the fp32 upcast under Triton's CPU interpreter.

Under the interpreter ``tl.dot`` on bf16 operands is wrong: the wrappers pass ``UPCAST=True``
there and operands are converted to fp32 before every dot; on a GPU they stay in their native dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlabench.device import triton_interpreting
from mlabench.kernels.triton_launch import CUDA_LAUNCH, ROCM_LAUNCH, default_launch_for

D_NOPE = 512  #: latent (kv_lora_rank) width, also the value/output width
D_ROPE = 64  #: decoupled RoPE width
D_QK = D_NOPE + D_ROPE
BLOCK_H = 16  #: rows of the smallest tile (the smallest M of tl.dot), one token's heads
LOG2E = 1.4426950408889634
MERGE_BLOCK_SLOTS = 32  #: partials merged per loop step in stage 2
MERGE_BLOCK_DV = 128  #: output columns per stage-2 program (grid axis 2 = 512 / this)
MERGE_NUM_STAGES = 2

#: Launch defaults of stage 1, chosen from ``scripts/gpu_kernel_probe.py`` (commit 0849486) on an H200 (Triton 3.6;
#: ``results/h200/kernel-probe/``): (32, 4, 6) was best at long context (B=1 L=128K: 71.5 µs, 49% of
#: floor; B=16 L=128K: 764 µs, 73%) and within ~2% of the best variant's median % of floor overall;
#: (64, 8, 2) wins only at batch 1 and short context.  Why 6 stages: compiled for sm_90 with
#: Triton 3.9, the pipeliner spends stages on the block-table load and the address computation that
#: follows it, so the KV tile gets ``num_stages - 3`` shared-memory buffers: stages 2-4 leave it
#: single-buffered (no load overlaps the dot products, so each program waits on load latency rather
#: than streaming at the SM's share of bandwidth); 6 stages give two 32-token buffers (~94 KB shared
#: memory, two programs per SM).
#: These are the 16-row tile's; the 32- and 64-row tiles' are in
#: :data:`mlabench.kernels.triton_launch.CUDA_LAUNCH`.
DEFAULT_BLOCK_N, DEFAULT_NUM_WARPS, DEFAULT_NUM_STAGES = CUDA_LAUNCH[BLOCK_H]
#: On ROCm the stream pipeliner gives a KV buffer per stage and LDS is 64-160 KB: stay at 2
#: (untested on AMD hardware; :data:`mlabench.kernels.triton_launch.ROCM_LAUNCH`).
ROCM_NUM_STAGES = ROCM_LAUNCH[BLOCK_H][2]


def default_launch(q: torch.Tensor, rows_per_tile: int = BLOCK_H) -> tuple[int, int, int]:
    """``(block_n, num_warps, num_stages)`` used when the caller passes None, for q's device
    (ROCm or not) and a tile of ``rows_per_tile`` rows (16, 32 or 64; ValueError otherwise)."""
    rocm = q.is_cuda and torch.version.hip is not None
    return default_launch_for(rows_per_tile, rocm)


def resolve_launch(q: torch.Tensor, block_n: int | None, num_warps: int | None,
                   num_stages: int | None, rows_per_tile: int = BLOCK_H) -> tuple[int, int, int]:
    """Fill None launch options from :func:`default_launch` for ``rows_per_tile``; ValueError
    unless block_n is a power of two >= 16 (the smallest tl.dot size)."""
    d_bn, d_nw, d_ns = default_launch(q, rows_per_tile)
    block_n, num_warps, num_stages = block_n or d_bn, num_warps or d_nw, num_stages or d_ns
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n}")
    return block_n, num_warps, num_stages


def pack_rows(t: torch.Tensor, batch: int, qo_len: int) -> torch.Tensor:
    """``[B * qo_len, H, D]`` -> ``[B, qo_len * H, D]``, a view (row ``t * H + h`` of request ``b``
    is ``t[b * qo_len + t, h]``).  ValueError when the first two dimensions cannot be merged
    without a copy (a stride gap between query tokens)."""
    rows, heads, dim = t.shape
    if rows != batch * qo_len:
        raise ValueError(f"{rows} query rows are not {batch} requests x qo_len {qo_len}")
    try:
        return t.view(batch, qo_len * heads, dim)
    except RuntimeError:
        raise ValueError(f"a [B*qo_len, H, D] tensor with strides {t.stride()} cannot be viewed as "
                         "packed rows: make it contiguous") from None


@triton.jit
def causal_row_limits(seq_len, rows, heads_per_token, QO_LEN: tl.constexpr):
    """Keys each packed row sees under the causal mask: row ``r`` is query token
    ``t = r // heads_per_token`` of a block of ``QO_LEN`` at the end of the request's ``seq_len``
    cached tokens, which sees the first ``seq_len - QO_LEN + t + 1`` (0 or fewer: none)."""
    return seq_len - QO_LEN + 1 + rows // heads_per_token


@triton.jit
def attend_tokens(q_nope, q_pe, kv_ptr, bt_row_ptr, tok_lo, tok_hi, qk_scale_log2,
                  stride_kv_page, stride_kv_tok, row_lim,
                  PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
                  UPCAST: tl.constexpr, NUM_STAGES: tl.constexpr, CAUSAL: tl.constexpr):
    """Online softmax over tokens ``[tok_lo, tok_hi)`` of one request.

    ``q_nope`` ``[BLOCK_H, 512]`` and ``q_pe`` ``[BLOCK_H, 64]`` are one row tile (16, 32 or 64
    rows; the compiler keeps them in registers or, for wgmma, shared memory); ``bt_row_ptr``
    points at the request's block-table row.  Lanes at or past ``tok_hi`` read neither the block
    table nor the cache: their K and V load as 0.0, their score is -inf and their weight 0 times a
    zero row, so cache slots no request may read (which the correctness check fills with NaN)
    never reach the arithmetic.  With ``CAUSAL`` row ``i`` also sees only tokens below
    ``row_lim[i]`` (``[BLOCK_H]`` int32, :func:`causal_row_limits`; the tokens it may not see are
    loaded, finite, and weighted 0); a row that sees none of the range keeps ``l = 0, m = -inf``
    (the running max is guarded, so no ``-inf - -inf``); without it ``row_lim`` is not read.
    Returns ``(acc [BLOCK_H, 512] fp32 unnormalised,
    l [BLOCK_H] fp32 sum of 2^(s - m), m [BLOCK_H] fp32 running max in base-2 units)``.  An empty
    range returns ``acc = 0, l = 0, m = -inf``.
    """
    offs_d = tl.arange(0, 512)
    offs_r = tl.arange(0, 64)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, 512], tl.float32)
    for start in tl.range(tok_lo, tok_hi, BLOCK_N, num_stages=NUM_STAGES):
        offs_n = start + tl.arange(0, BLOCK_N)
        valid = offs_n < tok_hi
        page = tl.load(bt_row_ptr + offs_n // PAGE_SIZE, mask=valid, other=0)
        row = page.to(tl.int64) * stride_kv_page + (offs_n % PAGE_SIZE).to(tl.int64) * stride_kv_tok
        k_nope = tl.load(kv_ptr + row[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        k_pe = tl.load(kv_ptr + row[:, None] + 512 + offs_r[None, :], mask=valid[:, None], other=0.0)
        if UPCAST:
            k_nope = k_nope.to(tl.float32)
            k_pe = k_pe.to(tl.float32)
        s = tl.dot(q_nope, tl.trans(k_nope)) + tl.dot(q_pe, tl.trans(k_pe))
        if CAUSAL:
            seen = valid[None, :] & (offs_n[None, :] < row_lim[:, None])
            s = tl.where(seen, s * qk_scale_log2, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))  # -inf for a row that has seen nothing yet
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
        else:
            s = tl.where(valid[None, :], s * qk_scale_log2, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every tile holds >= 1 valid token
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(k_nope.dtype), k_nope)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def load_q_tile(q_ptr, b, ht, num_heads, stride_qb, stride_qh, UPCAST: tl.constexpr,
                BLOCK_H: tl.constexpr):
    """Rows ``ht*BLOCK_H ..`` of request ``b``'s query: ``([BLOCK_H, 512], [BLOCK_H, 64], heads)``;
    rows at or past ``num_heads`` are zero."""
    heads = ht * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < num_heads
    base = q_ptr + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh
    q_nope = tl.load(base + tl.arange(0, 512)[None, :], mask=hmask[:, None], other=0.0)
    q_pe = tl.load(base + 512 + tl.arange(0, 64)[None, :], mask=hmask[:, None], other=0.0)
    if UPCAST:
        q_nope = q_nope.to(tl.float32)
        q_pe = q_pe.to(tl.float32)
    return q_nope, q_pe, heads


@triton.jit
def store_partial(po_ptr, plse_ptr, slot, heads, num_heads, acc, l_i, m_i, stride_ps,
                  stride_ph, stride_ls):
    """Write ``acc / l`` (0 when ``l == 0``) and ``lse2 = m + log2(l)`` (-inf when empty) to
    partial slot ``slot``; rows at or past ``num_heads`` are not written (pass 0 to skip all)."""
    nonempty = l_i > 0.0
    l_safe = tl.where(nonempty, l_i, 1.0)
    lse2 = tl.where(nonempty, m_i + tl.log2(l_safe), float("-inf"))
    hmask = heads < num_heads
    slot64 = slot.to(tl.int64)
    o_ptrs = po_ptr + slot64 * stride_ps + heads[:, None] * stride_ph + tl.arange(0, 512)[None, :]
    tl.store(o_ptrs, acc / l_safe[:, None], mask=hmask[:, None])
    tl.store(plse_ptr + slot64 * stride_ls + heads, lse2, mask=hmask)


@triton.jit
def policy_splits(seq_len, policy_ptr, cap, POLICY_ROWS: tl.constexpr):
    """Split count of a request of ``seq_len`` tokens from a policy table in device memory.

    ``policy_ptr`` points at ``POLICY_ROWS`` int32 rows ``(max_context_len, num_kv_splits)``
    (row-major ``[POLICY_ROWS, 2]``, ``POLICY_ROWS`` a power of two): the count of the first row
    with ``seq_len <= max_context_len``, else of the last row; a negative count ``-t`` (a row
    standing for a run of tokens-per-split rows, :func:`mlabench.policy.device_table.rule_rows`)
    gives ``ceil(seq_len / t)``; then clamped to ``[1, cap]``.  The rule of
    :meth:`mlabench.policy.device_table.SplitPolicy.lookup` on the table
    :meth:`~mlabench.policy.device_table.SplitPolicy.device_table` writes
    (:func:`~mlabench.policy.device_table.table_splits` is this lookup on the host).
    """
    LANES: tl.constexpr = 32 * ((POLICY_ROWS + 31) // 32)  # a whole-warp reduction (uniform)
    rows = tl.arange(0, LANES)
    real = rows < POLICY_ROWS
    max_len = tl.load(policy_ptr + 2 * rows, mask=real, other=0)
    prev_len = tl.load(policy_ptr + 2 * rows - 2, mask=real & (rows > 0), other=-1)
    splits = tl.load(policy_ptr + 2 * rows + 1, mask=real, other=0)
    # One reduction: the row whose (previous max, own max] holds the length (the last's open above;
    # the maxima increase strictly).  The rule's division only where a rule row matched.
    match = real & (seq_len > prev_len) & ((seq_len <= max_len) | (rows == POLICY_ROWS - 1))
    chosen = tl.sum(tl.where(match, splits, 0), 0)
    if chosen < 0:
        chosen = tl.cdiv(seq_len, -chosen)
    return tl.minimum(tl.maximum(chosen, 1), cap)


@triton.jit(do_not_specialize=["num_splits"])
def merge_partials_kernel(po_ptr, plse_ptr, out_ptr, slot_lo_ptr, slot_hi_ptr, num_splits,
                          seqlens_ptr, policy_ptr,
                          stride_ps, stride_ph, stride_ls, stride_ob, stride_oh,
                          FROM_RANGES: tl.constexpr, POLICY_ROWS: tl.constexpr,
                          BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr,
                          NUM_STAGES: tl.constexpr):
    """One program per (request b, head h, column block): merge partial slots ``[lo, hi)`` into
    ``out[b, h, cols]``; grid ``(B, H, 512 // BLOCK_DV)`` so that a batch-1 merge still spreads
    over many SMs.

    ``FROM_RANGES``: the slot range comes from ``slot_lo_ptr[b]`` / ``slot_hi_ptr[b]`` (persistent
    work list); otherwise it starts at ``b * num_splits`` and holds ``num_splits`` slots, or, with
    ``POLICY_ROWS > 0``, the request's own count from the policy table at ``policy_ptr`` for its
    length ``seqlens_ptr[b]`` (:func:`policy_splits`).  A request with no non-empty partial gets a
    zero output row.
    """
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_d = tl.program_id(2) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    if FROM_RANGES:
        lo = tl.load(slot_lo_ptr + b)
        hi = tl.load(slot_hi_ptr + b)
    else:
        lo = b * num_splits
        if POLICY_ROWS > 0:
            hi = lo + policy_splits(tl.load(seqlens_ptr + b), policy_ptr, num_splits, POLICY_ROWS)
        else:
            hi = lo + num_splits
    m_run = tl.full([1], float("-inf"), tl.float32)
    w_sum = tl.zeros([1], tl.float32)
    acc = tl.zeros([BLOCK_DV], tl.float32)
    for c in tl.range(lo, hi, BLOCK_S, num_stages=NUM_STAGES):
        slots = c + tl.arange(0, BLOCK_S)
        smask = slots < hi
        lse = tl.load(plse_ptr + slots.to(tl.int64) * stride_ls + h, mask=smask, other=float("-inf"))
        part = tl.load(po_ptr + slots.to(tl.int64)[:, None] * stride_ps + h * stride_ph + offs_d[None, :],
                       mask=smask[:, None], other=0.0)
        m_new = tl.maximum(m_run, tl.max(lse, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # all empty so far: avoid -inf - -inf
        alpha = tl.exp2(m_run - m_safe)
        w = tl.exp2(lse - m_safe)  # empty slots: 2^-inf = 0, and their partial is 0, not NaN
        acc = acc * alpha + tl.sum(w[:, None] * part, 0)
        w_sum = w_sum * alpha + tl.sum(w, 0)
        m_run = m_new
    res = tl.where(w_sum > 0.0, acc / tl.where(w_sum > 0.0, w_sum, 1.0), 0.0)
    tl.store(out_ptr + b.to(tl.int64) * stride_ob + h * stride_oh + offs_d, res.to(out_ptr.dtype.element_ty))


def launch_merge(partial_out: torch.Tensor, partial_lse: torch.Tensor, out: torch.Tensor,
                 slot_lo: torch.Tensor, slot_hi: torch.Tensor, num_splits: int,
                 from_ranges: bool, *, seqlens: torch.Tensor | None = None,
                 policy: torch.Tensor | None = None) -> None:
    """Launch :func:`merge_partials_kernel` over ``(B, H, 512 / MERGE_BLOCK_DV)`` programs.

    ``partial_out`` ``[slots, H, 512]`` and ``partial_lse`` ``[slots, H]`` fp32; ``out``
    ``[B, H, 512]`` is written.  With ``from_ranges`` request ``b`` merges slots
    ``[slot_lo[b], slot_hi[b])`` (``[B]`` int32 each); otherwise the slots from ``b * num_splits``
    on, ``num_splits`` of them, or with ``policy`` (an int32 ``[R, 2]`` table, R a power of two)
    and ``seqlens`` (``[B]`` int32) the request's own count (:func:`policy_splits`);
    ``slot_lo`` / ``slot_hi`` are then not read.
    """
    batch, heads = out.shape[0], out.shape[1]
    rows = 0 if policy is None else policy.shape[0]
    merge_partials_kernel[(batch, heads, D_NOPE // MERGE_BLOCK_DV)](
        partial_out, partial_lse, out, slot_lo, slot_hi, num_splits,
        slot_lo if seqlens is None else seqlens, slot_lo if policy is None else policy,
        partial_out.stride(0), partial_out.stride(1), partial_lse.stride(0),
        out.stride(0), out.stride(1), FROM_RANGES=from_ranges, POLICY_ROWS=rows,
        BLOCK_S=MERGE_BLOCK_SLOTS, BLOCK_DV=MERGE_BLOCK_DV, NUM_STAGES=MERGE_NUM_STAGES,
        num_warps=4,
    )


def check_decode_args(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                      cache_seqlens: torch.Tensor, out: torch.Tensor, qo_len: int = 1,
                      q_rope: torch.Tensor | None = None) -> None:
    """Raise ValueError unless the tensors have the MLA decode layout this module assumes:
    q ``[B * qo_len, H, 576]`` in the cache's dtype, out ``[B * qo_len, H, 512]``, ``B`` the block
    table's rows.

    With ``q_rope`` the query comes in halves, as vLLM hands them over: q ``[B * qo_len, H, 512]``
    (the latent columns) and q_rope ``[B * qo_len, H, 64]`` (the RoPE columns), each with any
    strides but a unit column stride, both in the cache's dtype."""
    if q.dtype != kv_cache.dtype:
        raise ValueError(f"q must have the cache's dtype {kv_cache.dtype}, got {q.dtype}")
    if q_rope is None:
        if q.dim() != 3 or q.shape[-1] != D_QK or q.stride(-1) != 1:
            raise ValueError(f"q must be [B*qo_len, H, {D_QK}] with unit last stride, got {tuple(q.shape)}")
    else:
        halves = [(t.dim(), t.shape[-1], t.stride(-1)) for t in (q, q_rope)]
        if (halves != [(3, D_NOPE, 1), (3, D_ROPE, 1)] or q.shape[:2] != q_rope.shape[:2]
                or q_rope.dtype != q.dtype):
            raise ValueError(f"query halves must be q [B*qo_len, H, {D_NOPE}] and q_rope "
                             f"[B*qo_len, H, {D_ROPE}], unit last strides, the cache's dtype "
                             f"{kv_cache.dtype}; got {tuple(q.shape)} {q.dtype} stride {q.stride()}"
                             f" and {tuple(q_rope.shape)} {q_rope.dtype} stride {q_rope.stride()}")
    if kv_cache.dim() != 4 or kv_cache.shape[2] != 1 or kv_cache.shape[3] != D_QK:
        raise ValueError(f"kv_cache must be [pages, page_size, 1, {D_QK}], got {tuple(kv_cache.shape)}")
    if kv_cache.stride(-1) != 1:
        raise ValueError("kv_cache must have a unit last stride")
    rows, heads, _ = q.shape
    batch = block_table.shape[0] if block_table.dim() == 2 else -1
    if batch < 1 or rows != batch * qo_len or block_table.dtype != torch.int32:
        raise ValueError(f"block_table must be [B, max_pages] int32 with B * qo_len = {rows} q rows")
    if cache_seqlens.shape != (batch,) or cache_seqlens.dtype != torch.int32:
        raise ValueError("cache_seqlens must be [B] int32")
    if out.shape != (rows, heads, D_NOPE) or out.stride(-1) != 1:
        raise ValueError(f"out must be [B*qo_len, H, {D_NOPE}] with unit last stride, got {tuple(out.shape)}")
    if block_table.stride(-1) != 1:
        raise ValueError("block_table must have a unit last stride")


def upcast_for_interpreter(dtype: torch.dtype) -> bool:
    """True when dots must run in fp32: bf16 operands under the Triton CPU interpreter, whose
    ``tl.dot`` on bf16 is wrong (errors ~1e10 with Triton 3.6 and 3.9; fp16/fp32 dots are right)."""
    return triton_interpreting() and dtype == torch.bfloat16
