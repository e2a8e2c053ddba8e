"""The project's own Triton kernels as backends: ``triton-splitkv`` and ``triton-persistent``.

Triton is imported lazily (in :meth:`available` and :meth:`prepare`): this module is imported on
every CLI start and must not fail where Triton is missing or broken.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mlabench.backends.base import Backend, ParamSpec, PreparedCall, check_mla_dims
from mlabench.backends.registry import register
from mlabench.backends.shared import (
    HEAD_PADDING, NUM_KV_SPLITS, SPLIT_POLICY, TRITON_PACKAGES, timed_us,
)
from mlabench.device import current_device, triton_interpreting
from mlabench.errors import ConfigError
from mlabench.extras import optional_import
from mlabench.inputs import MLADecodeInputs
from mlabench.kernels.padding import HEAD_TILE, HeadPadder, padded_heads
from mlabench.kernels.triton_launch import CUDA_LAUNCH, ROW_TILES, choose_rows_per_tile, row_tiles
from mlabench.policy.split_choice import SplitChoice
from mlabench.shapes import MLADecodeShape

NO_GPU_REASON = "no GPU: set TRITON_INTERPRET=1 to run it in Triton's CPU interpreter (slow)"


@dataclass(frozen=True)
class RowsPerTileSpec(ParamSpec):
    """:data:`ROWS_PER_TILE`: a string parameter without choices (so ``tune`` and ``check`` keep
    it at its default rather than searching it), validated here: ``"auto"`` or one of
    :data:`mlabench.kernels.triton_launch.ROW_TILES` (an int or its digits), returned as a string."""

    def validate(self, value: Any) -> Any:
        text = str(value).strip()
        if text == "auto":
            return text
        if not text.isdigit() or int(text) not in ROW_TILES:
            raise ConfigError(f"{self.name} must be auto or one of "
                              f"{', '.join(map(str, ROW_TILES))}, got {value!r}")
        return str(int(text))


ROWS_PER_TILE = RowsPerTileSpec(
    "rows_per_tile", str, default="16", omit_default=True,
    help="query rows (qo_len x heads, packed token-major) one program holds: 16 (default), 32 or "
         "64, each tile streaming the KV cache once; auto = the smallest that holds a request's "
         "rows, at most 64.  Default 16: on an H200 (results/h200/deploy/triton-rows/) the 32- and "
         "64-row tiles read the cache fewer times but ran 5-17% slower at batch 16 for 2-8 tokens",
)


def resolve_rows_per_tile(params: dict[str, Any], rows: int) -> int:
    """The row tile a launch of ``rows`` packed rows per request uses under ``params``'
    ``rows_per_tile`` (absent: the default, 16; ``"auto"``:
    :func:`mlabench.kernels.triton_launch.choose_rows_per_tile`)."""
    value = str(params.get("rows_per_tile") or ROWS_PER_TILE.default)
    return choose_rows_per_tile(rows, None if value == "auto" else int(value))


PROGRAMS_PER_SM = ParamSpec(
    "programs_per_sm", int, default=2, low=1, high=8,
    help="persistent grid size per SM/CU (grid = programs_per_sm x SM count, per 16-head tile); "
         "default 2: best at all but batch 1 / 4K on an H200 (results/h200/kernel-probe/)",
)


#: Shared memory of one stage-1 program of ``triton-splitkv`` at the default launch (32-token
#: tiles, 4 warps, 6 stages) compiled for sm_90: 93.7 KB (docs/PERFORMANCE.md), so two fit in an
#: H200 SM's 228 KB.  At 4 warps the registers allow two as well (65,536 per SM / (128 x 255)).
SPLITKV_SHARED_BYTES = int(93.7 * 1024)
#: Stage-1 programs of one SM, per row tile, from registers and shared memory of the sm_90
#: compile (:mod:`mlabench.kernels.triton_launch`): 16 rows: 2 (93.7 KB, 187 registers x 128 threads);
#: 32 rows: 1 (170 registers x 256 threads); 64 rows: 1 (255 registers x 256 threads).  The
#: registers of 32 and 64 rows bound it below what shared memory would allow.
SPLITKV_REGISTER_PROGRAMS_PER_SM = {16: 2, 32: 1, 64: 1}
#: Tokens per tile of ``triton-splitkv``'s default launch, ``DEFAULT_BLOCK_N`` of
#: ``mlabench/kernels/common.py`` (that module imports Triton, this one must not; a test checks
#: that they agree).
SPLITKV_TILE_TOKENS = 32
#: Shared memory CUDA reserves per resident block (the "reserved shared memory" of compute 8.0+).
CUDA_RESERVED_SHARED_BYTES = 1024


def programs_per_sm(sm_shared_bytes: int, program_shared_bytes: int = SPLITKV_SHARED_BYTES) -> int:
    """Programs of ``program_shared_bytes`` shared memory each that fit at once in one SM with
    ``sm_shared_bytes`` (at least 1): 2 on an H200 (233,472 bytes), 1 on an A100 (167,936)."""
    return max(1, sm_shared_bytes // (program_shared_bytes + CUDA_RESERVED_SHARED_BYTES))


def triton_available() -> tuple[bool, str]:
    """``(True, "")`` on a CUDA/ROCm GPU with Triton importable, or on the CPU under
    ``TRITON_INTERPRET=1``; otherwise ``(False, reason)``."""
    if not (current_device().is_gpu or triton_interpreting()):
        return False, NO_GPU_REASON
    _mod, reason = optional_import("triton")
    return (True, "") if _mod is not None else (False, reason)


class _TritonBackend(Backend):
    """What the project's two Triton kernels share: availability, the shapes they take, versions."""

    gpu_kernel = True
    packages = TRITON_PACKAGES

    def available(self) -> tuple[bool, str]:
        return triton_available()

    def supports(self, shape: MLADecodeShape) -> tuple[bool, str]:
        if shape.q_dtype != shape.kv_dtype:
            return False, f"q and kv dtypes must match, got {shape.q_dtype} / {shape.kv_dtype}"
        return check_mla_dims(shape, "the project's Triton kernels")


@register
class TritonSplitKVBackend(_TritonBackend):
    """Two-stage split-KV Triton kernel (:func:`mlabench.kernels.splitkv.mla_decode_splitkv`).

    The split count is ``num_kv_splits``, or comes from a split policy (:data:`SPLIT_POLICY`): in
    ``device`` mode every request looks its own count up on the device (the grid is sized for the
    policy's largest count for this batch size; nothing to refresh); in ``host`` mode ``refresh``
    looks one count up from the longest context, as a server choosing the count on the host does,
    which a captured graph cannot follow (``mlabench graph-check`` flags it).  A multi-token step
    packs each request's ``qo_len x H`` rows into the kernel's row tiles (no head padding), of
    :data:`ROWS_PER_TILE` rows: by default 16 (three passes over the cache at 4 tokens of 12 heads;
    one 64-row tile reads it once but measured slower on an H200).
    """

    name = "triton-splitkv"
    family = "split-kv"
    summary = "project Triton split-KV (flash-decoding) kernel, explicit num_kv_splits or a split policy"
    params = (NUM_KV_SPLITS, SPLIT_POLICY, ROWS_PER_TILE)

    def resident_programs(self, shape: MLADecodeShape, params: dict[str, Any]) -> int | None:
        """Stage-1 programs resident at once with a fixed ``num_kv_splits`` on a CUDA GPU: for the
        16-row tile :func:`programs_per_sm` of the SM's shared memory x SMs (264 on an H200); for
        32 and 64 rows one per SM (:data:`SPLITKV_REGISTER_PROGRAMS_PER_SM`, the registers of
        the sm_90 compile).  None on ROCm (other launch defaults, not measured), on the CPU, with
        a split policy, and with a torch that does not report the SM's shared memory."""
        dev = current_device()
        if dev.kind != "cuda" or params.get("split_policy"):
            return None
        sm_shared = getattr(torch.cuda.get_device_properties(0), "shared_memory_per_multiprocessor", None)
        if not sm_shared:
            return None
        tile = resolve_rows_per_tile(params, shape.qo_len * shape.num_heads)
        per_sm = min(programs_per_sm(int(sm_shared)), SPLITKV_REGISTER_PROGRAMS_PER_SM[tile])
        return per_sm * dev.num_sms

    def split_programs(self, shape: MLADecodeShape, params: dict[str, Any]) -> int:
        """Row tiles of one split: ``ceil(qo_len x heads / rows_per_tile)`` (the grid's third axis)."""
        rows = shape.qo_len * shape.num_heads
        return row_tiles(rows, resolve_rows_per_tile(params, rows))

    def split_tile_tokens(self, shape: MLADecodeShape, params: dict[str, Any]) -> int | None:
        """Tokens of the default launch's KV tile for the row tile (32 for 16 and 32 rows,
        :data:`SPLITKV_TILE_TOKENS`; 16 for 64 rows, :data:`mlabench.kernels.triton_launch.CUDA_LAUNCH`):
        a split walks its tokens in those tiles, and its length, ``ceil(L / S)`` rounded up to 16
        tokens, is a whole number of tiles when ``ceil(L / S)`` is
        (:func:`mlabench.policy.rules.whole_tile_splits`).  None with a split policy (the count does not
        come from ``num_kv_splits`` then)."""
        if params.get("split_policy"):
            return None
        return CUDA_LAUNCH[resolve_rows_per_tile(params, shape.qo_len * shape.num_heads)][0]

    def prepare(self, inputs: MLADecodeInputs, params: dict[str, Any]) -> PreparedCall:
        from mlabench.kernels.splitkv import (
            SPLIT_ALIGN_TOKENS, alloc_splitkv_workspace, mla_decode_splitkv, splitkv_workspace_bytes,
        )

        s = inputs.shape
        choice = SplitChoice(params, s, inputs.device)
        out = inputs.new_output()
        rows = s.qo_len * s.num_heads
        tile = resolve_rows_per_tile(params, rows)
        part_o, part_lse = alloc_splitkv_workspace(s.batch, rows, choice.grid_splits, inputs.device)

        def fn() -> torch.Tensor:
            return mla_decode_splitkv(inputs.q, inputs.kv_cache, inputs.block_table,
                                      inputs.cache_seqlens, out, choice.splits, s.scale,
                                      partial_out=part_o, partial_lse=part_lse,
                                      split_policy=choice.table, qo_len=s.qo_len, causal=s.causal,
                                      rows_per_tile=tile)

        refresh = choice.refresh_fn(inputs.cache_seqlens)
        choice.effective["rows_per_tile"] = tile
        return PreparedCall(fn=fn, out=out, effective_params=choice.effective, refresh=refresh,
                            workspace_bytes=splitkv_workspace_bytes(
                                1, rows, sum(choice.counts(s.context_lens))),
                            split_starts=choice.split_starts(s.context_lens, SPLIT_ALIGN_TOKENS))


@register
class TritonPersistentBackend(_TritonBackend):
    """Persistent Triton kernel over a balanced work list, on row tiles
    (:func:`mlabench.kernels.persistent.mla_decode_persistent`).

    One query token: the timed call pads q to 16-head tiles, runs the kernel into a
    ``[B, Hp, 512]`` buffer and copies the first H rows into the output, as a server pays those
    copies every layer.  Several query tokens (``qo_len`` > 1): each request's ``qo_len x H`` rows
    are packed unpadded into tiles of :data:`ROWS_PER_TILE` rows (by default one 64-row tile for
    up to 64 rows, one pass over the cache), the tile's spare rows masked in the kernel, so q and
    the output are used in place (no padding or copies; ``head_padding`` applies to one token only,
    and ``padded_heads`` reports H).  The work
    list is built once in ``prepare`` (untimed, reported in ``setup_us``) and rebuilt in place by
    ``refresh``, like FlashMLA's scheduling metadata, which servers build once per step for all
    layers.  The list is computed on the device, but by about 35 small torch ops launched eagerly
    from Python (:func:`mlabench.kernels.worklist.rebuild_work_list`): ``refresh_us`` is their
    host-side launch cost (no host sync, no host-side build), hundreds of µs where one fused
    kernel would take a few.
    """

    name = "triton-persistent"
    family = "persistent"
    summary = "project Triton persistent kernel, balanced work list, row tiles (16-head padded at one token)"
    params = (HEAD_PADDING, PROGRAMS_PER_SM, ROWS_PER_TILE)

    def prepare(self, inputs: MLADecodeInputs, params: dict[str, Any]) -> PreparedCall:
        from mlabench.kernels.common import default_launch
        from mlabench.kernels.persistent import (
            WORK_GRANULARITY_TOKENS, alloc_persistent_workspace, mla_decode_persistent,
            persistent_workspace_bytes,
        )
        from mlabench.kernels.worklist import build_work_list, rebuild_work_list, request_split_starts

        s = inputs.shape
        mode = str(params["head_padding"])
        num_programs = int(params["programs_per_sm"]) * current_device().num_sms
        pad = s.qo_len == 1  # several tokens: packed rows, masked in the kernel, need no padding
        hp = padded_heads(s.num_heads, HEAD_TILE) if pad else s.num_heads
        tile = resolve_rows_per_tile(params, s.qo_len * hp)
        out = inputs.new_output()
        part_o, part_lse = alloc_persistent_workspace(num_programs, s.batch, s.qo_len * hp, inputs.device)
        work, work_list_us = timed_us(inputs.device, lambda: build_work_list(
            inputs.cache_seqlens, num_programs, WORK_GRANULARITY_TOKENS))

        def refresh() -> None:  # the work list the kernel (or a graph of it) reads, in place
            rebuild_work_list(work, inputs.cache_seqlens, WORK_GRANULARITY_TOKENS)

        def decode(q: torch.Tensor, into: torch.Tensor) -> torch.Tensor:
            return mla_decode_persistent(q, inputs.kv_cache, inputs.block_table, inputs.cache_seqlens,
                                         into, s.scale, num_programs, work=work,
                                         partial_out=part_o, partial_lse=part_lse, qo_len=s.qo_len,
                                         causal=s.causal, rows_per_tile=tile)

        if pad:
            padder = HeadPadder(inputs.q, hp, mode)
            out_pad = inputs.new_output(hp, poison=False)  # [B, Hp, 512]

            def fn() -> torch.Tensor:
                decode(padder(), out_pad)
                return out.copy_(out_pad[:, :s.num_heads])
        else:
            def fn() -> torch.Tensor:
                return decode(inputs.q, out)

        block_n, num_warps, num_stages = default_launch(inputs.q, tile)
        return PreparedCall(
            fn=fn, out=out,
            effective_params={"head_padding": mode, "num_programs": num_programs,
                              "padded_heads": hp, "rows_per_tile": tile, "block_n": block_n,
                              "num_warps": num_warps, "num_stages": num_stages},
            setup_us={"work_list_us": work_list_us}, refresh=refresh,
            workspace_bytes=persistent_workspace_bytes(num_programs, s.batch, s.qo_len * hp),
            split_starts=request_split_starts(work),
        )
