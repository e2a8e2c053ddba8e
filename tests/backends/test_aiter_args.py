"""Pure AITER argument construction: page-size-1 addressing, versions, split rule, batch gate."""

from __future__ import annotations

import pytest
import torch

from mlabench.backends.aiter_args import (
    aiter_asm_persistent,
    aiter_gluon_effective_splits,
    aiter_version_is_exact,
    min_kv_seq_len_for_splits,
    page1_cache_view,
    page1_kv_layout,
    parse_aiter_version,
    persistent_max_batch,
)
from mlabench.inputs import SPARE_PAGES, make_inputs
from mlabench.kernels.reference import gather_kv
from mlabench.shapes import MLADecodeShape

RAGGED = (1, 17, 64, 130, 63)


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_page1_layout_gathers_every_request_exactly(page_size):
    shape = MLADecodeShape.create(num_heads=12, context_lens=RAGGED, page_size=page_size,
                                  q_dtype="float16", kv_dtype="float16")
    inp = make_inputs(shape, device="cpu", seed=3)
    lay = page1_kv_layout(inp.block_table, shape.context_lens, page_size)
    rows = page1_cache_view(inp.kv_cache).view(-1, 576)
    assert page1_cache_view(inp.kv_cache).shape == ((shape.num_pages + SPARE_PAGES) * page_size, 1, 1, 576)
    assert lay.kv_indptr.tolist() == [0, 1, 18, 82, 212, 275]
    assert lay.qo_indptr.tolist() == [0, 1, 2, 3, 4, 5]
    assert lay.kv_last_page_lens.tolist() == [1] * 5
    assert lay.total_tokens == sum(RAGGED)
    for t in (lay.qo_indptr, lay.kv_indptr, lay.kv_indices, lay.kv_last_page_lens):
        assert t.dtype == torch.int32
    for b, n in enumerate(RAGGED):
        got = rows[lay.kv_indices[lay.kv_indptr[b]:lay.kv_indptr[b + 1]].long()]
        assert torch.equal(got, gather_kv(inp.kv_cache, inp.block_table, n, b))


def test_page1_layout_follows_the_block_table_not_page_order():
    # Request 0 owns pages 2 and 0 (in that order), page size 4, 6 tokens.
    table = torch.tensor([[2, 0]], dtype=torch.int32)
    lay = page1_kv_layout(table, [6], page_size=4)
    assert lay.kv_indices.tolist() == [8, 9, 10, 11, 0, 1]


def test_page1_layout_rejects_mismatches():
    table = torch.zeros((2, 1), dtype=torch.int32)
    with pytest.raises(ValueError, match="does not match"):
        page1_kv_layout(table, [4], page_size=4)
    with pytest.raises(ValueError, match="needs 2 pages"):
        page1_kv_layout(table, [4, 5], page_size=4)


@pytest.mark.parametrize("text, expected", [
    ("0.1.19", (0, 1, 19)), ("v0.1.20", (0, 1, 20)), ("0.1.20.dev12+g1a2b3c", (0, 1, 20)),
    ("0.1.19+rocm7.0.0", (0, 1, 19)), ("0.2", (0, 2, 0)), ("1.0.0rc1", (1, 0, 0)),
    ("unknown", None), ("", None), (None, None),
])
def test_parse_aiter_version(text, expected):
    assert parse_aiter_version(text) == expected


def test_version_exactness():
    assert aiter_version_is_exact("0.1.19")
    assert not aiter_version_is_exact("0.1.20.dev3")
    assert not aiter_version_is_exact("0.1.19+rocm7")
    assert not aiter_version_is_exact("garbage")


@pytest.mark.parametrize("version, batch, heads, min_kv, expected", [
    ((0, 1, 20), 1, 12, 1, 256),        # fixed rule ignores min_kv_seq_len
    ((0, 1, 19), 1, 12, 1, 1),          # the graph-capture hazard: dummy length 1 -> 1 split
    ((0, 1, 19), 1, 12, 100_000, 256),  # real 100K context -> capped at 256
    ((0, 1, 19), 1, 12, 200, 4),        # cdiv(200, 64)
    ((0, 1, 20), 16, 12, 1, 16),
    ((0, 1, 21), 1, 32, 1, 128),        # two 16-head tiles
    ((0, 1, 20), 300, 12, 1, 1),        # never below 1
    (None, 2, 16, 1, 128),              # unknown version -> fixed rule
    ("0.1.18", 1, 8, 64, 1),
])
def test_gluon_effective_splits(version, batch, heads, min_kv, expected):
    assert aiter_gluon_effective_splits(version, batch, 1, heads, min_kv) == expected


def test_gluon_splits_bounded_override_and_errors():
    assert aiter_gluon_effective_splits((0, 1, 25), 1, 1, 12, 1, bounded=True) == 1
    assert aiter_gluon_effective_splits((0, 1, 10), 1, 1, 12, 1, bounded=False) == 256
    with pytest.raises(ValueError):
        aiter_gluon_effective_splits((0, 1, 20), 0, 1, 12, 1)


@pytest.mark.parametrize("n", [1, 2, 7, 64, 255, 256])
def test_min_kv_steering_reaches_the_requested_split_count(n):
    assert aiter_gluon_effective_splits((0, 1, 19), 1, 1, 12, min_kv_seq_len_for_splits(n)) == n


def test_persistent_batch_gate():
    assert persistent_max_batch({}) == 32
    assert persistent_max_batch({"AITER_MLA_DECODE_PERSISTENT_MAX_BATCH": "8"}) == 8
    assert persistent_max_batch({"AITER_MLA_DECODE_PERSISTENT_MAX_BATCH": "x"}) == 32
    args = ("gfx950", "bfloat16", "bfloat16", 16, 1)
    assert aiter_asm_persistent(*args, batch=31, max_batch=32)
    assert not aiter_asm_persistent(*args, batch=32, max_batch=32)
    assert aiter_asm_persistent(*args, batch=512, max_batch=0)  # 0 disables the gate
    assert aiter_asm_persistent("gfx942", "bfloat16", "bfloat16", 16, 1, batch=64, max_batch=32)
    assert aiter_asm_persistent("gfx950", "bfloat16", "bfloat16", 32, 1, batch=64, max_batch=32)
    assert aiter_asm_persistent("gfx950", "float16", "float16", 16, 1, batch=64, max_batch=32)
