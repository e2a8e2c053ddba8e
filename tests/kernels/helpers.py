"""Small input builders shared by the kernel tests, and where the kernels run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mlabench.device import current_device, triton_interpreting
from mlabench.inputs import MLADecodeInputs, make_inputs
from mlabench.kernels.reference import mla_decode_reference
from mlabench.shapes import MLADecodeShape

#: True when the kernels run in Triton's CPU interpreter (tests/conftest.py sets it without a GPU).
INTERPRETED = triton_interpreting()
#: The device the kernel tests put their tensors on: the GPU, where the kernels are compiled, or
#: the CPU under the interpreter.
DEVICE = "cpu" if INTERPRETED else current_device().torch_device

#: Max abs error against the fp32 reference.  fp16 operands: exact products, fp32 accumulation,
#: the softmax weights rounded to fp16 before P.V.  fp32 operands: exact in the interpreter, TF32
#: (fp16's 10-bit mantissa) in a compiled ``tl.dot`` on NVIDIA GPUs, so fp16's bound holds for both.
#: bf16 operands carry 8-bit mantissas (upcast to fp32 for the dots in the interpreter).
TOL = {"float16": 2e-3, "bfloat16": 2e-2, "float32": 2e-3}


def run_compile_script(code: str, *args: object, timeout: int = 600) -> str:
    """Standard output of ``python3 -c code args...`` run in a fresh process (no interpreter state:
    ``TRITON_INTERPRET`` removed; the repository first on the path): how the compile tests build
    a kernel for sm_90 without a GPU.  Skips the test where this Triton build has no ptxas; fails
    with the script's stderr tail on any other error."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                         env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                         text=True, env=env, timeout=timeout)
    if run.returncode != 0 and "ptxas" in run.stderr and "not found" in run.stderr:
        pytest.skip("this Triton build has no ptxas")
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def make_case(heads: int, lens: tuple[int, ...], page: int, dtype: str = "float16",
              seed: int = 0, poison: bool = True) -> tuple[MLADecodeInputs, torch.Tensor]:
    """Inputs on :data:`DEVICE` (NaN in every slot no request may read unless ``poison`` is False: for
    tests whose lengths grow in place) and the fp32 reference output ``[B, H, 512]``."""
    shape = MLADecodeShape.create(num_heads=heads, context_lens=lens, page_size=page,
                                  q_dtype=dtype, kv_dtype=dtype)
    inp = make_inputs(shape, device=DEVICE, seed=seed, poison=poison)
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



def vllm_query_halves(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``q [T, H, 576]`` -> ``(ql_nope [T, H, 512], q_pe [T, H, 64])`` holding q's values, laid out
    as vLLM's MLA layer hands them to ``forward_mqa``: ``ql_nope`` the transposed view of a ``[H,
    T, 512]`` bmm output (strides ``(512, T * 512, 1)``: not contiguous), ``q_pe`` a slice of the
    ``[T, H, 192]`` projected query (strides ``(H * 192, 192, 1)``).  The bmm multiplies by the
    identity, so the values are exact in any dtype."""
    tokens, heads, _ = q.shape
    eye = torch.eye(512, dtype=q.dtype, device=q.device).expand(heads, 512, 512)
    ql_nope = torch.bmm(q[..., :512].transpose(0, 1), eye).transpose(0, 1)
    projected = torch.zeros(tokens, heads, 192, dtype=q.dtype, device=q.device)
    projected[..., 128:] = q[..., 512:]
    return ql_nope, projected[..., 128:]
