"""The portable split-KV implementation (mlabench.kernels.splitkv_torch, backend torch-splitkv) on
what the GPU kernels take (issue 35 item 11): a latent width other than 512, and block-table
entries past a request's own pages that point past the cache (a graph batch's padding)."""

from __future__ import annotations

import pytest
import torch

from mlabench.backends.registry import get_backend
from mlabench.inputs import make_inputs
from mlabench.kernels.reference import mla_decode_reference
from mlabench.kernels.splitkv_torch import mla_decode_splitkv_torch, split_starts
from mlabench.shapes import MLADecodeShape
from tests.kernels.helpers import TOL, max_err


@pytest.mark.parametrize("splits", [1, 3])
def test_entries_past_a_requests_own_pages_are_never_followed(splits):
    """Requests of 40, 1 and 17 tokens in pages of 16 own 3, 1 and 2 pages; every entry after
    those points past the cache (or is -1), as a padded graph batch's table may.  It raised
    IndexError; now it gives the reference's rows."""
    inp = make_inputs(MLADecodeShape.create(num_heads=12, context_lens=(40, 1, 17), page_size=16), seed=2)
    lens = torch.tensor([40, 1, 17], dtype=torch.int32)
    table = inp.block_table.clone()
    past = inp.kv_cache.shape[0]
    table[1, 1:] = past + 7
    table[2, 2:] = -1
    assert table.shape[1] == 3
    ref, _ = mla_decode_reference(inp.q, inp.kv_cache, inp.block_table, lens, inp.shape.scale)
    out = mla_decode_splitkv_torch(inp.q, inp.kv_cache, table, lens, splits, inp.shape.scale)
    assert max_err(out, ref) < TOL[inp.shape.q_dtype]


def test_a_latent_width_of_256_runs_and_is_right():
    """A Mistral-Small-4-like shape (kv_lora_rank 256 + rope 64): torch-splitkv says it takes it,
    so it must compute it (it crashed with a reshape error, computing a 512-wide output)."""
    shape = MLADecodeShape.create(num_heads=12, context_lens=(70, 9), page_size=16, kv_lora_rank=256)
    backend = get_backend("torch-splitkv")
    assert backend.supports(shape) == (True, "")
    inp = make_inputs(shape, seed=3)
    out = backend.prepare(inp, {"num_kv_splits": 4}).fn()
    ref, _ = mla_decode_reference(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens, shape.scale,
                                  kv_lora_rank=256)
    assert out.shape == (2, 12, 256) and max_err(out, ref) < TOL[shape.q_dtype]


@pytest.mark.parametrize("length,splits,starts", [
    (2000, 12, [0, 192, 384, 576, 768, 960, 1152, 1344, 1536, 1728, 1920]),  # 32 pages, 3 a split: 11 written
    (640, 8, [0, 128, 256, 384, 512]),  # 10 pages, 2 a split: 5 of 8 written
    (320, 4, [0, 128, 256]),            # 5 pages, 2 a split: 3 of 4 written
    (320, 8, [0, 64, 128, 192, 256]),   # fewer pages than splits: one page each
    (1, 4, [0]),
])
def test_page_granular_split_starts_leave_the_last_splits_empty(length, splits, starts):
    """Issue 35 item 14: the splits that own pages (the starts a record names, what stage 1
    writes) are ceil(pages / ceil(pages / S)), fewer than min(pages, S) at these lengths; the
    rule of mlabench.kernels.wide_merge.written_splits and gluon_blocks.split_pages."""
    got = split_starts([length], splits, align=64)[0]
    pages = -(-length // 64)
    assert got == starts and len(got) == -(-pages // -(-pages // splits))
