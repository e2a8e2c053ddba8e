"""gluon-splitkv's stage 1 with the persistent split loop (``KernelVariant.split_loop``), for a
split policy in device memory: a grid no larger than the work.

The grid's split axis holds ``G`` programs (:func:`mlabench.kernels.split_loop.loop_grid_splits`,
host-known, so a captured graph keeps it); program ``p`` of a (request, row tile) runs the
request's splits ``p, p + G, ...`` below its written count, each exactly as the loop-free kernel
runs one split (same pages, same partial slot ``b * S + split``), so the merges read what they
read without the loop.  What the loop shares across a program's splits:

- the page ring and its mbarriers: the ring's use count runs on across splits (``base``, the
  pages consumed so far), so every slot's phase stays right without re-initialising a barrier;
  the page functions of :mod:`mlabench.kernels.gluon_blocks` take page ``t`` of a split starting
  at ``page_lo`` as ring use ``base + t`` of pages shifted by ``page_lo - base``;
- the query tiles, loaded once (every split of a row tile multiplies the same rows);
- the next split's first pages, issued when the current split's last page has been consumed,
  before its partial is stored, so their latency hides under the epilogue.

A program with no split (``p >= written``) loads nothing and stores nothing, as an empty split
does without the loop.  With the fused merge (:mod:`mlabench.kernels.gluon_fused_merge`) the
programs that ran a split arrive once each, after all their partials, and share the columns of
the merge of every written slot.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from mlabench.kernels.common import causal_row_limits
from mlabench.kernels.gluon_blocks import (
    accumulators, attend_page, issue_page, launch_dependents, load_q_tiles, page_ring, row_tiles,
    D_NOPE, split_geometry, split_range, wait_prior_grid, written_splits,
)
from mlabench.kernels.gluon_fused_merge import arrive_and_wait, merge_share


@gluon.jit
def issue_split_start(kvn_desc, kvr_desc, bt_row_ptr, page_lo, base, n_tiles, kn_smem, kr_smem,
                      bars, NUM_STAGES: gl.constexpr):
    """Start the copies of a split's first ``NUM_STAGES - 1`` pages (those it owns), its page
    ``i`` (the request's ``page_lo + i``) as ring use ``base + i``."""
    for i in gl.static_range(NUM_STAGES - 1):
        if i < n_tiles:
            issue_page(kvn_desc, kvr_desc, bt_row_ptr, page_lo - base, base + i, kn_smem, kr_smem,
                       bars, NUM_STAGES)


@gluon.jit
def store_partial_in_place(po_ptr, plse_ptr, slot, row_lo, num_rows, o, l_i, m_i, stride_ps,
                           stride_ph, stride_ls):
    """:func:`~mlabench.kernels.gluon_blocks.store_partial` without its layout conversion: ``O^T /
    l`` stored from the output product's own layout (each warp writes 32-byte runs of a row's
    columns), the lse from the scores'.  The conversion needs 16 KB of scratch beside the page
    ring, which the loop keeps alive across splits: a 64-row tile would then exceed the 227 KB a
    CTA may have.  Same values, same slots, same ``-inf`` rule as ``store_partial``."""
    nonempty = l_i > 0.0
    l_safe = gl.where(nonempty, l_i, 1.0)
    lse2 = gl.where(nonempty, m_i + gl.log2(l_safe), float("-inf"))
    o_rows: gl.constexpr = gl.SliceLayout(0, o.type.layout)
    res = o / gl.convert_layout(l_safe, o_rows)[None, :]
    d = gl.arange(0, D_NOPE, layout=gl.SliceLayout(1, o.type.layout))
    rows = row_lo + gl.arange(0, o.shape[1], layout=o_rows)
    written = (rows < num_rows) & gl.convert_layout(nonempty, o_rows)
    slot64 = slot.to(gl.int64)
    gl.store(po_ptr + slot64 * stride_ps + rows[None, :] * stride_ph + d[:, None], res,
             mask=written[None, :])
    lse_rows = row_lo + gl.arange(0, o.shape[1], layout=lse2.type.layout)
    gl.store(plse_ptr + slot64 * stride_ls + lse_rows, lse2, mask=lse_rows < num_rows)


@gluon.jit
def run_split(kvn_desc, kvr_desc, bt_row_ptr, b, row_lo, seq_len, split, step, base, n_pages,
              per_split, written, kn_smem, kr_smem, bars, qn_smem, qr_smem, p_smem, po_ptr,
              plse_ptr, num_splits, num_rows, heads_per_token, qk_scale_log2, stride_ps,
              stride_ph, stride_ls, BLOCK_R: gl.constexpr, QO_LEN: gl.constexpr,
              CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr, O_WARPS_M: gl.constexpr,
              LAZY_SUM: gl.constexpr, num_warps: gl.constexpr):
    """Split ``split`` of request ``b``'s row tile, its first pages already issued from ring use
    ``base``: its pages (use ``base + t`` holds page ``page_lo + t``), the next split of this
    program's first pages (``split + step``, if below ``written``), then its partial at slot
    ``b * num_splits + split``.  Returns the ring uses so far."""
    page_lo, n_tiles = split_range(split, n_pages, per_split)
    # The page functions read the request's page shift + use.  shift >= 0: the k-th split of
    # program p starts at page (p + k*G) * per_split, past the k * per_split pages used before.
    shift = page_lo - base
    end = base + n_tiles
    o, l_i, m_i, s_zero, offs_t, rows = accumulators(row_lo, BLOCK_R, O_WARPS_M, LAZY_SUM,
                                                     num_warps)
    row_lim = causal_row_limits(seq_len, rows, heads_per_token, QO_LEN)
    for t in range(base, end):
        ahead = t + NUM_STAGES - 1
        if ahead < end:  # its slot was released when use t - 1's products completed
            issue_page(kvn_desc, kvr_desc, bt_row_ptr, shift, ahead, kn_smem, kr_smem, bars,
                       NUM_STAGES)
        o, l_i, m_i = attend_page(t, shift, seq_len, kn_smem, kr_smem, bars, qn_smem, qr_smem,
                                  p_smem, s_zero, offs_t, row_lim, qk_scale_log2, o, l_i, m_i,
                                  NUM_STAGES, CAUSAL, LAZY_SUM, num_warps)
    if split + step < written:  # the next split's first pages load under this epilogue
        next_lo, next_tiles = split_range(split + step, n_pages, per_split)
        issue_split_start(kvn_desc, kvr_desc, bt_row_ptr, next_lo, end, next_tiles, kn_smem,
                          kr_smem, bars, NUM_STAGES)
    if LAZY_SUM:
        l_i = gl.sum(l_i, axis=0)
    store_partial_in_place(po_ptr, plse_ptr, b * num_splits + split, row_lo, num_rows, o, l_i,
                           m_i, stride_ps, stride_ph, stride_ls)
    return end


@gluon.jit(do_not_specialize=["num_splits"])
def stage1_split_loop(q_ptr, qr_ptr, kvn_desc, kvr_desc, bt_ptr, seqlens_ptr, policy_ptr, po_ptr,
                      plse_ptr, out_ptr, sync_ptr, num_splits, num_rows, heads_per_token,
                      qk_scale_log2, stride_qb, stride_qh, stride_qrb, stride_qrh, stride_btb,
                      stride_ps, stride_ph, stride_ls, stride_ob, stride_oh, BLOCK_R: gl.constexpr,
                      ROW_TILES: gl.constexpr, QO_LEN: gl.constexpr, CAUSAL: gl.constexpr,
                      POLICY_ROWS: gl.constexpr, NUM_STAGES: gl.constexpr, PDL: gl.constexpr,
                      O_WARPS_M: gl.constexpr, LAZY_SUM: gl.constexpr, WAIT_PRIOR: gl.constexpr,
                      FUSED: gl.constexpr, MERGE_COLS: gl.constexpr, MERGE_SPLITS: gl.constexpr,
                      M_TS: gl.constexpr, M_TR: gl.constexpr, M_TC: gl.constexpr,
                      M_WS: gl.constexpr, M_WR: gl.constexpr, num_warps: gl.constexpr):
    """Stage 1 on the grid ``(B * ROW_TILES, G)``: the loop-free kernel's arguments
    (:func:`mlabench.kernels.gluon_splitkv._gluon_splitkv_stage1`), ``num_splits`` the most splits
    a request may take (its slots in the workspace), ``G`` = ``num_programs(1)``.  With ``FUSED``
    the programs that ran a split meet at the (request, row tile)'s barrier once all their
    partials are stored, ``min(written, G)`` of them, and share the merge of all ``written``
    slots."""
    if PDL == 1:  # let the merge grid be scheduled now; it waits for this grid before reading
        launch_dependents()
    b = gl.program_id(0) // ROW_TILES
    row_lo = (gl.program_id(0) % ROW_TILES) * BLOCK_R
    first = gl.program_id(1)
    step = gl.num_programs(1)
    seq_len = gl.load(seqlens_ptr + b)
    n_pages, per_split = split_geometry(seq_len, num_splits, policy_ptr, POLICY_ROWS, False, num_warps)
    written = written_splits(n_pages, per_split)
    bt_row_ptr = bt_ptr + b.to(gl.int64) * stride_btb

    kn_smem, kr_smem, bars = page_ring(kvn_desc, kvr_desc, NUM_STAGES)
    if WAIT_PRIOR:  # as without the loop: a program with no split touches nothing, waits for nothing
        if first < written:
            wait_prior_grid()
    page_lo, n_tiles = split_range(first, n_pages, per_split)
    issue_split_start(kvn_desc, kvr_desc, bt_row_ptr, page_lo, 0, n_tiles, kn_smem, kr_smem, bars,
                      NUM_STAGES)
    qn_smem, qr_smem, p_smem = row_tiles(kvn_desc.dtype, BLOCK_R)
    if first < written:  # the query tiles serve every split of this program
        load_q_tiles(q_ptr, qr_ptr, b, row_lo, num_rows, stride_qb, stride_qh, stride_qrb,
                     stride_qrh, qn_smem, qr_smem, BLOCK_R, num_warps)
        fence_async_shared()
    base = 0  # ring uses so far: page t of the current split is use base + t
    for split in range(first, written, step):
        base = run_split(kvn_desc, kvr_desc, bt_row_ptr, b, row_lo, seq_len, split, step, base,
                         n_pages, per_split, written, kn_smem, kr_smem, bars, qn_smem, qr_smem,
                         p_smem, po_ptr, plse_ptr, num_splits, num_rows, heads_per_token,
                         qk_scale_log2, stride_ps, stride_ph, stride_ls, BLOCK_R, QO_LEN, CAUSAL,
                         NUM_STAGES, O_WARPS_M, LAZY_SUM, num_warps)
    if PDL == 2:  # the merge's launch overlaps this program's last epilogue only
        launch_dependents()
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(bars.index(i))
    if FUSED:  # the programs that ran a split merge the request's written splits together
        if first < written:
            participants = gl.minimum(written, step)
            arrive_and_wait(sync_ptr, gl.program_id(0), participants)
            merge_share(po_ptr, plse_ptr, out_ptr + b.to(gl.int64) * stride_ob, b * num_splits,
                        first, participants, written, row_lo, num_rows, stride_ps, stride_ph,
                        stride_ls, stride_oh, BLOCK_R, MERGE_COLS, MERGE_SPLITS, M_TS, M_TR, M_TC,
                        M_WS, M_WR)
