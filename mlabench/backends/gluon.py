"""The project's Hopper-only Gluon kernel as a backend: ``gluon-splitkv``.

It runs only on an NVIDIA sm_90 GPU (TMA and wgmma) with Triton's Gluon importable, and only with
page size 64 (one TMA tile per block-table entry); :meth:`available` and :meth:`supports` say why
not elsewhere.  Triton is imported lazily: this module is imported on every CLI start.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from mlabench.backends.base import Backend, ParamSpec, PreparedCall, check_mla_dims
from mlabench.backends.registry import register
from mlabench.backends.shared import NUM_KV_SPLITS, SPLIT_POLICY, TRITON_PACKAGES
from mlabench.device import current_device, triton_interpreting
from mlabench.errors import UnsupportedShapeError
from mlabench.extras import optional_import
from mlabench.inputs import MLADecodeInputs
from mlabench.kernels.row_tiling import RowTiling
from mlabench.policy.rules import MAX_KV_SPLITS
from mlabench.policy.split_choice import SplitChoice
from mlabench.shapes import MLADecodeShape

PAGE_TOKENS = 64


def default_gluon_splits(shape: MLADecodeShape, num_sms: int | None = None) -> int:
    """Page-granular split count: one page per split while that fills at most half a wave
    (``pages <= (SMs // batch) // 2``), else one wave, ``SMs // batch``; at least 1.

    From the first H200 run in results/h200/hopper-kernel/first-run/ of commit 0849486 (every count measured at
    every point): at batch 1 one page per split was best at 1K and 4K (16 and 64 splits), 132
    splits was best from 32K up and within 7% of the best at 8K and 16K, and 8 = 132 // 16 was
    best at batch 16.  The next run (results/h200/hopper-kernel/) agrees except at batch 1, 8K and
    16K, where 132 splits took 31% and 15% longer than the best configuration (64 splits; 128
    splits with pdl 2; docs/PERFORMANCE.md)."""
    sms = num_sms or (current_device().num_sms if current_device().is_gpu else 132)
    pages = -(-shape.max_context_len // PAGE_TOKENS)
    wave = max(1, sms // shape.batch)
    return max(1, min(pages if pages <= wave // 2 else wave, MAX_KV_SPLITS))


KV_SPLITS = dataclasses.replace(
    NUM_KV_SPLITS, default=lambda s: default_gluon_splits(s),
    help="page-granular KV splits per request (1-512); default: pages while they fill at most "
         "half a wave, else SMs // batch",
)
def default_pdl(batch: int) -> int:
    """``pdl``'s default for a step of ``batch`` requests: 1 (a programmatic dependent launch of the
    merge) at batch 1, else 0; H200: PDL saved 0.6-1.5 µs a call at batch 1 and cost 1-2 µs at
    batch 16 (docs/PERFORMANCE.md)."""
    return 1 if batch == 1 else 0


PDL = ParamSpec(
    "pdl", int, default=lambda s: default_pdl(s.batch), low=0, high=2,
    help="merge launch: 0 plain; 1 programmatic dependent launch released at stage 1's start; "
         "2 released after stage 1's token loop.  Default 1 at batch 1, else 0 (H200: PDL saved "
         "0.6-1.5 µs a call at batch 1 and cost 1-2 µs at batch 16)",
)
RING_STAGES = ParamSpec(
    "num_stages", int, default=2, low=1, high=2,
    help="pages in the shared-memory TMA ring: 2 (one CTA per SM, default) or 1 (two CTAs per SM)",
)

# Kernel variants (results/h200/deploy/variants/: o_split m and lazy_sum 1 took 2-17% off every
# multi-token point, pdl_prologue 1 took 0.9-1.2 µs off batch 1 and the short contexts of batch
# 16); tune keeps them at their defaults unless --space names them.
O_SPLIT = ParamSpec(
    "o_split", str, default="m", choices=("n", "m"), omit_default=True, searched=False,
    help="32- and 64-row tiles: the output product's two warpgroups each take half of the 512 "
         "output columns (m, default: each reads half of V^T) or half of the rows (n: each reads "
         "all of it)",
)
LAZY_SUM = ParamSpec(
    "lazy_sum", int, default=1, low=0, high=1, omit_default=True, searched=False,
    help="1 (default): the softmax denominator is summed over tokens once after the last page; "
         "0: once a page",
)
PDL_PROLOGUE = ParamSpec(
    "pdl_prologue", int, default=1, low=0, high=1, omit_default=True, searched=False,
    help="1 (default): stage 1 is a programmatic dependent launch of the kernel before it (the "
         "previous call's merge releases it early): its launch, length load and split lookup "
         "overlap that kernel's tail, and it waits before its first page, query or store.  "
         "cache_seqlens and the device table must be written before that kernel",
)

# results/h200/deploy/fused-merge/: at batch 16 (8 splits) the fused merge took 0.2-4.6 µs off
# every context from 4K (+0.1 µs at 1K); at batch 1 it cost 0.95-1.3 µs at the best counts from
# 1K to 16K, and from -0.1 to +0.8 µs from 32K.  Left out of a point's parameters at 0, the wide
# merge every record before it ran, so those records never pair with a fused point.
FUSED_MERGE = ParamSpec(
    "fused_merge", int, default=lambda s: 1 if s.batch >= 16 else 0, low=0, high=1,
    omit_default=True, omitted_value=0, searched=False,
    help="1: no merge launch; a request's splits merge their own partials after an arrival "
         "barrier, where the grid is resident at once (batch x row tiles x splits <= SMs; else "
         "the wide merge runs and effective_params say so); 0: the wide merge kernel.  Default 1 "
         "from batch 16 (H200: 0.2-4.6 µs faster from 4K), else 0",
)

# Off by default: on an H200 it gained nothing (results/h200/deploy/README.md; the sweep:
# results/h200/deploy/empty-programs/split-loop.toml).
SPLIT_LOOP = ParamSpec(
    "split_loop", int, default=0, low=0, high=1, omit_default=True, searched=False,
    help="1: with split_policy=device only, the persistent split loop: the grid holds one wave of "
         "programs per request and row tile (at most the policy's largest count, not always it) "
         "and each runs its request's splits p, p + G, ...; where that wave holds the largest "
         "count the loop-free kernel runs.  0 (default): one program per split of the largest "
         "count (H200: the loop gained nothing at batch 16, results/h200/deploy/README.md)",
)

# H200 (docs/multi-token-tile.md): 1 wins where a split holds >= 16 pages, loses at <= 4; off by default.
MULTI_TOKEN = ParamSpec(
    "multi_token", int, default=0, low=0, high=2, omit_default=True, searched=False,
    help="1 or 2: requests of more than 16 query rows (qo_len x heads) run the warp-specialised "
         "multi-token stage 1 (a TMA loader warp, a softmax warpgroup, two output warpgroups) "
         "with the wide merge (fused_merge is then 0); 2 computes the next page's scores before "
         "handing a page's weights over (num_stages 2 only).  0 (default): the kernel above for "
         "every shape.  Not with split_loop=1.  H200: 1 is faster where each split holds >= 16 "
         "pages, slower at <= 4",
)

# H200 (docs/multi-token-tile.md): 2 beats 0 at every point measured with multi_token 1 and 2.
ROWS_AS_M = ParamSpec(
    "rows_as_m", int, default=0, low=0, high=3, omit_default=True, searched=False,
    help="with multi_token 1 or 2, a 64-row tile (qo_len 3-8 at 12 heads) computes with its rows "
         "as the wgmma M: 1 the output product as O = P V (half the instructions of O^T = V^T "
         "P^T, 3/4 of their shared-memory operand bytes), 2 the scores as S = Q K^T too (a row's "
         "softmax reductions within a warp), 3 as 2 with the output product as m64n256k16 and the "
         "output warps copying the pages (no loader warp).  0 (default): the rows as N; 32-row tiles and the "
         "one-token kernel run it either way.  H200: 2 is 5-25% faster than 0 with multi_token=1",
)


def _kernel_variant(params: dict[str, Any], s: MLADecodeShape, split_mode: str):
    """The :class:`~mlabench.kernels.gluon_splitkv.KernelVariant` of resolved ``params`` (its
    ``fused_merge`` off: the caller decides it from the grid).  Raises UnsupportedShapeError for
    ``split_loop`` without ``split_policy=device`` (``split_mode``) or with ``multi_token``."""
    from mlabench.kernels.gluon_splitkv import KernelVariant

    split_loop = bool(int(SPLIT_LOOP.value_in(params, s)))
    if split_loop and split_mode != "device":
        raise UnsupportedShapeError("split_loop=1 runs only with split_policy=device:...: the "
                                    "other split counts keep their grid")
    multi_token = int(MULTI_TOKEN.value_in(params, s))
    if split_loop and multi_token:
        raise UnsupportedShapeError("split_loop=1 and multi_token=1 or 2 do not run together: "
                                    "the multi-token stage 1 has no split loop")
    return KernelVariant(str(O_SPLIT.value_in(params, s)), bool(int(LAZY_SUM.value_in(params, s))),
                         bool(int(PDL_PROLOGUE.value_in(params, s))), False, split_loop,
                         multi_token=multi_token,
                         rows_as_m=int(ROWS_AS_M.value_in(params, s)))


def hopper_gluon_available() -> tuple[bool, str]:
    """``(True, "")`` on an NVIDIA compute-capability-9.0 GPU with Triton's Gluon importable,
    else ``(False, reason)``."""
    if triton_interpreting():
        return False, "TRITON_INTERPRET=1: Gluon kernels have no interpreter (unset it on a GPU)"
    if not torch.cuda.is_available():
        return False, "no GPU: this kernel needs an NVIDIA Hopper GPU (sm_90: TMA, wgmma)"
    if torch.version.hip is not None:
        return False, "ROCm GPU: this kernel needs an NVIDIA Hopper GPU (sm_90: TMA, wgmma)"
    major, minor = torch.cuda.get_device_capability(0)
    if (major, minor) != (9, 0):
        return False, f"sm_{major}{minor} GPU: this kernel is written for Hopper (sm_90) only"
    _mod, reason = optional_import("triton.experimental.gluon")
    return (True, "") if _mod is not None else (False, f"{reason} (Gluon ships with Triton >= 3.5)")


@register
class GluonSplitKVBackend(Backend):
    """Split-KV decode with TMA page tiles and wgmma on Hopper
    (:func:`mlabench.kernels.gluon_splitkv.mla_decode_gluon_splitkv`), merged by
    :func:`mlabench.kernels.wide_merge.wide_merge`.

    A multi-token step packs each request's ``qo_len x H`` rows into tiles of up to 64 (12 heads x
    4 tokens: one tile, so the cache is streamed once for all four tokens), causal or not.  The
    split count is ``num_kv_splits`` or comes from a split policy (``split_policy``, as for
    ``triton-splitkv``): ``device`` looks each request's count up inside the kernel, so one
    captured graph runs the policy's count at every length; ``host`` looks one count up at each
    refresh from the longest context, which a captured graph freezes.  With ``device``,
    ``split_loop`` sizes the grid to one wave and lets each program loop over its request's splits
    (:mod:`mlabench.kernels.split_loop`).
    """

    name = "gluon-splitkv"
    family = "split-kv"
    gpu_kernel = True
    packages = TRITON_PACKAGES
    summary = ("project Gluon split-KV kernel for Hopper: TMA page ring, wgmma, up to 64 query rows "
               "a tile, num_kv_splits or a split policy")
    params = (KV_SPLITS, SPLIT_POLICY, RING_STAGES, PDL, O_SPLIT, LAZY_SUM, PDL_PROLOGUE,
              FUSED_MERGE, SPLIT_LOOP, MULTI_TOKEN, ROWS_AS_M)

    def available(self) -> tuple[bool, str]:
        return hopper_gluon_available()

    def supports(self, shape: MLADecodeShape) -> tuple[bool, str]:
        ok, why = check_mla_dims(shape, "the Hopper Gluon kernel")
        if not ok:
            return ok, why
        if shape.page_size != 64:
            return False, f"page size must be 64 (one TMA tile per page), got {shape.page_size}"
        if shape.q_dtype != shape.kv_dtype or shape.q_dtype not in ("bfloat16", "float16"):
            return False, f"q and kv must both be bf16 or fp16, got {shape.q_dtype} / {shape.kv_dtype}"
        return True, ""

    def split_programs(self, shape: MLADecodeShape, params: dict[str, Any]) -> int:
        """Row tiles of one split (:class:`mlabench.kernels.row_tiling.RowTiling`): 1 up to 64
        packed rows (``qo_len x heads``), ``ceil(rows / 64)`` beyond."""
        return RowTiling.for_rows(shape.qo_len * shape.num_heads).row_tiles

    def prepare(self, inputs: MLADecodeInputs, params: dict[str, Any]) -> PreparedCall:
        from mlabench.kernels.gluon_fused_merge import fused_merge_fits, stage1_programs
        from mlabench.kernels.gluon_splitkv import (
            kv_descriptors, merge_sync_shape, mla_decode_gluon_splitkv,
        )
        from mlabench.kernels.split_loop import stage1_grid_splits
        from mlabench.kernels.splitkv import splitkv_workspace_bytes
        from mlabench.kernels.workspace import splitkv_workspace_shapes

        s = inputs.shape
        choice = SplitChoice(params, s, inputs.device)
        stages, pdl = int(params["num_stages"]), int(params["pdl"])
        rows = s.qo_len * s.num_heads
        variant = _kernel_variant(params, s, choice.mode)
        split_loop = variant.split_loop
        grid = stage1_grid_splits(split_loop, s.batch, rows, choice.grid_splits, stages,
                                  current_device().num_sms)
        fits = fused_merge_fits(stage1_programs(s.batch, rows, grid), current_device().num_sms)
        fits = fits and variant.multi_token_tiling(rows) is None  # the multi-token path: wide merge
        variant = dataclasses.replace(variant, fused_merge=fits and bool(int(FUSED_MERGE.value_in(params, s))))
        merge_sync = (torch.zeros(merge_sync_shape(s.batch, rows), dtype=torch.int32,
                                  device=inputs.device) if variant.fused_merge else None)
        o_shape, l_shape = splitkv_workspace_shapes(s.batch, rows, choice.grid_splits)
        part_o = torch.empty(o_shape, dtype=torch.float32, device=inputs.device)
        part_lse = torch.empty(l_shape, dtype=torch.float32, device=inputs.device)
        out = inputs.new_output()
        descs = kv_descriptors(inputs.kv_cache)

        def fn() -> torch.Tensor:
            return mla_decode_gluon_splitkv(inputs.q, inputs.kv_cache, inputs.block_table,
                                            inputs.cache_seqlens, out, choice.splits, s.scale,
                                            partial_out=part_o, partial_lse=part_lse,
                                            descriptors=descs, num_stages=stages, pdl=pdl,
                                            split_policy=choice.table, qo_len=s.qo_len,
                                            causal=s.causal, variant=variant,
                                            merge_sync=merge_sync)

        refresh = choice.refresh_fn(inputs.cache_seqlens)
        choice.effective.update(num_stages=stages, pdl=pdl, o_split=variant.o_split,
                                lazy_sum=int(variant.lazy_sum),
                                pdl_prologue=int(variant.pdl_prologue),
                                fused_merge=int(variant.fused_merge),
                                split_loop=int(variant.split_loop),
                                **({"grid_splits": grid} if split_loop else {}))
        if variant.multi_token:  # what ran where asked (0: one token, or 16 rows or fewer)
            runs = variant.multi_token_tiling(rows) is not None
            choice.effective.update(multi_token=(variant.multi_token if stages > 1 else 1) * runs)
        if variant.rows_as_m:  # what ran where asked (0 on 32-row tiles and one token)
            choice.effective.update(rows_as_m=variant.rows_as_m_runs(rows))
        return PreparedCall(fn=fn, out=out, effective_params=choice.effective, refresh=refresh,
                            workspace_bytes=splitkv_workspace_bytes(
                                1, rows, sum(choice.counts(s.context_lens))),
                            split_starts=choice.split_starts(s.context_lens, PAGE_TOKENS))
