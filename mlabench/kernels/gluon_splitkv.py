"""Hopper (sm_90) split-KV MLA decode in Gluon: TMA page loads into a shared-memory ring, wgmma.

Why a second split-KV kernel: the portable Triton kernel (:mod:`mlabench.kernels.splitkv`) reads
the cache with per-thread asynchronous copies and multiplies 16-row head tiles with ``mma.sync``;
on an H200 it stays latency-bound per program (docs/PERFORMANCE.md).  This kernel is written for
Hopper alone:

- **Page tiles through TMA.** With page size 64 a page is one contiguous ``[64, 576]`` block, so
  each block-table entry becomes two bulk tensor copies (the 512 latent columns and the 64 RoPE
  columns) that complete on one mbarrier.  ``NUM_STAGES`` pages live in a shared-memory ring and
  the copy of page ``t + NUM_STAGES - 1`` is issued before page ``t`` is consumed, so loads stay
  in flight while the tensor cores work; no thread spends registers or issue slots on addresses.
- **Tokens as the MMA's M ("swap AB").** wgmma needs M = 64 rows per warpgroup; 12 heads would
  fill 12 of 64 rows.  Here the scores are computed transposed, ``S^T [64 tokens, 16 heads] =
  K_page [64, 576] @ Q^T [576, 16]``, and the output as ``O^T [512, 16] += V_page^T [512, 64] @
  P^T [64, 16]``: the page in shared memory is the A operand of both products (the second one
  reads it transposed), the 16-column query tile (12 heads used) is the B operand, and no FLOP
  is spent on padding rows beyond the 16-head tile.
- **Page-granular splits.** Split ``s`` of a request owns pages ``[s*P, min((s+1)*P, n))`` with
  ``P = ceil(n / S)``, computed on the device from ``cache_seqlens``; only the last page of a
  request is partial (masked to ``-inf`` scores).  Splits write normalised fp32 partials and a
  base-2 log-sum-exp exactly like the portable kernel, and :mod:`mlabench.kernels.wide_merge`
  merges them.

Limits: NVIDIA Hopper only (TMA, wgmma), page size 64, a contiguous cache, q/cache bf16 or fp16.
Rows of a request's last page past its length are copied too (TMA copies whole pages), and may
hold anything, NaN included (the correctness check puts NaN there): their scores are set to -inf,
and before the output product their latent rows in shared memory are zeroed
(:func:`_zero_rows_from`), since a zero weight times NaN is NaN.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from mlabench.kernels.common import causal_row_limits
from mlabench.kernels.row_tiling import RowTiling

PAGE_SIZE = 64  #: the only page size read (one TMA tile per block-table entry)
#: Kernel-side constants: latent width (also V and the output), RoPE width, page tokens.
D_NOPE = gl.constexpr(512)
D_ROPE = gl.constexpr(64)
PAGE_TOKENS = gl.constexpr(PAGE_SIZE)
D_QK = 576
#: The TMA global-to-shared copy is ``async_copy_global_to_shared`` in Triton 3.6 and ``async_load``
#: from 3.7 on.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
MAX_KV_SPLITS = 512
LOG2E = 1.4426950408889634
#: Default ring depth: 2 pages (147 KB) plus the query tile fit one CTA per SM in the H200's
#: 227 KB of shared memory; 1 stage gives two CTAs per SM instead.
DEFAULT_NUM_STAGES = 2


@gluon.jit
def _issue_page(kvn_desc, kvr_desc, bt_row_ptr, page_lo, t, kn_smem, kr_smem, bars,
                NUM_STAGES: gl.constexpr):
    """Start the two bulk copies of the request's page ``page_lo + t`` into ring slot
    ``t % NUM_STAGES``; they complete on that slot's mbarrier."""
    slot = t % NUM_STAGES
    page = gl.load(bt_row_ptr + page_lo + t)
    row = page * PAGE_TOKENS
    bar = bars.index(slot)
    mbarrier.expect(bar, kvn_desc.block_type.nbytes + kvr_desc.block_type.nbytes)
    _tma_load(kvn_desc, [row, 0], bar, kn_smem.index(slot))
    _tma_load(kvr_desc, [row, D_NOPE], bar, kr_smem.index(slot))


@gluon.jit
def _load_q_tiles(q_ptr, b, row_lo, num_rows, stride_qb, stride_qh, qn_smem, qr_smem,
                  BLOCK_R: gl.constexpr, num_warps: gl.constexpr):
    """Copy packed rows ``row_lo .. row_lo + BLOCK_R`` of request ``b`` (rows past ``num_rows``
    zero) into the two shared-memory query tiles ``[BLOCK_R, 512]`` and ``[BLOCK_R, 64]``."""
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
    rows = row_lo + gl.arange(0, BLOCK_R, layout=gl.SliceLayout(1, ld))
    rmask = rows < num_rows
    base = q_ptr + b.to(gl.int64) * stride_qb + rows[:, None] * stride_qh
    cols = gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, ld))
    qn_smem.store(gl.load(base + cols[None, :], mask=rmask[:, None], other=0.0))
    rcols = gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, ld))
    qr_smem.store(gl.load(base + D_NOPE + rcols[None, :], mask=rmask[:, None], other=0.0))


@gluon.jit
def _store_partial(po_ptr, plse_ptr, slot, row_lo, num_rows, o, l_i, m_i, stride_ps, stride_ph,
                   stride_ls, BLOCK_R: gl.constexpr, num_warps: gl.constexpr):
    """Write ``O^T / l`` as the partial ``[BLOCK_R rows, 512]`` of ``slot`` and ``lse2 = m +
    log2 l``.  A row that saw no token gets ``lse2 = -inf`` and no partial at all: the merge
    (:func:`mlabench.kernels.wide_merge.wide_merge`) weights it 0 and never reads its partial, so
    the empty splits of a short request cost a few lse stores, not a 2 KB row each."""
    st: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, num_warps], [0, 1])
    nonempty = l_i > 0.0
    l_safe = gl.where(nonempty, l_i, 1.0)
    lse2 = gl.where(nonempty, m_i + gl.log2(l_safe), float("-inf"))
    res = gl.convert_layout(o / l_safe[None, :], st)
    d = gl.arange(0, D_NOPE, layout=gl.SliceLayout(1, st))
    rows = row_lo + gl.arange(0, BLOCK_R, layout=gl.SliceLayout(0, st))
    written = (rows < num_rows) & gl.convert_layout(nonempty, gl.SliceLayout(0, st))
    slot64 = slot.to(gl.int64)
    ptrs = po_ptr + slot64 * stride_ps + rows[None, :] * stride_ph + d[:, None]
    gl.store(ptrs, res, mask=written[None, :])
    lse_st = gl.convert_layout(lse2, gl.SliceLayout(0, st))
    gl.store(plse_ptr + slot64 * stride_ls + rows, lse_st, mask=rows < num_rows)


@gluon.jit
def _store_empty(plse_ptr, slot, row_lo, num_rows, stride_ls, BLOCK_R: gl.constexpr,
                 num_warps: gl.constexpr):
    """An empty split's record: ``lse2 = -inf`` for its rows and no partial (the merge stops
    before it)."""
    lay: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    rows = row_lo + gl.arange(0, BLOCK_R, layout=lay)
    gl.store(plse_ptr + slot.to(gl.int64) * stride_ls + rows,
             gl.full([BLOCK_R], float("-inf"), gl.float32, layout=lay), mask=rows < num_rows)


@gluon.jit
def _zero_rows_from(tile, first, num_warps: gl.constexpr):
    """Zero rows ``first ..`` of a ``[64, 512]`` shared-memory page tile, 64 columns at a time
    (a few registers per thread), then fence it for the wgmma that reads it next."""
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    keep = (gl.arange(0, PAGE_TOKENS, layout=gl.SliceLayout(1, ld)) < first)[:, None]
    for c in gl.static_range(D_NOPE // 64):
        block = tile.slice(c * 64, 64, dim=1)
        x = block.load(ld)
        block.store(gl.where(keep, x, gl.zeros_like(x)))
    fence_async_shared()


@gluon.jit
def _launch_dependents():
    """``griddepcontrol.launch_dependents``: the next grid, launched as a programmatic dependent
    launch, may be scheduled once every program of this one has executed it (or exited)."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _policy_splits(seq_len, policy_ptr, cap, POLICY_ROWS: gl.constexpr, num_warps: gl.constexpr):
    """A request's split count from a policy table in device memory: ``POLICY_ROWS`` int32 rows
    ``(max_context_len, num_kv_splits)`` (a power of two of them, padded as
    :meth:`mlabench.policy.device_table.SplitPolicy.device_table` pads), the count of the first row with
    ``seq_len <= max_context_len``, else of the last, clamped to ``[1, cap]``.  The rule of
    :meth:`~mlabench.policy.device_table.SplitPolicy.lookup` and of the Triton kernels'
    :func:`mlabench.kernels.common.policy_splits` (Gluon needs the layout spelled out)."""
    lay: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    rows = gl.arange(0, POLICY_ROWS, layout=lay)
    max_len = gl.load(policy_ptr + 2 * rows)
    splits = gl.load(policy_ptr + 2 * rows + 1)
    first = gl.min(gl.where(seq_len <= max_len, rows, POLICY_ROWS - 1), axis=0)
    chosen = gl.sum(gl.where(rows == first, splits, 0), axis=0)
    return gl.minimum(gl.maximum(chosen, 1), cap)


@gluon.jit(do_not_specialize=["num_splits"])
def _gluon_splitkv_stage1(q_ptr, kvn_desc, kvr_desc, bt_ptr, seqlens_ptr, policy_ptr, po_ptr,
                          plse_ptr, num_splits, num_rows, heads_per_token, qk_scale_log2,
                          stride_qb, stride_qh, stride_btb, stride_ps, stride_ph, stride_ls,
                          BLOCK_R: gl.constexpr, ROW_TILES: gl.constexpr, QO_LEN: gl.constexpr,
                          CAUSAL: gl.constexpr, POLICY_ROWS: gl.constexpr,
                          NUM_STAGES: gl.constexpr, PDL: gl.constexpr, num_warps: gl.constexpr):
    if PDL == 1:  # let the merge grid be scheduled now; it waits for this grid before reading
        _launch_dependents()
    # Grid (B * ROW_TILES, S): the row tiles of one (request, split) are neighbours in launch
    # order, so they run together and the later ones read the pages from L2.
    b = gl.program_id(0) // ROW_TILES
    row_lo = (gl.program_id(0) % ROW_TILES) * BLOCK_R
    split = gl.program_id(1)
    seq_len = gl.load(seqlens_ptr + b)
    if POLICY_ROWS > 0:  # the request's own count; splits past it own no page
        own = _policy_splits(seq_len, policy_ptr, num_splits, POLICY_ROWS, num_warps)
    else:
        own = num_splits
    n_pages = gl.cdiv(seq_len, PAGE_TOKENS)
    per_split = gl.cdiv(n_pages, own)
    page_lo = gl.minimum(split * per_split, n_pages)
    n_tiles = gl.minimum(page_lo + per_split, n_pages) - page_lo
    bt_row_ptr = bt_ptr + b.to(gl.int64) * stride_btb

    kn_smem = gl.allocate_shared_memory(kvn_desc.dtype, [NUM_STAGES] + kvn_desc.block_type.shape,
                                        kvn_desc.layout)
    kr_smem = gl.allocate_shared_memory(kvr_desc.dtype, [NUM_STAGES] + kvr_desc.block_type.shape,
                                        kvr_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(bars.index(i), count=1)
    # Start the first pages before anything else: their latency hides the query load.
    for i in gl.static_range(NUM_STAGES - 1):
        if i < n_tiles:
            _issue_page(kvn_desc, kvr_desc, bt_row_ptr, page_lo, i, kn_smem, kr_smem, bars,
                        NUM_STAGES)

    dt: gl.constexpr = kvn_desc.dtype
    qn_smem = gl.allocate_shared_memory(dt, [BLOCK_R, D_NOPE],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_R, D_NOPE], dt))
    qr_smem = gl.allocate_shared_memory(dt, [BLOCK_R, D_ROPE],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_R, D_ROPE], dt))
    p_smem = gl.allocate_shared_memory(dt, [PAGE_TOKENS, BLOCK_R],
                                       gl.NVMMASharedLayout.get_default_for([PAGE_TOKENS, BLOCK_R], dt))
    if n_tiles > 0:  # an empty split only stores -inf log-sum-exps
        _load_q_tiles(q_ptr, b, row_lo, num_rows, stride_qb, stride_qh, qn_smem, qr_smem, BLOCK_R,
                      num_warps)
        fence_async_shared()

    # 4 warps (one warpgroup) for 16 rows; 8 warps (two warpgroups side by side on N) for 32 and
    # 64, so that each holds at most a [512, 32] fp32 accumulator (128 registers a thread):
    # compiled for sm_90 (Triton 3.9), 166, 131 and 245 registers a thread, no spills.
    WG_N: gl.constexpr = num_warps // 4
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, WG_N],
                                                  instr_shape=[16, BLOCK_R // WG_N, 16])
    o = gl.zeros([D_NOPE, BLOCK_R], gl.float32, layout=mma)
    m_i = gl.full([BLOCK_R], float("-inf"), gl.float32, layout=gl.SliceLayout(0, mma))
    l_i = gl.zeros([BLOCK_R], gl.float32, layout=gl.SliceLayout(0, mma))
    s_zero = gl.zeros([PAGE_TOKENS, BLOCK_R], gl.float32, layout=mma)
    offs_t = gl.arange(0, PAGE_TOKENS, layout=gl.SliceLayout(1, mma))
    # Causal block: packed row r is query token r // heads_per_token of the QO_LEN at the end of
    # the request and sees keys below seq_len - QO_LEN + 1 + that token (the Triton kernels' rule,
    # one definition, tested on the CPU through them).
    rows = row_lo + gl.arange(0, BLOCK_R, layout=gl.SliceLayout(0, mma))
    row_lim = causal_row_limits(seq_len, rows, heads_per_token, QO_LEN)
    for t in range(n_tiles):
        ahead = t + NUM_STAGES - 1
        if ahead < n_tiles:  # its slot was released when page t - 1's products completed
            _issue_page(kvn_desc, kvr_desc, bt_row_ptr, page_lo, ahead, kn_smem, kr_smem, bars,
                        NUM_STAGES)
        slot = t % NUM_STAGES
        mbarrier.wait(bars.index(slot), (t // NUM_STAGES) & 1)
        kn = kn_smem.index(slot)
        s = warpgroup_mma(kn, qn_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma(kr_smem.index(slot), qr_smem.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        tok = (page_lo + t) * PAGE_TOKENS + offs_t
        if CAUSAL:
            seen = (tok < seq_len)[:, None] & (tok[:, None] < row_lim[None, :])
            s = gl.where(seen, s * qk_scale_log2, float("-inf"))
        else:
            s = gl.where((tok < seq_len)[:, None], s * qk_scale_log2, float("-inf"))
        if (page_lo + t + 1) * PAGE_TOKENS > seq_len:  # the last page: rows past the length
            _zero_rows_from(kn, seq_len - (page_lo + t) * PAGE_TOKENS, num_warps)
        m_new = gl.maximum(m_i, gl.max(s, axis=0))
        if CAUSAL:  # a row may have seen no key yet: keep -inf - -inf out of the exponent
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        else:  # finite: a page holds >= 1 valid token
            m_use = m_new
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(s - m_use[None, :])
        l_i = l_i * alpha + gl.sum(p, axis=0)
        o = o * alpha[None, :]
        p_smem.store(p.to(dt))
        fence_async_shared()
        o = warpgroup_mma(kn.permute((1, 0)), p_smem, o, is_async=True)
        o = warpgroup_mma_wait(num_outstanding=0, deps=(o,))
        m_i = m_new
    if PDL == 2:  # the merge's launch overlaps this program's epilogue only
        _launch_dependents()
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(bars.index(i))
    if n_tiles > 0:
        _store_partial(po_ptr, plse_ptr, b * num_splits + split, row_lo, num_rows, o, l_i, m_i,
                       stride_ps, stride_ph, stride_ls, BLOCK_R, num_warps)
    else:  # past the request's pages or its own count: -inf log-sum-exps, no partial
        _store_empty(plse_ptr, b * num_splits + split, row_lo, num_rows, stride_ls, BLOCK_R,
                     num_warps)


def stage1_shared_bytes(block_rows: int, num_stages: int) -> int:
    """Shared memory of one stage-1 program the kernel allocates explicitly, in bytes: the page
    ring (``num_stages x 64 x 576`` bf16), the query tile (``block_rows x 576``) and the P tile
    (``64 x block_rows``), plus the mbarriers; the compiler adds a little scratch for reductions."""
    return 2 * (num_stages * PAGE_SIZE * D_QK + block_rows * D_QK + PAGE_SIZE * block_rows) + 8 * num_stages


def kv_descriptors(kv_cache: torch.Tensor) -> tuple[TensorDescriptor, TensorDescriptor]:
    """TMA descriptors of the cache ``[num_pages, 64, 1, 576]`` seen as ``[num_pages*64, 576]``:
    ``[64, 512]`` latent tiles and ``[64, 64]`` RoPE tiles (128-byte swizzle, the layout wgmma
    reads).  Build them once per cache: a captured graph keeps them by value.

    Raises ValueError unless the cache is contiguous with page size 64 and bf16/fp16.
    """
    if kv_cache.dim() != 4 or kv_cache.shape[1] != PAGE_SIZE or kv_cache.shape[2:] != (1, D_QK):
        raise ValueError(f"kv_cache must be [pages, {PAGE_SIZE}, 1, {D_QK}], "
                         f"got {tuple(kv_cache.shape)}")
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache must be contiguous (pages are read as TMA tiles)")
    gl_dtype = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}.get(kv_cache.dtype)
    if gl_dtype is None:
        raise ValueError(f"kv_cache must be bf16 or fp16, got {kv_cache.dtype}")
    rows = kv_cache.view(-1, D_QK)
    descs = []
    for width in (512, 64):
        block = [PAGE_SIZE, width]
        layout = gl.NVMMASharedLayout.get_default_for(block, gl_dtype)
        descs.append(TensorDescriptor(rows, list(rows.shape), list(rows.stride()), block, layout))
    return descs[0], descs[1]


def gluon_workspace_shapes(batch: int, rows: int, max_splits: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of the fp32 partials one call needs: ``([B * S, R, 512], [B * S, R])``, ``S`` the
    most splits a request may take (a fixed count, or a policy table's largest), ``R = qo_len x H``
    packed rows.  Request ``b``'s split ``s`` writes slot ``b * S + s``."""
    slots = batch * max_splits
    return (slots, rows, 512), (slots, rows)


def _checked_rows(q, kv_cache, block_table, cache_seqlens, out, splits, partial_out, partial_lse,
                  split_policy, qo_len) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed-row views ``[B, qo_len * H, D]`` of q and out after every argument check of
    :func:`mla_decode_gluon_splitkv` (ValueError naming what is wrong)."""
    from mlabench.kernels.common import check_decode_args, pack_rows
    from mlabench.kernels.splitkv import check_policy_table

    check_decode_args(q, kv_cache, block_table, cache_seqlens, out, qo_len)
    batch, rows = block_table.shape[0], qo_len * q.shape[1]
    if not 1 <= splits <= MAX_KV_SPLITS:
        raise ValueError(f"num_kv_splits must be in 1..{MAX_KV_SPLITS}, got {splits}")
    if q.dtype != kv_cache.dtype:
        raise ValueError("q must have the cache's dtype")
    o_shape, l_shape = gluon_workspace_shapes(batch, rows, splits)
    if (partial_out.shape[0] < o_shape[0] or tuple(partial_out.shape[1:]) != o_shape[1:]
            or partial_lse.shape[0] < l_shape[0] or partial_lse.shape[1] != rows):
        raise ValueError(f"workspace too small for B={batch} rows={rows} splits={splits}")
    check_policy_table(split_policy, q.device)
    return pack_rows(q, batch, qo_len), pack_rows(out, batch, qo_len)


def mla_decode_gluon_splitkv(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                             cache_seqlens: torch.Tensor, out: torch.Tensor, num_kv_splits: int,
                             softmax_scale: float, *, partial_out: torch.Tensor,
                             partial_lse: torch.Tensor,
                             descriptors: tuple[TensorDescriptor, TensorDescriptor] | None = None,
                             num_stages: int = DEFAULT_NUM_STAGES, pdl: int = 1,
                             merge_block_dv: int | None = None, split_policy: torch.Tensor | None = None,
                             qo_len: int = 1, causal: bool = True,
                             stage1_only: bool = False) -> torch.Tensor:
    """Split-KV MLA decode on Hopper: ``out = softmax(q K^T * softmax_scale) V`` per query row.

    Args:
        q: ``[B * qo_len, H, 576]`` bf16/fp16, contiguous over its first two dimensions; request
            ``b``'s ``qo_len x H`` rows are packed token-major (row ``t * H + h``) into tiles of up
            to 64 (:class:`RowTiling`), each tile streaming the request's pages once.
        kv_cache: ``[num_pages, 64, 1, 576]`` contiguous, q's dtype.
        block_table: ``[B, max_pages]`` int32.  cache_seqlens: ``[B]`` int32, each >= 1 (>= qo_len
            when causal), read on the device (a captured graph follows new lengths).
        out: ``[B * qo_len, H, 512]`` in q's dtype, written in place and returned.
        num_kv_splits: S, 1..512: split ``s`` takes pages ``[s*P, (s+1)*P)``, ``P = ceil(pages/S)``;
            with ``split_policy`` the most splits any request may take (the grid's split axis).
        softmax_scale: multiplier of ``q . k``.
        partial_out / partial_lse: fp32 workspace of :func:`gluon_workspace_shapes` (or larger).
        descriptors: from :func:`kv_descriptors` (None: built here; pass them when capturing).
        num_stages: pages in the shared-memory ring (1 or 2).
        pdl: the merge launch: 0 ordinary; 1 programmatic dependent, released at stage 1's start;
            2 released after stage 1's token loop (it overlaps the epilogue).
        merge_block_dv: output columns per merge program (None: sized to the GPU).
        split_policy: None, or the int32 ``[R, 2]`` table of
            :meth:`mlabench.policy.device_table.SplitPolicy.device_table` on q's device: request
            ``b`` takes ``min(lookup(cache_seqlens[b]), num_kv_splits)`` splits, looked up in stage
            1; its other splits store only a ``-inf`` log-sum-exp, which the merge weights 0.
        qo_len, causal: query tokens per request; causal: token ``t`` sees the first
            ``cache_seqlens[b] - qo_len + t + 1`` keys, else all.
        stage1_only: skip the merge (for timing stage 1 alone; ``out`` is then not written).

    Returns ``out``.  Raises ValueError on bad layouts, split counts, tables or workspace sizes.
    """
    batch, heads, splits = block_table.shape[0], q.shape[1], int(num_kv_splits)
    rows, tiling = qo_len * heads, RowTiling.for_rows(qo_len * q.shape[1])
    q_rows, out_rows = _checked_rows(q, kv_cache, block_table, cache_seqlens, out, splits,
                                     partial_out, partial_lse, split_policy, qo_len)
    kvn_desc, kvr_desc = descriptors or kv_descriptors(kv_cache)
    _gluon_splitkv_stage1[(batch * tiling.row_tiles, splits)](
        q_rows, kvn_desc, kvr_desc, block_table, cache_seqlens,
        cache_seqlens if split_policy is None else split_policy, partial_out, partial_lse,
        splits, rows, heads, float(softmax_scale) * LOG2E,
        q_rows.stride(0), q_rows.stride(1), block_table.stride(0), partial_out.stride(0),
        partial_out.stride(1), partial_lse.stride(0), BLOCK_R=tiling.block_rows,
        ROW_TILES=tiling.row_tiles, QO_LEN=qo_len, CAUSAL=bool(causal) and qo_len > 1,
        POLICY_ROWS=0 if split_policy is None else split_policy.shape[0], NUM_STAGES=num_stages,
        PDL=0 if stage1_only else int(pdl), num_warps=tiling.num_warps,
    )
    if not stage1_only:
        from mlabench.device import current_device
        from mlabench.kernels.wide_merge import wide_merge

        wide_merge(partial_out, partial_lse, out_rows, splits, block_dv=merge_block_dv,
                   num_sms=current_device().num_sms, pdl=bool(pdl))
    return out
