"""The project's own Triton kernels as backends: ``triton-splitkv`` and ``triton-persistent``.

Triton is imported lazily (in :meth:`available` and :meth:`prepare`): this module is imported on
every CLI start and must not fail where Triton is missing or broken.
"""

from __future__ import annotations

from typing import Any

import torch

from mlabench.backends.base import Backend, ParamSpec, PreparedCall
from mlabench.backends.registry import register
from mlabench.backends.shared import HEAD_PADDING, NUM_KV_SPLITS, check_mla_dims, timed_us
from mlabench.device import current_device, triton_interpreting
from mlabench.extras import optional_import
from mlabench.inputs import MLADecodeInputs
from mlabench.kernels.padding import HEAD_TILE, HeadPadder, padded_heads
from mlabench.policy.device_table import parse_split_policy
from mlabench.shapes import MLADecodeShape

NO_GPU_REASON = "no GPU: set TRITON_INTERPRET=1 to run it in Triton's CPU interpreter (slow)"
#: Distributions that ship Triton: upstream, and the builds torch's ROCm and CUDA wheels pull in.
TRITON_PACKAGES = {"triton": ("triton", "pytorch-triton-rocm", "pytorch-triton")}

SPLIT_POLICY = ParamSpec(
    "split_policy", str, default="",
    help="where the split count comes from: empty = num_kv_splits for every request; "
         "'device[:POLICY.json]' = each request's own count looked up in a policy table in device "
         "memory (one captured graph keeps the right count at every length); "
         "'host[:POLICY.json]' = one count looked up on the host from the longest context at each "
         "refresh (a captured graph keeps the count of capture time). Without a file: vLLM's "
         "heuristic as a table. num_kv_splits is ignored in both policy modes",
)

PROGRAMS_PER_SM = ParamSpec(
    "programs_per_sm", int, default=2, low=1, high=8,
    help="persistent grid size per SM/CU (grid = programs_per_sm x SM count, per 16-head tile); "
         "default 2: best at all but batch 1 / 4K on an H200 (results/h200/kernel-probe/)",
)


#: Shared memory of one stage-1 program of ``triton-splitkv`` at the default launch (32-token
#: tiles, 4 warps, 6 stages) compiled for sm_90: 93.7 KB (docs/PERFORMANCE.md), so two fit in an
#: H200 SM's 228 KB.  At 4 warps the registers allow two as well (65,536 per SM / (128 x 255)).
SPLITKV_SHARED_BYTES = int(93.7 * 1024)
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
    packs each request's ``qo_len x H`` rows into the kernel's 16-row tiles (no head padding).
    """

    name = "triton-splitkv"
    family = "split-kv"
    summary = "project Triton split-KV (flash-decoding) kernel, explicit num_kv_splits or a split policy"
    params = (NUM_KV_SPLITS, SPLIT_POLICY)

    def resident_programs(self, shape: MLADecodeShape, params: dict[str, Any]) -> int | None:
        """Stage-1 programs resident at once with a fixed ``num_kv_splits`` on a CUDA GPU:
        :func:`programs_per_sm` of the SM's shared memory x SMs (264 on an H200).  None on ROCm
        (other launch defaults, not measured), on the CPU, with a split policy, and with a torch
        that does not report the SM's shared memory."""
        dev = current_device()
        if dev.kind != "cuda" or params.get("split_policy"):
            return None
        sm_shared = getattr(torch.cuda.get_device_properties(0), "shared_memory_per_multiprocessor", None)
        return None if not sm_shared else programs_per_sm(int(sm_shared)) * dev.num_sms

    def split_programs(self, shape: MLADecodeShape, params: dict[str, Any]) -> int:
        """Head tiles of one split: ``ceil(qo_len x heads / 16)`` (the grid's third axis)."""
        return -(-shape.qo_len * shape.num_heads // HEAD_TILE)

    def split_tile_tokens(self, shape: MLADecodeShape, params: dict[str, Any]) -> int | None:
        """:data:`SPLITKV_TILE_TOKENS` (32): a split walks its tokens in tiles of the default
        ``block_n``, and its length, ``ceil(L / S)`` rounded up to 16 tokens, is a whole number of
        tiles when ``ceil(L / S)`` is (:func:`mlabench.policy.whole_tile_splits`).  None with a split
        policy (the count does not come from ``num_kv_splits`` then)."""
        return None if params.get("split_policy") else SPLITKV_TILE_TOKENS

    def prepare(self, inputs: MLADecodeInputs, params: dict[str, Any]) -> PreparedCall:
        from mlabench.kernels.splitkv import (
            SPLIT_ALIGN_TOKENS, alloc_splitkv_workspace, mla_decode_splitkv, splitkv_workspace_bytes,
        )
        from mlabench.kernels.splitkv_torch import split_starts

        s = inputs.shape
        mode, policy = parse_split_policy(str(params.get("split_policy") or ""),
                                          current_device().num_sms)
        grid_splits = int(params["num_kv_splits"]) if policy is None else policy.max_splits(s.batch)
        table = policy.device_table(s.batch, inputs.device) if mode == "device" else None
        state = {"splits": grid_splits}
        out = inputs.new_output()
        rows = s.qo_len * s.num_heads
        part_o, part_lse = alloc_splitkv_workspace(s.batch, rows, grid_splits, inputs.device)

        def fn() -> torch.Tensor:
            return mla_decode_splitkv(inputs.q, inputs.kv_cache, inputs.block_table,
                                      inputs.cache_seqlens, out, state["splits"], s.scale,
                                      partial_out=part_o, partial_lse=part_lse, split_policy=table,
                                      qo_len=s.qo_len, causal=s.causal)

        def refresh() -> None:  # host mode: one count for the step, from the longest context
            state["splits"] = policy.lookup(s.batch, int(inputs.cache_seqlens.max()))
            effective["num_kv_splits"] = state["splits"]

        effective: dict[str, Any] = {"num_kv_splits": grid_splits}
        if mode == "host":
            refresh()
        if policy is not None:
            effective.update(split_policy=mode, policy_source=policy.source)
        counts = ([policy.lookup(s.batch, n) for n in s.context_lens] if mode == "device"
                  else [state["splits"]] * s.batch)
        return PreparedCall(fn=fn, out=out, effective_params=effective,
                            refresh=refresh if mode == "host" else None,
                            workspace_bytes=splitkv_workspace_bytes(1, rows, sum(counts)),
                            split_starts=[split_starts([n], c, SPLIT_ALIGN_TOKENS)[0]
                                          for n, c in zip(s.context_lens, counts)])


@register
class TritonPersistentBackend(_TritonBackend):
    """Persistent Triton kernel over a balanced work list, on 16-head tiles
    (:func:`mlabench.kernels.persistent.mla_decode_persistent`).

    The timed call pads q to 16-head tiles, runs the kernel into a ``[B, Hp, 512]`` buffer and
    copies the first H rows into the output: a server pays those copies every layer.  With
    ``qo_len`` query tokens the padding applies per token (``[B * qo_len, Hp, 576]``: 12 heads ->
    16 of each token, one tile per token).  The work
    list is built once in ``prepare`` (untimed, reported in ``setup_us``) and rebuilt in place by
    ``refresh``, like FlashMLA's scheduling metadata, which servers build once per step for all
    layers.  The list is computed on the device, but by about 35 small torch ops launched eagerly
    from Python (:func:`mlabench.kernels.worklist.rebuild_work_list`): ``refresh_us`` is their
    host-side launch cost (no host sync, no host-side build), hundreds of µs where one fused
    kernel would take a few.
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
        from mlabench.kernels.worklist import build_work_list, rebuild_work_list, request_split_starts

        s = inputs.shape
        mode = str(params["head_padding"])
        num_programs = int(params["programs_per_sm"]) * current_device().num_sms
        hp = padded_heads(s.num_heads, HEAD_TILE)
        padder = HeadPadder(inputs.q, hp, mode)
        out_pad = inputs.new_output(hp, poison=False)  # [B * qo_len, Hp, 512]
        out = inputs.new_output()
        part_o, part_lse = alloc_persistent_workspace(num_programs, s.batch, s.qo_len * hp, inputs.device)
        work, work_list_us = timed_us(inputs.device, lambda: build_work_list(
            inputs.cache_seqlens, num_programs, WORK_GRANULARITY_TOKENS))

        def refresh() -> None:  # the work list the kernel (or a graph of it) reads, in place
            rebuild_work_list(work, inputs.cache_seqlens, WORK_GRANULARITY_TOKENS)

        def fn() -> torch.Tensor:
            q_pad = padder()
            mla_decode_persistent(q_pad, inputs.kv_cache, inputs.block_table, inputs.cache_seqlens,
                                  out_pad, s.scale, num_programs, work=work,
                                  partial_out=part_o, partial_lse=part_lse, qo_len=s.qo_len,
                                  causal=s.causal)
            return out.copy_(out_pad[:, :s.num_heads])

        block_n, num_warps, num_stages = default_launch(inputs.q)
        return PreparedCall(
            fn=fn, out=out,
            effective_params={"head_padding": mode, "num_programs": num_programs,
                              "padded_heads": hp, "block_n": block_n, "num_warps": num_warps,
                              "num_stages": num_stages},
            setup_us={"work_list_us": work_list_us}, refresh=refresh,
            workspace_bytes=persistent_workspace_bytes(num_programs, s.batch, s.qo_len * hp),
            split_starts=request_split_starts(work),
        )
