"""CPU tests of gluon-splitkv's persistent split loop (``KernelVariant.split_loop``, issue 34 item 2).

The schedule: a model of the loop kernel's control flow (:mod:`mlabench.kernels.gluon_split_loop`,
line for line: which splits each program runs, the ring use of each page, when each copy is
issued) proves that every page of every request is read exactly once, in order, through a ring
slot that is free, and that the slots written are exactly those both merges read; the wide merge
then runs on partials written by that schedule (the others NaN).  The grid: its split axis for
each batch, row tiling and ring depth.  The backend: the parameter, its refusal without a device
policy.  The loop kernel compiled for sm_90 is in test_split_loop_compile.py; tests/gpu/ runs it.
"""

from __future__ import annotations

import itertools
import re
import json
from pathlib import Path

import pytest
import torch

from mlabench.kernels.gluon_fused_merge import MergeTiling
from mlabench.kernels.split_loop import (
    fused_participants, loop_grid_splits, program_splits, resident_per_sm, split_geometry,
    split_range, stage1_grid_splits,
)
from mlabench.kernels.wide_merge import wide_merge
from mlabench.policy.device_table import load_split_policy
from tests.kernels.helpers import DEVICE, make_case, max_err
from tests.kernels.test_gluon_splitkv import page_split_partials

ROOT = Path(__file__).resolve().parents[2]
#: The policy the H200 deploy runs tuned (1 and 16 requests, up to 128 splits) and the small one
#: of results/h200/deploy/empty-programs/.
TUNED = ROOT / "results/h200/deploy/qo1/tune-kimi-k3-tp8-20261201-152425-462/policy.json"
SMALL = ROOT / "results/h200/deploy/empty-programs/policy-small.json"


def loop_program_trace(program: int, grid_splits: int, seq_len: int, own: int, num_stages: int):
    """The loop kernel's page traffic for one program, as its code runs it: a list of events
    ``("issue" | "consume", ring use, page)`` and the list of ``(split, first page, pages)`` it
    stored.  ``issue_split_start`` issues a split's uses ``base .. base + NUM_STAGES - 2`` (those
    it owns); the token loop issues use ``t + NUM_STAGES - 1`` before consuming ``t``; after a
    split's last page the next split's start is issued, then its partial stored."""
    pages, per_split, written = split_geometry(seq_len, own)
    events, stored = [], []

    def issue_start(split, base):
        lo, n = split_range(split, pages, per_split)
        for i in range(num_stages - 1):
            if i < n:
                events.append(("issue", base + i, (lo - base) + (base + i)))

    lo, n = split_range(program, pages, per_split)
    issue_start(program, 0)
    base = 0
    for split in range(program, written, grid_splits):
        lo, n = split_range(split, pages, per_split)
        shift, end = lo - base, base + n
        assert shift >= 0  # the block-table pointer never steps below the request's row
        for t in range(base, end):
            if t + num_stages - 1 < end:
                events.append(("issue", t + num_stages - 1, shift + t + num_stages - 1))
            events.append(("consume", t, shift + t))
        if split + grid_splits < written:
            issue_start(split + grid_splits, end)
        stored.append((split, lo, n))
        base = end
    return events, stored


def _check_ring(events, num_stages: int) -> None:
    """Each ring use issued once, before it is consumed, into a slot whose previous use
    (``use - NUM_STAGES``) was consumed already; uses consumed in order from 0."""
    issued, consumed = {}, []
    for i, (kind, use, page) in enumerate(events):
        if kind == "issue":
            assert use not in issued, f"use {use} issued twice"
            assert use < num_stages or (use - num_stages) in consumed, f"slot of use {use} busy"
            issued[use] = page
        else:
            assert issued.get(use) == page, f"use {use} consumed before its copy of page {page}"
            consumed.append(use)
    assert consumed == list(range(len(consumed)))
    assert set(issued) == set(consumed)


def _policies():
    tuned, small = load_split_policy(TUNED), load_split_policy(SMALL)
    return [("tuned", tuned, 1), ("tuned", tuned, 16), ("small", small, 1)]


LENGTHS = [1, 63, 64, 65, 1000, 1024, 1025, 4096, 5000, 8192, 16384, 32768, 65536, 100000, 131072]


@pytest.mark.parametrize("name,policy,batch", _policies())
@pytest.mark.parametrize("qo_len,num_stages,num_sms", [(1, 2, 132), (1, 1, 132), (4, 2, 132),
                                                       (8, 2, 132), (1, 2, 78), (2, 2, 16)])
def test_loop_reads_every_page_once_and_writes_the_slots_the_merges_read(name, policy, batch, qo_len,
                                                                         num_stages, num_sms):
    """Every request of ``batch`` at each length (ragged batches: the lengths in turn), on the grid
    the launcher sizes: each page read once, in order within each split, each written split's slot
    stored once by one program and no other slot; both merges read exactly those slots (the
    wide merge: ``written`` from the lengths; the fused merge: ``min(written, G)`` programs
    arrive, covering every column chunk once)."""
    rows = qo_len * 12
    largest = policy.max_splits(batch)
    grid = stage1_grid_splits(True, batch, rows, largest, num_stages, num_sms)
    assert 1 <= grid <= largest
    tiling = MergeTiling.for_launch(16, grid, 4)
    for first in range(0, len(LENGTHS), batch if batch < len(LENGTHS) else 1):
        lens = list(itertools.islice(itertools.cycle(LENGTHS), first, first + batch))
        for b, seq_len in enumerate(lens):
            own = min(policy.lookup(batch, seq_len), largest)
            pages, per_split, written = split_geometry(seq_len, own)
            read, slots, arrived = [], [], 0
            for program in range(grid):
                events, stored = loop_program_trace(program, grid, seq_len, own, num_stages)
                _check_ring(events, num_stages)
                read += [page for kind, _use, page in events if kind == "consume"]
                slots += [b * largest + split for split, _lo, _n in stored]
                assert [s for s, _lo, _n in stored] == program_splits(program, grid, written)
                assert all(n >= 1 for _s, _lo, n in stored)
                arrived += bool(stored)
            assert sorted(read) == list(range(pages)), (seq_len, own)
            assert sorted(slots) == [b * largest + s for s in range(written)]
            assert arrived == fused_participants(written, grid)
            chunks = sorted(c for p in range(arrived) for c in tiling.chunks_of(p, arrived))
            assert chunks == list(range(512 // tiling.cols))


@pytest.mark.parametrize("batch,rows,largest,stages,want", [
    (1, 12, 128, 2, 128),    # one wave holds the largest count: the loop-free kernel runs
    (16, 12, 16, 2, 8),      # 256 programs -> 128, the tuned count at 1K-16K
    (16, 12, 16, 1, 16),     # a 1-page ring holds two programs an SM
    (1, 96, 128, 2, 66),     # 8 tokens: two 64-row tiles
    (4, 48, 33, 2, 33),
    (33, 12, 8, 2, 4),
    (200, 12, 4, 2, 1),      # more requests than SMs: one program each, looping over all
])
def test_grid_is_one_wave_at_most_the_largest_count(batch, rows, largest, stages, want):
    assert stage1_grid_splits(True, batch, rows, largest, stages, 132) == want
    assert stage1_grid_splits(False, batch, rows, largest, stages, 132) == largest


def test_programs_an_sm_holds_and_bad_grids():
    assert [resident_per_sm(r, 2) for r in (16, 32, 64)] == [1, 1, 1]
    assert [resident_per_sm(r, 1) for r in (16, 32, 64)] == [2, 2, 1]
    with pytest.raises(ValueError, match=">= 1"):
        loop_grid_splits(0, 1, 8, 132)


@pytest.mark.parametrize("lens,policy_rows,grid", [
    ((2000, 640, 320, 1, 9000), [[400, 4], [700, 8], [1 << 20, 12]], 5),
    ((131072, 64, 4097), [[64, 1], [4096, 16], [1 << 20, 40]], 7),
])
def test_wide_merge_of_the_loops_partials_matches_reference(lens, policy_rows, grid):
    """Partials written program by program as the loop schedules them (every other slot NaN):
    the wide merge, reading from the lengths and the device table, gives the reference."""
    inp, ref = make_case(12, lens, 64)
    largest = max(count for _n, count in policy_rows)
    table = torch.tensor(policy_rows + policy_rows[-1:], dtype=torch.int32, device=DEVICE)
    po = torch.full((len(lens) * largest, 12, 512), float("nan"), device=DEVICE)
    pl = torch.full((len(lens) * largest, 12), float("nan"), device=DEVICE)
    for b, n in enumerate(lens):
        own = next(count for n_max, count in policy_rows if n <= n_max)
        p_all, l_all = page_split_partials(inp, own)
        for program in range(grid):
            for split, _lo, _n in loop_program_trace(program, grid, n, own, 2)[1]:
                po[b * largest + split] = p_all[b * own + split]
                pl[b * largest + split] = l_all[b * own + split]
    out = inp.new_output()
    wide_merge(po, pl, out, largest, block_dv=64, cache_seqlens=inp.cache_seqlens,
               split_policy=table)
    assert max_err(out, ref) < 2e-3


def _policy_file(tmp_path) -> Path:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"num_kv_splits": {"16": [[4096, 8], [1 << 20, 16]]}}))
    return path


def test_backend_runs_the_loop_only_with_a_device_policy(tmp_path):
    """``split_loop`` is left out of a point at 0 (earlier records pair), reported in the effective
    parameters with the grid's split axis, and refused (unsupported) with a host policy or a
    fixed count."""
    from mlabench.backends import get_backend, gluon as _gluon  # noqa: F401
    from mlabench.device import current_device
    from mlabench.errors import UnsupportedShapeError
    from mlabench.inputs import make_inputs
    from mlabench.shapes import MLADecodeShape

    backend = get_backend("gluon-splitkv")
    shape = MLADecodeShape.create(num_heads=12, context_lens=(4096,) * 16, page_size=64)
    assert "split_loop" not in backend.resolve_params(shape)
    assert "split_loop" not in backend.resolve_params(shape, {"split_loop": 0})
    x = make_inputs(shape, seed=0)
    device = backend.resolve_params(shape, {"split_loop": 1,
                                            "split_policy": f"device:{_policy_file(tmp_path)}"})
    call = backend.prepare(x, device)
    want = stage1_grid_splits(True, 16, 12, 16, 2, current_device().num_sms)
    assert call.effective_params["split_loop"] == 1
    assert call.effective_params["grid_splits"] == want
    assert call.effective_params["num_kv_splits"] == 16  # the workspace's slots per request
    for other in ({"split_policy": f"host:{_policy_file(tmp_path)}"}, {"num_kv_splits": 8}):
        params = backend.resolve_params(shape, {"split_loop": 1, **other})
        with pytest.raises(UnsupportedShapeError, match="split_loop=1 runs only with split_policy=device"):
            backend.prepare(x, params)
    plain = backend.prepare(x, backend.resolve_params(shape, {"num_kv_splits": 8}))
    assert plain.effective_params["split_loop"] == 0 and "grid_splits" not in plain.effective_params


def test_kernel_entry_refuses_the_loop_without_a_device_policy():
    pytest.importorskip("triton.experimental.gluon")
    from mlabench.kernels.gluon_splitkv import KernelVariant, mla_decode_gluon_splitkv

    x, _ = make_case(12, (4096,), 64, dtype="bfloat16")
    with pytest.raises(ValueError, match="split_loop needs a split policy in device memory"):
        mla_decode_gluon_splitkv(x.q, x.kv_cache, x.block_table, x.cache_seqlens, x.new_output(),
                                 8, x.shape.scale, partial_out=None, partial_lse=None,
                                 variant=KernelVariant(split_loop=True))


@pytest.mark.parametrize("block_rows,qo_len,causal,stages,fused,wgmma", [
    (16, 1, False, 2, False, {"m64n16k16": 36 + 32}),
    (16, 1, False, 2, True, {"m64n16k16": 36 + 32}),
    (16, 1, False, 1, False, {"m64n16k16": 36 + 32}),
    (32, 2, True, 2, False, {"m64n16k16": 36, "m64n32k16": 16}),
    (64, 4, True, 2, False, {"m64n32k16": 36, "m64n64k16": 16}),
    (64, 8, False, 2, True, {"m64n32k16": 36, "m64n64k16": 16}),
])
def test_loop_kernel_compiles_to_the_same_products_and_shared_memory(block_rows, qo_len, causal,
                                                                     stages, fused, wgmma):
    """The loop kernel for sm_90 beside the loop-free one (a device table of 64 rows): the same
    page products, the same shared memory (the partial is stored from the accumulator's layout,
    so no conversion scratch sits beside the ring the loop keeps alive), no local memory in the
    token loop; with the fused merge one arrival and one release add."""
    from tests.kernels.test_gluon_splitkv import _compile_stage1, release_adds

    args = (stages, block_rows, qo_len, causal, 64, "m", fused, 8)
    loop, plain = _compile_stage1(*args, split_loop=True), _compile_stage1(*args)
    found = {m.group(1): loop["ptx"].count(m.group(0)) for m in re.finditer(
        r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.f32\.bf16\.bf16", loop["ptx"])}
    assert found == wgmma
    assert loop["shared"] == plain["shared"] <= 227 * 1024
    assert "cp.async.bulk.tensor.2d" in loop["ptx"] and "mma.sync" not in loop["ptx"]
    if loop["usage"]:
        assert loop["token_loop_spills"] == 0
    if fused:
        assert len(re.findall(r"atom\.global\.gpu\.acq_rel\.add\.u32", loop["ptx"])) == 1
        assert release_adds(loop["ptx"]) == 1
    else:
        assert "atom.global" not in loop["ptx"]
