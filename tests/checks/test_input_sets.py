"""The verification input sets: where needles go, that they score and weigh what they should,
that writing a set into the inputs is undone exactly, and the flat set."""

from __future__ import annotations

import math

import pytest
import torch

from mlabench.backends.shared import likely_split_starts
from mlabench.checks.input_sets import (
    NEEDLE_SHARE, PEAK_SHARE, VerificationCase, make_case, needle_positions, split_starts_for, with_reference,
)
from mlabench.inputs import make_inputs
from mlabench.kernels.reference import gather_kv
from mlabench.shapes import MLADecodeShape

SHAPE = MLADecodeShape.create(num_heads=4, context_lens=(130, 1000, 7), page_size=16)


@pytest.fixture
def setup():
    x = make_inputs(SHAPE, device="cpu", seed=4)
    return x, with_reference(VerificationCase("random"), x)


def test_needles_sit_at_split_edges_page_edges_and_the_last_token():
    where = needle_positions(130, 64, [0, 48, 96], num_heads=4)
    assert set(where) == {0, 47, 48, 95, 96, 129, 63, 64, 127, 128}
    assert where[0] == "first token of split 1/3, first token of page 0"
    assert where[129] == "last token of split 3/3, last token of page 2, last valid token"
    assert where[128] == "first token of page 2"
    many = needle_positions(32768, 64, [0], num_heads=1)  # 512 pages: an even spread of 4 and the last
    assert {t // 64 for t in many} == {0, 128, 256, 384, 511}


def test_split_starts_come_from_the_backend_or_are_one_split():
    assert split_starts_for([100, 5], [[0, 40, 80, 120], [3]]) == [[0, 40, 80], [0, 3]]
    assert split_starts_for([100, 7], None) == [[0], [0]]


def test_a_backend_that_cannot_say_reports_the_likely_cuts_of_its_count():
    assert likely_split_starts([100], 3) == [[0, 34, 48, 64, 68, 96]]  # splits of 34, 48 and 64 tokens
    assert likely_split_starts([100, 40], [2, 1]) == [[0, 50, 64], [0]]  # a count per request
    assert likely_split_starts([100, 7], None) == [[0], [0]]


def test_each_needle_scores_its_head_as_designed_and_the_needles_weigh_their_share(setup):
    x, random = setup
    case = make_case("needles", x, random, likely_split_starts(SHAPE.context_lens, 4))
    heads = {(n.request, n.head) for n in case.needles}
    assert {n.head for n in case.needles if n.request == 1} == set(range(4))  # dealt out to every head
    with case.applied(x):
        for i, n in enumerate(case.needles):
            k = gather_kv(x.kv_cache, x.block_table, SHAPE.context_lens[n.request], n.request)[n.token].double()
            score = float(x.q[n.request, n.head].double() @ k) * SHAPE.scale
            assert score == pytest.approx(float(case.scores[i]), abs=0.05)  # bf16 rounding of the key
            assert torch.equal(k[:512].to(x.kv_cache.dtype), case.values[i, :512])
    for b, h in heads - {(2, h) for h in range(4)}:  # request 2's 7 tokens are mostly needles
        mine = [i for i, n in enumerate(case.needles) if (n.request, n.head) == (b, h)]
        share = float((case.scores[mine] - case.lse[b, h]).exp().sum())
        assert share == pytest.approx(NEEDLE_SHARE, abs=0.07), (b, h)  # other heads' needles weigh too
    values = case.values[:, :512].float()
    assert (torch.cdist(values, values) + torch.eye(len(values)) * 1e9).min() > 10  # distinct value rows


def test_peaky_needles_dominate_and_flat_scores_are_nearly_equal(setup):
    x, random = setup
    peaky = make_case("peaky", x, random, [[0]] * 3)
    assert [sum(n.request == b for n in peaky.needles) for b in range(3)] == [4, 4, 4]
    for i, n in enumerate(peaky.needles):
        assert math.exp(float(peaky.scores[i] - peaky.lse[n.request, n.head])) == pytest.approx(PEAK_SHARE, abs=0.01)
        assert torch.allclose(peaky.reference[n.request, n.head], peaky.values[i, :512].float(), atol=0.1)
    flat = make_case("flat", x, random, [[0]] * 3)
    v = gather_kv(x.kv_cache, x.block_table, 1000, 1)[:, :512].float()
    assert torch.allclose(flat.reference[1], v.mean(0).expand(4, 512), atol=2e-3)


@pytest.mark.parametrize("name", ["needles", "peaky", "flat"])
def test_a_set_written_into_the_inputs_is_undone_exactly(setup, name):
    x, random = setup
    q, kv = x.q.clone(), x.kv_cache.clone()
    case = make_case(name, x, random, [[0, 64]] * 3)
    assert torch.equal(x.q, q) and torch.equal(x.kv_cache.nan_to_num(), kv.nan_to_num())
    with pytest.raises(RuntimeError, match="boom"), case.applied(x):
        assert not (torch.equal(x.q, q) and torch.equal(x.kv_cache.nan_to_num(), kv.nan_to_num()))
        raise RuntimeError("boom")
    assert torch.equal(x.q, q) and torch.equal(torch.isnan(x.kv_cache), torch.isnan(kv))
    assert torch.equal(x.kv_cache.nan_to_num(), kv.nan_to_num())
    assert torch.isfinite(case.reference).all()
