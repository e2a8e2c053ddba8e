"""The page feed of gluon-splitkv's multi-token stage 1 (:mod:`mlabench.kernels.gluon_multi_token`):
its loader warp, the output warps' refill of a slot where there is no loader warp (``rows_as_m``
3), the score product of a landed page, and the shared-memory tiles and mbarriers of the
partitions' hand-overs.  Every function is inlined into that kernel.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier, warpgroup_mma, warpgroup_mma_wait,
)

from mlabench.kernels.gluon_blocks import (
    D_NOPE, PAGE_TOKENS, copy_page, issue_page, partition_barrier,
)


@gluon.jit
def loader_partition(kvn_desc, kvr_desc, bt_row_ptr, page_lo, n_tiles, seq_len, row_lo,
                     heads_per_token, qk_scale_log2, smem, bars, BLOCK_R: gl.constexpr,
                     QO_LEN: gl.constexpr, CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr,
                     SCORES_FIRST: gl.constexpr, ROWS_M: gl.constexpr, ISOLATE: gl.constexpr):
    """Loader partition: page ``t`` into slot ``t % NUM_STAGES`` once the slot is free (a fresh
    mbarrier counts as having completed the phase before its first, so the first pages go at
    once)."""
    kn_smem, kr_smem = smem[0], smem[1]
    kv_ready, kv_free = bars[0], bars[1]
    for t in range(n_tiles):
        slot = t % NUM_STAGES
        mbarrier.wait(kv_free.index(slot), ((t // NUM_STAGES) & 1) ^ 1)
        if ISOLATE == 1 and t >= NUM_STAGES:  # products alone: the slot "lands" as it is
            mbarrier.arrive(kv_ready.index(slot), count=1)
        else:
            issue_page(kvn_desc, kvr_desc, bt_row_ptr, page_lo, t, kn_smem, kr_smem, kv_ready,
                       NUM_STAGES)


@gluon.jit
def page_scores(t, kn_smem, kr_smem, qn_smem, qr_smem, kv_ready, dead, NUM_STAGES: gl.constexpr,
                ROWS_M: gl.constexpr):
    """``S^T = K Q^T`` (``[64, rows]``; ``S = Q K^T``, ``[rows, 64]``, for ``ROWS_M`` 2 and 3) of page
    ``t`` of the ring (latent and RoPE parts) once it has landed, into the registers of ``dead``
    (a score tensor no longer read: its values are not used, so no zero tile stays live)."""
    slot = t % NUM_STAGES
    q = t >> 30  # 0 (a split has far fewer pages), but not provably so: see shared_tiles
    mbarrier.wait(kv_ready.index(slot), (t // NUM_STAGES) & 1)
    if ROWS_M >= 2:
        s = warpgroup_mma(qn_smem.index(q), kn_smem.index(slot).permute((1, 0)), dead,
                          use_acc=False, is_async=True)
        s = warpgroup_mma(qr_smem.index(q), kr_smem.index(slot).permute((1, 0)), s, is_async=True)
    else:
        s = warpgroup_mma(kn_smem.index(slot), qn_smem.index(q).permute((1, 0)), dead,
                          use_acc=False, is_async=True)
        s = warpgroup_mma(kr_smem.index(slot), qr_smem.index(q).permute((1, 0)), s, is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(s,))


@gluon.jit
def pages_read(n_tiles, kv_ready, p_ready, p_free, NUM_STAGES: gl.constexpr,
               P_BUFS: gl.constexpr, ISOLATE: gl.constexpr):
    """The pages the softmax partition reads: ``n_tiles``, or none with ``ISOLATE`` 2 (copies
    alone), each page then handed on unread once it has landed."""
    pages = n_tiles
    if ISOLATE == 2:
        for t in range(n_tiles):
            mbarrier.wait(kv_ready.index(t % NUM_STAGES), (t // NUM_STAGES) & 1)
            mbarrier.wait(p_free.index(t % P_BUFS), ((t // P_BUFS) & 1) ^ 1)
            mbarrier.arrive(p_ready.index(t % P_BUFS), count=1)
        pages = 0
    return pages


@gluon.jit
def shared_tiles(dt: gl.constexpr, BLOCK_R: gl.constexpr, P_BUFS: gl.constexpr):
    """The query tiles ``[1, BLOCK_R, 512]``/``[1, BLOCK_R, 64]``, ``P_BUFS`` P^T (or P) tiles
    ``[64, BLOCK_R]``, their ``alpha`` rows and the final ``(m, l)`` rows (fp32).

    The query tiles have a leading dimension of 1 that the score product indexes with a value
    the compiler cannot prove to be 0 (:func:`page_scores`): with a constant index, Triton 3.6 hoists
    the 36 wgmma descriptors of the query out of the page loop, 64 bits each, and keeps them in
    about 70 registers of the softmax warpgroup, which then spilled 42-54 values a page (Triton
    3.9 keeps only their low halves, in uniform registers).  Computed in the loop, they are a
    uniform add each, as the page's own descriptors are."""
    qn_smem = gl.allocate_shared_memory(dt, [1, BLOCK_R, D_NOPE],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_R, D_NOPE], dt))
    qr_smem = gl.allocate_shared_memory(dt, [1, BLOCK_R, 64],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_R, 64], dt))
    p_smem = gl.allocate_shared_memory(dt, [P_BUFS, PAGE_TOKENS, BLOCK_R],
                                       gl.NVMMASharedLayout.get_default_for([PAGE_TOKENS, BLOCK_R], dt))
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    a_smem = gl.allocate_shared_memory(gl.float32, [P_BUFS, BLOCK_R], flat)
    ml_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_R], flat)
    return qn_smem, qr_smem, p_smem, a_smem, ml_smem


@gluon.jit
def mt_barriers(NUM_STAGES: gl.constexpr, P_BUFS: gl.constexpr):
    """``(kv_ready, kv_free, p_ready, p_free, done)``, each mbarrier initialised to one arrival."""
    lay: gl.constexpr = mbarrier.MBarrierLayout()
    kv_free = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], lay)
    p_ready = gl.allocate_shared_memory(gl.int64, [P_BUFS, 1], lay)
    p_free = gl.allocate_shared_memory(gl.int64, [P_BUFS, 1], lay)
    done = gl.allocate_shared_memory(gl.int64, [1, 1], lay)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(kv_free.index(i), count=1)
    for i in gl.static_range(P_BUFS):
        mbarrier.init(p_ready.index(i), count=1)
        mbarrier.init(p_free.index(i), count=1)
    mbarrier.init(done.index(0), count=1)
    return kv_free, p_ready, p_free, done


@gluon.jit
def refill_slot(pages, page, t, n_tiles, kn_smem, kr_smem, kv_ready, NUM_STAGES: gl.constexpr,
                ISOLATE: gl.constexpr):
    """Where the output warps copy the pages (``rows_as_m`` 3, no loader warp): once both output
    warpgroups' products of page ``t`` have read its slot (a barrier of the partition), start the
    copy of page ``t + NUM_STAGES`` there, ``page`` its block-table entry, loaded earlier (with
    ``ISOLATE`` 1 the slot is marked landed as it is: the products alone).
    ``pages``: ``(kvn_desc, kvr_desc, ...)``."""
    partition_barrier()
    slot = t % NUM_STAGES
    if t + NUM_STAGES < n_tiles:
        if ISOLATE == 1:
            mbarrier.arrive(kv_ready.index(slot), count=1)
        else:
            copy_page(pages[0], pages[1], page, slot, kn_smem, kr_smem, kv_ready)
