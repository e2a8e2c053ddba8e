"""The project's own Triton kernels as backends: ``triton-splitkv`` and ``triton-persistent``.

Triton is imported lazily (in :meth:`available` and :meth:`prepare`): this module is imported on
every CLI start and must not fail where Triton is missing or broken.
"""

from __future__ import annotations

from typing import Any

import torch

from mlabench.backends.base import Backend, ParamSpec, PreparedCall
from mlabench.backends.common import HEAD_PADDING, NUM_KV_SPLITS, check_mla_dims, timed_us
from mlabench.backends.registry import register
from mlabench.device import current_device, triton_interpreting
from mlabench.extras import optional_import
from mlabench.inputs import MLADecodeInputs
from mlabench.kernels.padding import HEAD_TILE, HeadPadder, padded_heads
from mlabench.shapes import MLADecodeShape

NO_GPU_REASON = "no GPU: set TRITON_INTERPRET=1 to run it in Triton's CPU interpreter (slow)"
#: Distributions that ship Triton: upstream, and the builds torch's ROCm and CUDA wheels pull in.
TRITON_PACKAGES = {"triton": ("triton", "pytorch-triton-rocm", "pytorch-triton")}

PROGRAMS_PER_SM = ParamSpec(
    "programs_per_sm", int, default=2, low=1, high=8,
    help="persistent grid size per SM/CU (grid = programs_per_sm x SM count, per 16-head tile); "
         "default 2: best at all but batch 1 / 4K on an H200 (results/h200/kernel-probe/)",
)


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
        if shape.qo_len != 1:
            return False, f"only qo_len 1 is supported, got {shape.qo_len}"
        if shape.q_dtype != shape.kv_dtype:
            return False, f"q and kv dtypes must match, got {shape.q_dtype} / {shape.kv_dtype}"
        return check_mla_dims(shape, "the project's Triton kernels")


@register
class TritonSplitKVBackend(_TritonBackend):
    """Two-stage split-KV Triton kernel (:func:`mlabench.kernels.splitkv.mla_decode_splitkv`)."""

    name = "triton-splitkv"
    family = "split-kv"
    summary = "project Triton split-KV (flash-decoding) kernel, explicit num_kv_splits"
    params = (NUM_KV_SPLITS,)

    def prepare(self, inputs: MLADecodeInputs, params: dict[str, Any]) -> PreparedCall:
        from mlabench.kernels.splitkv import (
            SPLIT_ALIGN_TOKENS, alloc_splitkv_workspace, mla_decode_splitkv, splitkv_workspace_bytes,
        )
        from mlabench.kernels.splitkv_torch import split_starts

        s = inputs.shape
        splits = int(params["num_kv_splits"])
        out = inputs.new_output()
        part_o, part_lse = alloc_splitkv_workspace(s.batch, s.num_heads, splits, inputs.device)

        def fn() -> torch.Tensor:
            return mla_decode_splitkv(inputs.q, inputs.kv_cache, inputs.block_table,
                                      inputs.cache_seqlens, out, splits, s.scale,
                                      partial_out=part_o, partial_lse=part_lse)

        return PreparedCall(fn=fn, out=out, effective_params={"num_kv_splits": splits},
                            workspace_bytes=splitkv_workspace_bytes(s.batch, s.num_heads, splits),
                            split_starts=split_starts(s.context_lens, splits, SPLIT_ALIGN_TOKENS))


@register
class TritonPersistentBackend(_TritonBackend):
    """Persistent Triton kernel over a balanced work list, on 16-head tiles
    (:func:`mlabench.kernels.persistent.mla_decode_persistent`).

    The timed call pads q to 16-head tiles, runs the kernel into a ``[B, Hp, 512]`` buffer and
    copies the first H rows into the output: a server pays those copies every layer.  The work
    list is built once in ``prepare`` (untimed, reported in ``setup_us``), like FlashMLA's
    scheduling metadata, which servers build once per step for all layers.
    """

    name = "triton-persistent"
    family = "persistent"
    summary = "project Triton persistent kernel, balanced work list, 16-head tiles"
    params = (HEAD_PADDING, PROGRAMS_PER_SM)

    def prepare(self, inputs: MLADecodeInputs, params: dict[str, Any]) -> PreparedCall:
        from mlabench.kernels.common import default_launch
        from mlabench.kernels.persistent import (
            WORK_GRANULARITY_TOKENS, alloc_persistent_workspace, mla_decode_persistent,
            persistent_workspace_bytes,
        )
        from mlabench.kernels.worklist import build_work_list, request_split_starts

        s = inputs.shape
        mode = str(params["head_padding"])
        num_programs = int(params["programs_per_sm"]) * current_device().num_sms
        hp = padded_heads(s.num_heads, HEAD_TILE)
        padder = HeadPadder(inputs.q, hp, mode)
        out_pad = torch.empty((s.batch, hp, s.v_head_dim), dtype=inputs.q.dtype, device=inputs.device)
        out = inputs.new_output()
        part_o, part_lse = alloc_persistent_workspace(num_programs, s.batch, hp, inputs.device)
        work, work_list_us = timed_us(inputs.device, lambda: build_work_list(
            inputs.cache_seqlens, num_programs, WORK_GRANULARITY_TOKENS))

        def fn() -> torch.Tensor:
            q_pad = padder()
            mla_decode_persistent(q_pad, inputs.kv_cache, inputs.block_table, inputs.cache_seqlens,
                                  out_pad, s.scale, num_programs, work=work,
                                  partial_out=part_o, partial_lse=part_lse)
            return out.copy_(out_pad[:, :s.num_heads])

        block_n, num_warps, num_stages = default_launch(inputs.q)
        return PreparedCall(
            fn=fn, out=out,
            effective_params={"head_padding": mode, "num_programs": num_programs,
                              "padded_heads": hp, "block_n": block_n, "num_warps": num_warps,
                              "num_stages": num_stages},
            setup_us={"work_list_us": work_list_us},
            workspace_bytes=persistent_workspace_bytes(num_programs, s.batch, hp),
            split_starts=request_split_starts(work),
        )
