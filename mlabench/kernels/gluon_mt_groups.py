"""Two softmax warpgroups for gluon-splitkv's multi-token stage 1 (``rows_as_m`` 4; the kernel:
:mod:`mlabench.kernels.gluon_multi_token`).

With one softmax warpgroup a 64-row page costs its score product (36 ``m64n64k16`` from shared
memory) and then its softmax, one after the other in the same four warps, and the output warps
wait for the weights more than half of their time (docs/multi-token-tile.md, "Where a page's
time goes").  Here two warpgroups take alternate pages (group ``g`` the pages ``t`` with ``t % 2
== g``): both pages' score products are in flight at once, and one page's softmax runs beside
the other's product.  What stays serial is the running max: page ``t``'s weights are taken
against the max after page ``t - 1``, which the other group stores (``mx_smem[(t - 1) % 2]``,
``m_ready``) as soon as it has it, before its exponentials.  Each group sums its own pages'
weights relative to the last max it saw and hands ``(m, l)`` over at the end; the output warps
combine the two (:func:`final_rows`).  A page's weights go to the output warps in its ring
slot's RoPE tile (``[64, 64]`` bf16, the P tile's shape and layout), which only its score product
reads and which is refilled only after its output product: one P tile a slot, where a separate
second one would not fit (224 KB of the 227 a block may have), so a group need not wait for the
previous page's output product before storing its weights.

Registers: 16 warps (two output warpgroups at 160, these two at 96): each group holds one page's
scores ``[64, 64]`` fp32 and its row sums as vectors (a full ``[64, 64]`` sum tile would spill).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from mlabench.kernels.common import causal_row_limits
from mlabench.kernels.gluon_blocks import (
    PAGE_TOKENS, scaled_scores, softmax_step, zero_rows_from,
)
from mlabench.kernels.gluon_mt_feed import page_scores

#: Registers a thread of each softmax warpgroup: the output warpgroups keep 160 of the 64K
#: register file's 16 warps (65,536 = 256 x 160 + 256 x 96).  No local memory in the page loop
#: under Triton 3.6 at 88 either.
GROUP_REGS = gl.constexpr(96)


@gluon.jit
def softmax_group(page_lo, n_tiles, seq_len, row_lo, heads_per_token, qk_scale_log2, smem, bars,
                  GROUP: gl.constexpr, BLOCK_R: gl.constexpr, QO_LEN: gl.constexpr,
                  CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr):
    """Softmax warpgroup ``GROUP`` (0 or 1) of two: for each page ``t = GROUP, GROUP + 2, ...``
    of the split, ``S = Q K^T`` (``[BLOCK_R, 64]`` fp32, the rows as M), the length and causal
    masks, the max after page ``t`` from the max after page ``t - 1`` (published for the other
    group at once), the weights ``P`` (bf16) and ``alpha`` (``a_smem[slot]``) into the
    RoPE tile of the page's slot, the tail zeroing of a last page; then its ``(m, l)`` rows into
    ``ml_smem[2 GROUP], [2 GROUP + 1]`` (``done`` counts both groups)."""
    kn_smem, kr_smem, qn_smem, qr_smem, _p, a_smem, ml_smem, mx_smem = smem
    kv_ready, p_ready, done, m_ready = bars[0], bars[2], bars[4], bars[5]
    gl.static_assert(NUM_STAGES == 2, "two softmax warpgroups need the 2-page ring")
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, PAGE_TOKENS, 16])
    per_row: gl.constexpr = gl.SliceLayout(1, mma)
    s = gl.zeros([BLOCK_R, PAGE_TOKENS], gl.float32, layout=mma)
    m_own = gl.full([BLOCK_R], float("-inf"), gl.float32, layout=per_row)  # l_own's reference
    l_own = gl.zeros([BLOCK_R], gl.float32, layout=per_row)
    offs_t = gl.arange(0, PAGE_TOKENS, layout=gl.SliceLayout(0, mma))
    first_masked = seq_len - QO_LEN + 1  # under CAUSAL, no row sees a key from here on
    for t in range(GROUP, n_tiles, 2):
        s = page_scores(t, kn_smem, kr_smem, qn_smem, qr_smem, kv_ready, s, NUM_STAGES, 2)
        tok = (page_lo + t) * PAGE_TOKENS + offs_t
        if CAUSAL and (page_lo + t + 1) * PAGE_TOKENS > first_masked:  # the last page or two
            rows = row_lo + gl.arange(0, BLOCK_R, layout=per_row)
            row_lim = causal_row_limits(seq_len, rows, heads_per_token, QO_LEN)
            s = scaled_scores(s, tok, seq_len, row_lim, qk_scale_log2, True, 1)
        else:
            s = scaled_scores(s, tok, seq_len, seq_len, qk_scale_log2, False, 1)
        m_prev = gl.full([BLOCK_R], float("-inf"), gl.float32, layout=per_row)
        if t > 0:  # the max after page t - 1, from the other group
            mbarrier.wait(m_ready.index((t - 1) % 2), ((t - 1) // 2) & 1)
            m_prev = mx_smem.index((t - 1) % 2).load(per_row)
        p, alpha, m_new = softmax_step(s, m_prev, CAUSAL, 1)
        mx_smem.index(t % 2).store(m_new)
        mbarrier.arrive(m_ready.index(t % 2), count=1)
        l_own = l_own * gl.exp2(m_own - gl.where(m_new == float("-inf"), 0.0, m_new))
        l_own += gl.sum(p, axis=1)
        m_own = m_new
        slot = t % NUM_STAGES  # the page's RoPE tile, free since its score product completed
        kr_smem.index(slot).store(p.to(kr_smem.dtype))
        a_smem.index(slot).store(alpha)
        fence_async_shared()  # P is read by wgmma (the async proxy) in the output partition
        if (page_lo + t + 1) * PAGE_TOKENS > seq_len:
            zero_rows_from(kn_smem.index(slot), seq_len - (page_lo + t) * PAGE_TOKENS, 4)
        mbarrier.arrive(p_ready.index(slot), count=1)
    if n_tiles > 0:
        ml_smem.index(2 * GROUP).store(m_own)
        ml_smem.index(2 * GROUP + 1).store(l_own)
        mbarrier.arrive(done.index(0), count=1)


@gluon.jit
def final_rows(ml_smem, done, n_tiles, BLOCK_R: gl.constexpr, GROUPS: gl.constexpr,
               per_row: gl.constexpr):
    """The rows' final max and weight sum ``(m, l)`` (``[BLOCK_R]`` fp32 in ``per_row``) once
    every softmax warpgroup has stored its own: one group's as stored, two groups' sums
    rescaled to the larger max and added; ``(-inf, 0)`` for a split with no page."""
    m_i = gl.full([BLOCK_R], float("-inf"), gl.float32, layout=per_row)
    l_i = gl.zeros([BLOCK_R], gl.float32, layout=per_row)
    if n_tiles > 0:
        mbarrier.wait(done.index(0), 0)
        m_i = ml_smem.index(0).load(per_row)
        l_i = ml_smem.index(1).load(per_row)
        if GROUPS == 2:
            m_b = ml_smem.index(2).load(per_row)
            m_all = gl.maximum(m_i, m_b)
            m_use = gl.where(m_all == float("-inf"), 0.0, m_all)
            l_i = l_i * gl.exp2(m_i - m_use) + ml_smem.index(3).load(per_row) * gl.exp2(
                m_b - m_use)
            m_i = m_all
    return m_i, l_i
