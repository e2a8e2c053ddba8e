"""The persistent split loop of gluon-splitkv's device-policy mode, on the host: the grid's split
axis, and a model of which splits (and pages) each program takes.

With a split policy in device memory every request looks its own count up inside stage 1, so the
grid's split axis must hold the policy's largest count for the batch size (128 at batch 1, 16 at
batch 16 for the tuned kimi-k3 policy), and a short request leaves most programs owning no page.
At batch 16 that is 16 x 16 = 256 programs on 132 SMs (one CTA per SM by shared memory): two
waves, half of them empty at 1K-8K (results/h200/deploy/README.md, "One graph...").

With ``KernelVariant.split_loop`` the split axis holds :func:`loop_grid_splits` programs ``G``
instead: as many as one wave of resident programs gives each (request, row tile), capped by the
largest count.  Program ``p`` of a request runs the request's splits ``p, p + G, p + 2G, ...``
below its written count (the splits that own pages), each into its own partial slot as without the
loop, so the partials, the merge and the split edges are those of the policy's count; only the
schedule changes.  Nothing here imports Triton: the backend and the CPU tests use it.
"""

from __future__ import annotations

from mlabench.kernels.row_tiling import PAGE_TOKENS, RowTiling, stage1_shared_bytes

#: Shared memory of one Hopper SM (H100/H200: 228 KiB) and what the driver reserves per CTA.
SM90_SHARED_PER_SM = 228 * 1024
SM90_SHARED_RESERVED_PER_CTA = 1024


def resident_per_sm(block_rows: int, num_stages: int) -> int:
    """Stage-1 programs one sm_90 SM holds at once, by shared memory (the limit that binds):
    1 with the 2-page ring, 2 with a 1-page ring and a 16-row tile."""
    need = stage1_shared_bytes(block_rows, num_stages) + SM90_SHARED_RESERVED_PER_CTA
    return max(1, SM90_SHARED_PER_SM // need)


def loop_grid_splits(batch: int, row_tiles: int, max_splits: int, num_sms: int,
                     per_sm: int = 1) -> int:
    """``G``, the grid's split axis with the persistent split loop: ``min(max_splits, (num_sms *
    per_sm) // (batch * row_tiles))``, at least 1.  Host-known (a captured graph keeps it):
    batch 1 -> 128 for a largest count of 128 on 132 SMs (the same grid as without the loop),
    batch 16 -> 8 instead of 16 (128 programs, one wave).  Raises ValueError unless every
    argument is >= 1."""
    if min(batch, row_tiles, max_splits, num_sms, per_sm) < 1:
        raise ValueError(f"need batch, row tiles, splits, SMs and programs per SM >= 1, got "
                         f"{batch}, {row_tiles}, {max_splits}, {num_sms}, {per_sm}")
    return max(1, min(max_splits, num_sms * per_sm // (batch * row_tiles)))


def split_geometry(seq_len: int, own: int) -> tuple[int, int, int]:
    """``(pages, pages per split, written)`` of a request of ``seq_len`` tokens cut into ``own``
    splits: ``ceil(pages / own)`` pages each, so ``ceil(pages / per_split)`` of them own a page.
    The arithmetic of :func:`mlabench.kernels.gluon_blocks.split_geometry` (stage 1) and of
    :func:`mlabench.kernels.wide_merge.written_splits` (the merge)."""
    pages = -(-seq_len // PAGE_TOKENS)
    per_split = -(-pages // own)
    return pages, per_split, -(-pages // max(per_split, 1))


def split_range(split: int, pages: int, per_split: int) -> tuple[int, int]:
    """``(first page, pages)`` of split ``split``: :func:`mlabench.kernels.gluon_blocks.split_range`."""
    lo = min(split * per_split, pages)
    return lo, min(lo + per_split, pages) - lo


def program_splits(program: int, grid_splits: int, written: int) -> list[int]:
    """The splits program ``program`` of a (request, row tile) runs with the loop: ``program,
    program + G, ...`` below ``written`` (none when ``program >= written``)."""
    return list(range(program, written, grid_splits))


def fused_participants(written: int, grid_splits: int) -> int:
    """Programs of a (request, row tile) that meet at a fused merge's barrier with the loop: those
    that run a split, ``min(written, G)``; each arrives once, after all its splits' partials."""
    return min(written, grid_splits)


def stage1_grid_splits(split_loop: bool, batch: int, rows: int, max_splits: int, num_stages: int,
                       num_sms: int) -> int:
    """The split axis of gluon-splitkv's stage-1 grid for requests of ``rows`` packed query rows:
    ``max_splits`` (a fixed count, or a device policy's largest), or with ``split_loop``
    :func:`loop_grid_splits` over the resident programs of a ``num_stages`` ring
    (:func:`resident_per_sm`).  Raises ValueError for fewer than one row, split or SM."""
    if not split_loop:
        return max_splits
    tiling = RowTiling.for_rows(rows)
    return loop_grid_splits(batch, tiling.row_tiles, max_splits, num_sms,
                            resident_per_sm(tiling.block_rows, num_stages))
