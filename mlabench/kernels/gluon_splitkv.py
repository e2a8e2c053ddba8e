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
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

PAGE_SIZE = 64  #: the only page size read (one TMA tile per block-table entry)
#: Kernel-side constants: latent width (also V and the output), RoPE width, page tokens, and the
#: heads per program (the N of both wgmma products).
D_NOPE = gl.constexpr(512)
D_ROPE = gl.constexpr(64)
PAGE_TOKENS = gl.constexpr(PAGE_SIZE)
BLOCK_H = gl.constexpr(16)
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
def _load_q_tiles(q_ptr, b, ht, num_heads, stride_qb, stride_qh, qn_smem, qr_smem,
                  num_warps: gl.constexpr):
    """Copy heads ``ht*16 ..`` of request ``b`` (rows past ``num_heads`` zero) into the two
    shared-memory query tiles ``[16, 512]`` and ``[16, 64]``."""
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
    heads = ht * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld))
    hmask = heads < num_heads
    base = q_ptr + b.to(gl.int64) * stride_qb + heads[:, None] * stride_qh
    cols = gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, ld))
    qn_smem.store(gl.load(base + cols[None, :], mask=hmask[:, None], other=0.0))
    rcols = gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, ld))
    qr_smem.store(gl.load(base + D_NOPE + rcols[None, :], mask=hmask[:, None], other=0.0))


@gluon.jit
def _store_partial(po_ptr, plse_ptr, slot, ht, num_heads, o, l_i, m_i, stride_ps, stride_ph,
                   stride_ls, num_warps: gl.constexpr):
    """Write ``O^T / l`` as the partial ``[16 heads, 512]`` of ``slot`` and ``lse2 = m + log2 l``
    (``-inf`` and a zero partial for an empty split)."""
    st: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, num_warps], [0, 1])
    nonempty = l_i > 0.0
    l_safe = gl.where(nonempty, l_i, 1.0)
    lse2 = gl.where(nonempty, m_i + gl.log2(l_safe), float("-inf"))
    res = gl.convert_layout(o / l_safe[None, :], st)
    d = gl.arange(0, D_NOPE, layout=gl.SliceLayout(1, st))
    heads = ht * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, st))
    slot64 = slot.to(gl.int64)
    ptrs = po_ptr + slot64 * stride_ps + heads[None, :] * stride_ph + d[:, None]
    gl.store(ptrs, res, mask=(heads < num_heads)[None, :])
    lse_st = gl.convert_layout(lse2, gl.SliceLayout(0, st))
    gl.store(plse_ptr + slot64 * stride_ls + heads, lse_st, mask=heads < num_heads)


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


@gluon.jit(do_not_specialize=["num_splits"])
def _gluon_splitkv_stage1(q_ptr, kvn_desc, kvr_desc, bt_ptr, seqlens_ptr, po_ptr, plse_ptr,
                          num_splits, num_heads, qk_scale_log2,
                          stride_qb, stride_qh, stride_btb, stride_ps, stride_ph, stride_ls,
                          NUM_STAGES: gl.constexpr, PDL: gl.constexpr, num_warps: gl.constexpr):
    if PDL == 1:  # let the merge grid be scheduled now; it waits for this grid before reading
        _launch_dependents()
    b = gl.program_id(0)
    split = gl.program_id(1)
    ht = gl.program_id(2)
    seq_len = gl.load(seqlens_ptr + b)
    n_pages = gl.cdiv(seq_len, PAGE_TOKENS)
    per_split = gl.cdiv(n_pages, num_splits)
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
    qn_smem = gl.allocate_shared_memory(dt, [BLOCK_H, D_NOPE],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_H, D_NOPE], dt))
    qr_smem = gl.allocate_shared_memory(dt, [BLOCK_H, D_ROPE],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_H, D_ROPE], dt))
    p_smem = gl.allocate_shared_memory(dt, [PAGE_TOKENS, BLOCK_H],
                                       gl.NVMMASharedLayout.get_default_for([PAGE_TOKENS, BLOCK_H], dt))
    _load_q_tiles(q_ptr, b, ht, num_heads, stride_qb, stride_qh, qn_smem, qr_smem, num_warps)
    fence_async_shared()

    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BLOCK_H, 16])
    o = gl.zeros([D_NOPE, BLOCK_H], gl.float32, layout=mma)
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(0, mma))
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(0, mma))
    s_zero = gl.zeros([PAGE_TOKENS, BLOCK_H], gl.float32, layout=mma)
    offs_t = gl.arange(0, PAGE_TOKENS, layout=gl.SliceLayout(1, mma))
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
        s = gl.where((tok < seq_len)[:, None], s * qk_scale_log2, float("-inf"))
        if (page_lo + t + 1) * PAGE_TOKENS > seq_len:  # the last page: rows past the length
            _zero_rows_from(kn, seq_len - (page_lo + t) * PAGE_TOKENS, num_warps)
        m_new = gl.maximum(m_i, gl.max(s, axis=0))  # finite: a page holds >= 1 valid token
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[None, :])
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
    _store_partial(po_ptr, plse_ptr, b * num_splits + split, ht, num_heads, o, l_i, m_i,
                   stride_ps, stride_ph, stride_ls, num_warps)


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


def mla_decode_gluon_splitkv(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                             cache_seqlens: torch.Tensor, out: torch.Tensor, num_kv_splits: int,
                             softmax_scale: float, *, partial_out: torch.Tensor,
                             partial_lse: torch.Tensor,
                             descriptors: tuple[TensorDescriptor, TensorDescriptor] | None = None,
                             num_stages: int = DEFAULT_NUM_STAGES, pdl: int = 1,
                             merge_block_dv: int | None = None,
                             stage1_only: bool = False) -> torch.Tensor:
    """Split-KV MLA decode on Hopper: ``out = softmax(q K^T * softmax_scale) V``.

    Args:
        q: ``[B, H, 576]`` bf16/fp16 with unit last stride; any H (16-head tiles, grid axis 2).
        kv_cache: ``[num_pages, 64, 1, 576]`` contiguous, q's dtype.
        block_table: ``[B, max_pages]`` int32, unit last stride.  cache_seqlens: ``[B]`` int32,
            each >= 1, read on the device (a captured graph follows new lengths).
        out: ``[B, H, 512]`` in q's dtype, written in place and returned.
        num_kv_splits: S, 1..512: split ``s`` takes pages ``[s*P, (s+1)*P)``, ``P = ceil(pages/S)``.
        softmax_scale: multiplier of ``q . k``.
        partial_out / partial_lse: fp32 ``[B*S, H, 512]`` / ``[B*S, H]`` workspace
            (:func:`mlabench.kernels.splitkv.alloc_splitkv_workspace` has these shapes).
        descriptors: from :func:`kv_descriptors` (built here when None; pass them when capturing).
        num_stages: pages in the shared-memory ring (1 or 2 fit an H200).
        pdl: 0: the merge is an ordinary launch; 1: a programmatic dependent launch that stage 1
            releases at its start (merge programs wait, resident, while stage 1 streams); 2: one
            that stage 1 releases after its token loop (the launch overlaps the epilogue).
        merge_block_dv: output columns per merge program (None: sized to the GPU).
        stage1_only: skip the merge (for timing stage 1 alone; ``out`` is then not written).

    Returns ``out``.  Raises ValueError on bad layouts, split counts or workspace sizes.
    """
    batch, heads, _ = q.shape
    if not 1 <= int(num_kv_splits) <= MAX_KV_SPLITS:
        raise ValueError(f"num_kv_splits must be in 1..{MAX_KV_SPLITS}, got {num_kv_splits}")
    if q.dtype != kv_cache.dtype or q.shape[-1] != D_QK or q.stride(-1) != 1:
        raise ValueError("q must be [B, H, 576] with unit last stride and the cache's dtype")
    if partial_out.shape[0] < batch * num_kv_splits or partial_out.shape[1:] != (heads, 512):
        raise ValueError(f"workspace too small for B={batch} H={heads} splits={num_kv_splits}")
    kvn_desc, kvr_desc = descriptors or kv_descriptors(kv_cache)
    grid = (batch, int(num_kv_splits), triton.cdiv(heads, 16))
    _gluon_splitkv_stage1[grid](
        q, kvn_desc, kvr_desc, block_table, cache_seqlens, partial_out, partial_lse,
        int(num_kv_splits), heads, float(softmax_scale) * LOG2E,
        q.stride(0), q.stride(1), block_table.stride(0), partial_out.stride(0),
        partial_out.stride(1), partial_lse.stride(0), NUM_STAGES=num_stages,
        PDL=0 if stage1_only else int(pdl), num_warps=4,
    )
    if not stage1_only:
        from mlabench.kernels.wide_merge import wide_merge

        from mlabench.device import current_device

        wide_merge(partial_out, partial_lse, out, int(num_kv_splits), block_dv=merge_block_dv,
                   num_sms=current_device().num_sms, pdl=bool(pdl))
    return out


def compile_stage1_sm90(num_stages: int = DEFAULT_NUM_STAGES, dtype: str = "bf16"):
    """Compile stage 1 for sm_90 without a GPU (Triton bundles ptxas) and return Triton's
    compiled kernel: ``.asm["ptx"]``, ``.asm["ttgir"]``, ``.metadata.shared`` (bytes).  For the
    resource report in docs/PERFORMANCE.md and the CPU tests; run it in a process where Triton's
    interpreter has not run (the interpreter patches the language module it shares with Gluon).
    """
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    elem = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]

    def desc(width: int) -> str:
        layout = gl.NVMMASharedLayout.get_default_for([PAGE_SIZE, width], elem)
        return f"tensordesc<{dtype}[{PAGE_SIZE}, {width}],{layout!r}>"

    sig = {"q_ptr": f"*{dtype}", "kvn_desc": desc(512), "kvr_desc": desc(64),
           "bt_ptr": "*i32", "seqlens_ptr": "*i32", "po_ptr": "*fp32", "plse_ptr": "*fp32",
           "num_splits": "i32", "num_heads": "i32", "qk_scale_log2": "fp32"}
    sig |= {n: "i32" for n in ("stride_qb", "stride_qh", "stride_btb", "stride_ps", "stride_ph",
                               "stride_ls")}
    sig |= {"NUM_STAGES": "constexpr", "PDL": "constexpr", "num_warps": "constexpr"}
    # what Triton's launcher would specialise: 16-byte aligned pointers and strides
    attrs = {(i,): [["tt.divisibility", 16]] for i, (n, t) in enumerate(sig.items())
             if t.startswith("*") or n.startswith("stride")}
    src = GluonASTSource(fn=_gluon_splitkv_stage1, signature=sig, attrs=attrs,
                         constexprs={"NUM_STAGES": num_stages, "PDL": 1, "num_warps": 4})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
