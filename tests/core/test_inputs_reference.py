import math

import pytest
import torch

from mlabench.checks.verdict import compare_outputs
from mlabench.errors import OutOfMemoryError
from mlabench.inputs import SPARE_PAGES, check_fits, make_inputs
from mlabench.kernels.reference import gather_kv, mla_decode_reference
from mlabench.kernels.splitkv_torch import mla_decode_splitkv_torch, split_starts
from mlabench.shapes import MLADecodeShape


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_paged_inputs(page_size):
    s = MLADecodeShape.create(num_heads=12, context_lens=(1, 63, 64, 130), page_size=page_size)
    x = make_inputs(s, seed=3)
    assert x.q.shape == (4, 12, 576) and x.q.dtype == torch.bfloat16
    assert x.kv_cache.shape == (s.num_pages + SPARE_PAGES, page_size, 1, 576)
    assert x.cache_seqlens.tolist() == [1, 63, 64, 130]
    used = torch.cat([x.block_table[i, :n] for i, n in enumerate(s.pages_per_request)])
    assert len(set(used.tolist())) == s.num_pages  # every page used once, the spare ones never
    if s.num_pages > 2:
        assert used.tolist() != list(range(s.num_pages))  # permuted, not identity
    assert (x.kv_cache != 0).float().mean() > 0.99 and (x.q != 0).float().mean() > 0.99


def unread_rows(s: MLADecodeShape, block_table: torch.Tensor, total_pages: int) -> torch.Tensor:
    """``[pages, page_size]`` True where no request may read, by the definition: not among the
    first L slots, in block-table order, of any request."""
    read = torch.zeros(total_pages, s.page_size, dtype=torch.bool, device=block_table.device)
    for b, n in enumerate(s.context_lens):
        for t in range(n):
            read[block_table[b, t // s.page_size], t % s.page_size] = True
    return ~read


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_every_slot_no_request_reads_is_nan_and_only_those(page_size):
    s = MLADecodeShape.create(num_heads=4, context_lens=(1, 63, 64, 130), page_size=page_size)
    x = make_inputs(s, seed=3)  # on the current device, as check and sweep build them
    unread = unread_rows(s, x.block_table, x.kv_cache.shape[0])
    assert x.poisoned and unread.any()  # at least the spare page
    nan_rows = torch.isnan(x.kv_cache[:, :, 0]).all(-1)
    assert torch.equal(nan_rows, unread) and not torch.isnan(x.kv_cache[~unread]).any()
    padding = [x.block_table[b, n:] for b, n in enumerate(s.pages_per_request)]
    assert all(unread[p.long()].all() for p in padding)  # block-table padding points at NaN pages
    timing = make_inputs(s, seed=3, poison=False)
    assert not timing.poisoned and torch.isfinite(timing.kv_cache).all()
    assert torch.equal(timing.kv_cache[~unread], x.kv_cache[~unread])


def test_poisoned_tail_leaves_the_reference_and_torch_splitkv_finite():
    """12 heads, one request of 13 tokens, page size 16, fp16 on the CPU: NaN in slots 13-15 of the
    request's only page.  Multiplying them by a zero softmax weight gave NaN everywhere."""
    s = MLADecodeShape.create(num_heads=12, context_lens=(13,), page_size=16, q_dtype="float16",
                              kv_dtype="float16")
    x = make_inputs(s, seed=0)
    page = x.block_table[0, 0]
    assert torch.isnan(x.kv_cache[page, 13:]).all() and torch.isfinite(x.kv_cache[page, :13]).all()
    ref, _ = mla_decode_reference(x.q, x.kv_cache, x.block_table, x.cache_seqlens, s.scale)
    assert torch.isfinite(ref).all()
    for splits in (1, 2, 13, 40):
        out = mla_decode_splitkv_torch(x.q, x.kv_cache, x.block_table, x.cache_seqlens, splits, s.scale)
        assert compare_outputs(out, ref).passed, splits


def test_inputs_seeded():
    s = MLADecodeShape.uniform(2, 100, 8, page_size=16)
    same = torch.equal(make_inputs(s, seed=1).kv_cache.nan_to_num(), make_inputs(s, seed=1).kv_cache.nan_to_num())
    assert same
    assert not torch.equal(make_inputs(s, seed=1).kv_cache.nan_to_num(), make_inputs(s, seed=2).kv_cache.nan_to_num())


def test_out_of_memory_is_checked_before_allocating(monkeypatch):
    import mlabench.inputs as inputs

    monkeypatch.setattr(inputs, "free_memory_bytes", lambda device=None: 10 * 2**20)
    s = MLADecodeShape.uniform(16, 131072, 12)
    with pytest.raises(OutOfMemoryError, match="GiB"):
        check_fits(s)
    with pytest.raises(OutOfMemoryError):
        make_inputs(s)


def naive_decode(q, kv_cache, block_table, lens, scale):
    """Per request, per head, per token, in float64 with an explicit softmax."""
    page = kv_cache.shape[1]
    out = torch.zeros(q.shape[0], q.shape[1], 512, dtype=torch.float64)
    for b, n in enumerate(lens):
        rows = [kv_cache[block_table[b, t // page], t % page, 0].double() for t in range(n)]
        k = torch.stack(rows)
        for h in range(q.shape[1]):
            logits = [float(q[b, h].double() @ k[t]) * scale for t in range(n)]
            m = max(logits)
            w = [math.exp(v - m) for v in logits]
            z = sum(w)
            out[b, h] = sum(wi / z * k[t, :512] for t, wi in enumerate(w))
    return out


def test_reference_matches_naive_loop():
    s = MLADecodeShape.create(num_heads=3, context_lens=(1, 17, 40), page_size=16, q_dtype="float32",
                              kv_dtype="float32")
    x = make_inputs(s, seed=5)
    ref, lse = mla_decode_reference(x.q, x.kv_cache, x.block_table, x.cache_seqlens, s.scale)
    want = naive_decode(x.q, x.kv_cache, x.block_table, s.context_lens, s.scale)
    assert torch.allclose(ref.double(), want.to(ref.device), atol=1e-5, rtol=1e-5)
    # a single token: the output is that token's V row, for every head
    row = gather_kv(x.kv_cache, x.block_table, 1, 0)[0, :512].float()
    assert torch.allclose(ref[0], row.expand(3, 512), atol=1e-6)
    assert lse.shape == (3, 3)


def test_reference_uses_the_block_table():
    s = MLADecodeShape.create(num_heads=4, context_lens=(40, 40), page_size=16)
    x = make_inputs(s)
    ref, _ = mla_decode_reference(x.q, x.kv_cache, x.block_table, x.cache_seqlens, s.scale)
    wrong, _ = mla_decode_reference(x.q, x.kv_cache, x.block_table.flip(0), x.cache_seqlens, s.scale)
    assert (ref - wrong).abs().max() > 1e-2


@pytest.mark.parametrize("splits", [1, 2, 3, 7, 40, 41, 300])
def test_torch_splitkv_matches_reference(splits):
    s = MLADecodeShape.create(num_heads=12, context_lens=(1, 16, 40), page_size=16, q_dtype="float32",
                              kv_dtype="float32")
    x = make_inputs(s, seed=splits)
    ref, _ = mla_decode_reference(x.q, x.kv_cache, x.block_table, x.cache_seqlens, s.scale)
    out = mla_decode_splitkv_torch(x.q, x.kv_cache, x.block_table, x.cache_seqlens, splits, s.scale)
    assert torch.isfinite(out).all()
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)


def test_split_starts_of_the_split_kv_cuts():
    assert split_starts([100, 5, 1], 3) == [[0, 34, 68], [0, 2, 4], [0]]  # ceil(L / 3) tokens
    assert split_starts([100, 5], 3, align=16) == [[0, 48, 96], [0]]  # rounded up to 16
    assert split_starts([4096], 512, align=16) == [list(range(0, 4096, 16))]
    with pytest.raises(ValueError):
        split_starts([10], 0)
