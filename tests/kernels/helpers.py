"""Small input builders shared by the kernel tests."""

from __future__ import annotations

import torch

from mlabench.inputs import MLADecodeInputs, make_inputs
from mlabench.kernels.reference import mla_decode_reference
from mlabench.shapes import MLADecodeShape

#: fp16/fp32 dots in the interpreter are exact to fp32 rounding; bf16 inputs carry 8-bit mantissas.
TOL = {"float16": 2e-3, "bfloat16": 2e-2, "float32": 2e-3}


def make_case(heads: int, lens: tuple[int, ...], page: int, dtype: str = "float16",
              seed: int = 0) -> tuple[MLADecodeInputs, torch.Tensor]:
    """Inputs on the CPU and the fp32 reference output ``[B, H, 512]``."""
    shape = MLADecodeShape.create(num_heads=heads, context_lens=lens, page_size=page,
                                  q_dtype=dtype, kv_dtype=dtype)
    inp = make_inputs(shape, device="cpu", seed=seed)
    return inp, reference(inp, inp.q)


def reference(inp: MLADecodeInputs, q: torch.Tensor) -> torch.Tensor:
    ref, _ = mla_decode_reference(q, inp.kv_cache, inp.block_table, inp.cache_seqlens,
                                  inp.shape.scale)
    return ref


def max_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Max abs difference; NaN anywhere (an unwritten poisoned row) counts as infinite."""
    if torch.isnan(out).any():
        return float("inf")
    return (out.float() - ref.float()).abs().max().item()
