"""Triton split-KV kernel against the fp32 reference: compiled on a GPU, in the Triton interpreter
without one."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from mlabench.kernels.splitkv import alloc_splitkv_workspace, mla_decode_splitkv
from mlabench.kernels.wide_merge import wide_merge
from tests.kernels.helpers import TOL, make_case, max_err, reference

CASES = [
    # heads, lens, page, splits, dtype, block_n
    (12, (1, 64, 100), 16, 1, "float16", 32),   # one split; lengths 1 and an exact page multiple
    (12, (1, 64, 100), 16, 3, "float16", 32),   # non-power-of-two splits
    (12, (5, 2), 16, 7, "float16", 16),         # more splits than tokens: most splits are empty
    (8, (33, 128), 64, 5, "float16", 64),       # page 64, exact multiple, 8 heads
    (16, (17, 40), 1, 4, "float16", 16),        # page 1: every token its own page
    (32, (20,), 16, 2, "float16", 16),          # two head tiles
    (12, (50, 1), 16, 3, "bfloat16", 32),       # bf16 (fp32 upcast before tl.dot in the interpreter)
    (12, (30,), 16, 2, "float32", 16),
    (12, (1100, 3), 16, 70, "float16", 16),   # 69 non-empty splits: the merge crosses slot blocks
]


@pytest.mark.parametrize("heads,lens,page,splits,dtype,block_n", CASES)
def test_matches_reference(heads, lens, page, splits, dtype, block_n):
    inp, ref = make_case(heads, lens, page, dtype)
    out = inp.new_output()  # NaN-poisoned: every row must be written
    part_o, part_lse = alloc_splitkv_workspace(inp.shape.batch, heads, splits, inp.device)
    part_o.fill_(float("nan"))  # every slot stage 2 reads must be written by stage 1
    part_lse.fill_(float("nan"))
    res = mla_decode_splitkv(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens, out, splits,
                             inp.shape.scale, partial_out=part_o, partial_lse=part_lse,
                             block_n=block_n)
    assert res is out
    assert max_err(out, ref) < TOL[dtype]


def test_split_bounds_follow_lengths_on_device():
    """Same workspace and split count, lengths shortened in place (as under a replayed graph)."""
    inp, _ = make_case(12, (90, 45), 16)
    splits = 5
    part_o, part_lse = alloc_splitkv_workspace(2, 12, splits, inp.device)
    out = inp.new_output()
    args = (inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens, out, splits, inp.shape.scale)
    mla_decode_splitkv(*args, partial_out=part_o, partial_lse=part_lse, block_n=16)
    inp.cache_seqlens.copy_(torch.tensor([3, 44], dtype=torch.int32))
    out.fill_(float("nan"))
    mla_decode_splitkv(*args, partial_out=part_o, partial_lse=part_lse, block_n=16)
    assert max_err(out, reference(inp, inp.q)) < TOL["float16"]


def test_sensitive_to_the_softmax_scale():
    """A kernel that ignored the scale would pass a loose check; this one must not."""
    inp, ref = make_case(12, (40,), 16)
    out = inp.new_output()
    mla_decode_splitkv(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens, out, 2,
                       inp.shape.scale * 2, block_n=16)
    assert max_err(out, ref) > 0.05


@pytest.mark.parametrize("splits", [0, 513])
def test_rejects_bad_split_counts(splits):
    inp, _ = make_case(12, (8,), 16)
    with pytest.raises(ValueError, match="num_kv_splits"):
        mla_decode_splitkv(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens,
                           inp.new_output(), splits, inp.shape.scale)


def test_rejects_small_workspace():
    inp, _ = make_case(12, (8, 8), 16)
    part_o, part_lse = alloc_splitkv_workspace(2, 12, 2, inp.device)
    with pytest.raises(ValueError, match="workspace"):
        mla_decode_splitkv(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens,
                           inp.new_output(), 4, inp.shape.scale, partial_out=part_o,
                           partial_lse=part_lse)


@pytest.mark.parametrize("block_n", [8, 24])
def test_rejects_bad_block_n(block_n):
    inp, _ = make_case(12, (8,), 16)
    with pytest.raises(ValueError, match="block_n"):
        mla_decode_splitkv(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens,
                           inp.new_output(), 2, inp.shape.scale, block_n=block_n)


def test_stage1_only_writes_partials_that_the_wide_merge_completes():
    inp, ref = make_case(12, (300, 64, 1), 64)
    splits = 6  # the 1- and 64-token requests leave most of their splits empty
    part_o, part_lse = alloc_splitkv_workspace(3, 12, splits, inp.device)
    out = inp.new_output()  # NaN-poisoned
    res = mla_decode_splitkv(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens, out, splits,
                             inp.shape.scale, partial_out=part_o, partial_lse=part_lse,
                             block_n=16, stage1_only=True)
    assert res is out and torch.isnan(out).all()  # no merge ran
    wide_merge(part_o, part_lse, out, splits)
    assert max_err(out, ref) < TOL["float16"]


def test_hopper_script_portable_calls_follow_the_kernel():
    """scripts/h200_hopper_kernel.py times the portable kernel through ``portable_calls``; its
    calls must run against the current kernel signature and give the reference (two copies)."""
    path = Path(__file__).resolve().parents[2] / "scripts" / "h200_hopper_kernel.py"
    spec = importlib.util.spec_from_file_location("h200_hopper_kernel", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    cases = [make_case(12, (200, 70), 64, seed=seed) for seed in (0, 1)]
    splits = 4
    part_o, part_lse = alloc_splitkv_workspace(2, 12, splits, cases[0][0].device)
    calls = script.portable_calls([inp for inp, _ in cases], cases[0][0].shape.scale, splits,
                                  part_o, part_lse, num_sms=4)
    for label in ("own", "wide"):
        for (_, ref), out, call in zip(cases, calls["outs"], calls[label]):
            out.fill_(float("nan"))
            call()
            assert max_err(out, ref) < TOL["float16"], label
    calls["outs"][1].fill_(float("nan"))
    calls["stage1"][1]()
    assert torch.isnan(calls["outs"][1]).all()
    wide_merge(part_o, part_lse, calls["outs"][1], splits)
    assert max_err(calls["outs"][1], cases[1][1]) < TOL["float16"]


@pytest.mark.parametrize("qo_len,causal", [(1, True), (4, True), (4, False)])
def test_portable_implementations_take_a_zero_length_request(qo_len, causal):
    """A captured graph's padding request has length 0: the torch split-KV implementation and the
    fp32 reference give it a zero row, as the Triton kernels do, and the other rows are right."""
    from mlabench.inputs import make_inputs
    from mlabench.kernels.reference import mla_decode_reference
    from mlabench.kernels.splitkv_torch import mla_decode_splitkv_torch
    from mlabench.shapes import MLADecodeShape

    inp = make_inputs(MLADecodeShape.create(num_heads=12, context_lens=(40, 20, 33), page_size=16,
                                            qo_len=qo_len, causal=causal), seed=1)
    lens = torch.tensor([40, 0, 33], dtype=torch.int32, device=inp.device)
    args = (inp.q, inp.kv_cache, inp.block_table)
    ref, _ = mla_decode_reference(*args, lens, inp.shape.scale, qo_len=qo_len, causal=causal)
    out = mla_decode_splitkv_torch(*args, lens, 3, inp.shape.scale, qo_len=qo_len, causal=causal)
    padding = slice(qo_len, 2 * qo_len)  # the rows of request 1
    for rows in (ref, out):
        assert torch.equal(rows[padding], torch.zeros_like(rows[padding]))
    assert max_err(out, ref) < TOL[inp.shape.q_dtype]
