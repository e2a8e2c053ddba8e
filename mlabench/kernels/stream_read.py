"""A streaming read-only reduction in Triton: one of the two read ceilings of the roofline.

Each program sums ``BLOCK``-element blocks of a flat fp32 buffer, stepping by the grid size, with a
software-pipelined loop (16-byte loads, several blocks in flight per program), and writes one fp32
partial sum.  It reads every byte once and writes ``programs * 4`` bytes, so its time is the time
to stream the buffer from memory.  On an NVIDIA H200 (Triton 3.6) this read 4.49-4.61 TB/s where
``torch.amax`` over the same 4 GiB read 4.16-4.41 TB/s, and the project's Hopper decode kernel
itself read 4.41-4.47 TB/s (docs/PERFORMANCE.md §1): a floor measured with ``torch.amax`` alone
would let a decode kernel show more than 100%.

:func:`paged_sum` reads the same way through a block table, page by page in the table's order, as
a decode kernel reads a paged latent cache (a page of 64 tokens x 576 bf16 values is 72 KiB): the
third reading of the ceiling (:mod:`mlabench.measure.bandwidth`).
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


#: fp32 elements per block of the paged read (8 KiB): a page is a whole number of them.
PAGED_BLOCK = 2048


@triton.jit
def _paged_sum_kernel(x_ptr, table_ptr, out_ptr, n_pages, PAGE_BLOCKS: tl.constexpr, BLOCK: tl.constexpr,
                      NUM_STAGES: tl.constexpr):
    acc = tl.zeros([BLOCK], tl.float32)
    for i in tl.range(tl.program_id(0), n_pages * PAGE_BLOCKS, tl.num_programs(0), num_stages=NUM_STAGES):
        page = tl.load(table_ptr + i // PAGE_BLOCKS).to(tl.int64)
        offs = (page * PAGE_BLOCKS + i % PAGE_BLOCKS) * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, 0))


def paged_sum(x: torch.Tensor, block_table: torch.Tensor, page_elems: int, partial_out: torch.Tensor,
              num_stages: int = 4) -> torch.Tensor:
    """Sum the pages of ``x`` that ``block_table`` names, each once, into ``partial_out`` (one fp32
    partial per program; the grid is ``partial_out.numel()`` programs, stepping over the pages'
    blocks in table order).

    ``x``: contiguous fp32 on a GPU, read as pages of ``page_elems`` elements (a multiple of
    :data:`PAGED_BLOCK`); ``block_table``: int32 page indices, each below ``x.numel() // page_elems``.
    Returns ``partial_out``.  Raises ValueError on a wrong dtype, a page size that is not a whole
    number of blocks, or a page index outside ``x``.
    """
    if x.dtype != torch.float32 or partial_out.dtype != torch.float32 or not x.is_contiguous():
        raise ValueError("paged_sum takes contiguous fp32 tensors")
    if page_elems < PAGED_BLOCK or page_elems % PAGED_BLOCK:
        raise ValueError(f"paged_sum: a page of {page_elems} elements is not a whole number of {PAGED_BLOCK}-element blocks")
    pages = x.numel() // page_elems
    if block_table.dtype != torch.int32 or block_table.numel() < 1 or int(block_table.max()) >= pages \
            or int(block_table.min()) < 0:
        raise ValueError(f"paged_sum: the block table must be int32 indices of the {pages} pages of x")
    _paged_sum_kernel[(partial_out.numel(),)](x, block_table, partial_out, block_table.numel(),
                                              PAGE_BLOCKS=page_elems // PAGED_BLOCK, BLOCK=PAGED_BLOCK,
                                              NUM_STAGES=num_stages, num_warps=8)
    return partial_out
