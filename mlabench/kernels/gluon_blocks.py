"""Gluon building blocks of the Hopper split-KV MLA decode (:mod:`mlabench.kernels.gluon_splitkv`):
the page ring and its TMA copies, the query and P tiles, one page's products and online-softmax
step, the split's pages (from a fixed count or a policy table in device memory), and the stores of
a split's partial.  Every function is inlined into the one kernel that calls them.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)

from mlabench.kernels.row_tiling import PAGE_TOKENS as PAGE_SIZE  # the only page size read

#: Kernel-side constants: latent width (also V and the output), RoPE width, page tokens.
D_NOPE = gl.constexpr(512)
D_ROPE = gl.constexpr(64)
PAGE_TOKENS = gl.constexpr(PAGE_SIZE)
#: The TMA global-to-shared copy is ``async_copy_global_to_shared`` in Triton 3.6 and ``async_load``
#: from 3.7 on.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
#: The barrier of a partition's (or the CTA's) warps: ``thread_barrier`` in Triton 3.6, ``barrier``
#: later.
partition_barrier = getattr(gl, "thread_barrier", None) or gl.barrier


@gluon.jit
def issue_page(kvn_desc, kvr_desc, bt_row_ptr, page_lo, t, kn_smem, kr_smem, bars,
               NUM_STAGES: gl.constexpr):
    """Start the two bulk copies of the request's page ``page_lo + t`` into ring slot
    ``t % NUM_STAGES``; they complete on that slot's mbarrier."""
    copy_page(kvn_desc, kvr_desc, gl.load(bt_row_ptr + page_lo + t), t % NUM_STAGES, kn_smem,
              kr_smem, bars)


@gluon.jit
def copy_page(kvn_desc, kvr_desc, page, slot, kn_smem, kr_smem, bars):
    """Start the two bulk copies of cache page ``page`` (its block-table entry) into ring slot
    ``slot``; they complete on that slot's mbarrier."""
    row = page * PAGE_TOKENS
    bar = bars.index(slot)
    mbarrier.expect(bar, kvn_desc.block_type.nbytes + kvr_desc.block_type.nbytes)
    _tma_load(kvn_desc, [row, 0], bar, kn_smem.index(slot))
    _tma_load(kvr_desc, [row, D_NOPE], bar, kr_smem.index(slot))


@gluon.jit
def issue_first_pages(kvn_desc, kvr_desc, bt_row_ptr, page_lo, n_tiles, kn_smem, kr_smem, bars,
                      NUM_STAGES: gl.constexpr, PAGES: gl.constexpr):
    """Start the copies of the split's first ``PAGES`` pages (those it owns; at most
    ``NUM_STAGES``, one a ring slot): ``NUM_STAGES - 1`` where the page loop copies each next
    page itself, the whole ring where the multi-token kernel's output warps refill it."""
    for i in gl.static_range(PAGES):
        if i < n_tiles:
            issue_page(kvn_desc, kvr_desc, bt_row_ptr, page_lo, i, kn_smem, kr_smem, bars,
                       NUM_STAGES)


@gluon.jit
def load_q_tiles(q_ptr, qr_ptr, b, row_lo, num_rows, stride_qb, stride_qh, stride_qrb, stride_qrh,
                 qn_smem, qr_smem, BLOCK_R: gl.constexpr, num_warps: gl.constexpr):
    """Copy packed rows ``row_lo .. row_lo + BLOCK_R`` of request ``b`` (rows past ``num_rows``
    zero) into the two shared-memory query tiles: ``[BLOCK_R, 512]`` from the latent columns at
    ``q_ptr`` and ``[BLOCK_R, 64]`` from the RoPE columns at ``qr_ptr``, each with its own request
    and row strides (one 576-wide query: ``qr_ptr`` is ``q_ptr + 512`` with q's strides)."""
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
    rows = row_lo + gl.arange(0, BLOCK_R, layout=gl.SliceLayout(1, ld))
    rmask = rows < num_rows
    base = q_ptr + b.to(gl.int64) * stride_qb + rows[:, None] * stride_qh
    cols = gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, ld))
    qn_smem.store(gl.load(base + cols[None, :], mask=rmask[:, None], other=0.0))
    rbase = qr_ptr + b.to(gl.int64) * stride_qrb + rows[:, None] * stride_qrh
    rcols = gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, ld))
    qr_smem.store(gl.load(rbase + rcols[None, :], mask=rmask[:, None], other=0.0))


@gluon.jit
def store_partial(po_ptr, plse_ptr, slot, row_lo, num_rows, o, l_i, m_i, stride_ps, stride_ph,
                  stride_ls, BLOCK_R: gl.constexpr, num_warps: gl.constexpr):
    """Write ``O^T / l`` as the partial ``[BLOCK_R rows, 512]`` of ``slot`` and ``lse2 = m +
    log2 l``.  A row that saw no token gets ``lse2 = -inf`` and no partial at all: the merge
    (:func:`mlabench.kernels.wide_merge.wide_merge`) weights it 0 and never reads its partial.  A
    split that owns no page calls nothing here: the merge knows from the lengths that it wrote
    nothing."""
    st: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, num_warps], [0, 1])
    nonempty = l_i > 0.0
    l_safe = gl.where(nonempty, l_i, 1.0)
    lse2 = gl.where(nonempty, m_i + gl.log2(l_safe), float("-inf"))
    res = gl.convert_layout(o / gl.convert_layout(l_safe, gl.SliceLayout(0, o.type.layout))[None, :],
                            st)
    d = gl.arange(0, D_NOPE, layout=gl.SliceLayout(1, st))
    rows = row_lo + gl.arange(0, BLOCK_R, layout=gl.SliceLayout(0, st))
    written = (rows < num_rows) & gl.convert_layout(nonempty, gl.SliceLayout(0, st))
    slot64 = slot.to(gl.int64)
    ptrs = po_ptr + slot64 * stride_ps + rows[None, :] * stride_ph + d[:, None]
    gl.store(ptrs, res, mask=written[None, :])
    lse_st = gl.convert_layout(lse2, gl.SliceLayout(0, st))
    gl.store(plse_ptr + slot64 * stride_ls + rows, lse_st, mask=rows < num_rows)


@gluon.jit
def zero_rows_from(tile, first, num_warps: gl.constexpr):
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
def launch_dependents():
    """``griddepcontrol.launch_dependents``: the next grid, launched as a programmatic dependent
    launch, may be scheduled once every program of this one has executed it (or exited)."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def wait_prior_grid():
    """``griddepcontrol.wait``: block until the grid this one was launched as a programmatic
    dependent of has completed and its memory is visible (a no-op in an ordinary launch)."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def policy_rows(policy_ptr, POLICY_ROWS: gl.constexpr, num_warps: gl.constexpr):
    """The rows of a policy table in device memory, ``POLICY_ROWS`` int32 pairs ``(max_context_len,
    num_kv_splits)`` (a power of two of them, padded as
    :meth:`mlabench.policy.device_table.SplitPolicy.device_table` pads), as :func:`lookup_splits`
    reads them: ``(rows, max_len, prev_len, splits)``, the row indices and each row's values over
    one lane a row or more (masked past ``POLICY_ROWS``; ``prev_len`` the row before's maximum, -1
    for the first)."""
    # At least one row a lane: a whole-warp sum is one redux.sync whose result the compiler knows
    # is the same in every lane; over fewer rows it is a partial butterfly, a per-lane value, and
    # the TMA coordinates built from it (uniform registers) cost the kernel ~200 instructions.
    LANES: gl.constexpr = 32 * ((POLICY_ROWS + 31) // 32)
    lay: gl.constexpr = gl.BlockedLayout([LANES // 32], [32], [num_warps], [0])
    rows = gl.arange(0, LANES, layout=lay)
    real = rows < POLICY_ROWS
    max_len = gl.load(policy_ptr + 2 * rows, mask=real, other=0)
    prev_len = gl.load(policy_ptr + 2 * rows - 2, mask=real & (rows > 0), other=-1)
    splits = gl.load(policy_ptr + 2 * rows + 1, mask=real, other=0)
    return rows, max_len, prev_len, splits


@gluon.jit
def policy_table(policy_ptr, POLICY_ROWS: gl.constexpr, TABLE_FIRST: gl.constexpr,
                 num_warps: gl.constexpr):
    """What :func:`split_pages` reads as ``table``: with ``TABLE_FIRST`` and ``POLICY_ROWS > 0``
    the rows (:func:`policy_rows`), loaded now, before the request's length, so that the two
    loads overlap instead of adding up; else ``policy_ptr``, whose rows :func:`lookup_splits`
    loads after the length, and only in a split that owns pages.  A kernel with the fused merge
    loads them first (on an H100, batch 16 at 1K: device mode's own cost from +3.5% to +0.9-1.6%
    of the best count), one with the wide merge after (first, batch 1 ran 2.9-4.1 µs slower from
    64K on the 132-split grid, a cause not found): results/h100/deploy/README.md, "The table's rows
    before the length"."""
    if TABLE_FIRST and POLICY_ROWS > 0:
        table = policy_rows(policy_ptr, POLICY_ROWS, num_warps)
    else:
        table = policy_ptr
    return table


@gluon.jit
def lookup_splits(seq_len, table, cap, POLICY_ROWS: gl.constexpr, TABLE_FIRST: gl.constexpr,
                  num_warps: gl.constexpr):
    """A request's split count from a policy table (:func:`policy_table`'s ``table``: its rows,
    loaded, with ``TABLE_FIRST``, else the pointer to load them from): the count of the first row
    with ``seq_len <= max_context_len``, else of the last; a negative count ``-t`` (a row standing
    for a run of tokens-per-split rows, :func:`mlabench.policy.device_table.rule_rows`) gives
    ``ceil(seq_len / t)``; then clamped to ``[1, cap]``.  The rule of
    :meth:`~mlabench.policy.device_table.SplitPolicy.lookup` and of the Triton kernels'
    :func:`mlabench.kernels.common.policy_splits` (Gluon needs the layout spelled out).  Every
    warp holds the whole table (at least one row a lane), so the one reduction stays inside a warp
    (no shared-memory round trip, no barrier before the first page is requested) and its result is
    warp-uniform.  The rows' ``max_context_len`` increase strictly (padding rows repeat ``2**31 -
    1``), so exactly one row's range ``(previous max, own max]`` (the last's open above) holds the
    length."""
    if TABLE_FIRST:
        rows, max_len, prev_len, splits = table
    else:
        rows, max_len, prev_len, splits = policy_rows(table, POLICY_ROWS, num_warps)
    # The matching row is the one whose range (previous row's max, own max] holds the length (the
    # last row's range open above): one reduction, not a first-row index then a second one.
    match = (rows < POLICY_ROWS) & (seq_len > prev_len) & ((seq_len <= max_len) | (rows == POLICY_ROWS - 1))
    chosen = gl.sum(gl.where(match, splits, 0), axis=0)
    if chosen < 0:  # a rule row: the division only where one matched (a uniform branch)
        chosen = gl.cdiv(seq_len, -chosen)
    return gl.minimum(gl.maximum(chosen, 1), cap)


@gluon.jit
def split_geometry(seq_len, num_splits, table, POLICY_ROWS: gl.constexpr, TABLE_FIRST: gl.constexpr,
                   num_warps: gl.constexpr):
    """``(pages, pages per split)`` of a request of ``seq_len`` tokens cut into its own count
    (``num_splits``, or with ``POLICY_ROWS > 0`` the policy's, from :func:`policy_table`'s
    ``table``, at most ``num_splits``) of ``ceil(pages / count)`` pages each.  The host's model is
    :func:`mlabench.kernels.split_loop.split_geometry`."""
    if POLICY_ROWS > 0:  # the request's own count; splits past it own no page
        own = lookup_splits(seq_len, table, num_splits, POLICY_ROWS, TABLE_FIRST, num_warps)
    else:
        own = num_splits
    n_pages = gl.cdiv(seq_len, PAGE_TOKENS)
    return n_pages, gl.cdiv(n_pages, own)


@gluon.jit
def split_range(split, n_pages, per_split):
    """``(first page, pages)`` of split ``split`` of :func:`split_geometry`'s request: 0 pages past
    its last page."""
    page_lo = gl.minimum(split * per_split, n_pages)
    return page_lo, gl.minimum(page_lo + per_split, n_pages) - page_lo


@gluon.jit
def written_splits(n_pages, per_split):
    """How many of :func:`split_geometry`'s splits own a page (the first ones): the count
    :func:`mlabench.kernels.wide_merge.written_splits` derives for the merge."""
    return gl.cdiv(n_pages, gl.maximum(per_split, 1))


@gluon.jit
def split_pages(seq_len, split, num_splits, table, POLICY_ROWS: gl.constexpr, TABLE_FIRST: gl.constexpr,
                num_warps: gl.constexpr):
    """``(first page, pages, written)`` of split ``split`` of a request of ``seq_len`` tokens
    (:func:`split_geometry`, :func:`split_range`, :func:`written_splits`); 0 pages past the
    request's last page or its count.  With a policy table a split at or past the request's
    page count owns no page at any count, so it skips the lookup and exits sooner (``written``
    is then 0: it stores nothing); ``table``: :func:`policy_table`'s."""
    if POLICY_ROWS > 0:
        n_pages = gl.cdiv(seq_len, PAGE_TOKENS)
        page_lo = n_pages
        n_tiles = n_pages - n_pages
        written = n_tiles
        if split < n_pages:  # the lookup's loads, reduction and division only where they count
            n_pages, per_split = split_geometry(seq_len, num_splits, table, POLICY_ROWS, TABLE_FIRST,
                                                num_warps)
            page_lo, n_tiles = split_range(split, n_pages, per_split)
            written = written_splits(n_pages, per_split)
    else:
        n_pages, per_split = split_geometry(seq_len, num_splits, table, POLICY_ROWS, TABLE_FIRST, num_warps)
        page_lo = gl.minimum(split * per_split, n_pages)  # split_range's, in main's order (same PTX)
        written = written_splits(n_pages, per_split)
        n_tiles = gl.minimum(page_lo + per_split, n_pages) - page_lo
    return page_lo, n_tiles, written


@gluon.jit
def program_split(seqlens_ptr, bt_ptr, stride_btb, num_splits, policy_ptr,
                  ROW_TILES: gl.constexpr, BLOCK_R: gl.constexpr, POLICY_ROWS: gl.constexpr,
                  TABLE_FIRST: gl.constexpr, num_warps: gl.constexpr):
    """What a stage-1 program of the grid ``(B * ROW_TILES, S)`` works on (a request's row tiles
    next to each other, so they share its pages in L2): ``(b, row_lo, split, seq_len, page_lo,
    n_tiles, written, bt_row_ptr)``, its request, first row, split, the request's length, the
    split's pages (:func:`split_pages`; ``TABLE_FIRST``: :func:`policy_table`'s) and the request's
    block-table row."""
    b = gl.program_id(0) // ROW_TILES
    row_lo = (gl.program_id(0) % ROW_TILES) * BLOCK_R
    split = gl.program_id(1)
    table = policy_table(policy_ptr, POLICY_ROWS, TABLE_FIRST, num_warps)
    seq_len = gl.load(seqlens_ptr + b)
    page_lo, n_tiles, written = split_pages(seq_len, split, num_splits, table, POLICY_ROWS, TABLE_FIRST,
                                            num_warps)
    return b, row_lo, split, seq_len, page_lo, n_tiles, written, bt_ptr + b.to(gl.int64) * stride_btb


@gluon.jit
def scaled_scores(s, tok, seq_len, row_lim, qk_scale_log2, CAUSAL: gl.constexpr,
                  TOKEN_AXIS: gl.constexpr = 0):
    """Scores ``S^T [64 tokens, rows]`` (``TOKEN_AXIS`` 0) or ``S [rows, 64 tokens]`` (1) in
    base-2 units, ``-inf`` for tokens past the length and, under ``CAUSAL``, past each row's key
    limit ``row_lim``."""
    tok2 = gl.expand_dims(tok, 1 - TOKEN_AXIS)
    seen = tok2 < seq_len
    if CAUSAL:  # row_lim [rows] (a scalar otherwise, not read)
        seen = seen & (tok2 < gl.expand_dims(row_lim, TOKEN_AXIS))
    return gl.where(seen, s * qk_scale_log2, float("-inf"))


@gluon.jit
def softmax_step(s, m_i, CAUSAL: gl.constexpr, TOKEN_AXIS: gl.constexpr = 0):
    """One page of the online softmax over ``S^T [64, rows]`` (``TOKEN_AXIS`` 0) or ``S [rows,
    64]`` (1): ``(p, alpha, m_new)`` with the running max ``m_new``, the page's weights ``p =
    2^(s - m_new)`` and the rescale ``alpha`` of what came before."""
    m_new = gl.maximum(m_i, gl.max(s, axis=TOKEN_AXIS))
    if CAUSAL:  # a row may have seen no key yet: keep -inf - -inf out of the exponent
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    else:  # finite: a page holds >= 1 valid token
        m_use = m_new
    alpha = gl.exp2(m_i - m_use)
    return gl.exp2(s - gl.expand_dims(m_use, TOKEN_AXIS)), alpha, m_new


@gluon.jit
def page_ring(kvn_desc, kvr_desc, NUM_STAGES: gl.constexpr):
    """The shared-memory ring of ``NUM_STAGES`` pages (latent ``[64, 512]`` and RoPE ``[64, 64]``
    tiles in the TMA layout) and one initialised mbarrier per slot."""
    kn_smem = gl.allocate_shared_memory(kvn_desc.dtype, [NUM_STAGES] + kvn_desc.block_type.shape,
                                        kvn_desc.layout)
    kr_smem = gl.allocate_shared_memory(kvr_desc.dtype, [NUM_STAGES] + kvr_desc.block_type.shape,
                                        kvr_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(bars.index(i), count=1)
    return kn_smem, kr_smem, bars


@gluon.jit
def row_tiles(dt: gl.constexpr, BLOCK_R: gl.constexpr):
    """The shared-memory query tiles ``[BLOCK_R, 512]`` and ``[BLOCK_R, 64]`` (the B operand of the
    score product) and the P tile ``[64, BLOCK_R]`` (the B operand of the output product)."""
    qn_smem = gl.allocate_shared_memory(dt, [BLOCK_R, D_NOPE],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_R, D_NOPE], dt))
    qr_smem = gl.allocate_shared_memory(dt, [BLOCK_R, D_ROPE],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_R, D_ROPE], dt))
    p_smem = gl.allocate_shared_memory(dt, [PAGE_TOKENS, BLOCK_R],
                                       gl.NVMMASharedLayout.get_default_for([PAGE_TOKENS, BLOCK_R], dt))
    return qn_smem, qr_smem, p_smem


@gluon.jit
def accumulators(row_lo, BLOCK_R: gl.constexpr, O_WARPS_M: gl.constexpr, LAZY_SUM: gl.constexpr,
                 num_warps: gl.constexpr):
    """A split's starting state: ``(o, l_i, m_i, s_zero, offs_t, rows)``.

    The score product's layout: one warpgroup for 16 rows, two side by side on its N (the rows)
    for 32 and 64 (:class:`~mlabench.kernels.row_tiling.RowTiling`).  The output accumulator
    ``O^T [512, BLOCK_R]`` fp32 may stack its warps on its 512 rows instead (``O_WARPS_M`` =
    ``num_warps``: each warpgroup reads half of V^T).  ``l_i`` is ``[64, BLOCK_R]`` under
    ``LAZY_SUM``, else ``[BLOCK_R]``; ``m_i`` starts at ``-inf``; ``offs_t`` are a page's token
    offsets and ``rows`` the tile's packed row indices, both in the score layout."""
    WG_N: gl.constexpr = num_warps // 4
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, WG_N],
                                                  instr_shape=[16, BLOCK_R // WG_N, 16])
    O_WN: gl.constexpr = num_warps // O_WARPS_M
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[O_WARPS_M, O_WN],
                                                    instr_shape=[16, BLOCK_R // O_WN, 16])
    o = gl.zeros([D_NOPE, BLOCK_R], gl.float32, layout=mma_o)
    m_i = gl.full([BLOCK_R], float("-inf"), gl.float32, layout=gl.SliceLayout(0, mma))
    s_zero = gl.zeros([PAGE_TOKENS, BLOCK_R], gl.float32, layout=mma)
    if LAZY_SUM:
        l_i = gl.zeros([PAGE_TOKENS, BLOCK_R], gl.float32, layout=mma)
    else:
        l_i = gl.zeros([BLOCK_R], gl.float32, layout=gl.SliceLayout(0, mma))
    offs_t = gl.arange(0, PAGE_TOKENS, layout=gl.SliceLayout(1, mma))
    rows = row_lo + gl.arange(0, BLOCK_R, layout=gl.SliceLayout(0, mma))
    return o, l_i, m_i, s_zero, offs_t, rows


@gluon.jit
def attend_page(t, page_lo, seq_len, kn_smem, kr_smem, bars, qn_smem, qr_smem, p_smem, s_zero,
                offs_t, row_lim, qk_scale_log2, o, l_i, m_i, NUM_STAGES: gl.constexpr,
                CAUSAL: gl.constexpr, LAZY_SUM: gl.constexpr, num_warps: gl.constexpr):
    """Page ``t`` of the split, once its copies have landed: ``S^T = K Q^T`` (two wgmma, the
    latent and the RoPE part), the masks, one online-softmax step, ``O^T += V^T P^T`` (V is the
    page's latent tile read transposed).  ``o`` may have its own layout (the output product's
    warps stacked on its 512 rows); ``alpha`` is converted to it.  ``LAZY_SUM``: ``l_i`` is the
    ``[64, rows]`` elementwise sum of the weights, reduced over tokens once after the last page,
    not per page.  Returns the updated ``(o, l_i, m_i)``."""
    slot = t % NUM_STAGES
    mbarrier.wait(bars.index(slot), (t // NUM_STAGES) & 1)
    kn = kn_smem.index(slot)
    s = warpgroup_mma(kn, qn_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma(kr_smem.index(slot), qr_smem.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    tok = (page_lo + t) * PAGE_TOKENS + offs_t
    s = scaled_scores(s, tok, seq_len, row_lim, qk_scale_log2, CAUSAL)
    if (page_lo + t + 1) * PAGE_TOKENS > seq_len:  # the last page: rows past the length
        zero_rows_from(kn, seq_len - (page_lo + t) * PAGE_TOKENS, num_warps)
    p, alpha, m_new = softmax_step(s, m_i, CAUSAL)
    if LAZY_SUM:
        l_i = l_i * alpha[None, :] + p
    else:
        l_i = l_i * alpha + gl.sum(p, axis=0)
    o = o * gl.convert_layout(alpha, gl.SliceLayout(0, o.type.layout))[None, :]
    p_smem.store(p.to(p_smem.dtype))
    fence_async_shared()
    o = warpgroup_mma(kn.permute((1, 0)), p_smem, o, is_async=True)
    o = warpgroup_mma_wait(num_outstanding=0, deps=(o,))
    return o, l_i, m_new
