"""The persistent kernel's work list: coverage, balance, slot uniqueness (plain torch, no Triton)."""

from __future__ import annotations

import pytest
import torch

from mlabench.kernels.worklist import build_work_list, request_split_starts, segments

LENGTHS = [
    ((5, 0, 0, 130, 1, 0), 4, 16),       # zero-length requests around and between
    ((1,), 8, 16),                       # many more programs than tokens
    ((1, 2, 3), 132, 64),
    ((4096,), 132, 64),
    ((1000, 1, 64, 0, 777), 7, 32),
    ((0, 0, 0), 4, 16),                  # nothing at all
]


def _random_lengths():
    gen = torch.Generator().manual_seed(1)
    for _ in range(6):
        batch = int(torch.randint(1, 9, (1,), generator=gen))
        lens = torch.randint(0, 300, (batch,), generator=gen)
        yield tuple(lens.tolist()), int(torch.randint(1, 20, (1,), generator=gen)), 16


@pytest.mark.parametrize("lens,programs,block_n", LENGTHS + list(_random_lengths()))
def test_work_list_invariants(lens, programs, block_n):
    work = build_work_list(torch.tensor(lens, dtype=torch.int32), programs, block_n)
    total = sum(lens)
    chunk = int(work.chunk_tokens.item())
    # Chunk: a multiple of block_n, the smallest one covering T with G programs.
    assert chunk % block_n == 0 and chunk >= block_n
    assert chunk * programs >= total
    assert chunk - block_n < max(-(-total // programs), 1)
    segs = segments(work)
    # Every token of every request covered exactly once.
    for i, n in enumerate(lens):
        covered = torch.zeros(n, dtype=torch.int32)
        for _p, r, a, b in segs:
            if r == i:
                covered[a:b] += 1
        assert bool((covered == 1).all()), f"request {i}: coverage {covered.tolist()}"
    # Balanced: each program holds exactly C tokens except at the end of the token space.
    load = [0] * programs
    for p, _r, a, b in segs:
        load[p] += b - a
    assert load == [max(0, min(chunk, total - p * chunk)) for p in range(programs)]
    # Slots p + i: unique, in range, and exactly the ranges the merge reads.
    slots = [p + r for p, r, _a, _b in segs]
    assert len(set(slots)) == len(slots)
    assert all(0 <= s < work.num_slots for s in slots)
    lo, hi = work.req_slot_lo.tolist(), work.req_slot_hi.tolist()
    for i, n in enumerate(lens):
        mine = sorted(p + r for p, r, _a, _b in segs if r == i)
        assert mine == list(range(lo[i], hi[i]))
        assert (hi[i] > lo[i]) == (n > 0)


def test_work_list_tensors_and_layout():
    work = build_work_list(torch.tensor([5, 0, 0, 130, 1, 0], dtype=torch.int32), 4, 16)
    assert work.cu_seqlens.tolist() == [0, 5, 5, 5, 135, 136, 136]
    assert work.chunk_tokens.tolist() == [48]
    assert work.prog_first_req.tolist() == [0, 3, 3, 6]
    assert all(t.dtype == torch.int32 for t in (work.cu_seqlens, work.chunk_tokens,
                                                   work.prog_first_req, work.req_slot_lo,
                                                   work.req_slot_hi))
    assert work.num_slots == 4 + 6 - 1


@pytest.mark.parametrize("programs,block_n", [(0, 16), (4, 0)])
def test_rejects_bad_arguments(programs, block_n):
    with pytest.raises(ValueError):
        build_work_list(torch.tensor([4], dtype=torch.int32), programs, block_n)


def test_split_starts_are_where_each_requests_segments_begin():
    work = build_work_list(torch.tensor([100, 0, 40], dtype=torch.int32), 4, 16)  # chunk 48
    assert segments(work) == [(0, 0, 0, 48), (1, 0, 48, 96), (2, 0, 96, 100), (2, 2, 0, 40)]
    assert request_split_starts(work) == [[0, 48, 96], [], [0]]
