"""Launch of the portable Triton MLA decode kernels per row tile: how many of a request's query
rows one program holds, and the ``(block_n, num_warps, num_stages)`` that goes with each tile size.

A request's rows are its ``qo_len x H`` query rows packed token-major (12 heads x 4 tokens = 48
rows).  Each program of stage 1 streams its request's KV range once for the rows of its tile, so a
request with ``R`` rows reads its cache ``ceil(R / rows_per_tile)`` times: 16-row tiles read it
three times at qo_len 4 (48 rows), one 64-row tile once.  :func:`choose_rows_per_tile` takes the
tile of :meth:`mlabench.kernels.row_tiling.RowTiling.for_rows`, the rule the Hopper Gluon kernel
uses too (the smallest of 16, 32, 64 that holds the rows, 64 at most), so one query token of up to
16 heads keeps the 16-row kernel and launch of before.

No Triton here: the backends read these tables on every CLI start (the kernels import them too).

Launch defaults per tile size (:data:`CUDA_LAUNCH`, :data:`ROCM_LAUNCH`), ``(block_n, num_warps,
num_stages)``.  The 32- and 64-row CUDA ones were chosen from the sm_90 compile of stage 1 (Triton
3.9 and its bundled ptxas, :mod:`mlabench.kernels.offline_compile`; bf16, page 64, causal qo_len 2
for 32 rows and 4 for 64), not from timings (chosen without a GPU).  Registers / spill-store bytes /
shared memory per program, for split-KV (fixed count and device policy) and persistent:

=====  ==========  =======================  =======================  =========================
rows   launch      splitkv                  splitkv, device policy   persistent
=====  ==========  =======================  =======================  =========================
16     (32, 4, 6)  187 / 0 / 93,696         187 / 0 / 93,696         255 / 0 / 93,696
32     (32, 8, 6)  170 / 0 / 113,152        174 / 0 / 113,152        254 / 0 / 113,152
64     (16, 8, 7)  255 / 0 / 147,840        255 / 0 / 147,840        255 / 212 / 147,840 (*)
=====  ==========  =======================  =======================  =========================

- 16 rows: the launch timed on an H200 (``DEFAULT_*`` in ``common.py``), 2 programs per SM.
- 32 rows, 8 warps: one program per SM (170 x 256 registers).  4 warps (2 programs per SM) spill
  in the device policy path (4 B, 15 local loads/stores in the token loop) and the persistent
  kernel (52 B).
- 64 rows, 8 warps: the accumulator ``[64, 512]`` fp32 is 128 registers a thread (wgmma m64, the
  two warpgroups split the 512 columns), so one program per SM (255 x 256 registers).  4 warps
  spill 2.4-3 KB (482 local accesses in the token loop); 16 warps are capped at 128 registers and
  spill; 32-token tiles spill 4-40 B at every stage count tried (24 accesses in the loop at 2
  stages).  7 stages give 4 KV buffers of 16 tokens (18 KB apiece, beside q's 72 KB in shared
  memory; 6 stages: 3 buffers, 131,072 B): more loads in flight for the one program of an SM.
- (*) The persistent kernel spills at every 64-row launch tried (176-244 B at 1-7 stages),
  all outside its token loop (0 local loads/stores in the loop's SASS): a reload per segment, not
  per KV tile.  :func:`mlabench.kernels.offline_compile.token_loop_spills` counts them.

ROCm (untested on AMD hardware; compiled for gfx942, MI300, whose LDS is 64 KB; VGPRs / spilled
VGPRs / LDS bytes): 16 rows keep ``(32, 4, 2)`` (474 / 0 / 36,864); 32 rows ``(16, 4, 2)``
(349 / 0 / 32,768; 32-token tiles spill 109 VGPRs); 64 rows ``(16, 4, 2)`` (437 / 0 / 65,536;
persistent 468 / 4; 8 warps are capped at 256 VGPRs and spill 59).
``python -m mlabench.kernels.offline_compile`` prints all of these again.
"""

from __future__ import annotations

from mlabench.kernels.row_tiling import MAX_BLOCK_ROWS, RowTiling

#: Row-tile sizes the kernels are built for (powers of two; 16 is the smallest M of ``tl.dot``).
ROW_TILES = (16, 32, MAX_BLOCK_ROWS)
#: ``rows_per_tile -> (block_n, num_warps, num_stages)`` of stage 1 on NVIDIA GPUs (see the table above).
CUDA_LAUNCH = {16: (32, 4, 6), 32: (32, 8, 6), 64: (16, 8, 7)}
#: The same on ROCm: untested on AMD hardware, sized from the gfx942 compile to fit 64 KB of LDS.
ROCM_LAUNCH = {16: (32, 4, 2), 32: (16, 4, 2), 64: (16, 4, 2)}


def choose_rows_per_tile(rows: int, requested: int | None = None) -> int:
    """Rows of one stage-1 program for a request of ``rows`` packed query rows (``qo_len x H``).

    ``requested`` None: the smallest of :data:`ROW_TILES` that is >= ``rows``, 64 when none is
    (12 heads: 16 at qo_len 1, 32 at qo_len 2, 64 at qo_len 4 and 8), the ``block_rows`` of
    :meth:`mlabench.kernels.row_tiling.RowTiling.for_rows`; otherwise ``requested`` itself.
    Raises ValueError when ``rows < 1`` or ``requested`` is not one of :data:`ROW_TILES`.
    """
    if rows < 1:
        raise ValueError(f"a request needs at least one query row, got {rows}")
    if requested is None:
        return RowTiling.for_rows(rows).block_rows
    if requested not in ROW_TILES:
        raise ValueError(f"rows_per_tile must be one of {ROW_TILES}, got {requested}")
    return requested


def row_tiles(rows: int, rows_per_tile: int) -> int:
    """Programs per (request, split): ``ceil(rows / rows_per_tile)``, each a full cache pass."""
    return -(-rows // rows_per_tile)


def default_launch_for(rows_per_tile: int, rocm: bool) -> tuple[int, int, int]:
    """``(block_n, num_warps, num_stages)`` of :data:`CUDA_LAUNCH` or :data:`ROCM_LAUNCH`.
    Raises ValueError for a tile size not in :data:`ROW_TILES`."""
    table = ROCM_LAUNCH if rocm else CUDA_LAUNCH
    if rows_per_tile not in table:
        raise ValueError(f"rows_per_tile must be one of {ROW_TILES}, got {rows_per_tile}")
    return table[rows_per_tile]
