"""The merge inside gluon-splitkv's stage 1: no second launch (docs/PERFORMANCE.md §3, change 2).

With ``fused_merge`` the splits of one (request, row tile) finish the decode together:

1. **Arrival barrier.** Each split that owns pages stores its partial as before, then arrives on
   the tile's word (one ``atom.add.acq_rel.gpu`` once the CTA has synchronised).  The last to
   arrive resets the count and bumps the generation in the same word with one release add; the
   others spin on it (``ld.volatile``, then an acquire fence).  The words live in a zeroed int32
   workspace ``[B * row_tiles]`` that every call leaves with a count of 0, so a captured graph
   replays it as is.  Splits that own no page neither store
   nor arrive: the participants are the request's written splits (:func:`split_pages`' third
   value), the same count the wide merge derives.
2. **Merge by column share.** The tile's 512 output columns are cut into ``512 / MERGE_COLS``
   chunks; participant ``i`` of ``n`` merges chunks ``i, i + n, ...`` for all the tile's rows,
   reading every participant's lse and partial for those columns (they were just written, so
   they come from L2), with an online rescale over blocks of ``MERGE_SPLITS`` splits.  At batch 1
   with 132 splits that is 128 chunks of 4 columns, 34 KB read per CTA; at batch 16 with 8 splits,
   8 chunks of 64 columns.

Every participant waits for the others, so all splits of the grid must be resident at once:
``B * row_tiles * S`` programs at most the SM count (one program per SM at a 2-page ring; the
launcher checks :func:`fused_merge_fits`).  A waiting program never blocks one that is not yet
running, because a later grid launched as a programmatic dependent of this one is only scheduled
once every program here has started.
"""

from __future__ import annotations

from dataclasses import dataclass

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from mlabench.kernels.gluon_blocks import D_NOPE
from mlabench.kernels.row_tiling import RowTiling
from mlabench.kernels.wide_merge import D_V

MIN_MERGE_COLS = 4  #: 16-byte loads of fp32
MERGE_TILE_PER_WARP = 2048  #: fp32 partial elements one loop step holds per warp (64 a thread)

#: The CTA barrier is ``gl.barrier`` from Triton 3.7 and ``gl.thread_barrier`` before.
_cta_barrier = getattr(gl, "barrier", None) or getattr(gl, "thread_barrier")


@dataclass(frozen=True)
class MergeTiling:
    """How each participant of a fused merge reads: ``cols`` output columns a chunk (a power of
    two, 4..512), ``splits`` partials a loop step, and how a ``[splits, rows, cols]`` tile is
    spread: ``threads`` a warp and ``warps`` a program on its three axes (four columns a thread;
    the warps on the rows first, so a small tile is not held twice)."""

    cols: int
    splits: int
    threads: tuple[int, int, int]
    warps: tuple[int, int, int]

    @classmethod
    def for_launch(cls, block_rows: int, num_splits: int, num_warps: int) -> MergeTiling:
        """Chunks so that the grid's ``num_splits`` participants each take about one
        (``512 / next_pow2(num_splits)`` columns, at least 4), and a loop step of at most
        ``2048 * num_warps`` partial elements.  ``block_rows`` 16, 32 or 64.  Raises ValueError
        for fewer than one split or a row count that is not a power of two."""
        if num_splits < 1 or block_rows < 1 or block_rows & (block_rows - 1):
            raise ValueError(f"need >= 1 split and a power-of-two row tile, got {num_splits}, "
                             f"{block_rows}")
        pow2 = 1 << (num_splits - 1).bit_length()
        cols = max(MIN_MERGE_COLS, D_V // min(pow2, D_V))
        t_c = min(cols // 4, 32)
        t_r = min(block_rows, 32 // t_c)
        t_s = 32 // (t_c * t_r)
        w_r = max(1, min(block_rows // t_r, num_warps))
        w_s = num_warps // w_r
        budget = MERGE_TILE_PER_WARP * num_warps // (block_rows * cols)
        splits = max(1, min(pow2, budget), t_s * w_s)
        return cls(cols, splits, (t_s, t_r, t_c), (w_s, w_r, 1))

    def constexprs(self) -> dict[str, int]:
        """The kernel's merge constants (``MERGE_COLS``, ``MERGE_SPLITS``, ``M_T*``, ``M_W*``)."""
        (t_s, t_r, t_c), (w_s, w_r, _) = self.threads, self.warps
        return {"MERGE_COLS": self.cols, "MERGE_SPLITS": self.splits, "M_TS": t_s, "M_TR": t_r,
                "M_TC": t_c, "M_WS": w_s, "M_WR": w_r}

    def chunks_of(self, participant: int, participants: int) -> list[int]:
        """Column chunks participant ``participant`` of ``participants`` merges (the kernel's
        loop, for the CPU tests): every ``participants``-th chunk from its own index."""
        return list(range(participant, D_V // self.cols, participants))


def stage1_programs(batch: int, rows: int, splits: int) -> int:
    """Programs of a stage-1 grid: ``batch x row tiles x splits`` for requests of ``rows`` packed
    query rows (:class:`~mlabench.kernels.row_tiling.RowTiling`)."""
    return batch * RowTiling.for_rows(rows).row_tiles * splits


def fused_merge_fits(programs: int, num_sms: int) -> bool:
    """True when ``programs`` stage-1 programs (``B * row_tiles * S``) can all be resident at once
    on ``num_sms`` SMs at one program per SM, which the arrival barrier needs."""
    return 1 <= programs <= num_sms


@gluon.jit
def _fence_gpu():
    """``fence.acq_rel.gpu`` by every thread."""
    gl.inline_asm_elementwise("fence.acq_rel.gpu; // $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def arrive_and_wait(sync_ptr, tile, participants):
    """The arrival barrier of one (request, row tile): returns once all ``participants`` programs
    of it have arrived, with their stores visible to this program.  ``sync_ptr`` int32 ``[tiles]``,
    zero before the first call: a word of (generation << 16) | count.  One thread arrives for the
    program (``atom.add.acq_rel.gpu`` after the CTA barrier, so the release covers every thread's
    stores, the pattern of CUTLASS's ``arrive_inc``); the last arrival adds ``2^16 - participants``
    (count back to 0, generation + 1, a release); the others spin until the generation moves,
    then every thread fences (acquire)."""
    word_ptr = sync_ptr + tile
    _cta_barrier()
    old = gl.atomic_add(word_ptr, 1, sem="acq_rel", scope="gpu")
    if (old & 0xFFFF) == participants - 1:
        gl.atomic_add(word_ptr, 0x10000 - participants, sem="release", scope="gpu")
    else:
        generation = (old >> 16) & 0xFFFF
        seen = gl.load(word_ptr, volatile=True)
        while ((seen >> 16) & 0xFFFF) == generation:
            seen = gl.load(word_ptr, volatile=True)
    _fence_gpu()


@gluon.jit
def merge_share(po_ptr, plse_ptr, out_row_ptr, first_slot, participant, participants, slots,
                row_lo, num_rows, stride_ps, stride_ph, stride_ls, stride_oh, BLOCK_R: gl.constexpr,
                MERGE_COLS: gl.constexpr, MERGE_SPLITS: gl.constexpr, M_TS: gl.constexpr,
                M_TR: gl.constexpr, M_TC: gl.constexpr, M_WS: gl.constexpr, M_WR: gl.constexpr):
    """Merge this participant's column chunks of a (request, row tile): for rows ``row_lo ..``
    (those below ``num_rows``) and each chunk, ``sum_s 2^(lse_s - m) o_s / sum_s 2^(lse_s - m)``
    over the ``slots`` slots from ``first_slot`` (the written splits; as many as the
    ``participants`` sharing the chunks, or more with the persistent split loop), written to the request's output
    ``out_row_ptr`` (packed row ``r`` at ``r * stride_oh``, in its dtype).  A row no split saw
    gets 0.
    A row's partial in a split that saw none of its keys (lse ``-inf``) may hold anything: its
    weight selects 0, it is never multiplied."""
    l3: gl.constexpr = gl.BlockedLayout([1, 1, 4], [M_TS, M_TR, M_TC], [M_WS, M_WR, 1], [2, 1, 0])
    l_sr: gl.constexpr = gl.SliceLayout(2, l3)
    l_rc: gl.constexpr = gl.SliceLayout(0, l3)
    s_ar = gl.arange(0, MERGE_SPLITS, layout=gl.SliceLayout(1, l_sr))
    r_sr = row_lo + gl.arange(0, BLOCK_R, layout=gl.SliceLayout(0, l_sr))
    c_ar = gl.arange(0, MERGE_COLS, layout=gl.SliceLayout(0, gl.SliceLayout(1, l3)))
    r_rc = row_lo + gl.arange(0, BLOCK_R, layout=gl.SliceLayout(1, l_rc))
    c_rc = gl.arange(0, MERGE_COLS, layout=gl.SliceLayout(0, l_rc))
    r_ok = r_sr < num_rows
    for chunk in range(participant, D_NOPE // MERGE_COLS, participants):
        col0 = chunk * MERGE_COLS
        m = gl.full([BLOCK_R], float("-inf"), gl.float32, layout=gl.SliceLayout(0, l_sr))
        w_sum = gl.zeros([BLOCK_R], gl.float32, layout=gl.SliceLayout(0, l_sr))
        acc = gl.zeros([BLOCK_R, MERGE_COLS], gl.float32, layout=l_rc)
        for s0 in range(0, slots, MERGE_SPLITS):
            slot = (first_slot + s0 + s_ar).to(gl.int64)
            live = (s0 + s_ar) < slots
            ok = live[:, None] & r_ok[None, :]
            lse = gl.load(plse_ptr + slot[:, None] * stride_ls + r_sr[None, :], mask=ok,
                          other=float("-inf"))
            rows3 = (slot[:, None] * stride_ps + r_sr[None, :] * stride_ph)[:, :, None]
            part = gl.load(po_ptr + rows3 + (col0 + c_ar)[None, None, :], mask=ok[:, :, None],
                           other=0.0)
            m_new = gl.maximum(m, gl.max(lse, axis=0))
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = gl.exp2(m - m_use)
            w = gl.exp2(lse - m_use[None, :])
            part = gl.where((w > 0.0)[:, :, None], part, 0.0)
            w_sum = w_sum * alpha + gl.sum(w, axis=0)
            alpha_rc = gl.convert_layout(alpha, gl.SliceLayout(1, l_rc))
            acc = acc * alpha_rc[:, None] + gl.sum(w[:, :, None] * part, axis=0)
            m = m_new
        w_rc = gl.convert_layout(w_sum, gl.SliceLayout(1, l_rc))
        res = gl.where(w_rc[:, None] > 0.0, acc / gl.where(w_rc > 0.0, w_rc, 1.0)[:, None], 0.0)
        ptrs = out_row_ptr + r_rc[:, None] * stride_oh + (col0 + c_rc)[None, :]
        gl.store(ptrs, res.to(out_row_ptr.dtype.element_ty), mask=(r_rc < num_rows)[:, None])
