"""Merge of split-KV partials, spread over many programs and with no serial rescaling.

Stage 1 of a split-KV decode leaves, per request ``b`` and split ``s``, a normalised fp32 partial
output ``o_s [H, 512]`` at slot ``b * S + s`` and its base-2 log-sum-exp ``lse_s [H]``.  An empty
split (no token for that row: past a short request's pages, past its own count under a device
split policy, or past the row's causal limit) has ``lse = -inf``.  A row's empty splits are its
last ones, so the merge stops at its last non-empty slot and never reads an empty split's partial:
stage 1 need not write it.  The result is ``sum_s w_s o_s / sum_s w_s`` with ``w_s = 2^(lse_s - max lse)``
(Dao et al., "Flash-Decoding for long-context inference", 2023).

At batch 1 the merge is on the critical path: with 132-264 splits a request's partials are
3-6 MB, read back right after stage 1.  This kernel therefore

- takes the maximum over all of a request's split log-sum-exps first (one vector load), so the
  loop over slot blocks carries no running rescale and its loads can be in flight together;
- sizes its grid to the GPU: one program per (request, head, ``BLOCK_DV`` output columns) with
  ``BLOCK_DV`` chosen so that there are about two programs per SM (:func:`merge_blocks`): at batch
  1 and 12 heads 192 programs of 32 columns, at batch 16 384 programs of 256 columns;
- with the lengths, merges a request that wrote at most ``FEW_SLOTS`` (32) slots with an lse
  vector and slot tile of that size, not of the workspace's count (a run-time branch, the same
  for all of a request's programs): under a device split policy the workspace holds the table's
  largest count (132 at batch 1) and a 1K request writes 16; no tier between (a 64-slot one,
  74e251b, doubled a program's shared memory and cost batch 1 at 132 host splits 1.8-2.9 µs on an
  H100: results/h100/deploy/README.md, bisect-132);
- can be launched as a programmatic dependent launch (``pdl=True``, NVIDIA sm_90+): it is
  scheduled while stage 1 still runs and waits on ``griddepcontrol.wait`` before its first read,
  so the gap between the two launches leaves the critical path; with the lengths, the count of
  a request's written splits is computed before that wait (:func:`wait_prior_after`).

Portable Triton (CUDA, ROCm, the CPU interpreter; ``pdl`` only on NVIDIA Hopper and later).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlabench.kernels.common import policy_splits
from mlabench.kernels.row_tiling import PAGE_TOKENS as _PAGE_TOKENS

D_V = 512  #: output width
MAX_SPLITS_POW2 = 512  #: the lse vector of one request is loaded whole: S <= this
TILE_ELEMENTS = 8192  #: BLOCK_S * BLOCK_DV fp32 per loop step: 64 registers a thread at 4 warps
PAGE_TOKENS = tl.constexpr(_PAGE_TOKENS)  #: the page-granular splits' unit (a jit global: constexpr)
#: With the lengths, a request that wrote at most this many slots is merged with an lse vector and
#: slot tile of this size, not the workspace's: under a device policy the workspace holds the
#: table's largest count (132 at batch 1) while a 1K request writes 16.
FEW_SLOTS = 32


def merge_blocks(batch: int, heads: int, num_kv_splits: int, num_sms: int) -> tuple[int, int]:
    """``(block_dv, block_s)``: output columns per program, so that ``batch * heads * 512 /
    block_dv`` is near ``2 * num_sms`` (power-of-two column blocks, 1 to 16), and slots per loop
    step (the split count rounded up to a power of two, at most 64 and ``8192 / block_dv``)."""
    want = -(-2 * max(1, num_sms) // (batch * heads))
    col_blocks = 1 << min(4, max(0, want.bit_length() - 1))
    block_dv = D_V // col_blocks
    block_s = min(triton.next_power_of_2(num_kv_splits), 64, TILE_ELEMENTS // block_dv)
    return block_dv, max(block_s, 1)


@triton.jit
def written_splits(seqlens_ptr, policy_ptr, b, num_splits, POLICY_ROWS: tl.constexpr):
    """The splits of request ``b`` that own at least one page, hence wrote a record: its own count
    ``S`` (``num_splits``, or the policy's looked up as stage 1 does it, at most ``num_splits``),
    ``P = ceil(pages / S)`` pages each, so ``ceil(pages / P)`` of them; 0 for a length of 0.
    The page-granular rule of :func:`mlabench.kernels.gluon_blocks.split_pages`."""
    seq_len = tl.load(seqlens_ptr + b)
    if POLICY_ROWS > 0:
        own = policy_splits(seq_len, policy_ptr, num_splits, POLICY_ROWS)
    else:
        own = num_splits
    pages = tl.cdiv(seq_len, PAGE_TOKENS)
    per_split = tl.maximum(tl.cdiv(pages, own), 1)
    return tl.cdiv(pages, per_split)


@triton.jit
def wait_prior_after(x):
    """``griddepcontrol.wait`` (PDL: until the grid this one depends on has finished and its
    stores are visible) with the int32 scalar ``x`` as its input, returned unchanged: ``x`` is
    then computed before the wait, where its latency overlaps that grid, instead of where the
    compiler would sink it, after the wait next to its first use (the two integer divisions of
    :func:`written_splits`).  NVIDIA sm_90+ only."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $1, -2147483648; @p griddepcontrol.wait; mov.b32 $0, $1; }",
        "=r,r", [x], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def merge_slots(po_ptr, plse_ptr, first, h, cols, written, stride_ps, stride_ph, stride_ls,
                SLOTS_POW2: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Columns ``cols`` (``[BLOCK_DV]``) of head ``h``'s merge over slots ``first ..
    first + written - 1`` (``written <= SLOTS_POW2``), fp32: the maximum lse of all of them from
    one vector load, then the weighted partials ``BLOCK_S`` slots a step, up to the last
    non-empty slot."""
    every = tl.arange(0, SLOTS_POW2)
    lse_all = tl.load(plse_ptr + (first + every) * stride_ls + h, mask=every < written,
                      other=float("-inf"))
    top = tl.max(lse_all, 0)
    top = tl.where(top == float("-inf"), 0.0, top)  # no token at all: every weight is 0
    w_total = tl.sum(tl.exp2(lse_all - top), 0)
    # A row's empty splits are its last ones (past its pages, its own count, or its causal limit):
    # merge up to the last non-empty slot, whose partials stage 1 has written.  The bound comes
    # from the one lse load above, so no partial load waits on another lse load.
    live_hi = tl.max(tl.where(lse_all > float("-inf"), every + 1, 0), 0)
    acc = tl.zeros([BLOCK_DV], tl.float32)
    for c in tl.range(0, live_hi, BLOCK_S, num_stages=3):
        idx = c + tl.arange(0, BLOCK_S)
        live = idx < live_hi
        lse = tl.load(plse_ptr + (first + idx) * stride_ls + h, mask=live, other=float("-inf"))
        w = tl.exp2(lse - top)  # empty split: 2^-inf = 0
        part = tl.load(po_ptr + (first + idx)[:, None] * stride_ps + h * stride_ph + cols[None, :],
                       mask=live[:, None], other=0.0)
        acc += tl.sum(w[:, None] * part, 0)
    return tl.where(w_total > 0.0, acc / tl.where(w_total > 0.0, w_total, 1.0), 0.0)


@triton.jit(do_not_specialize=["num_splits"])
def _wide_merge_kernel(po_ptr, plse_ptr, out_ptr, seqlens_ptr, policy_ptr, num_splits, stride_ps,
                       stride_ph, stride_ls, stride_ob, stride_oh, SPLITS_POW2: tl.constexpr,
                       BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr, USE_PDL: tl.constexpr,
                       RELEASE_NEXT: tl.constexpr, FROM_LENGTHS: tl.constexpr,
                       POLICY_ROWS: tl.constexpr, FEW_SLOTS: tl.constexpr,
                       FEW_BLOCK_S: tl.constexpr):
    if RELEASE_NEXT:  # the next kernel, launched as our programmatic dependent, may start now
        tl.extra.cuda.gdc_launch_dependents()
    b = tl.program_id(0)
    h = tl.program_id(1)
    if FROM_LENGTHS:  # only the splits that own pages wrote a record; the lengths and the table
        written = written_splits(seqlens_ptr, policy_ptr, b, num_splits, POLICY_ROWS)
    else:  # are not stage 1's outputs, so they are read before the wait, their latency hidden
        written = num_splits
    if USE_PDL:  # launched early: wait until stage 1 has finished and its stores are visible
        if FROM_LENGTHS:  # with `written` computed first (its divisions overlap stage 1)
            written = wait_prior_after(written)
        else:
            tl.extra.cuda.gdc_wait()
    cols = tl.program_id(2) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    first = b.to(tl.int64) * num_splits
    if FEW_SLOTS > 0:  # a request that wrote few of its slots merges them with small tiles
        if written <= FEW_SLOTS:
            res = merge_slots(po_ptr, plse_ptr, first, h, cols, written, stride_ps, stride_ph,
                              stride_ls, FEW_SLOTS, FEW_BLOCK_S, BLOCK_DV)
        else:
            res = merge_slots(po_ptr, plse_ptr, first, h, cols, written, stride_ps, stride_ph,
                              stride_ls, SPLITS_POW2, BLOCK_S, BLOCK_DV)
    else:
        res = merge_slots(po_ptr, plse_ptr, first, h, cols, written, stride_ps, stride_ph,
                          stride_ls, SPLITS_POW2, BLOCK_S, BLOCK_DV)
    tl.store(out_ptr + b.to(tl.int64) * stride_ob + h * stride_oh + cols,
             res.to(out_ptr.dtype.element_ty))


def wide_merge(partial_out: torch.Tensor, partial_lse: torch.Tensor, out: torch.Tensor,
               num_kv_splits: int, *, block_dv: int | None = None, block_s: int | None = None,
               num_sms: int = 132, pdl: bool = False, release_next: bool = False,
               cache_seqlens: torch.Tensor | None = None,
               split_policy: torch.Tensor | None = None) -> torch.Tensor:
    """Merge ``partial_out [B*S, H, 512]`` fp32 / ``partial_lse [B*S, H]`` fp32 (base-2) into
    ``out [B, H, 512]`` (any float dtype, unit last stride), in place; returns ``out``.

    ``num_kv_splits`` = S, 1..512.  ``block_dv`` output columns per program (a power of two that
    divides 512) and ``block_s`` slots per loop step default to :func:`merge_blocks` for
    ``num_sms``.  ``pdl``: launch as a programmatic dependent launch of the kernel before it (that
    kernel should execute ``griddepcontrol.launch_dependents``); NVIDIA sm_90+ only.
    ``release_next``: execute ``launch_dependents`` at the start, so that a kernel launched as this
    one's programmatic dependent (gluon-splitkv's stage 1 with ``pdl_prologue``) is scheduled
    early; it must wait before touching what this merge reads or writes.
    ``cache_seqlens`` (``[B]`` int32, with ``split_policy``, the device table stage 1 read, or
    None): only each request's splits that own pages are read (:func:`written_splits`), so a
    stage 1 may leave the records of its empty splits unwritten.  Without it every slot's lse is
    read and empty splits must hold ``-inf``.  Slots whose
    lse is ``-inf`` weigh 0, and those after a row's last non-empty slot are not read (they may
    hold anything, NaN included; empty slots before it must hold finite values, as every stage 1
    here gives: a row's empty splits are its last).  A request whose partials are all empty gets
    a zero row.  Raises ValueError on a bad split count, block size or workspace shape.
    """
    batch, heads, width = out.shape
    auto_dv, auto_s = merge_blocks(batch, heads, num_kv_splits, num_sms)
    block_dv, block_s = block_dv or auto_dv, block_s or auto_s
    if not 1 <= num_kv_splits <= MAX_SPLITS_POW2:
        raise ValueError(f"num_kv_splits must be in 1..{MAX_SPLITS_POW2}, got {num_kv_splits}")
    if width != D_V or D_V % block_dv or block_dv & (block_dv - 1):
        raise ValueError(f"block_dv must be a power of two dividing {D_V}, got {block_dv}")
    if partial_out.shape[0] < batch * num_kv_splits or partial_out.shape[1:] != (heads, D_V):
        raise ValueError(f"partials {tuple(partial_out.shape)} too small for B={batch} "
                         f"S={num_kv_splits} H={heads}")
    lengths = cache_seqlens if cache_seqlens is not None else partial_lse
    splits_pow2 = max(16, triton.next_power_of_2(num_kv_splits))
    _wide_merge_kernel[(batch, heads, D_V // block_dv)](
        partial_out, partial_lse, out, lengths, lengths if split_policy is None else split_policy,
        int(num_kv_splits), partial_out.stride(0),
        partial_out.stride(1), partial_lse.stride(0), out.stride(0), out.stride(1),
        SPLITS_POW2=splits_pow2, BLOCK_S=block_s,
        BLOCK_DV=block_dv, USE_PDL=pdl, RELEASE_NEXT=release_next,
        FROM_LENGTHS=cache_seqlens is not None,
        POLICY_ROWS=0 if split_policy is None else split_policy.shape[0],
        FEW_SLOTS=FEW_SLOTS if cache_seqlens is not None and splits_pow2 > FEW_SLOTS else 0,
        FEW_BLOCK_S=min(block_s, FEW_SLOTS), num_warps=4, **({"launch_pdl": True} if pdl else {}),
    )
    return out
