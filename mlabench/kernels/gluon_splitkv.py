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
(:func:`mlabench.kernels.gluon_blocks.zero_rows_from`), since a zero weight times NaN is NaN.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from mlabench.device import current_device
from mlabench.kernels.common import causal_row_limits
from mlabench.kernels.gluon_fused_merge import (
    MergeTiling, arrive_and_wait, fused_merge_fits, merge_share, stage1_programs,
)
from mlabench.kernels.gluon_blocks import (
    PAGE_SIZE, accumulators, attend_page, issue_first_pages, issue_page, launch_dependents,
    load_q_tiles, page_ring, program_split, row_tiles, store_partial, wait_prior_grid,
)
from mlabench.kernels.gluon_split_loop import stage1_split_loop
from mlabench.kernels.row_tiling import QK_WIDTH as D_QK, RowTiling
from mlabench.kernels.split_loop import stage1_grid_splits
from mlabench.kernels.splitkv import checked_splitkv_args
from mlabench.kernels.wide_merge import wide_merge

LOG2E = 1.4426950408889634
#: Default ring depth: 2 pages (147 KB) plus the query tile fit one CTA per SM in the H200's
#: 227 KB of shared memory; 1 stage gives two CTAs per SM instead.
DEFAULT_NUM_STAGES = 2


# A device policy's grid fits its largest count: many empty programs, which exit first (after the
# grid before). A host count's few (4 of 132 at 16K) run on, storing nothing: there the exit cost
# 3.4 us at batch 1 (results/h100/deploy/README.md: empty-exit/, bisect-132/host-exit/).  The
# n_tiles > 0 guards in the body stay: without them ptxas allocates otherwise (unmeasured).
@gluon.jit(do_not_specialize=["num_splits"])
def _gluon_splitkv_stage1(q_ptr, qr_ptr, kvn_desc, kvr_desc, bt_ptr, seqlens_ptr, policy_ptr,
                          po_ptr, plse_ptr, out_ptr, sync_ptr, num_splits, num_rows,
                          heads_per_token, qk_scale_log2, stride_qb, stride_qh, stride_qrb,
                          stride_qrh, stride_btb, stride_ps, stride_ph, stride_ls, stride_ob,
                          stride_oh, BLOCK_R: gl.constexpr,
                          ROW_TILES: gl.constexpr, QO_LEN: gl.constexpr, CAUSAL: gl.constexpr,
                          POLICY_ROWS: gl.constexpr, NUM_STAGES: gl.constexpr, PDL: gl.constexpr,
                          O_WARPS_M: gl.constexpr, LAZY_SUM: gl.constexpr, WAIT_PRIOR: gl.constexpr,
                          FUSED: gl.constexpr, MERGE_COLS: gl.constexpr, MERGE_SPLITS: gl.constexpr,
                          M_TS: gl.constexpr, M_TR: gl.constexpr, M_TC: gl.constexpr,
                          M_WS: gl.constexpr, M_WR: gl.constexpr, num_warps: gl.constexpr):
    if PDL == 1:  # let the merge grid be scheduled now; it waits for this grid before reading
        launch_dependents()
    b, row_lo, split, seq_len, page_lo, n_tiles, written, bt_row_ptr = program_split(
        seqlens_ptr, bt_ptr, stride_btb, num_splits, policy_ptr, ROW_TILES, BLOCK_R, POLICY_ROWS,
        FUSED, num_warps)  # the table's rows before the length with the fused merge (policy_table)
    if POLICY_ROWS > 0:  # empty splits of a device policy exit first (see above)
        if n_tiles == 0:
            if WAIT_PRIOR:
                wait_prior_grid()
            return
    kn_smem, kr_smem, bars = page_ring(kvn_desc, kvr_desc, NUM_STAGES)
    if WAIT_PRIOR:  # launched early (PDL): the length, the split and the ring are ready; now wait
        if POLICY_ROWS == 0 or n_tiles > 0:  # for the grid before (it may write q, read partials)
            wait_prior_grid()
    # Start the first pages before anything else: their latency hides the query load.
    issue_first_pages(kvn_desc, kvr_desc, bt_row_ptr, page_lo, n_tiles, kn_smem, kr_smem, bars,
                      NUM_STAGES, NUM_STAGES - 1)
    qn_smem, qr_smem, p_smem = row_tiles(kvn_desc.dtype, BLOCK_R)
    if n_tiles > 0:  # an empty split loads nothing and stores nothing
        load_q_tiles(q_ptr, qr_ptr, b, row_lo, num_rows, stride_qb, stride_qh, stride_qrb,
                     stride_qrh, qn_smem, qr_smem, BLOCK_R, num_warps)
        fence_async_shared()

    o, l_i, m_i, s_zero, offs_t, rows = accumulators(row_lo, BLOCK_R, O_WARPS_M, LAZY_SUM,
                                                     num_warps)
    row_lim = causal_row_limits(seq_len, rows, heads_per_token, QO_LEN)  # the Triton kernels' rule
    for t in range(n_tiles):
        ahead = t + NUM_STAGES - 1
        if ahead < n_tiles:  # its slot was released when page t - 1's products completed
            issue_page(kvn_desc, kvr_desc, bt_row_ptr, page_lo, ahead, kn_smem, kr_smem, bars,
                       NUM_STAGES)
        o, l_i, m_i = attend_page(t, page_lo, seq_len, kn_smem, kr_smem, bars, qn_smem, qr_smem,
                                  p_smem, s_zero, offs_t, row_lim, qk_scale_log2, o, l_i, m_i,
                                  NUM_STAGES, CAUSAL, LAZY_SUM, num_warps)
    if LAZY_SUM:
        l_i = gl.sum(l_i, axis=0)
    if PDL == 2:  # the merge's launch overlaps this program's epilogue only
        launch_dependents()
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(bars.index(i))
    if n_tiles > 0:  # an empty split writes nothing: the merge reads only the splits owning pages
        store_partial(po_ptr, plse_ptr, b * num_splits + split, row_lo, num_rows, o, l_i, m_i,
                      stride_ps, stride_ph, stride_ls, BLOCK_R, num_warps)
        if FUSED:  # the request's written splits merge it together: no second launch
            arrive_and_wait(sync_ptr, gl.program_id(0), written)
            merge_share(po_ptr, plse_ptr, out_ptr + b.to(gl.int64) * stride_ob, b * num_splits,
                        split, written, written, row_lo, num_rows, stride_ps, stride_ph, stride_ls,
                        stride_oh, BLOCK_R, MERGE_COLS, MERGE_SPLITS, M_TS, M_TR, M_TC, M_WS, M_WR)


#: ``KernelVariant.isolate``'s values, in the order of the multi-token kernel's ``ISOLATE``
#: constexpr (0 both sides, 1 products alone, 2 copies alone).
ISOLATE_SIDES = ("", "products", "copies")


@dataclass(frozen=True)
class KernelVariant:
    """Layout and launch choices of stage 1 that leave its result unchanged (each measured on an
    H200 in results/h200/deploy/variants/).

    - ``o_split``: how a two-warpgroup tile (32 or 64 rows) shares the output product ``O^T
      [512, rows]``: ``"m"`` each warpgroup half of the 512 output columns (each reads half of
      V^T; ``alpha`` and ``l`` change layout once a page), ``"n"`` each half of the rows (each
      reads all of V^T).  Nothing changes for a one-warpgroup (16-row) tile.
    - ``lazy_sum``: the softmax denominator kept as a ``[64, rows]`` elementwise sum, reduced over
      tokens once after the last page, instead of once a page (a cross-warp reduction each).
    - ``pdl_prologue``: stage 1 launched as a programmatic dependent of the kernel before it (in a
      replayed graph the previous call's merge, which releases it at its start): its launch, the
      length load and the split lookup overlap that kernel's tail; it executes
      ``griddepcontrol.wait`` before its first page, its query and its partials.  It reads
      ``cache_seqlens`` and the device table before the wait: both must be written before that
      kernel.
    - ``fused_merge``: no merge launch; a request's splits merge their partials themselves after
      an arrival barrier (:mod:`mlabench.kernels.gluon_fused_merge`).  Needs every program of the
      grid resident at once (at most one per SM) and a zeroed int32 ``merge_sync`` workspace.
    - ``split_loop``: with a split policy in device memory only, the persistent split loop
      (:mod:`mlabench.kernels.gluon_split_loop`): the grid's split axis holds
      :func:`~mlabench.kernels.split_loop.loop_grid_splits` programs (one wave, at most the
      policy's largest count) instead of the largest count, and each program runs its request's
      splits ``p, p + G, ...``; the partials, slots and merges are unchanged.  H200: no gain.
    - ``multi_token``: 1 or 2: requests of more than 16 packed rows (``qo_len x heads``) run the
      warp-specialised stage 1 of :mod:`mlabench.kernels.gluon_multi_token` (a loader warp, a
      softmax warpgroup, two output warpgroups), merged by the wide merge (``fused_merge`` is
      ignored there); 1 hands a page's weights to the output warps before the next page's scores
      are computed, 2 computes the next page's scores first (its softmax then runs under this
      page's output product; needs the 2-page ring, 1 runs otherwise).  0 (default): the kernel
      above (H200: 1 wins at >= 16 pages a split).  Requests of 16 rows or fewer run it either way.
    - ``rows_as_m``: with ``multi_token``, a 64-row tile's products with its rows as M
      (:mod:`mlabench.kernels.gluon_multi_token`): 1 the output product as ``O = P V`` (half the
      wgmma instructions of ``O^T = V^T P^T``, 3/4 of their operand bytes), 2 the score product
      as ``S = Q K^T`` too (a row's softmax max and sum within a quad of threads), 3 as 2 with
      the output product as ``m64n256k16`` (one instruction a warpgroup and k-step, P read once)
      and no loader warp (the output warps copy the pages).  0: the rows as N.
    - ``isolate`` (timing only, the output is wrong; no backend parameter reaches it): with
      ``multi_token``, ``"products"`` copies no page after the ring's first ones (the products
      reread the slots), ``"copies"`` computes no product (the pages only stream through the
      ring): what each side of the pipeline takes alone (``scripts/h200_mt_profile.py``).
    Raises ValueError for an ``o_split`` other than ``"n"`` or ``"m"``, a ``multi_token`` or
    ``rows_as_m`` other than 0 to 3, ``split_loop`` with ``multi_token``, or an ``isolate``
    other than ``""``, ``"products"`` or ``"copies"`` or without ``multi_token``.
    """

    o_split: str = "m"
    lazy_sum: bool = True
    pdl_prologue: bool = False
    fused_merge: bool = False
    split_loop: bool = False
    multi_token: int = 0
    rows_as_m: int = 0
    isolate: str = ""

    def __post_init__(self) -> None:
        if self.isolate not in ISOLATE_SIDES or (self.isolate and not self.multi_token):
            raise ValueError(f"isolate must be '', 'products' or 'copies', the last two with "
                             f"multi_token; got {self.isolate!r}")
        if self.o_split not in ("n", "m"):
            raise ValueError(f"o_split must be 'n' or 'm', got {self.o_split!r}")
        if self.multi_token not in (0, 1, 2):
            raise ValueError(f"multi_token must be 0, 1 or 2, got {self.multi_token!r}")
        if self.rows_as_m not in (0, 1, 2, 3):
            raise ValueError(f"rows_as_m must be 0, 1, 2 or 3, got {self.rows_as_m!r}")
        if self.split_loop and self.multi_token:
            raise ValueError("split_loop and multi_token do not run together (the multi-token "
                             "stage 1 has no split loop)")

    def o_warps_m(self, num_warps: int) -> int:
        """Warps of the output product stacked on its 512 rows: all ``num_warps`` for ``"m"``, 4
        (one warpgroup's worth, the others side by side on the rows) for ``"n"``."""
        return num_warps if self.o_split == "m" else 4

    def multi_token_tiling(self, rows: int) -> RowTiling | None:
        """The tiling of the multi-token stage 1 where it runs for ``rows`` packed rows a request
        (``multi_token`` on, more than 16 rows), else None."""
        # imported here, not above: the one-token kernel's source lines, and so its PTX line
        # table, stay as they were
        from mlabench.kernels.gluon_multi_token import multi_token_tiling

        return multi_token_tiling(rows) if self.multi_token else None

    def rows_as_m_runs(self, rows: int) -> int:
        """``rows_as_m`` where it takes effect for ``rows`` packed rows a request (the multi-token
        stage 1 in 64-row tiles), else 0."""
        from mlabench.kernels.gluon_multi_token import rows_m_for

        tiling = self.multi_token_tiling(rows)
        return 0 if tiling is None else rows_m_for(self.rows_as_m, tiling.block_rows)


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


def merge_sync_shape(batch: int, rows: int) -> tuple[int]:
    """Shape of the int32 workspace of a fused merge (``KernelVariant.fused_merge``): one barrier
    word per (request, row tile) of a request of ``rows`` packed rows.  Allocate it zeroed, once:
    every call leaves the counts (the low 16 bits) at 0."""
    return (batch * RowTiling.for_rows(rows).row_tiles,)


def _launch_stage1(q_rows, rope_rows, kv_cache, block_table, cache_seqlens, partial_out,
                   partial_lse, splits: int, grid_splits: int, heads: int, softmax_scale: float, descriptors,
                   num_stages: int, pdl: int, split_policy, qo_len: int, causal: bool,
                   variant: KernelVariant, out_rows, merge_sync) -> None:
    """Launch stage 1 on the grid ``(B * row tiles, grid_splits)`` (arguments as
    :func:`mla_decode_gluon_splitkv` checked them; ``q_rows`` ``[B, qo_len * H, >= 512]`` (its first
    512 columns read; all 576 by the multi-token stage 1), ``rope_rows`` ``[B, qo_len * H, 64]``,
    ``out_rows`` ``[B, qo_len * H, 512]``, written only with ``variant.fused_merge``; ``grid_splits`` is
    ``splits`` unless ``variant.split_loop``).  Fewer programs than splits run the kernel of the
    persistent split loop; as many run the loop-free kernel, each program owning at most one
    split either way."""
    batch, tiling = block_table.shape[0], RowTiling.for_rows(qo_len * heads)
    kvn_desc, kvr_desc = descriptors or kv_descriptors(kv_cache)
    mt_tiling = variant.multi_token_tiling(qo_len * heads)
    if mt_tiling is not None:
        from mlabench.kernels.gluon_multi_token import launch_multi_token_stage1

        launch_multi_token_stage1(mt_tiling, q_rows, (kvn_desc, kvr_desc), block_table,
                                  cache_seqlens, split_policy, partial_out, partial_lse, splits,
                                  heads, float(softmax_scale) * LOG2E, qo_len, causal, num_stages,
                                  pdl, variant.pdl_prologue, variant.multi_token == 2,
                                  variant.rows_as_m, ISOLATE_SIDES.index(variant.isolate))
        return
    mt = MergeTiling.for_launch(tiling.block_rows, grid_splits, tiling.num_warps)
    kernel = stage1_split_loop if grid_splits < splits else _gluon_splitkv_stage1
    kernel[(batch * tiling.row_tiles, grid_splits)](
        q_rows, rope_rows, kvn_desc, kvr_desc, block_table, cache_seqlens,
        cache_seqlens if split_policy is None else split_policy, partial_out, partial_lse,
        out_rows, cache_seqlens if merge_sync is None else merge_sync,
        splits, qo_len * heads, heads, float(softmax_scale) * LOG2E,
        q_rows.stride(0), q_rows.stride(1), rope_rows.stride(0), rope_rows.stride(1),
        block_table.stride(0), partial_out.stride(0),
        partial_out.stride(1), partial_lse.stride(0), out_rows.stride(0), out_rows.stride(1),
        BLOCK_R=tiling.block_rows,
        ROW_TILES=tiling.row_tiles, QO_LEN=qo_len, CAUSAL=bool(causal) and qo_len > 1,
        POLICY_ROWS=0 if split_policy is None else split_policy.shape[0], NUM_STAGES=num_stages,
        PDL=pdl, O_WARPS_M=variant.o_warps_m(tiling.num_warps), LAZY_SUM=variant.lazy_sum,
        WAIT_PRIOR=variant.pdl_prologue, FUSED=variant.fused_merge, **mt.constexprs(),
        num_warps=tiling.num_warps,
        **({"launch_pdl": True} if variant.pdl_prologue else {}),
    )


def _check_fused(variant: KernelVariant, merge_sync, batch: int, rows: int, splits: int) -> None:
    """ValueError unless a fused merge can run: the grid (``splits`` on its split axis) resident
    at once, a sync workspace of :func:`merge_sync_shape`, int32, on q's device."""
    if not variant.fused_merge:
        return
    programs = stage1_programs(batch, rows, splits)
    sms = current_device().num_sms
    if not fused_merge_fits(programs, sms):
        raise ValueError(f"fused_merge needs the whole grid resident: {programs} programs "
                         f"(batch x row tiles x splits) on {sms} SMs; use the wide merge")
    want = merge_sync_shape(batch, rows)
    if merge_sync is None or tuple(merge_sync.shape) != want or merge_sync.dtype != torch.int32:
        got = None if merge_sync is None else (tuple(merge_sync.shape), merge_sync.dtype)
        raise ValueError(f"fused_merge needs a zeroed int32 merge_sync of shape {want}, got {got}")


def _launch_plan(variant: KernelVariant, stage1_only: bool, split_policy, merge_sync, batch: int,
                 rows: int, splits: int, num_stages: int, halves: bool) -> tuple[KernelVariant, int]:
    """``(variant, grid split axis)`` of a call: no fused merge when ``stage1_only`` or on the
    multi-token path; the split loop's grid
    (:func:`~mlabench.kernels.split_loop.stage1_grid_splits`); ValueError for the loop without a
    device policy, the multi-token path with the query in ``halves``, or a fused merge that cannot
    run (:func:`_check_fused`)."""
    if halves and variant.multi_token_tiling(rows) is not None:
        raise ValueError("multi_token reads one 576-wide q: pass q whole, not q_rope apart")
    if stage1_only or variant.multi_token_tiling(rows) is not None:
        variant = dataclasses.replace(variant, fused_merge=False)  # the wide merge, or none
    if variant.split_loop and split_policy is None:
        raise ValueError("split_loop needs a split policy in device memory (split_policy); "
                         "a fixed split count keeps its grid")
    grid_splits = stage1_grid_splits(variant.split_loop, batch, rows, splits, num_stages,
                                     current_device().num_sms)
    _check_fused(variant, merge_sync, batch, rows, grid_splits)
    return variant, grid_splits


def mla_decode_gluon_splitkv(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                             cache_seqlens: torch.Tensor, out: torch.Tensor, num_kv_splits: int,
                             softmax_scale: float, *, partial_out: torch.Tensor,
                             partial_lse: torch.Tensor,
                             descriptors: tuple[TensorDescriptor, TensorDescriptor] | None = None,
                             num_stages: int = DEFAULT_NUM_STAGES, pdl: int = 1,
                             merge_block_dv: int | None = None, split_policy: torch.Tensor | None = None,
                             qo_len: int = 1, causal: bool = True, variant: KernelVariant = KernelVariant(),
                             merge_sync: torch.Tensor | None = None, stage1_only: bool = False,
                             q_rope: torch.Tensor | None = None) -> torch.Tensor:
    """Split-KV MLA decode on Hopper: ``out = softmax(q K^T * softmax_scale) V`` per query row.

    Args:
        q: ``[B * qo_len, H, 576]`` bf16/fp16 (with ``q_rope`` its 512 latent columns); request
            ``b``'s ``qo_len x H`` rows are packed token-major (row ``t * H + h``) into tiles of up
            to 64 (:class:`RowTiling`), each tile streaming the request's pages once.
        kv_cache: ``[num_pages, 64, 1, 576]`` contiguous.  out: ``[B * qo_len, H, 512]``, written.
        block_table: ``[B, max_pages]`` int32.  cache_seqlens: ``[B]`` int32, each >= 1 (>= qo_len
            when causal), read on the device (a captured graph follows new lengths).
        num_kv_splits: S, 1..512: split ``s`` takes pages ``[s*P, (s+1)*P)``, ``P = ceil(pages/S)``;
            with ``split_policy`` the most splits a request may take (its slots; the grid's too
            unless ``variant.split_loop``).
        softmax_scale: multiplier of ``q . k``.
        partial_out / partial_lse: fp32 workspace of
            :func:`~mlabench.kernels.workspace.splitkv_workspace_shapes` (None: allocated here).
        descriptors: from :func:`kv_descriptors` (None: built here; pass them when capturing).
        num_stages: pages in the shared-memory ring (1 or 2).
        pdl: the merge launch (fused: the next dependent's): 0 ordinary; 1 programmatic
            dependent, released at stage 1's start; 2 released after stage 1's token loop.
        merge_block_dv: output columns per merge program (None: sized to the GPU).
        split_policy: None, or the int32 ``[R, 2]`` table of
            :meth:`mlabench.policy.device_table.SplitPolicy.device_table` on q's device: request
            ``b`` takes ``min(lookup(cache_seqlens[b]), num_kv_splits)`` splits, looked up in stage
            1; its other splits, like those past a short request's pages, store nothing (the merge
            looks the count up too and reads only the splits that own pages).
        qo_len, causal: query tokens per request; causal: token ``t`` sees the first
            ``cache_seqlens[b] - qo_len + t + 1`` keys, else all.
        variant: the layout and launch choices of :class:`KernelVariant`.
        merge_sync: with ``variant.fused_merge``, the zeroed int32 :func:`merge_sync_shape`.
        stage1_only: skip the merge (for timing stage 1 alone; ``out`` is then not written).
        q_rope: None, or the 64 RoPE columns ``[B * qo_len, H, 64]`` apart (vLLM's halves, read
            where they lie; not with ``variant.multi_token``); q, q_rope, kv_cache, out: one dtype.
            Unit column strides; at ``qo_len > 1`` token stride = H x head stride.

    Returns ``out``.  Raises ValueError on bad layouts, counts, tables, workspaces or variants.
    """
    heads, splits = q.shape[1], int(num_kv_splits)
    q_rows, rope_rows, out_rows, partial_out, partial_lse = checked_splitkv_args(
        q, kv_cache, block_table, cache_seqlens, out, splits, partial_out, partial_lse,
        split_policy, qo_len, q_rope)
    variant, grid_splits = _launch_plan(variant, stage1_only, split_policy, merge_sync, block_table.shape[0],
                                        qo_len * heads, splits, num_stages, q_rope is not None)
    _launch_stage1(q_rows, rope_rows, kv_cache, block_table, cache_seqlens, partial_out, partial_lse,
                   splits, grid_splits, heads, softmax_scale, descriptors, num_stages, 0 if stage1_only
                   else int(pdl), split_policy, qo_len, causal, variant, out_rows, merge_sync)
    if not stage1_only and not variant.fused_merge:
        wide_merge(partial_out, partial_lse, out_rows, splits, block_dv=merge_block_dv, pdl=bool(pdl),
                   num_sms=current_device().num_sms, release_next=variant.pdl_prologue,
                   cache_seqlens=cache_seqlens, split_policy=split_policy)
    return out
