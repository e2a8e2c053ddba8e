"""The bytes-moved formula every floor and TB/s figure divides by (issue 35 item 16: tested only
from tests/records and tests/core before), beside mlabench.shapes."""

from __future__ import annotations

import pytest

from mlabench.shapes import MLADecodeShape


def test_the_seed_shape_moves_its_latent_rows_q_and_output_once():
    """Kimi K3 at TP8, batch 1, 4096 tokens, bf16: 4096 rows of 576 latent values read, q of
    12 x 576 read, output of 12 x 512 written."""
    s = MLADecodeShape.create(num_heads=12, context_lens=(4096,), page_size=64)
    assert (s.kv_read_bytes, s.q_bytes, s.out_bytes) == (4096 * 576 * 2, 12 * 576 * 2, 12 * 512 * 2)
    assert s.min_bytes_moved == 4_744_704
    assert s.floor_us(4.0) == pytest.approx(4_744_704 / 4.0e12 * 1e6, rel=1e-12)


def test_ragged_lengths_count_tokens_not_pages_and_dtypes_their_width():
    """A page's unused tail is not read: 1 + 100 tokens, not 2 pages of 16 + 7 pages of 16."""
    s = MLADecodeShape.create(num_heads=16, context_lens=(1, 100), page_size=16, q_dtype="float32",
                              kv_dtype="float32")
    assert s.kv_read_bytes == 101 * 576 * 4 and s.kv_cache_bytes == (1 + 7) * 16 * 576 * 4
    assert s.min_bytes_moved == (101 * 576 + 2 * 16 * 576 + 2 * 16 * 512) * 4


def test_several_query_tokens_read_the_cache_once_and_scale_q_and_output():
    one = MLADecodeShape.create(num_heads=12, context_lens=(1000, 3000), page_size=64)
    four = MLADecodeShape.create(num_heads=12, context_lens=(1000, 3000), page_size=64, qo_len=4)
    assert four.kv_read_bytes == one.kv_read_bytes == 4000 * 576 * 2
    assert (four.q_bytes, four.out_bytes) == (4 * one.q_bytes, 4 * one.out_bytes) == (2 * 4 * 12 * 576 * 2,
                                                                                      2 * 4 * 12 * 512 * 2)
