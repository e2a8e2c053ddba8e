"""The query in halves (vLLM's ``(ql_nope, q_pe)``) without a GPU: the argument checks, and what
gluon-splitkv's stage 1 is handed (its launch replaced by a recorder: Gluon has no interpreter).
tests/gpu/test_gluon_splitkv.py runs the kernel on them."""

from __future__ import annotations

import pytest
import torch

from mlabench.kernels.splitkv import checked_splitkv_args
from tests.kernels.helpers import vllm_query_halves

HEADS = 12


def _args(batch: int, qo_len: int = 1, dtype=torch.bfloat16):
    """q ``[B*qo_len, H, 576]``, cache, block table, lengths, out (CPU tensors)."""
    q = torch.randn(batch * qo_len, HEADS, 576).to(dtype)
    cache = torch.zeros(4, 64, 1, 576, dtype=dtype)
    table = torch.zeros(batch, 4, dtype=torch.int32)
    lens = torch.full((batch,), 100, dtype=torch.int32)
    return q, cache, table, lens, torch.empty(batch * qo_len, HEADS, 512, dtype=dtype)


def _checked(q, cache, table, lens, out, qo_len=1, q_rope=None):
    return checked_splitkv_args(q, cache, table, lens, out, 4, None, None, None, qo_len, q_rope)


def test_one_tensor_gives_its_rope_columns_with_its_strides():
    q, *rest = _args(3, qo_len=2)
    q_rows, rope_rows, *_ = _checked(q, *rest, qo_len=2)
    assert rope_rows.data_ptr() == q.data_ptr() + 512 * q.element_size()
    assert rope_rows.shape == (3, 2 * HEADS, 64) and rope_rows.stride() == q_rows.stride()
    assert torch.equal(rope_rows, q.view(3, 2 * HEADS, 576)[..., 512:])


def test_vllm_halves_are_read_where_they_lie():
    q, *rest = _args(16)
    nope, pe = vllm_query_halves(q)
    assert nope.stride() == (512, 16 * 512, 1) and not nope.is_contiguous()
    q_rows, rope_rows, *_ = _checked(nope, *rest, q_rope=pe)
    assert q_rows.data_ptr() == nope.data_ptr() and q_rows.stride() == nope.stride()
    assert rope_rows.data_ptr() == pe.data_ptr() and rope_rows.stride() == pe.stride()
    assert torch.equal(torch.cat([q_rows, rope_rows], -1), q)


def test_halves_at_several_tokens_need_evenly_spaced_rows():
    q, *rest = _args(2, qo_len=3)
    _, rope_rows, *_ = _checked(q[..., :512], *rest, qo_len=3, q_rope=q[..., 512:])
    assert rope_rows.stride() == (3 * HEADS * 576, 576, 1)
    nope, pe = vllm_query_halves(q)
    with pytest.raises(ValueError, match="qo_len 1 only"):
        _checked(nope, *rest, qo_len=3, q_rope=pe)


@pytest.mark.parametrize("case", ["576 latent", "rope width", "heads", "dtype", "cache dtype",
                                  "column stride"])
def test_bad_halves_get_one_error(case):
    q, cache, *rest = _args(2)
    nope, pe = q[..., :512], q[..., 512:]
    if case == "576 latent":
        nope = q
    elif case == "rope width":
        pe = q[..., 500:]
    elif case == "heads":
        pe = pe[:, :6]
    elif case == "dtype":
        pe = pe.half()
    elif case == "cache dtype":
        nope, pe = nope.half(), pe.half()
    else:
        pe = q[..., 448::2][..., :64]
    match = "q must have the cache's dtype" if case == "cache dtype" else "query halves must be"
    with pytest.raises(ValueError, match=match):
        _checked(nope, cache, *rest, q_rope=pe)


class _Recorder:
    """Stands in for the Gluon kernel: ``kernel[grid](*args, **constexprs)`` records the args."""

    def __init__(self):
        self.args = None

    def __getitem__(self, grid):
        return lambda *args, **kwargs: setattr(self, "args", args)


@pytest.mark.parametrize("halves", [False, True])
def test_stage1_gets_both_pointers_and_their_strides(monkeypatch, halves):
    """Stage 1's query arguments: ``q_ptr, qr_ptr`` first, then ``stride_qb, stride_qh,
    stride_qrb, stride_qrh`` after the scale; one 576-wide q passes its RoPE columns' view with q's
    own strides (the bytes it read before the split), halves pass themselves."""
    gluon_splitkv = pytest.importorskip("mlabench.kernels.gluon_splitkv")
    recorder = _Recorder()
    monkeypatch.setattr(gluon_splitkv, "_gluon_splitkv_stage1", recorder)
    q, cache, table, lens, out = _args(16)
    nope, pe = vllm_query_halves(q) if halves else (q, None)
    gluon_splitkv.mla_decode_gluon_splitkv(nope, cache, table, lens, out, 4, 0.1,
                                           partial_out=None, partial_lse=None,
                                           descriptors=("n", "r"), stage1_only=True, q_rope=pe)
    args = recorder.args
    rope = q[..., 512:] if pe is None else pe
    assert args[0].data_ptr() == nope.data_ptr() and args[1].data_ptr() == rope.data_ptr()
    assert args[15:19] == (*nope.stride()[:2], *rope.stride()[:2])


def test_the_split_loop_kernel_gets_both_pointers_and_multi_token_refuses_halves(monkeypatch):
    """The split loop's stage 1 (a device policy, batch 16: a grid of fewer programs than splits)
    takes the same query arguments as the loop-free one; the multi-token stage 1 reads one
    576-wide q, so halves with ``multi_token`` are refused in one line."""
    gluon_splitkv = pytest.importorskip("mlabench.kernels.gluon_splitkv")
    recorder = _Recorder()
    monkeypatch.setattr(gluon_splitkv, "stage1_split_loop", recorder)
    monkeypatch.setattr(gluon_splitkv, "_gluon_splitkv_stage1", None)  # must not run
    q, cache, table, lens, out = _args(16)
    nope, pe = vllm_query_halves(q)
    policy = torch.tensor([[4096, 64]] * 2, dtype=torch.int32)
    run = lambda variant, q_rope: gluon_splitkv.mla_decode_gluon_splitkv(  # noqa: E731
        nope, cache, table, lens, out, 64, 0.1, partial_out=None, partial_lse=None,
        descriptors=("n", "r"), stage1_only=True, split_policy=policy, variant=variant, q_rope=q_rope)
    run(gluon_splitkv.KernelVariant(split_loop=True), pe)
    assert recorder.args[0].data_ptr() == nope.data_ptr() and recorder.args[1].data_ptr() == pe.data_ptr()
    assert recorder.args[15:19] == (*nope.stride()[:2], *pe.stride()[:2])
    q8, cache, table, lens, out8 = _args(2, qo_len=8)
    nope8, pe8 = q8[..., :512], q8[..., 512:]
    with pytest.raises(ValueError, match="multi_token reads one 576-wide q: pass q whole, not q_rope apart"):
        gluon_splitkv.mla_decode_gluon_splitkv(
            nope8, cache, table, lens, out8, 4, 0.1, partial_out=None, partial_lse=None, qo_len=8,
            descriptors=("n", "r"), variant=gluon_splitkv.KernelVariant(multi_token=1), q_rope=pe8)
