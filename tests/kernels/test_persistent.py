"""Persistent Triton kernel against the fp32 reference, and head padding: compiled on a GPU, in
the Triton interpreter without one."""

from __future__ import annotations

import pytest
import torch

from mlabench.kernels.padding import pad_heads
from mlabench.kernels.persistent import alloc_persistent_workspace, mla_decode_persistent
from mlabench.kernels.worklist import build_work_list
from tests.kernels.helpers import TOL, assert_equal_up_to_rounding, make_case, max_err, reference


def run(inp, q_pad, programs, block_n=16, lens=None):
    """Run the kernel on padded ``q_pad`` with NaN-filled partials; returns ``[B, Hp, 512]``."""
    batch, hp, _ = q_pad.shape
    out = torch.full((batch, hp, 512), float("nan"), dtype=q_pad.dtype, device=q_pad.device)
    part_o, part_lse = alloc_persistent_workspace(programs, batch, hp, q_pad.device)
    part_o.fill_(float("nan"))
    part_lse.fill_(float("nan"))
    seqlens = inp.cache_seqlens if lens is None else lens
    work = build_work_list(seqlens, programs, block_n)
    return mla_decode_persistent(q_pad, inp.kv_cache, inp.block_table, seqlens, out,
                                 inp.shape.scale, programs, work=work, partial_out=part_o,
                                 partial_lse=part_lse, block_n=block_n)


CASES = [
    # heads, lens, page, programs, dtype
    (12, (1, 64, 100), 16, 3, "float16"),   # programs span request boundaries
    (16, (200,), 64, 4, "float16"),         # one request cut over all programs
    (12, (1, 2), 16, 8, "float16"),         # more programs than tokens: idle programs
    (12, (17, 40), 1, 5, "float16"),        # page 1
    (32, (30, 9), 16, 2, "float16"),        # two head tiles
    (12, (50, 3), 16, 3, "bfloat16"),       # bf16 (the fp32 upcast path in the interpreter)
    (12, (1600, 300), 64, 48, "float16"),   # request 0 spans 34 slots: merge crosses slot blocks
]


@pytest.mark.parametrize("heads,lens,page,programs,dtype", CASES)
def test_matches_reference(heads, lens, page, programs, dtype):
    inp, ref = make_case(heads, lens, page, dtype)
    out = run(inp, pad_heads(inp.q, -(-heads // 16) * 16, "zero"), programs)
    assert not torch.isnan(out).any()  # padded rows are written too
    assert max_err(out[:, :heads], ref) < TOL[dtype]


def test_zero_length_request_gets_zero_row_and_others_unaffected():
    inp, _ = make_case(16, (40, 20, 33), 16)
    lens = torch.tensor([40, 0, 33], dtype=torch.int32, device=inp.device)
    out = run(inp, inp.q, 4, lens=lens)
    inp.cache_seqlens.copy_(lens[[0, 0, 2]])  # reference needs L >= 1: recompute rows 0 and 2 only
    ref = reference(inp, inp.q)
    assert max_err(out[[0, 2]], ref[[0, 2]]) < TOL["float16"]
    assert torch.equal(out[1], torch.zeros_like(out[1]))


def test_zero_and_repeat_padding_agree():
    inp, ref = make_case(12, (70, 5), 16)
    zero = run(inp, pad_heads(inp.q, 16, "zero"), 3)
    rep = run(inp, pad_heads(inp.q, 16, "repeat"), 3)
    assert torch.equal(zero[:, :12], rep[:, :12])
    assert_equal_up_to_rounding(rep[:, 12:], rep[:, :4])  # repeated heads give the same rows
    assert max_err(zero[:, :12], ref) < TOL["float16"]


def test_huge_padding_heads_do_not_leak():
    inp, _ = make_case(12, (70, 5), 16)
    zero = run(inp, pad_heads(inp.q, 16, "zero"), 3)
    q_bad = pad_heads(inp.q, 16, "zero")
    q_bad[:, 12:] = 1e4  # scores of ~1e8 in the pad rows: any shared max or sum would show
    bad = run(inp, q_bad, 3)
    assert torch.equal(zero[:, :12], bad[:, :12])
    assert not torch.equal(zero[:, 12:], bad[:, 12:])


def test_eight_heads_repeated_equal_unpadded():
    inp, ref = make_case(8, (45, 12), 16)
    rep = run(inp, pad_heads(inp.q, 16, "repeat"), 3)
    assert_equal_up_to_rounding(rep[:, 8:], rep[:, :8])
    assert max_err(rep[:, :8], ref) < TOL["float16"]


def test_unpadded_heads_are_masked_rows():
    """12 heads without padding: the 16-row tile's last 4 rows are masked (zero query, never
    stored), so the 12 real rows come out as with padding."""
    inp, ref = make_case(12, (70, 5), 16)
    out = run(inp, inp.q, 3)
    assert out.shape == (2, 12, 512) and max_err(out, ref) < TOL["float16"]
