"""Backends computed with plain PyTorch: the fp32 oracle and a portable split-KV implementation."""

from __future__ import annotations

from typing import Any

import torch

from mlabench.backends.base import Backend, PreparedCall
from mlabench.backends.registry import register
from mlabench.backends.shared import NUM_KV_SPLITS
from mlabench.errors import UnsupportedShapeError
from mlabench.inputs import MLADecodeInputs
from mlabench.kernels.reference import mla_decode_reference
from mlabench.kernels.splitkv_torch import mla_decode_splitkv_torch, split_starts, splitkv_torch_elements
from mlabench.kernels.workspace import split_workspace_bytes
from mlabench.shapes import MLADecodeShape


@register
class ReferenceBackend(Backend):
    """fp32 PyTorch attention over gathered pages; the oracle every other backend is checked against."""

    name = "reference"
    summary = "fp32 PyTorch attention over gathered pages (the correctness oracle)"
    is_reference = True
    family = "reference"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def prepare(self, inputs: MLADecodeInputs, params: dict[str, Any]) -> PreparedCall:
        s = inputs.shape
        lens = list(s.context_lens)
        out = torch.full((s.num_query_tokens, s.num_heads, s.v_head_dim), float("nan"), device=inputs.device)

        def fn() -> torch.Tensor:
            o, _ = mla_decode_reference(inputs.q, inputs.kv_cache, inputs.block_table, lens, s.scale,
                                        s.kv_lora_rank, qo_len=s.qo_len, causal=s.causal)
            return out.copy_(o)

        def refresh() -> None:  # the lengths fn slices with, read on the host
            lens[:] = inputs.cache_seqlens.tolist()

        return PreparedCall(fn=fn, out=out, graph_safe=False, refresh=refresh)


@register
class TorchSplitKVBackend(Backend):
    """The two-stage split-KV algorithm in vectorised PyTorch: runs anywhere, small shapes only."""

    name = "torch-splitkv"
    summary = "split-KV (flash-decoding) in plain PyTorch; portable, small shapes"
    params = (NUM_KV_SPLITS,)
    family = "split-kv"
    max_elements = 1 << 27

    def available(self) -> tuple[bool, str]:
        return True, ""

    def _too_large(self, shape: MLADecodeShape, splits: int) -> str:
        n = splitkv_torch_elements(shape.batch, shape.qo_len * shape.num_heads, shape.max_context_len, splits)
        if n > self.max_elements:
            return (f"too large for the PyTorch split-KV at {splits} splits "
                    f"({n:,} intermediate elements > {self.max_elements:,})")
        return ""

    def supports(self, shape: MLADecodeShape) -> tuple[bool, str]:
        why = self._too_large(shape, 1)
        return not why, why

    def prepare(self, inputs: MLADecodeInputs, params: dict[str, Any]) -> PreparedCall:
        s = inputs.shape
        splits = params["num_kv_splits"]
        if why := self._too_large(s, splits):
            raise UnsupportedShapeError(why)
        out = inputs.new_output()

        def fn() -> torch.Tensor:
            return mla_decode_splitkv_torch(inputs.q, inputs.kv_cache, inputs.block_table,
                                            inputs.cache_seqlens, splits, s.scale, out=out,
                                            kv_lora_rank=s.kv_lora_rank, qo_len=s.qo_len, causal=s.causal)

        rows = s.batch * splits * s.qo_len * s.num_heads
        return PreparedCall(fn=fn, out=out, effective_params={"num_kv_splits": splits},
                            workspace_bytes=split_workspace_bytes(rows, s.v_head_dim),
                            split_starts=split_starts(s.context_lens, splits))
