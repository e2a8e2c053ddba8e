"""Multi-token decode (qo_len > 1): the shape, the fp32 reference's two masks against a naive loop,
and the PyTorch split-KV at every split count."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from mlabench.errors import ShapeError
from mlabench.inputs import make_inputs
from mlabench.kernels.reference import mla_decode_reference, visible_keys
from mlabench.kernels.splitkv_torch import mla_decode_splitkv_torch
from mlabench.records.record import point_key
from mlabench.shapes import MLADecodeShape

FIXTURE = Path(__file__).parent.parent / "report" / "fixtures" / "h200-kimi-k3-tp8"


def fp32_shape(lens, qo_len, causal=True, heads=3, page_size=16):
    return MLADecodeShape.create(num_heads=heads, context_lens=lens, qo_len=qo_len, causal=causal,
                                 page_size=page_size, q_dtype="float32", kv_dtype="float32")


def naive_decode(q, kv_cache, block_table, lens, scale, qo_len, causal):
    """Per request, query token, head and key, in float64 with an explicit softmax; a query token
    sees key ``j`` when ``j < L - qo_len + t + 1`` (causal) or ``j < L``; seeing none gives 0."""
    page = kv_cache.shape[1]
    out = torch.zeros(q.shape[0], q.shape[1], 512, dtype=torch.float64, device=q.device)
    for b, n in enumerate(lens):
        k = torch.stack([kv_cache[block_table[b, j // page], j % page, 0].double() for j in range(n)])
        for t in range(qo_len):
            row = b * qo_len + t
            keys = [j for j in range(n) if not causal or j < n - qo_len + t + 1]
            for h in range(q.shape[1]):
                logits = [float(q[row, h].double() @ k[j]) * scale for j in keys]
                if not logits:
                    continue
                m = max(logits)
                w = [math.exp(v - m) for v in logits]
                out[row, h] = sum(wi / sum(w) * k[j, :512] for j, wi in zip(keys, w))
    return out


# ---- the shape ------------------------------------------------------------------------------------
def test_qo_len_range_and_causal_contexts():
    s = MLADecodeShape.create(num_heads=12, context_lens=(4, 9), qo_len=4)
    assert (s.qo_len, s.causal, s.num_query_tokens) == (4, True, 8)
    assert "qo=4" in s.label() and "non-causal" not in s.label()
    for bad in (0, 9):
        with pytest.raises(ShapeError, match="qo_len: must be 1-8"):
            MLADecodeShape.create(num_heads=12, context_lens=(64,), qo_len=bad)
    with pytest.raises(ShapeError, match="must hold >= 4 tokens, got 3"):
        MLADecodeShape.create(num_heads=12, context_lens=(3, 64), qo_len=4)
    draft = MLADecodeShape.create(num_heads=12, context_lens=(3, 64), qo_len=4, causal=False)
    assert "qo=4 non-causal" in draft.label()


def test_bytes_scale_q_and_output_not_the_cache():
    one = MLADecodeShape.uniform(16, 4096, 12)
    four = MLADecodeShape.uniform(16, 4096, 12, qo_len=4)
    assert four.kv_read_bytes == one.kv_read_bytes
    assert (four.q_bytes, four.out_bytes) == (4 * one.q_bytes, 4 * one.out_bytes)
    assert four.min_bytes_moved - one.min_bytes_moved == 3 * (one.q_bytes + one.out_bytes)
    assert four.floor_us(4.0) > one.floor_us(4.0)


def test_one_token_keys_are_unchanged():
    """qo_len 1 shapes have no causal field in their key: the keys of runs recorded before
    multi-token shapes existed are found again (resume, diff)."""
    line = (FIXTURE / "kimi-k3-tp8-20261130-105953-511" / "results.jsonl").read_text().splitlines()[0]
    rec = json.loads(line)
    for causal in (True, False):
        shape = MLADecodeShape.create(**rec["shape"], causal=causal)
        assert shape.causal and "causal" not in shape.key()
        assert point_key(rec["backend"], rec["params"], shape.key()) == rec["key"]
    two = MLADecodeShape.create(**{**rec["shape"], "qo_len": 2})
    assert two.key()["causal"] is True
    assert point_key(rec["backend"], rec["params"], two.key()) != rec["key"]


# ---- the reference ------------------------------------------------------------------------------
@pytest.mark.parametrize("qo_len", [1, 2, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_reference_masks_match_a_naive_loop(qo_len, causal):
    s = fp32_shape((5, 17, 40), qo_len, causal)
    x = make_inputs(s, seed=qo_len)
    assert x.q.shape == (3 * qo_len, 3, 576)
    ref, lse = mla_decode_reference(x.q, x.kv_cache, x.block_table, x.cache_seqlens, s.scale,
                                    qo_len=qo_len, causal=causal)
    want = naive_decode(x.q, x.kv_cache, x.block_table, s.context_lens, s.scale, qo_len, causal)
    assert ref.shape == (3 * qo_len, 3, 512) and lse.shape == (3 * qo_len, 3)
    assert torch.allclose(ref.double(), want, atol=1e-5, rtol=1e-5)


def test_causal_and_non_causal_differ_only_before_the_last_token():
    s = fp32_shape((6, 30), 4, causal=False)
    x = make_inputs(s, seed=1)
    args = (x.q, x.kv_cache, x.block_table, x.cache_seqlens, s.scale)
    causal, _ = mla_decode_reference(*args, qo_len=4, causal=True)
    draft, _ = mla_decode_reference(*args, qo_len=4, causal=False)
    last = [3, 7]  # token 3 of each request sees every key under both masks
    assert torch.allclose(causal[last], draft[last])
    first = [0, 1, 2, 4, 5, 6]
    assert ((causal[first] - draft[first]).abs().amax(dim=(1, 2)) > 1e-3).all()


def test_tokens_that_see_no_key_give_zeros():
    """A context shorter than the causal block (lengths the shape refuses, kernels still meet after
    a refresh): the query tokens that see nothing get 0 and lse -inf, the others their keys."""
    assert visible_keys(2, 4) == [0, 0, 1, 2] and visible_keys(2, 4, causal=False) == [2] * 4
    s = fp32_shape((2, 9), 4, causal=False)
    x = make_inputs(s, seed=2)
    ref, lse = mla_decode_reference(x.q, x.kv_cache, x.block_table, x.cache_seqlens, s.scale,
                                    qo_len=4, causal=True)
    assert (ref[:2] == 0).all() and torch.isinf(lse[:2]).all()
    want = naive_decode(x.q, x.kv_cache, x.block_table, (2, 9), s.scale, 4, True)
    assert torch.allclose(ref.double(), want, atol=1e-5, rtol=1e-5)


# ---- PyTorch split-KV ------------------------------------------------------------------------------
@pytest.mark.parametrize("qo_len", [2, 4])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("splits", [1, 3, 7, 64])
def test_torch_splitkv_matches_the_reference(qo_len, causal, splits):
    lens = (1, 2, 4, 16, 40)  # shorter than the block, as long, one past it, several pages
    s = fp32_shape(lens, qo_len, causal=False, heads=12)
    x = make_inputs(s, seed=splits)
    args = (x.q, x.kv_cache, x.block_table, x.cache_seqlens)
    ref, _ = mla_decode_reference(*args, s.scale, qo_len=qo_len, causal=causal)
    out = mla_decode_splitkv_torch(*args, splits, s.scale, qo_len=qo_len, causal=causal)
    assert out.shape == ref.shape and torch.isfinite(out).all()
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)


# ---- verification input sets with several query tokens ----------------------------------------
def test_needles_belong_to_query_tokens_that_see_them():
    from mlabench.backends.shared import likely_split_starts
    from mlabench.checks.input_sets import VerificationCase, make_case, with_reference
    from mlabench.kernels.reference import gather_kv

    s = MLADecodeShape.create(num_heads=4, context_lens=(4, 130), qo_len=4, page_size=16)
    x = make_inputs(s, device="cpu", seed=6)
    random = with_reference(VerificationCase("random"), x)
    assert random.reference.shape == (8, 4, 512) and random.qo_len == 4
    for name in ("needles", "peaky"):
        case = make_case(name, x, random, likely_split_starts(s.context_lens, 3))
        assert {n.query for n in case.needles} == {0, 1, 2, 3}
        for n in case.needles:  # a causal token t of 4 sees L - 4 + t + 1 keys
            assert n.token < s.context_lens[n.request] - 4 + n.query + 1, n
        with case.applied(x):
            for i, n in enumerate(case.needles):
                k = gather_kv(x.kv_cache, x.block_table, s.context_lens[n.request], n.request)[n.token]
                score = float(x.q[n.row(4), n.head].double() @ k.double()) * s.scale
                assert score == pytest.approx(float(case.scores[i]), abs=0.05)
    assert "query token" in case.needles[0].describe()


def _mutant(mask_error: str):
    """A backend that gets the causal mask wrong: ``ignored`` (every token sees all keys) or
    ``one short`` (token t sees one key fewer than it should)."""
    from mlabench.backends.base import Backend, PreparedCall

    class Mutant(Backend):
        name, summary, family = "mutant", "a wrong causal mask", "split-kv"

        def available(self):
            return True, ""

        def prepare(self, inputs, params):
            s, out = inputs.shape, inputs.new_output()

            def fn():
                lens = inputs.cache_seqlens.tolist()
                causal = mask_error != "ignored"
                if mask_error == "one short":
                    lens = [n - 1 for n in lens]  # the block's last token stays unread
                o, _ = mla_decode_reference(inputs.q, inputs.kv_cache, inputs.block_table, lens, s.scale,
                                            qo_len=s.qo_len, causal=causal)
                return out.copy_(o)

            return PreparedCall(fn=fn, out=out)

    return Mutant()


@pytest.mark.parametrize("mask_error", ["ignored", "one short"])
def test_a_wrong_causal_mask_fails_the_check(mask_error):
    """On check's ragged batch (the shortest request holds just the block) a kernel that ignores
    the causal mask, or stops one key short, is found wrong."""
    from mlabench.sweep.check import default_check_shapes
    from mlabench.bench.shape_bench import ShapeBench

    ragged = default_check_shapes(4, None, page_size=16, qo_len=4)[1]
    small = MLADecodeShape.create(**{**ragged.model_dump(), "context_lens": (4, 100, 300)})
    backend = _mutant(mask_error)
    _call, verdict = ShapeBench(small, seed=1, copies=1).check(backend, {})
    assert not verdict.passed, verdict
    _call, right = ShapeBench(small, seed=1, copies=1).check(_mutant("none"), {})
    assert right.passed, right
