"""Ping-pong stage 1 of ``gluon-splitkv`` for 64-row multi-token tiles (``multi_token=3``).

Two math warpgroups take the pages of a split in turn, as FlashMLA's Hopper kernel does: the
warpgroup that owns page ``t`` (``t % 2``) computes its scores ``S = Q K^T`` (rows as the wgmma
M: 36 ``m64n64k16``), the masks and the online-softmax step, and hands the weights ``P`` (bf16)
and the rescale ``alpha`` to the other one through shared memory; each warpgroup accumulates 256
of the 512 output columns, ``O [64, 256] *= alpha; += P V`` for every page (4 ``m64n256k16``:
``P`` from its registers for its own pages, from shared memory for the other's).  While one
warpgroup runs a page's softmax, the other runs its output product and the next page's score
product, so the tensor cores are not idle during a softmax and no single warpgroup's chain
(product, softmax, product) sets the time a page.  The running max crosses between the two
warpgroups once a page, with ``P``; a warpgroup computes its next page's scores before it waits
for it.  A loader warp fills a 2-page ring with TMA copies; a slot is free once both warpgroups'
output products of its page completed (``kv_free`` counts 2).

Shared memory (64 rows): query 73.7 KB, ring 2 x 73.7 KB, one P tile 8.2 KB, the exchanged rows
(fp32): 225 KB of the 227 KB a block may have.  One P tile is enough: the warpgroups write it in
turn, each only after its own read of the other's previous tile completed.  Registers: each math
warpgroup 240 a thread (the 128-register accumulator, the 32-register scores, their weights), the
loader 24.

32-row tiles (qo_len 2 at 12 heads) keep :mod:`mlabench.kernels.gluon_multi_token`'s kernel.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait,
)

from mlabench.kernels.common import causal_row_limits
from mlabench.kernels.gluon_blocks import (
    D_NOPE, PAGE_TOKENS, launch_dependents, load_q_tiles, page_ring, scaled_scores, softmax_step,
    split_pages, wait_prior_grid, zero_rows_from,
)
from mlabench.kernels.gluon_multi_token import page_loader, shared_query

PP_NUM_WARPS = 4  #: warps of the default partition (math warpgroup 0; the kernel's ``num_warps``)
#: Registers a thread: math warpgroup 1 and the loader warp ask for these; warpgroup 0 gets the
#: rest of ``maxnreg`` times the 12 warps (the loader's one counts as a warpgroup's four).
MATH_REGS = gl.constexpr(240)
LOADER_REGS = gl.constexpr(24)
PP_MAXNREG = 168
HALF = gl.constexpr(256)  #: output columns a math warpgroup accumulates


@gluon.jit
def _page_scores(t, kn_smem, kr_smem, qn_smem, qr_smem, kv_ready, s):
    """Issue ``S = Q K^T`` ``[64 rows, 64 tokens]`` of page ``t`` (ring slot ``t % 2``) once it
    has landed (latent and RoPE parts); asynchronous, into the registers of ``s``."""
    slot = t % 2
    q = t >> 30  # 0, not provably so: see shared_query
    mbarrier.wait(kv_ready.index(slot), (t // 2) & 1)
    s = warpgroup_mma(qn_smem.index(q), kn_smem.index(slot).permute((1, 0)), s, use_acc=False,
                      is_async=True)
    return warpgroup_mma(qr_smem.index(q), kr_smem.index(slot).permute((1, 0)), s, is_async=True)


@gluon.jit
def _other_page(t, kn_smem, p_smem, x_smem, kv_ready, p_ready, o, l_i, W: gl.constexpr):
    """Start the output product of the other warpgroup's page ``t``: wait for its weights (and
    for the page's copies, which the other warpgroup saw complete: the slot cannot be refilled
    before this warpgroup frees it, so the phase is still that page's), rescale ``o`` and ``l_i``
    by its ``alpha``, issue ``O += P V`` with ``P`` from shared memory.  Returns ``(o, l_i, m)``
    with ``m`` the running max after page ``t``."""
    mbarrier.wait(kv_ready.index(t % 2), (t // 2) & 1)
    mbarrier.wait(p_ready.index(1 - W), (t // 2) & 1)
    per_row: gl.constexpr = gl.SliceLayout(1, o.type.layout)
    alpha = x_smem.index(0).load(per_row)
    m = x_smem.index(1).load(l_i.type.layout)
    v = kn_smem.index(t % 2).slice(W * HALF, HALF, dim=1)
    o = warpgroup_mma(p_smem, v, o * alpha[:, None], is_async=True)
    return o, l_i * gl.convert_layout(alpha, l_i.type.layout), m


@gluon.jit
def _own_page(t, s, o, l_i, m_i, kn_smem, p_smem, x_smem, kv_free, p_ready, page_lo, seq_len,
              row_lo, heads_per_token, qk_scale_log2, QO_LEN: gl.constexpr, CAUSAL: gl.constexpr,
              W: gl.constexpr):
    """This warpgroup's page ``t``, its scores ``s`` computed: the masks, the online-softmax step,
    the weights and ``alpha`` (and the running max) to the other warpgroup once this one's
    product with the other's previous weights completed (``o`` may still be running it), then
    ``O = O * alpha + P V`` on this warpgroup's columns, ``P`` from registers; frees the slots of
    pages ``t - 1`` and ``t``.  Returns ``(o, l_i, m_i)``."""
    mma_s: gl.constexpr = s.type.layout
    rows_l: gl.constexpr = gl.SliceLayout(1, mma_s)
    tok = (page_lo + t) * PAGE_TOKENS + gl.arange(0, PAGE_TOKENS, layout=gl.SliceLayout(0, mma_s))
    if CAUSAL and (page_lo + t + 1) * PAGE_TOKENS > seq_len - QO_LEN + 1:  # the last page or two
        rows = row_lo + gl.arange(0, PAGE_TOKENS, layout=rows_l)
        row_lim = causal_row_limits(seq_len, rows, heads_per_token, QO_LEN)
        s = scaled_scores(s, tok, seq_len, row_lim, qk_scale_log2, True, 1)
    else:  # every row sees every key of the page below the length
        s = scaled_scores(s, tok, seq_len, seq_len, qk_scale_log2, False, 1)
    p, alpha, m_i = softmax_step(s, m_i, CAUSAL, 1)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    pb = p.to(p_smem.dtype)
    o = warpgroup_mma_wait(num_outstanding=0, deps=(o,))  # done reading the other's P
    if t > 0:
        mbarrier.arrive(kv_free.index((t - 1) % 2), count=1)
    if (page_lo + t + 1) * PAGE_TOKENS > seq_len:  # the last page: V rows past the length
        zero_rows_from(kn_smem.index(t % 2), seq_len - (page_lo + t) * PAGE_TOKENS, 4)
    p_smem.store(pb)
    x_smem.index(0).store(alpha)
    x_smem.index(1).store(m_i)
    fence_async_shared()  # P is read by wgmma (the async proxy) in the other warpgroup
    mbarrier.arrive(p_ready.index(W), count=1)
    mma_o: gl.constexpr = o.type.layout
    p_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
    o = o * gl.convert_layout(alpha, gl.SliceLayout(1, mma_o))[:, None]
    o = warpgroup_mma(gl.convert_layout(pb, p_op), kn_smem.index(t % 2).slice(W * HALF, HALF, dim=1),
                      o, is_async=True)
    o = warpgroup_mma_wait(num_outstanding=0, deps=(o,))
    mbarrier.arrive(kv_free.index(t % 2), count=1)
    return o, l_i, m_i


@gluon.jit
def _math(kn_smem, kr_smem, qn_smem, qr_smem, p_smem, x_smem, l_smem, bars, page_lo, n_tiles,
          seq_len, row_lo, heads_per_token, qk_scale_log2, po_ptr, plse_ptr, part, num_rows,
          stride_ps, stride_ph, stride_ls, QO_LEN: gl.constexpr, CAUSAL: gl.constexpr,
          W: gl.constexpr):
    """Math warpgroup ``W`` (0: the default partition; 1: a worker): pages ``W, W + 2, ..`` of the
    split are its own (:func:`_own_page`), and it multiplies the other's weights of every other
    page (:func:`_other_page`) while its next page's scores and softmax run; then the partial of
    its columns (and, from 0, the rows' lse2)."""
    kv_ready, kv_free, p_ready, done = bars
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, PAGE_TOKENS, 16])
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, HALF, 16])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma_s)
    o = gl.zeros([PAGE_TOKENS, HALF], gl.float32, layout=mma_o)
    s = gl.zeros([PAGE_TOKENS, PAGE_TOKENS], gl.float32, layout=mma_s)
    m_i = gl.full([PAGE_TOKENS], float("-inf"), gl.float32, layout=rows_l)
    l_i = gl.zeros([PAGE_TOKENS], gl.float32, layout=rows_l)
    if W == 0:  # page 0: no weights of the other's before it
        if n_tiles > 0:
            s = _page_scores(0, kn_smem, kr_smem, qn_smem, qr_smem, kv_ready, s)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            o, l_i, m_i = _own_page(0, s, o, l_i, m_i, kn_smem, p_smem, x_smem, kv_free, p_ready,
                                    page_lo, seq_len, row_lo, heads_per_token, qk_scale_log2,
                                    QO_LEN, CAUSAL, W)
    for t in range(2 - W, n_tiles, 2):
        s = _page_scores(t, kn_smem, kr_smem, qn_smem, qr_smem, kv_ready, s)
        # the other's previous page: its product runs under this page's softmax
        o, l_i, m_i = _other_page(t - 1, kn_smem, p_smem, x_smem, kv_ready, p_ready, o, l_i, W)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
        o, l_i, m_i = _own_page(t, s, o, l_i, m_i, kn_smem, p_smem, x_smem, kv_free, p_ready,
                                page_lo, seq_len, row_lo, heads_per_token, qk_scale_log2, QO_LEN,
                                CAUSAL, W)
    if n_tiles > 0 and (n_tiles - 1) % 2 != W:  # the split's last page is the other's
        o, l_i, m_i = _other_page(n_tiles - 1, kn_smem, p_smem, x_smem, kv_ready, p_ready, o, l_i, W)
        o = warpgroup_mma_wait(num_outstanding=0, deps=(o,))
        mbarrier.arrive(kv_free.index((n_tiles - 1) % 2), count=1)
    if n_tiles > 0:  # each warpgroup summed its own pages' weights: the rows' sum is both
        l_smem.index(W).store(l_i)
        mbarrier.arrive(done.index(W), count=1)
        mbarrier.wait(done.index(1 - W), 0)
        l_i = l_i + l_smem.index(1 - W).load(rows_l)
        _store_half(po_ptr, plse_ptr, part, row_lo, num_rows, o, l_i, m_i, stride_ps, stride_ph,
                    stride_ls, W)


@gluon.jit
def _store_half(po_ptr, plse_ptr, part, row_lo, num_rows, o, l_i, m_i, stride_ps, stride_ph,
                stride_ls, W: gl.constexpr):
    """Write ``O / l`` ``[64 rows, 256]`` into columns ``W * 256 ..`` of the partial of slot
    ``part`` (rows that saw no token: nothing, as :func:`~mlabench.kernels.gluon_blocks.store_partial`
    does), and from warpgroup 0 the rows' ``lse2 = m + log2 l`` (``-inf`` for those rows)."""
    lay: gl.constexpr = o.type.layout  # stored as held: no shared-memory scratch for a layout change
    nonempty = l_i > 0.0
    l_safe = gl.where(nonempty, l_i, 1.0)
    res = o / gl.convert_layout(l_safe, gl.SliceLayout(1, lay))[:, None]
    rows = row_lo + gl.arange(0, PAGE_TOKENS, layout=gl.SliceLayout(1, lay))
    cols = W * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(0, lay))
    written = (rows < num_rows) & gl.convert_layout(nonempty, gl.SliceLayout(1, lay))
    part64 = part.to(gl.int64)
    gl.store(po_ptr + part64 * stride_ps + rows[:, None] * stride_ph + cols[None, :], res,
             mask=written[:, None])
    if W == 0:
        lse2 = gl.where(nonempty, m_i + gl.log2(l_safe), float("-inf"))
        lrows = row_lo + gl.arange(0, PAGE_TOKENS, layout=l_i.type.layout)
        gl.store(plse_ptr + part64 * stride_ls + lrows, lse2, mask=lrows < num_rows)


@gluon.jit
def _pingpong_tiles(dt: gl.constexpr):
    """The P tile ``[64 rows, 64 tokens]``, the exchanged rows (``alpha`` and the running max;
    each warpgroup's sum) and the barriers ``(kv_free, p_ready, done)``: ``kv_free`` counts both
    warpgroups, ``p_ready`` and ``done`` one barrier a warpgroup (its writer)."""
    p_smem = gl.allocate_shared_memory(dt, [PAGE_TOKENS, PAGE_TOKENS],
                                       gl.NVMMASharedLayout.get_default_for([PAGE_TOKENS, PAGE_TOKENS], dt))
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    x_smem = gl.allocate_shared_memory(gl.float32, [2, PAGE_TOKENS], flat)
    l_smem = gl.allocate_shared_memory(gl.float32, [2, PAGE_TOKENS], flat)
    lay: gl.constexpr = mbarrier.MBarrierLayout()
    kv_free = gl.allocate_shared_memory(gl.int64, [2, 1], lay)
    p_ready = gl.allocate_shared_memory(gl.int64, [2, 1], lay)
    done = gl.allocate_shared_memory(gl.int64, [2, 1], lay)
    for i in gl.static_range(2):
        mbarrier.init(kv_free.index(i), count=2)
        mbarrier.init(p_ready.index(i), count=1)
        mbarrier.init(done.index(i), count=1)
    return p_smem, x_smem, l_smem, kv_free, p_ready, done


@gluon.jit(do_not_specialize=["num_splits"])
def _pingpong_stage1(q_ptr, kvn_desc, kvr_desc, bt_ptr, seqlens_ptr, policy_ptr, po_ptr, plse_ptr,
                     num_splits, num_rows, heads_per_token, qk_scale_log2, stride_qb, stride_qh,
                     stride_btb, stride_ps, stride_ph, stride_ls, ROW_TILES: gl.constexpr,
                     QO_LEN: gl.constexpr, CAUSAL: gl.constexpr, POLICY_ROWS: gl.constexpr,
                     PDL: gl.constexpr, WAIT_PRIOR: gl.constexpr, num_warps: gl.constexpr):
    if PDL == 1:  # let the merge grid be scheduled now; it waits for this grid before reading
        launch_dependents()
    b = gl.program_id(0) // ROW_TILES  # the one-token kernel's grid (B * ROW_TILES, S)
    row_lo = (gl.program_id(0) % ROW_TILES) * PAGE_TOKENS
    split = gl.program_id(1)
    seq_len = gl.load(seqlens_ptr + b)
    page_lo, n_tiles, written = split_pages(seq_len, split, num_splits, policy_ptr, POLICY_ROWS,
                                            num_warps)
    bt_row_ptr = bt_ptr + b.to(gl.int64) * stride_btb
    kn_smem, kr_smem, kv_ready = page_ring(kvn_desc, kvr_desc, 2)
    qn_smem, qr_smem = shared_query(kvn_desc.dtype, PAGE_TOKENS)
    p_smem, x_smem, l_smem, kv_free, p_ready, done = _pingpong_tiles(kvn_desc.dtype)
    if WAIT_PRIOR:  # PDL prologue: an empty split touches neither q nor the partials
        if n_tiles > 0:
            wait_prior_grid()
    if n_tiles > 0:
        load_q_tiles(q_ptr, q_ptr + D_NOPE, b, row_lo, num_rows, stride_qb, stride_qh, stride_qb,
                     stride_qh, qn_smem.index(0), qr_smem.index(0), PAGE_TOKENS, num_warps)
        fence_async_shared()
    bars = (kv_ready, kv_free, p_ready, done)
    part = b * num_splits + split
    gl.warp_specialize([
        (_math, (kn_smem, kr_smem, qn_smem, qr_smem, p_smem, x_smem, l_smem, bars, page_lo, n_tiles,
                 seq_len, row_lo, heads_per_token, qk_scale_log2, po_ptr, plse_ptr, part, num_rows,
                 stride_ps, stride_ph, stride_ls, QO_LEN, CAUSAL, 0)),
        (_math, (kn_smem, kr_smem, qn_smem, qr_smem, p_smem, x_smem, l_smem, bars, page_lo, n_tiles,
                 seq_len, row_lo, heads_per_token, qk_scale_log2, po_ptr, plse_ptr, part, num_rows,
                 stride_ps, stride_ph, stride_ls, QO_LEN, CAUSAL, 1)),
        (page_loader, (kvn_desc, kvr_desc, bt_row_ptr, page_lo, n_tiles, (kn_smem, kr_smem),
                       (kv_ready, kv_free), 2)),
    ], [4, 1], [MATH_REGS, LOADER_REGS])
    if PDL == 2:  # the merge's launch overlaps this program's epilogue only
        launch_dependents()


def launch_pingpong_stage1(row_tiles: int, q_rows, descriptors, block_table, cache_seqlens,
                           split_policy, partial_out, partial_lse, splits: int, heads: int,
                           qk_scale_log2: float, qo_len: int, causal: bool, pdl: int,
                           wait_prior: bool) -> None:
    """Launch the ping-pong stage 1 on the grid ``(B * row_tiles, splits)`` of 64-row tiles
    (arguments as :func:`mlabench.kernels.gluon_multi_token.launch_multi_token_stage1` takes them;
    a 2-page ring always).  Writes the partials the wide merge reads."""
    kvn_desc, kvr_desc = descriptors
    batch = block_table.shape[0]
    _pingpong_stage1[(batch * row_tiles, splits)](
        q_rows, kvn_desc, kvr_desc, block_table, cache_seqlens,
        cache_seqlens if split_policy is None else split_policy, partial_out, partial_lse,
        splits, qo_len * heads, heads, qk_scale_log2, q_rows.stride(0), q_rows.stride(1),
        block_table.stride(0), partial_out.stride(0), partial_out.stride(1), partial_lse.stride(0),
        ROW_TILES=row_tiles, QO_LEN=qo_len, CAUSAL=bool(causal) and qo_len > 1,
        POLICY_ROWS=0 if split_policy is None else split_policy.shape[0], PDL=pdl,
        WAIT_PRIOR=wait_prior, num_warps=PP_NUM_WARPS, maxnreg=PP_MAXNREG,
        **({"launch_pdl": True} if wait_prior else {}),
    )
