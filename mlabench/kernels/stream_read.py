"""A streaming read-only reduction in Triton: one of the two read ceilings of the roofline.

Each program sums ``BLOCK``-element blocks of a flat fp32 buffer, stepping by the grid size, with a
software-pipelined loop (16-byte loads, several blocks in flight per program), and writes one fp32
partial sum.  It reads every byte once and writes ``programs * 4`` bytes, so its time is the time
to stream the buffer from memory.  On an NVIDIA H200 (Triton 3.6) this read 4.49-4.61 TB/s where
``torch.amax`` over the same 4 GiB read 4.16-4.41 TB/s, and the project's Hopper decode kernel
itself read 4.41-4.47 TB/s (docs/PERFORMANCE.md §1): a floor measured with ``torch.amax`` alone
would let a decode kernel show more than 100%.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: fp32 elements per block (16 KiB): each thread of 8 warps loads 16 elements, four 16-byte loads.
STREAM_BLOCK = 4096
#: Programs per SM/CU: enough resident programs to keep every memory channel busy.
STREAM_PROGRAMS_PER_SM = 4


@triton.jit
def _stream_sum_kernel(x_ptr, out_ptr, n_blocks, BLOCK: tl.constexpr, NUM_STAGES: tl.constexpr):
    acc = tl.zeros([BLOCK], tl.float32)
    for blk in tl.range(tl.program_id(0), n_blocks, tl.num_programs(0), num_stages=NUM_STAGES):
        acc += tl.load(x_ptr + tl.cast(blk, tl.int64) * BLOCK + tl.arange(0, BLOCK))
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, 0))


def stream_sum(x: torch.Tensor, partial_out: torch.Tensor, num_stages: int = 4) -> torch.Tensor:
    """Sum the leading ``(x.numel() // STREAM_BLOCK) * STREAM_BLOCK`` elements of ``x`` into
    ``partial_out`` (one fp32 partial per program; the grid is ``partial_out.numel()`` programs).

    ``x``: a contiguous fp32 tensor on a GPU, at least one block long.  ``partial_out``: fp32
    ``[programs]``.  Returns ``partial_out``.  Raises ValueError on a wrong dtype or a short buffer.
    """
    if x.dtype != torch.float32 or partial_out.dtype != torch.float32 or not x.is_contiguous():
        raise ValueError("stream_sum takes contiguous fp32 tensors")
    n_blocks = x.numel() // STREAM_BLOCK
    if n_blocks < 1:
        raise ValueError(f"stream_sum needs at least {STREAM_BLOCK} elements, got {x.numel()}")
    _stream_sum_kernel[(partial_out.numel(),)](x, partial_out, n_blocks, BLOCK=STREAM_BLOCK,
                                               NUM_STAGES=num_stages, num_warps=8)
    return partial_out
