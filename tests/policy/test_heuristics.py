"""The public split heuristics, at values worked out by hand from their published rules."""

from __future__ import annotations

import pytest

from mlabench.policy.heuristics import (
    HEURISTICS, aiter_gluon_v0119_splits, aiter_gluon_v0120_splits, heuristic_splits, rocm_bucket_splits, sglang_splits,
    vllm_triton_splits,
)
from mlabench.shapes import MLADecodeShape


def shape(batch: int, length: int, heads: int = 12) -> MLADecodeShape:
    return MLADecodeShape.uniform(batch, length, heads)


@pytest.mark.parametrize("length, expected", [(1024, 2), (4096, 8), (32768, 64), (131072, 256), (600000, 264)])
def test_vllm_triton_rule(length, expected):
    # min(next_pow2(L // 512), 2 * 132)
    assert vllm_triton_splits(shape(1, length), 132) == expected


def test_sglang_rule():
    # cores = 132 * log2(L / 64); grid = B * ceil(12 / 12); n = min(ceil(cores / grid), 256)
    assert sglang_splits(shape(1, 131072), 132) == 256
    assert sglang_splits(shape(16, 131072), 132) == 91      # ceil(1452 / 16) = 91; ceil(L / ceil(L / 91)) = 91
    assert sglang_splits(shape(16, 1024), 132) == 32        # 132 * 4 = 528 -> 33 -> chunks of 32 tokens -> 32
    assert sglang_splits(shape(1, 64), 132) == 64           # log2 term floored at 1: 132, cut to 64 one-token chunks


def test_aiter_gluon_rules_by_version():
    assert aiter_gluon_v0120_splits(shape(1, 100000), 0) == 256     # 256 // (1 * 1 * ceil(12/16))
    assert aiter_gluon_v0120_splits(shape(16, 100000), 0) == 16
    assert aiter_gluon_v0120_splits(shape(1, 100000, heads=32), 0) == 128
    assert aiter_gluon_v0119_splits(shape(1, 1024), 0) == 16         # cdiv(1024, 64)
    assert aiter_gluon_v0119_splits(shape(1, 100000), 0) == 256


@pytest.mark.parametrize("length, expected", [(64, 1), (65, 16), (4096, 16), (16384, 48), (65536, 64), (65537, 128)])
def test_rocm_buckets(length, expected):
    assert rocm_bucket_splits(shape(1, length), 0) == expected


def test_clamped_to_the_backend_range():
    got = heuristic_splits(shape(1, 131072), 132, low=1, high=64)
    assert set(got) == {h.name for h in HEURISTICS}
    assert max(got.values()) == 64 and min(got.values()) >= 1
