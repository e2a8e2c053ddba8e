"""Packed multi-token rows in the Triton kernels, compiled on a GPU or in the interpreter without
one (fp16: the interpreter's bf16 dots are wrong).

Each request's ``qo_len x H`` query rows share the kernels' row tiles (by default the smallest of
16, 32 and 64 rows that holds them; tests/kernels/test_row_tiles.py tries each size); the
persistent kernel is run here on per-token padded heads (12 -> 16 of each token), a layout it still
takes.  The causal mask is applied per row.  Contexts include lengths shorter than ``qo_len + 1``: under the causal mask the first query
tokens of such a request see one key, or none (a zero output, like the reference's).
"""

from __future__ import annotations

import pytest
import torch

from mlabench.backends import get_backend
from mlabench.inputs import make_inputs
from mlabench.kernels.padding import pad_heads
from mlabench.kernels.persistent import alloc_persistent_workspace, mla_decode_persistent
from mlabench.kernels.reference import mla_decode_reference
from mlabench.kernels.splitkv import alloc_splitkv_workspace, mla_decode_splitkv
from mlabench.kernels.worklist import build_work_list
from mlabench.policy.device_table import SplitPolicy
from mlabench.shapes import MLADecodeShape
from tests.kernels.helpers import DEVICE, TOL, assert_equal_up_to_rounding, max_err

#: Contexts shorter than the block (1, 2), as long as a 4-token block (4), one past it (5), and
#: several 16-token pages (37, 70).
LENS = (1, 2, 4, 5, 37, 70)


def case(qo_len, lens=LENS, heads=12, page=16, seed=0):
    """fp16 inputs on :data:`DEVICE` (built non-causal, the shape that allows contexts shorter than the
    block) and the fp32 references of both masks: ``(inputs, {causal: [B*qo_len, H, 512]})``."""
    shape = MLADecodeShape.create(num_heads=heads, context_lens=lens, qo_len=qo_len, causal=False,
                                  page_size=page, q_dtype="float16", kv_dtype="float16")
    inp = make_inputs(shape, device=DEVICE, seed=seed)
    refs = {c: mla_decode_reference(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens,
                                    shape.scale, qo_len=qo_len, causal=c)[0] for c in (True, False)}
    return inp, refs


def splitkv(inp, qo_len, causal, splits, policy=None, block_n=16):
    rows = qo_len * inp.shape.num_heads
    part_o, part_lse = alloc_splitkv_workspace(inp.shape.batch, rows, splits, DEVICE)
    part_o.fill_(float("nan"))  # every slot the merge reads must be written
    part_lse.fill_(float("nan"))
    out = inp.new_output()
    return mla_decode_splitkv(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens, out, splits,
                              inp.shape.scale, partial_out=part_o, partial_lse=part_lse,
                              block_n=block_n, split_policy=policy, qo_len=qo_len, causal=causal)


def persistent(q_pad, inp, qo_len, causal, programs, block_n=16):
    """The persistent kernel on per-token padded ``q_pad`` ``[B*qo_len, Hp, 576]``."""
    hp = q_pad.shape[1]
    out = torch.full((q_pad.shape[0], hp, 512), float("nan"), dtype=q_pad.dtype, device=q_pad.device)
    part_o, part_lse = alloc_persistent_workspace(programs, inp.shape.batch, qo_len * hp, DEVICE)
    part_o.fill_(float("nan"))
    part_lse.fill_(float("nan"))
    work = build_work_list(inp.cache_seqlens, programs, block_n)
    return mla_decode_persistent(q_pad, inp.kv_cache, inp.block_table, inp.cache_seqlens, out,
                                 inp.shape.scale, programs, work=work, partial_out=part_o,
                                 partial_lse=part_lse, block_n=block_n, qo_len=qo_len, causal=causal)


@pytest.mark.parametrize("qo_len", [2, 4])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("splits", [1, 3, 8])
def test_splitkv_packed_rows(qo_len, causal, splits):
    """12 heads x 4 tokens = 48 rows in one 64-row tile; x 2 = 24 rows in a 32-row tile."""
    inp, refs = case(qo_len)
    out = splitkv(inp, qo_len, causal, splits)
    assert out.shape == (len(LENS) * qo_len, 12, 512)
    assert max_err(out, refs[causal]) < TOL["float16"]


def test_splitkv_causal_rows_are_masked_per_token():
    """The same kernel without the mask is wrong on exactly the rows the mask changes."""
    inp, refs = case(4)
    out = splitkv(inp, 4, False, 3)
    assert max_err(out, refs[False]) < TOL["float16"]
    assert max_err(out, refs[True]) > 0.05
    last = torch.arange(3, 4 * len(LENS), 4, device=DEVICE)  # each request's last token: every key either way
    assert max_err(out[last], refs[True][last]) < TOL["float16"]


def test_splitkv_device_policy_packed_rows():
    """Each request's own split count, looked up on the device, with 48 packed rows."""
    inp, refs = case(4, lens=(4, 5, 37, 300))
    table = SplitPolicy.create({4: [[16, 1], [64, 3], [100000, 6]]}, "test").device_table(4, DEVICE)
    out = splitkv(inp, 4, True, 6, policy=table)
    assert max_err(out, refs[True]) < TOL["float16"]


@pytest.mark.parametrize("qo_len", [2, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_persistent_per_token_padding(qo_len, causal, programs=5):
    """12 heads padded to 16 per token (32 or 64 rows, one tile), its 12 real rows of each token exact."""
    inp, refs = case(qo_len)
    out = persistent(pad_heads(inp.q, 16, "zero"), inp, qo_len, causal, programs)
    assert not torch.isnan(out).any()  # every padded row is written too
    assert max_err(out[:, :12], refs[causal]) < TOL["float16"]


def test_per_token_padding_is_exact():
    """Padding applies per token: with heads repeated, padded row 12 + j of token t equals head j of
    the same token (its own causal limit), zero and repeat padding agree on the real heads, and
    huge padding rows leak into no real row."""
    inp, refs = case(4, lens=(4, 5, 70))
    zero = persistent(pad_heads(inp.q, 16, "zero"), inp, 4, True, 5)
    rep = persistent(pad_heads(inp.q, 16, "repeat"), inp, 4, True, 5)
    assert torch.equal(zero[:, :12], rep[:, :12])
    assert_equal_up_to_rounding(rep[:, 12:], rep[:, :4])
    bad_q = pad_heads(inp.q, 16, "zero")
    bad_q[:, 12:] = 1e4
    bad = persistent(bad_q, inp, 4, True, 5)
    assert torch.equal(bad[:, :12], zero[:, :12])
    assert max_err(zero[:, :12], refs[True]) < TOL["float16"]


@pytest.mark.parametrize("qo_len,tiles", [(2, 1), (5, 1), (8, 2)])
def test_gluon_splitkv_takes_several_tokens_in_64_row_tiles(qo_len, tiles):
    """Its rows are packed as the Triton kernels' are, up to 64 a program (tests/gpu runs it)."""
    shape = MLADecodeShape.create(num_heads=12, context_lens=(64,), qo_len=qo_len)
    backend = get_backend("gluon-splitkv")
    assert backend.supports(shape) == (True, "")
    assert backend.split_programs(shape, {}) == tiles
