"""Warp-specialised stage 1 of ``gluon-splitkv`` for multi-token tiles (``KernelVariant.multi_token``).

Off by default: measured on an H200, it is not faster everywhere (docs/multi-token-tile.md).

The one-token kernel (:mod:`mlabench.kernels.gluon_splitkv`) runs a page's score product, its
softmax and its output product one after the other in the same warps, so the tensor cores idle
during the softmax and the page loads wait for the products; at 48 and 96 packed rows (4 and 8
tokens of 12 heads) that serialisation, not the cache stream, sets the time.  This stage 1 keeps
the one-token kernel's grid and row tiles (:class:`~mlabench.kernels.row_tiling.RowTiling`: one
CTA per 32 or 64 rows, so 96 rows are two CTAs reading the same pages, the second from L2) and
splits each CTA's work among three partitions:

- **Loader** (1 warp, 24 registers): the TMA copies of the split's pages into a 2-page ring; a
  slot is refilled once the output product of the page it held has completed (``kv_free``).
- **Softmax warpgroup** (4 warps, 168 registers): ``S^T [64 tokens, R] = K_page Q^T`` as one
  wgmma chain with all R rows as N (36 ``m64nRk16``), the masks (length; the causal limit per row
  only on a split's last page or two), the online softmax, the zeroing of a last page's rows
  past the length; it hands ``P^T`` (bf16) and the rescale ``alpha`` to the output warps through
  ``P_BUFS`` tiles (``p_ready``/``p_free``).  Two orders (``multi_token`` 1 and 2): hand page
  ``t``'s weights over, then compute page ``t + 1``'s scores (the tensor cores take both products
  at once, and a page that has not landed yet delays nothing); or compute page ``t + 1``'s scores
  first (the tensor cores take them before page ``t``'s output product, under which page ``t +
  1``'s softmax then runs: for the compute-bound 96-row steps, at the cost of waiting for page
  ``t + 1`` to land, and of one unused score product a split).
- **Output warpgroups** (8 warps, the default partition, 160 registers): ``O^T [512, R] fp32
  *= alpha; += V^T P^T``, each warpgroup 256 of the 512 output columns (16 ``m64nRk16`` a page),
  then the normalised partial store that :func:`mlabench.kernels.wide_merge.wide_merge` reads.

``rows_as_m`` (64-row tiles): the products with the rows as the wgmma M, as FlashMLA computes
them: 1 the output product as ``O [R, 512] += P V``, 2 the scores as ``S = Q K^T`` too
(:func:`_output`, :func:`_softmax`), 3 as 2 with the output product as ``m64n256k16`` and no
loader warp: ptxas needs 154 registers a thread for that instruction, and the kernel's register
target applies to every partition, so it runs 12 warps at 168 (16 at 128 with the loader warp
padded to a warpgroup); the output warps then copy a slot's next page once their products of
its page are done (:mod:`mlabench.kernels.gluon_mt_feed`).

Why not one CTA for all 96 rows of an 8-token request: its accumulator ``O^T [512, 96]`` fp32 is
192 KB, three quarters of an SM's 256 KB register file before any score, weight or address
register (two warpgroups would need 192 accumulator registers a thread, four 96 with 128 a thread
left in all); and Gluon tensors have power-of-two shapes, so no 48-row half either.  A 64-row CTA
holds 128 KB of accumulator, 128 registers a thread over two warpgroups.  Shared memory at 64
rows: query 73.7 KB, ring 2 x 73.7 KB, one P tile 8.2 KB: 225 KB of the 227 KB a block may have,
so the P tile is single-buffered there (the softmax warpgroup still computes the next page's
scores and weights before it waits for the tile); 2 tiles at 32 rows.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait,
)

from mlabench.kernels.common import causal_row_limits
from mlabench.kernels.gluon_blocks import (
    D_NOPE, PAGE_TOKENS, issue_first_pages, launch_dependents, load_q_tiles, page_ring,
    program_split, scaled_scores, softmax_step, store_partial, wait_prior_grid, zero_rows_from,
)
from mlabench.kernels.gluon_mt_feed import (
    loader_partition, mt_barriers, page_scores, pages_read, refill_slot, shared_tiles,
)
from mlabench.kernels.row_tiling import RowTiling

MT_NUM_WARPS = 8  #: warps of the output partition (the kernel's ``num_warps``)
#: Registers a thread the worker partitions ask for (softmax warpgroup, loader warp); the output
#: warpgroups get the rest of the 64K-register file (``maxnreg`` times the 16 warps): 160, which
#: their loop of a 128-register accumulator needs no local memory with.  At 152 the softmax loop
#: of a causal 64-row tile used local memory under Triton 3.6 (19 LDL/STL a page, 0 at 168).
SOFTMAX_REGS = gl.constexpr(168)
LOADER_REGS = gl.constexpr(24)
MT_MAXNREG = 128


def mt_maxnreg(rows_m: int) -> int:
    """The launch's register target: ``MT_MAXNREG``, or 168 with ``rows_m`` 3, whose 12 warps
    (no loader warp) may each have 168 of the 64K registers, as ptxas needs for its output
    product's ``m64n256k16`` (128 accumulator registers beside the operands' descriptors)."""
    return 168 if rows_m == 3 else MT_MAXNREG


def multi_token_tiling(rows: int) -> RowTiling | None:
    """The row tiling of the multi-token stage 1 for ``rows`` packed rows a request: the tiles of
    :meth:`RowTiling.for_rows` (32 or 64 rows; so the split grid, the workspace and the row-tile
    count the backend reports are those of the one-token kernel), with the output partition's
    8 warps; None for 16 rows or fewer, which the one-token kernel keeps."""
    if rows <= 16:
        return None
    return RowTiling.for_rows(rows)


def p_buffers(block_rows: int) -> int:
    """P^T tiles (P with ``rows_as_m`` 2) between the softmax and the output warps: 2 up to 32
    rows; 1 at 64, where a second would take shared memory past the 227 KB a block may have
    (query 73.7 KB, ring 147.5 KB, P 8.2 KB: 224 KB)."""
    return 2 if block_rows <= 32 else 1


def rows_m_for(rows_as_m: int, block_rows: int) -> int:
    """The ``rows_as_m`` a tile of ``block_rows`` rows runs: as asked at 64 rows, the M of a
    warpgroup's wgmma; 0 at 32 (its rows stay N in both products)."""
    return rows_as_m if block_rows == 64 else 0


@gluon.jit
def _softmax(kvn_desc, kvr_desc, bt_row_ptr, page_lo, n_tiles, seq_len, row_lo, heads_per_token,
             qk_scale_log2, smem, bars, BLOCK_R: gl.constexpr, QO_LEN: gl.constexpr,
             CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr, SCORES_FIRST: gl.constexpr,
             ROWS_M: gl.constexpr, ISOLATE: gl.constexpr):
    """Softmax partition (one warpgroup): per page the score product over all ``BLOCK_R`` rows,
    the masks, one online-softmax step and the tail zeroing; publishes ``P^T`` (``P`` for
    ``ROWS_M`` 2, whose scores have the rows as M: a row's max and sum within a quad of threads,
    not across the four warps) and ``alpha`` in buffer ``t % P_BUFS``, and after the last page
    the rows' max and sum (``ml_smem``, ``done``)."""
    kn_smem, kr_smem, qn_smem, qr_smem, p_smem, a_smem, ml_smem = smem
    kv_ready, p_ready, p_free, done = bars[0], bars[2], bars[3], bars[4]
    P_BUFS: gl.constexpr = p_smem.type.shape[0]
    gl.static_assert(ROWS_M == 0 or BLOCK_R == PAGE_TOKENS, "rows_as_m needs 64-row tiles")
    AX: gl.constexpr = 1 if ROWS_M >= 2 else 0  # the token axis of the scores
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, PAGE_TOKENS if AX else BLOCK_R, 16])
    if AX:
        s = gl.zeros([BLOCK_R, PAGE_TOKENS], gl.float32, layout=mma)  # S of page t in iteration t
        l_i = gl.zeros([BLOCK_R, PAGE_TOKENS], gl.float32, layout=mma)  # summed at the end
    else:
        s = gl.zeros([PAGE_TOKENS, BLOCK_R], gl.float32, layout=mma)  # S^T of page t
        l_i = gl.zeros([PAGE_TOKENS, BLOCK_R], gl.float32, layout=mma)
    m_i = gl.full([BLOCK_R], float("-inf"), gl.float32, layout=gl.SliceLayout(AX, mma))
    offs_t = gl.arange(0, PAGE_TOKENS, layout=gl.SliceLayout(1 - AX, mma))
    first_masked = seq_len - QO_LEN + 1  # under CAUSAL, no row sees a key from here on
    pages = pages_read(n_tiles, kv_ready, p_ready, p_free, NUM_STAGES, P_BUFS, ISOLATE)
    if SCORES_FIRST and pages > 0:
        s = page_scores(0, kn_smem, kr_smem, qn_smem, qr_smem, kv_ready, s, NUM_STAGES, ROWS_M)
    for t in range(pages):
        if not SCORES_FIRST:
            s = page_scores(t, kn_smem, kr_smem, qn_smem, qr_smem, kv_ready, s, NUM_STAGES, ROWS_M)
        tok = (page_lo + t) * PAGE_TOKENS + offs_t
        if CAUSAL and (page_lo + t + 1) * PAGE_TOKENS > first_masked:  # the last page or two
            rows = row_lo + gl.arange(0, BLOCK_R, layout=gl.SliceLayout(AX, mma))
            row_lim = causal_row_limits(seq_len, rows, heads_per_token, QO_LEN)
            s = scaled_scores(s, tok, seq_len, row_lim, qk_scale_log2, True, AX)
        else:  # every row sees every key of the page below the length
            s = scaled_scores(s, tok, seq_len, seq_len, qk_scale_log2, False, AX)
        p, alpha, m_i = softmax_step(s, m_i, CAUSAL, AX)
        l_i = l_i * gl.expand_dims(alpha, AX) + p
        j = t % P_BUFS
        mbarrier.wait(p_free.index(j), ((t // P_BUFS) & 1) ^ 1)  # a fresh barrier: at once
        p_smem.index(j).store(p.to(p_smem.dtype))
        a_smem.index(j).store(alpha)
        fence_async_shared()  # P is read by wgmma (the async proxy) in the other partition
        # the last page: V rows past the length, zeroed before p_ready and after the weights are
        # stored (the scores and weights no longer hold registers: no local memory)
        if (page_lo + t + 1) * PAGE_TOKENS > seq_len:
            zero_rows_from(kn_smem.index(t % NUM_STAGES), seq_len - (page_lo + t) * PAGE_TOKENS,
                           4)  # fenced inside
        if SCORES_FIRST:  # the next page's scores reach the tensor cores before this page's
            # output product, so the next softmax runs under that product (after the last page
            # this page's again, still in its slot: one unused product a split, no branch)
            s = page_scores(gl.minimum(t + 1, pages - 1), kn_smem, kr_smem, qn_smem, qr_smem,
                            kv_ready, s, NUM_STAGES, ROWS_M)
        mbarrier.arrive(p_ready.index(j), count=1)
    if n_tiles > 0:
        ml_smem.index(0).store(m_i)
        ml_smem.index(1).store(gl.sum(l_i, axis=AX))
        mbarrier.arrive(done.index(0), count=1)


@gluon.jit
def _output(smem, bars, pages, n_tiles, BLOCK_R: gl.constexpr, NUM_STAGES: gl.constexpr,
            ROWS_M: gl.constexpr, ISOLATE: gl.constexpr, num_warps: gl.constexpr):
    """Output partition (the default, ``num_warps`` = 8), per page, each warpgroup 256 of the 512
    output columns; frees the page's slot and P buffer once its product completed.

    - ``ROWS_M`` 0: ``O^T [512, R] *= alpha; O^T += V^T P^T``, the columns as M (16
      ``m64nRk16`` a warpgroup and page, 2 KB of A and 2 KB of B read from shared memory each);
    - ``ROWS_M`` 1 or 2 (64-row tiles): ``O [R, 512] *= alpha; O += P V``, the rows as M (8
      ``m64n128k16``, 2 KB of A, the P tile (1: P^T read transposed), and 4 KB of B, the page's
      latent tile): half the instructions and 48 KB of operands a warpgroup and page instead of
      64;
    - ``ROWS_M`` 3: as 2 with 4 ``m64n256k16`` (P read once: 40 KB), which needs 154 registers
      a thread (:func:`mt_maxnreg`), and the copies of the pages (``pages``) issued from here.

    Returns ``(o, m [BLOCK_R], l [BLOCK_R])``, ``o`` fp32 ``[512, BLOCK_R]`` (0) or ``[R, 512]``."""
    kn_smem, p_smem, a_smem, ml_smem = smem[0], smem[4], smem[5], smem[6]
    kv_ready, kv_free, p_ready, p_free, done = bars
    bt_row_ptr, page_lo = pages[2], pages[3]
    P_BUFS: gl.constexpr = p_smem.type.shape[0]
    if ROWS_M:
        mma_o: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, num_warps // 4],
            instr_shape=[16, 256 if ROWS_M == 3 else 128, 16])
        per_row: gl.constexpr = gl.SliceLayout(1, mma_o)
        o = gl.zeros([BLOCK_R, D_NOPE], gl.float32, layout=mma_o)
    else:
        mma_o: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_R, 16])
        per_row: gl.constexpr = gl.SliceLayout(0, mma_o)
        o = gl.zeros([D_NOPE, BLOCK_R], gl.float32, layout=mma_o)
    for t in range(n_tiles):
        slot = t % NUM_STAGES
        j = t % P_BUFS
        if ROWS_M == 3:  # the block-table entry of the page this slot takes next, early
            nxt = gl.load(bt_row_ptr + page_lo + gl.minimum(t + NUM_STAGES, n_tiles - 1))
        mbarrier.wait(p_ready.index(j), (t // P_BUFS) & 1)
        if ISOLATE != 2:  # copies alone: no product
            alpha = a_smem.index(j).load(per_row)
            if ROWS_M >= 2:
                o = warpgroup_mma(p_smem.index(j), kn_smem.index(slot), o * alpha[:, None],
                                  is_async=True)
            elif ROWS_M == 1:
                o = warpgroup_mma(p_smem.index(j).permute((1, 0)), kn_smem.index(slot),
                                  o * alpha[:, None], is_async=True)
            else:
                o = warpgroup_mma(kn_smem.index(slot).permute((1, 0)), p_smem.index(j),
                                  o * alpha[None, :], is_async=True)
            o = warpgroup_mma_wait(num_outstanding=0, deps=(o,))
        if ROWS_M == 3:  # no loader warp: the slot's next page is copied from here
            refill_slot(pages, nxt, t, n_tiles, kn_smem, smem[1], kv_ready, NUM_STAGES, ISOLATE)
        else:
            mbarrier.arrive(kv_free.index(slot), count=1)
        mbarrier.arrive(p_free.index(j), count=1)
    m_i = gl.full([BLOCK_R], float("-inf"), gl.float32, layout=per_row)
    l_i = gl.zeros([BLOCK_R], gl.float32, layout=per_row)
    if n_tiles > 0:
        mbarrier.wait(done.index(0), 0)
        m_i = ml_smem.index(0).load(per_row)
        l_i = ml_smem.index(1).load(per_row)
    return o, m_i, l_i


@gluon.jit
def _columns_first(o, ROWS_M: gl.constexpr, num_warps: gl.constexpr):
    """The output product as ``O^T [512, R]``, which :func:`store_partial` writes: ``o`` itself,
    or for ``ROWS_M`` its ``O [R, 512]`` transposed (through the blocked layout whose transpose is
    the store's, so the store converts nothing)."""
    if ROWS_M:
        rows_st: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [num_warps, 1], [1, 0])
        o = gl.permute(gl.convert_layout(o, rows_st), (1, 0))
    return o


@gluon.jit(do_not_specialize=["num_splits"])
def _multi_token_stage1(q_ptr, kvn_desc, kvr_desc, bt_ptr, seqlens_ptr, policy_ptr, po_ptr,
                        plse_ptr, num_splits, num_rows, heads_per_token, qk_scale_log2, stride_qb,
                        stride_qh, stride_btb, stride_ps, stride_ph, stride_ls,
                        BLOCK_R: gl.constexpr, ROW_TILES: gl.constexpr, QO_LEN: gl.constexpr,
                        CAUSAL: gl.constexpr, POLICY_ROWS: gl.constexpr,
                        NUM_STAGES: gl.constexpr, P_BUFS: gl.constexpr,
                        SCORES_FIRST: gl.constexpr, ROWS_M: gl.constexpr, ISOLATE: gl.constexpr,
                        PDL: gl.constexpr, WAIT_PRIOR: gl.constexpr, num_warps: gl.constexpr):
    if PDL == 1:  # let the merge grid be scheduled now; it waits for this grid before reading
        launch_dependents()
    # the grid and program of the one-token kernel: a request's row tiles share pages in L2
    b, row_lo, split, seq_len, page_lo, n_tiles, written, bt_row_ptr = program_split(
        seqlens_ptr, bt_ptr, stride_btb, num_splits, policy_ptr, ROW_TILES, BLOCK_R, POLICY_ROWS,
        False, num_warps)
    kn_smem, kr_smem, kv_ready = page_ring(kvn_desc, kvr_desc, NUM_STAGES)
    qn_smem, qr_smem, p_smem, a_smem, ml_smem = shared_tiles(kvn_desc.dtype, BLOCK_R, P_BUFS)
    kv_free, p_ready, p_free, done = mt_barriers(NUM_STAGES, P_BUFS)
    if WAIT_PRIOR:  # PDL prologue: an empty split touches neither q nor the partials
        if n_tiles > 0:
            wait_prior_grid()
    if n_tiles > 0:
        load_q_tiles(q_ptr, q_ptr + D_NOPE, b, row_lo, num_rows, stride_qb, stride_qh, stride_qb,
                     stride_qh, qn_smem.index(0), qr_smem.index(0), BLOCK_R, num_warps)
        fence_async_shared()
    smem = (kn_smem, kr_smem, qn_smem, qr_smem, p_smem, a_smem, ml_smem)
    bars = (kv_ready, kv_free, p_ready, p_free, done)
    pages = (kvn_desc, kvr_desc, bt_row_ptr, page_lo)
    # the worker partitions take the same arguments, spelled out in the call: a tuple assigned to
    # a variable first would turn its constexprs into tensors
    if ROWS_M == 3:  # the output warps copy the pages: no loader warp
        issue_first_pages(kvn_desc, kvr_desc, bt_row_ptr, page_lo, n_tiles, kn_smem, kr_smem,
                          kv_ready, NUM_STAGES, NUM_STAGES)
        o, m_i, l_i = gl.warp_specialize([
            (_output, (smem, bars, pages, n_tiles, BLOCK_R, NUM_STAGES, ROWS_M, ISOLATE,
                       num_warps)),
            (_softmax, (kvn_desc, kvr_desc, bt_row_ptr, page_lo, n_tiles, seq_len, row_lo,
                        heads_per_token, qk_scale_log2, smem, bars, BLOCK_R, QO_LEN, CAUSAL,
                        NUM_STAGES, SCORES_FIRST, ROWS_M, ISOLATE)),
        ], [4], [SOFTMAX_REGS])
    else:
        o, m_i, l_i = gl.warp_specialize([
            (_output, (smem, bars, pages, n_tiles, BLOCK_R, NUM_STAGES, ROWS_M, ISOLATE,
                       num_warps)),
            (_softmax, (kvn_desc, kvr_desc, bt_row_ptr, page_lo, n_tiles, seq_len, row_lo,
                        heads_per_token, qk_scale_log2, smem, bars, BLOCK_R, QO_LEN, CAUSAL,
                        NUM_STAGES, SCORES_FIRST, ROWS_M, ISOLATE)),
            (loader_partition, (kvn_desc, kvr_desc, bt_row_ptr, page_lo, n_tiles, seq_len,
                                row_lo, heads_per_token, qk_scale_log2, smem, bars, BLOCK_R,
                                QO_LEN, CAUSAL, NUM_STAGES, SCORES_FIRST, ROWS_M, ISOLATE)),
        ], [4, 1], [SOFTMAX_REGS, LOADER_REGS])
    if PDL == 2:  # the merge's launch overlaps this program's epilogue only
        launch_dependents()
    if n_tiles > 0:  # an empty split writes nothing: the merge reads only the splits owning pages
        store_partial(po_ptr, plse_ptr, b * num_splits + split, row_lo, num_rows,
                      _columns_first(o, ROWS_M, num_warps), l_i, m_i,
                      stride_ps, stride_ph, stride_ls, BLOCK_R, num_warps)


def launch_multi_token_stage1(tiling: RowTiling, q_rows, descriptors, block_table, cache_seqlens,
                              split_policy, partial_out, partial_lse, splits: int, heads: int,
                              qk_scale_log2: float, qo_len: int, causal: bool, num_stages: int,
                              pdl: int, wait_prior: bool, scores_first: bool = False,
                              rows_as_m: int = 0, isolate: int = 0) -> None:
    """Launch the multi-token stage 1 on the grid ``(B * tiling.row_tiles, splits)`` (arguments as
    :func:`mlabench.kernels.gluon_splitkv.mla_decode_gluon_splitkv` checked them; ``q_rows``
    ``[B, qo_len * H, 576]``, ``tiling`` from :func:`multi_token_tiling`, ``descriptors`` from
    :func:`~mlabench.kernels.gluon_splitkv.kv_descriptors`).  ``scores_first``: the softmax
    warpgroup computes page ``t + 1``'s scores before it hands page ``t``'s weights over (with a
    2-page ring only: with one slot the next page lands after that product, so it is ignored).
    ``rows_as_m``: 1 the output product as ``O = P V``, 2 the score product as ``S = Q K^T`` too
    (:func:`_output`, :func:`_softmax`; 64-row tiles only, :func:`rows_m_for`).  ``isolate``
    (timing only, wrong output): 1 no page copy after the ring's first, 2 no product.
    Writes the partials the wide merge reads; no fused merge."""
    kvn_desc, kvr_desc = descriptors
    batch = block_table.shape[0]
    _multi_token_stage1[(batch * tiling.row_tiles, splits)](
        q_rows, kvn_desc, kvr_desc, block_table, cache_seqlens,
        cache_seqlens if split_policy is None else split_policy, partial_out, partial_lse,
        splits, qo_len * heads, heads, qk_scale_log2, q_rows.stride(0), q_rows.stride(1),
        block_table.stride(0), partial_out.stride(0), partial_out.stride(1), partial_lse.stride(0),
        BLOCK_R=tiling.block_rows, ROW_TILES=tiling.row_tiles, QO_LEN=qo_len,
        CAUSAL=bool(causal) and qo_len > 1,
        POLICY_ROWS=0 if split_policy is None else split_policy.shape[0], NUM_STAGES=num_stages,
        P_BUFS=p_buffers(tiling.block_rows), SCORES_FIRST=scores_first and num_stages > 1,
        ROWS_M=rows_m_for(rows_as_m, tiling.block_rows), ISOLATE=isolate, PDL=pdl,
        WAIT_PRIOR=wait_prior, num_warps=tiling.num_warps,
        maxnreg=mt_maxnreg(rows_m_for(rows_as_m, tiling.block_rows)),
        **({"launch_pdl": True} if wait_prior else {}),
    )
