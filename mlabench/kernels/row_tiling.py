"""How a request's packed query rows are cut into tiles, one program each (Triton-free: the
backends import it on every CLI start).

A multi-token step has ``qo_len x H`` query rows per request, packed token-major (row ``t * H + h``
is head ``h`` of query token ``t``; :func:`mlabench.kernels.common.pack_rows`).  Every program of a
(request, split) streams the same pages of the cache, so the fewer row tiles, the fewer times the
cache is read: one tile of up to 64 rows reads it once for 12 heads x 5 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The most packed query rows one program of the Hopper Gluon kernel holds (the N of its wgmma
#: products): a 64-row query tile, two pages of ring and the P tile take 224 KB of the 227 KB of
#: shared memory an H200 block may have.
MAX_BLOCK_ROWS = 64
PAGE_TOKENS = 64  #: tokens of one page, one TMA tile
QK_WIDTH = 576  #: latent + RoPE width of a query or key row


@dataclass(frozen=True)
class RowTiling:
    """How a request's ``qo_len x H`` packed query rows are cut into stage-1 programs.

    ``block_rows`` rows per program (the N of both wgmma products: 16, 32 or 64), ``row_tiles``
    programs per (request, split), ``num_warps`` 4 (one warpgroup) for 16 rows, else 8 (two
    warpgroups side by side on N, each holding a ``[512, block_rows / 2]`` fp32 accumulator;
    compiled for sm_90 with Triton 3.9: 166, 131 and 245 registers a thread, no spills).
    Every program of a (request, split) streams the same pages; one tile reads the cache once for
    all the request's rows, up to 64 (12 heads x 5 tokens).
    """

    block_rows: int
    row_tiles: int
    num_warps: int

    @classmethod
    def for_rows(cls, rows: int) -> RowTiling:
        """The fewest programs for ``rows`` packed rows, in the smallest tile that holds them (at
        most 64 a tile: a 64-row query tile, two pages of ring and the P tile fill 224 KB of the
        H200's 227 KB of shared memory).  Raises ValueError for ``rows < 1``."""
        if rows < 1:
            raise ValueError(f"a request needs at least one query row, got {rows}")
        block = 16 if rows <= 16 else 32 if rows <= 32 else MAX_BLOCK_ROWS
        return cls(block, -(-rows // block), 4 if block <= 16 else 8)


def stage1_shared_bytes(block_rows: int, num_stages: int) -> int:
    """Shared memory of one stage-1 program the kernel allocates explicitly, in bytes: the page
    ring (``num_stages x 64 x 576`` bf16), the query tile (``block_rows x 576``) and the P tile
    (``64 x block_rows``), plus the mbarriers; the compiler adds a little scratch for reductions."""
    return 2 * (num_stages * PAGE_TOKENS * QK_WIDTH + block_rows * QK_WIDTH + PAGE_TOKENS * block_rows) + 8 * num_stages
