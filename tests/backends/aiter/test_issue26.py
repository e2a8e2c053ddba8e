"""The AITER adapters against the four defects found by driving AITER's real host code (issue 26),
each reproduced by the fakes generated from the manifest: the split count of a call prepared at
the lengths a server captures at and refreshed to longer ones, AITER's ASM fallback count (taken
from ``kv_indices``), the 2 GiB guard on the allocated cache, and the 128-head batch-1 failure."""

from __future__ import annotations

import sys

import pytest
import torch

from mlabench.backends import get_backend
from mlabench.backends.aiter import rules
from mlabench.errors import UnsupportedShapeError
from mlabench.inputs import make_inputs
from mlabench.kernels.reference import mla_decode_reference
from mlabench.kernels.workspace import split_workspace_bytes
from mlabench.shapes import MLADecodeShape
from tests.backends.aiter.fakes import install_fake_aiter


def prepare(name, inp, **params):
    backend = get_backend(name)
    return backend.prepare(inp, backend.resolve_params(inp.shape, params))


def assert_right(inp, out):
    ref, _ = mla_decode_reference(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens,
                                  inp.shape.scale)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def step_to(call, inp, lens):
    """Write ``lens`` into the call's lengths in place and refresh, as a server's decode step does."""
    inp.cache_seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
    call.refresh_for_new_lengths()


# 1 and 2: prepared at the lengths in cache_seqlens; what runs recorded after refresh -------------
@pytest.mark.parametrize("rng, at_1, at_4096, launched_4096", [
    ("v0.1.19.post2", 1, 1, 1),  # bounded: min_kv_seq_len 1 frozen, 1 split whatever the length
    ("v0.1.20", 1, 64, 256)])   # budget: 64 of 256 at 4096 tokens, computed in the kernel
def test_gluon_prepared_at_capture_length_records_what_runs(monkeypatch, tmp_path, rng, at_1, at_4096,
                                                           launched_4096):
    fake = install_fake_aiter(monkeypatch, tmp_path, rng)
    inp = make_inputs(MLADecodeShape.uniform(1, 4096, 12, page_size=64), device="cpu", seed=1)
    inp.cache_seqlens.fill_(1)  # a server captures with every request at 1 token
    call = prepare("aiter-gluon", inp)
    eff = call.effective_params
    assert eff["min_kv_seq_len"] == 1 and eff["num_kv_splits"] == at_1
    call.fn()
    assert fake.last["min_kv_seq_len"] == 1 and fake.last["per_request"] == [at_1]
    step_to(call, inp, [4096])
    inp.q.copy_(torch.randn_like(inp.q))
    assert_right(inp, call.fn())
    assert fake.last["launched"] == launched_4096 and fake.last["per_request"] == [at_4096]
    assert eff["num_kv_splits"] == at_4096 and eff["num_kv_splits_launched"] == launched_4096
    partials = 0 if launched_4096 == 1 else split_workspace_bytes(at_4096 * 12, 512, 2)
    assert call.workspace_bytes == partials


def test_gluon_budget_record_follows_a_ragged_step(monkeypatch, tmp_path):
    fake = install_fake_aiter(monkeypatch, tmp_path, "v0.1.20")
    inp = make_inputs(MLADecodeShape.create(num_heads=12, context_lens=(1, 4096)), device="cpu", seed=2)
    call = prepare("aiter-gluon", inp)
    assert call.effective_params["num_kv_splits"] == [1, 64]  # budget 128 at batch 2: 64-token splits
    step_to(call, inp, [4096, 4096])
    call.fn()
    assert fake.last["per_request"] == [64, 64] and call.effective_params["num_kv_splits"] == 64


def test_asm_prepared_at_capture_length(monkeypatch, tmp_path):
    fake = install_fake_aiter(monkeypatch, tmp_path, "v0.1.20")
    inp = make_inputs(MLADecodeShape.uniform(2, 1000, 12, page_size=16), device="cpu", seed=3)
    inp.cache_seqlens.fill_(1)
    call = prepare("aiter-asm", inp)
    assert fake.calls_to("metadata")[-1]["seqlens_kv_indptr"].tolist() == [0, 1, 2]
    assert_right(inp, call.fn())
    step_to(call, inp, [1000, 700])
    assert_right(inp, call.fn())


# 3: AITER's fallback count is taken from kv_indices.shape[0] ------------------------------------
def test_asm_fallback_records_the_count_aiter_takes_from_kv_indices(monkeypatch, tmp_path):
    fake = install_fake_aiter(monkeypatch, tmp_path, "v0.1.18", gfx="gfx950", cu_num=256)
    shape = MLADecodeShape.create(num_heads=12, context_lens=(65536,) + (64,) * 47, page_size=64)
    inp = make_inputs(shape, device="cpu", seed=4)
    call = prepare("aiter-asm", inp)
    call.fn()
    assert fake.last["persistent"] is False and fake.last["splits"] == 16  # 48 x 1024 pages x 64 rows
    assert call.effective_params["num_kv_splits"] == 16  # not 5, the count of the real lengths
    assert call.workspace_bytes == split_workspace_bytes(48 * 16 * 16)  # 50.4 MB, not 15.8 MB
    assert rules.asm_nonpersistent_splits(48, shape.total_tokens, 256) == 5


# 4: the 2 GiB guard measures the allocated cache (one spare page more than the shape) -------------
BORDER = MLADecodeShape.uniform(1, 1_864_128, 12, page_size=64)  # shape 2,147,475,456 B, tensor 2,147,549,184 B


@pytest.mark.parametrize("rng, refused", [("v0.1.19", True), ("v0.1.19.post1", False)])
def test_gluon_guard_counts_the_spare_page(monkeypatch, tmp_path, rng, refused):
    install_fake_aiter(monkeypatch, tmp_path, rng)
    assert BORDER.kv_cache_bytes <= rules.KV_OFFSET_LIMIT_BYTES
    ok, why = get_backend("aiter-gluon").supports(BORDER)
    assert ok is not refused and (("2.00 GiB" in why and "#4474" in why) if refused else why == "")


@pytest.mark.parametrize("rng, gfx, refused", [("v0.1.19.post1", "gfx950", True),
                                               ("v0.1.19.post1", "gfx942", False),
                                               ("v0.1.19.post2", "gfx950", False)])
def test_asm_guard_counts_the_spare_page(monkeypatch, tmp_path, rng, gfx, refused):
    install_fake_aiter(monkeypatch, tmp_path, rng, gfx=gfx)
    ok, why = get_backend("aiter-asm").supports(BORDER)
    assert ok is not refused and (("#4452" in why) if refused else why == "")


@pytest.mark.parametrize("name, rng", [("aiter-gluon", "v0.1.19"), ("aiter-asm", "v0.1.18")])
def test_a_cache_over_the_limit_only_by_its_spare_page_never_reaches_aiter(monkeypatch, tmp_path, name, rng):
    """The same border at a small scale (the limit lowered to the shape's bytes).  The fake AITER
    measures the tensor, as AITER does: with the guard lifted it crashes (Gluon) or reads wrong
    rows (ASM); with the guard, the call is refused before anything launches."""
    fake = install_fake_aiter(monkeypatch, tmp_path, rng, gfx="gfx950")
    shape = MLADecodeShape.uniform(1, 160, 12, page_size=16)
    monkeypatch.setattr(rules, "KV_OFFSET_LIMIT_BYTES", shape.kv_cache_bytes)
    backend = get_backend(name)
    ok, why = backend.supports(shape)
    assert not ok and "> 2 GiB" in why
    with pytest.raises(UnsupportedShapeError, match="> 2 GiB"):
        prepare(name, make_inputs(shape, device="cpu"))
    module = sys.modules[type(backend).__module__]
    guard = "gluon_crash_reason" if name == "aiter-gluon" else "asm_wrong_result_reason"
    monkeypatch.setattr(module, guard, lambda *args: None)
    call = prepare(name, make_inputs(shape, device="cpu"))
    if name == "aiter-gluon":
        with pytest.raises(RuntimeError, match="WITHIN_2GB=False"):
            call.fn()
    else:
        out = call.fn()
        assert fake.last["persistent"] and torch.equal(out, torch.zeros_like(out))  # wrong rows


# 5: 128 heads below batch 8 fail in AITER's split count, before its batch check ------------------
@pytest.mark.parametrize("batch, cited", [(1, "ZeroDivisionError"), (4, "ZeroDivisionError"),
                                          (8, "divisible by 64")])
def test_bh64_refusal_cites_the_failure_aiter_hits_first(monkeypatch, tmp_path, batch, cited):
    install_fake_aiter(monkeypatch, tmp_path, "v0.1.20")
    shape = MLADecodeShape.uniform(batch, 1024, 128)
    ok, why = get_backend("aiter-gluon").supports(shape)
    assert not ok and cited in why
    inp = make_inputs(shape, device="cpu")
    q, rows = inp.q, inp.kv_cache.view(-1, 576)
    gluon = sys.modules["aiter.ops.triton.gluon.mla_gluon"].mla_gluon
    error = ZeroDivisionError if cited == "ZeroDivisionError" else AssertionError
    with pytest.raises(error):
        gluon(q[..., :512], q[..., 512:], rows, o=inp.new_output(), page_table=None,
              seq_info=None, sm_scale=1.0, kv_pe_offset=512, use_2d_view=False, min_kv_seq_len=1024)
