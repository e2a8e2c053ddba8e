"""Pure AITER argument construction: the page-size-1 addressing of a paged cache."""

from __future__ import annotations

import pytest
import torch

from mlabench.backends.aiter.args import page1_cache_view, page1_kv_layout
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
