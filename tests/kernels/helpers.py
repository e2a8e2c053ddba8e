"""Small input builders shared by the kernel tests."""

from __future__ import annotations

import torch

from mlabench.inputs import MLADecodeInputs, make_inputs
from mlabench.kernels.reference import mla_decode_reference
from mlabench.shapes import MLADecodeShape

#: fp16/fp32 dots in the interpreter are exact to fp32 rounding; bf16 inputs carry 8-bit mantissas.
TOL = {"float16": 2e-3, "bfloat16": 2e-2, "float32": 2e-3}


def make_case(heads: int, lens: tuple[int, ...], page: int, dtype: str = "float16",
              seed: int = 0, poison: bool = True) -> tuple[MLADecodeInputs, torch.Tensor]:
    """Inputs on the CPU (NaN in every slot no request may read unless ``poison`` is False: for
    tests whose lengths grow in place) and the fp32 reference output ``[B, H, 512]``."""
    shape = MLADecodeShape.create(num_heads=heads, context_lens=lens, page_size=page,
                                  q_dtype=dtype, kv_dtype=dtype)
    inp = make_inputs(shape, device="cpu", seed=seed, poison=poison)
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


def assert_equal_up_to_rounding(out: torch.Tensor, expected: torch.Tensor) -> None:
    """Rows computed from the same query at other rows of a 16-row head tile agree to one rounding
    of the fp16 output.

    Under the interpreter ``tl.dot`` is a CPU matmul, which may sum a tile's edge rows in another
    order, so the fp32 accumulators of two copies of one query differ in their last bits and the
    fp16 outputs can land one step apart (seen: 2e-7 and 8e-6, one ulp).  One fp16 ulp is at most
    ``2**-10 * |x|`` (fp16 machine epsilon), and ``1e-6`` covers results rounded near zero.  Rows
    of a wrong head or a leaked padding row differ by ~1 (outputs are O(1)), 1000x more.
    """
    torch.testing.assert_close(out, expected, rtol=2.0 ** -10, atol=1e-6)

