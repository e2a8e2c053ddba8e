"""The project's own Triton kernels as backends: ``triton-splitkv`` and ``triton-persistent``.

Triton is imported lazily (in :meth:`available` and :meth:`prepare`): this module is imported on
every CLI start and must not fail where Triton is missing or broken.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from mlabench.backends.base import Backend, ParamSpec, PreparedCall
from mlabench.backends.reference import NUM_KV_SPLITS
from mlabench.backends.registry import register
from mlabench.device import current_device, triton_interpreting
from mlabench.extras import optional_import
from mlabench.inputs import MLADecodeInputs
from mlabench.kernels.padding import HEAD_PADDINGS, HEAD_TILE, padded_heads
from mlabench.shapes import MLADecodeShape

NO_GPU_REASON = "no GPU: set TRITON_INTERPRET=1 to run it in Triton's CPU interpreter (slow)"

HEAD_PADDING = ParamSpec(
    "head_padding", str, default="zero", choices=HEAD_PADDINGS,
    help="how q is padded to 16-head tiles: zero heads, or the heads repeated in order",
)
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


def _supports(shape: MLADecodeShape) -> tuple[bool, str]:
    if shape.qo_len != 1:
        return False, f"only qo_len 1 is supported, got {shape.qo_len}"
    if (shape.kv_lora_rank, shape.qk_rope_head_dim) != (512, 64):
        return False, (f"kernels are written for kv_lora_rank 512 + rope 64, got "
                       f"{shape.kv_lora_rank} + {shape.qk_rope_head_dim}")
    if shape.q_dtype != shape.kv_dtype:
        return False, f"q and kv dtypes must match, got {shape.q_dtype} / {shape.kv_dtype}"
    return True, ""


@register
class TritonSplitKVBackend(Backend):
    """Two-stage split-KV Triton kernel (:func:`mlabench.kernels.splitkv.mla_decode_splitkv`)."""

    name = "triton-splitkv"
    family = "split-kv"
    gpu_kernel = True
    summary = "project Triton split-KV (flash-decoding) kernel, explicit num_kv_splits"
    params = (NUM_KV_SPLITS,)

    def available(self) -> tuple[bool, str]:
        return triton_available()

    def supports(self, shape: MLADecodeShape) -> tuple[bool, str]:
        return _supports(shape)

    def prepare(self, inputs: MLADecodeInputs, params: dict[str, Any]) -> PreparedCall:
        from mlabench.kernels.splitkv import (
            alloc_splitkv_workspace, mla_decode_splitkv, splitkv_workspace_bytes,
        )

        s = inputs.shape
        splits = int(params["num_kv_splits"])
        out = inputs.new_output()
        part_o, part_lse = alloc_splitkv_workspace(s.batch, s.num_heads, splits, inputs.device)

        def fn() -> torch.Tensor:
            return mla_decode_splitkv(inputs.q, inputs.kv_cache, inputs.block_table,
                                      inputs.cache_seqlens, out, splits, s.scale,
                                      partial_out=part_o, partial_lse=part_lse)

        return PreparedCall(fn=fn, out=out, effective_params={"num_kv_splits": splits},
                            workspace_bytes=splitkv_workspace_bytes(s.batch, s.num_heads, splits))


class _HeadPadder:
    """Copies q ``[B, H, 576]`` into a preallocated ``[B, Hp, 576]`` as
    :func:`mlabench.kernels.padding.pad_heads` lays it out, allocating nothing per call.

    ``zero``: the padding rows are zeroed once here and never written again.  ``repeat``: row
    ``r`` receives head ``r % H``, done as ``ceil(Hp / H)`` slice copies.
    """

    def __init__(self, q: torch.Tensor, target_heads: int, mode: str) -> None:
        batch, heads, dim = q.shape
        self.q = q
        self.buf = q.new_zeros((batch, target_heads, dim))
        self.copies = [(0, heads)]
        if mode == "repeat":
            self.copies = [(start, min(heads, target_heads - start))
                           for start in range(0, target_heads, heads)]

    def __call__(self) -> torch.Tensor:
        for start, n in self.copies:
            self.buf[:, start:start + n].copy_(self.q[:, :n])
        return self.buf


@register
class TritonPersistentBackend(Backend):
    """Persistent Triton kernel over a balanced work list, on 16-head tiles
    (:func:`mlabench.kernels.persistent.mla_decode_persistent`).

    The timed call pads q to 16-head tiles, runs the kernel into a ``[B, Hp, 512]`` buffer and
    copies the first H rows into the output: a server pays those copies every layer.  The work
    list is built once in ``prepare`` (untimed, reported in ``setup_us``), like FlashMLA's
    scheduling metadata, which servers build once per step for all layers.
    """

    name = "triton-persistent"
    family = "persistent"
    gpu_kernel = True
    summary = "project Triton persistent kernel, balanced work list, 16-head tiles"
    params = (HEAD_PADDING, PROGRAMS_PER_SM)

    def available(self) -> tuple[bool, str]:
        return triton_available()

    def supports(self, shape: MLADecodeShape) -> tuple[bool, str]:
        return _supports(shape)

    def prepare(self, inputs: MLADecodeInputs, params: dict[str, Any]) -> PreparedCall:
        from mlabench.kernels.persistent import (
            WORK_GRANULARITY_TOKENS, alloc_persistent_workspace, mla_decode_persistent,
            persistent_workspace_bytes,
        )
        from mlabench.kernels.common import default_launch
        from mlabench.kernels.worklist import build_work_list

        s = inputs.shape
        mode = str(params["head_padding"])
        num_programs = int(params["programs_per_sm"]) * current_device().num_sms
        hp = padded_heads(s.num_heads, HEAD_TILE)
        padder = _HeadPadder(inputs.q, hp, mode)
        out_pad = torch.empty((s.batch, hp, s.v_head_dim), dtype=inputs.q.dtype, device=inputs.device)
        out = inputs.new_output()
        part_o, part_lse = alloc_persistent_workspace(num_programs, s.batch, hp, inputs.device)
        t0 = time.perf_counter()
        work = build_work_list(inputs.cache_seqlens, num_programs, WORK_GRANULARITY_TOKENS)
        if inputs.device.type == "cuda":
            torch.cuda.synchronize()
        setup_us = {"work_list": (time.perf_counter() - t0) * 1e6}

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
            setup_us=setup_us,
            workspace_bytes=persistent_workspace_bytes(num_programs, s.batch, hp),
        )
