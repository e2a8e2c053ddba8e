"""The split-KV kernel with a per-request split count from a policy table in device memory, compiled
on a GPU or in the Triton interpreter without one (fp16: the interpreter's bf16 dots are wrong).

The workspace is poisoned with NaN: stage 1 must write exactly the slots of each request's own
count (the slots past it stay NaN) and the merge must read no others (a NaN read would reach the
output), so a correct output with untouched tail slots shows both stages used the request's count.
"""

from __future__ import annotations

import pytest
import torch

from mlabench.kernels.splitkv import alloc_splitkv_workspace, mla_decode_splitkv
from mlabench.policy.device_table import SplitPolicy
from tests.kernels.helpers import DEVICE, TOL, make_case, max_err, reference

LENS = (1, 37, 100, 260)  # ragged: one token, a non-multiple of the page, several pages


def run_policy(inp, policy: SplitPolicy, cap: int, block_n: int = 16):
    """Decode with ``policy`` and grid split axis ``cap``; returns ``(out, partial_lse)``."""
    batch, heads = inp.shape.batch, inp.shape.num_heads
    part_o, part_lse = alloc_splitkv_workspace(batch, heads, cap, DEVICE)
    part_o.fill_(float("nan"))
    part_lse.fill_(float("nan"))
    out = inp.new_output()
    mla_decode_splitkv(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens, out, cap,
                       inp.shape.scale, partial_out=part_o, partial_lse=part_lse, block_n=block_n,
                       split_policy=policy.device_table(batch, DEVICE))
    return out, part_lse


def assert_own_counts(part_lse: torch.Tensor, counts: list[int], cap: int) -> None:
    """Slots ``[b*cap, b*cap + counts[b])`` written (finite or -inf), the rest still NaN."""
    written = ~torch.isnan(part_lse.view(len(counts), cap, -1)).any(dim=-1)  # [B, cap]
    for b, own in enumerate(counts):
        expect = [s < own for s in range(cap)]
        assert written[b].tolist() == expect, (b, own, written[b].tolist())


@pytest.mark.parametrize("count", range(1, 9))
def test_every_count_for_every_length(count):
    """One count for every length (1..8, more splits than some requests have tokens)."""
    inp, ref = make_case(12, LENS, 16, "float16", seed=count)
    cap = 8
    out, lse = run_policy(inp, SplitPolicy.create({1: [(1 << 20, count)]}), cap)
    assert max_err(out, ref) < TOL["float16"]
    assert_own_counts(lse, [count] * len(LENS), cap)


def test_ragged_batch_each_request_its_own_count():
    """Rows chosen per request length; the last row covers lengths past every bucket."""
    inp, ref = make_case(12, LENS, 16, "float16", seed=3)
    policy = SplitPolicy.create({1: [(16, 1), (64, 3), (128, 5), (200, 2)]})
    counts = [policy.lookup(4, n) for n in LENS]
    assert counts == [1, 3, 5, 2]  # 260 > 200: the last row
    out, lse = run_policy(inp, policy, cap=6)
    assert max_err(out, ref) < TOL["float16"]
    assert_own_counts(lse, counts, cap=6)


def test_rule_row_counts_follow_the_length():
    """A run of tokens-per-split rows is one device row ``(128, -32)``: ``ceil(L / 32)`` splits for
    each length inside it (1, 2, 4), the last row's fixed count past it (260 tokens: 6)."""
    inp, ref = make_case(12, LENS, 16, "float16", seed=7)
    policy = SplitPolicy.create({1: [(32, 1), (64, 2), (96, 3), (128, 4), (1 << 20, 6)]})
    assert policy.device_table(4, "cpu").tolist()[0] == [128, -32]
    counts = [policy.lookup(4, n) for n in LENS]
    assert counts == [1, 2, 4, 6]
    out, lse = run_policy(inp, policy, cap=6)
    assert max_err(out, ref) < TOL["float16"]
    assert_own_counts(lse, counts, cap=6)


def test_counts_are_clamped_to_the_grid():
    inp, ref = make_case(32, (70, 9), 16, "float16", seed=4)  # two head tiles
    policy = SplitPolicy.create({1: [(10, 2), (100, 9)]})
    out, lse = run_policy(inp, policy, cap=4)
    assert max_err(out, ref) < TOL["float16"]
    assert_own_counts(lse, [4, 2], cap=4)


def test_batch_size_picks_its_table():
    """The table of the largest tuned batch size <= B: batch 2 here, not batch 4."""
    inp, ref = make_case(12, (50, 50), 16, "float16", seed=5)
    policy = SplitPolicy.create({1: [(1000, 1)], 2: [(1000, 3)], 4: [(1000, 5)]})
    out, lse = run_policy(inp, policy, cap=6)
    assert max_err(out, ref) < TOL["float16"]
    assert_own_counts(lse, [3, 3], cap=6)


def test_one_launch_follows_new_lengths():
    """Lengths changed in place (as before a graph replay): the counts follow them on the device."""
    inp, _ = make_case(12, (200, 30), 16, "float16", seed=6, poison=False)  # request 1 grows to 150
    policy = SplitPolicy.create({1: [(32, 1), (128, 2), (256, 4)]})
    table = policy.device_table(2, DEVICE)
    part_o, part_lse = alloc_splitkv_workspace(2, 12, 4, DEVICE)
    out = inp.new_output()
    args = (inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens, out, 4, inp.shape.scale)
    mla_decode_splitkv(*args, partial_out=part_o, partial_lse=part_lse, block_n=16,
                       split_policy=table)
    inp.cache_seqlens.copy_(torch.tensor([20, 150], dtype=torch.int32, device=DEVICE))
    out.fill_(float("nan"))
    part_lse.fill_(float("nan"))
    mla_decode_splitkv(*args, partial_out=part_o, partial_lse=part_lse, block_n=16,
                       split_policy=table)
    assert max_err(out, reference(inp, inp.q)) < TOL["float16"]
    assert_own_counts(part_lse, [1, 4], cap=4)


@pytest.mark.parametrize("bad", [torch.zeros((3, 2), dtype=torch.int32),
                                 torch.zeros((4, 2), dtype=torch.int64),
                                 torch.zeros((4, 3), dtype=torch.int32),
                                 torch.zeros((8,), dtype=torch.int32)])
def test_rejects_bad_tables(bad):
    inp, _ = make_case(12, (8,), 16)
    with pytest.raises(ValueError, match="split_policy must be a contiguous int32"):
        mla_decode_splitkv(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens,
                           inp.new_output(), 2, inp.shape.scale, split_policy=bad.to(DEVICE))


def test_rejects_a_table_on_another_device():
    inp, _ = make_case(12, (8,), 16)
    other = "cpu" if DEVICE != "cpu" else "meta"
    table = SplitPolicy.create({1: [(1000, 2)]}).device_table(1, other)
    with pytest.raises(ValueError, match=f"split_policy is on {other}"):
        mla_decode_splitkv(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens,
                           inp.new_output(), 2, inp.shape.scale, split_policy=table)
