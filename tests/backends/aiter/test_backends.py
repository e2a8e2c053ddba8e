"""aiter-asm / aiter-gluon on the CPU: availability reasons, shape support, and prepare() driving
fake AITER packages generated from the manifest (their functions bind arguments by AITER's own
parameter names and compute real attention)."""

from __future__ import annotations

import pytest
import torch

from mlabench.backends import get_backend
from mlabench.inputs import SPARE_PAGES, make_inputs
from mlabench.kernels.padding import pad_heads
from mlabench.kernels.reference import mla_decode_reference
from mlabench.shapes import MLADecodeShape
from tests.backends.aiter.fakes import install_fake_aiter, pretend_rocm
from tests.backends.fakes import install

LENS = (70, 5, 129)


def shape_of(page_size=16, heads=12, lens=LENS):
    return MLADecodeShape.create(num_heads=heads, context_lens=lens, page_size=page_size)


def reference(inp):
    s = inp.shape
    out, _ = mla_decode_reference(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens, s.scale)
    return out


def prepared(name, inp, **params):
    backend = get_backend(name)
    return backend.prepare(inp, backend.resolve_params(inp.shape, params))


# ---- availability and support --------------------------------------------------------------------
@pytest.mark.skipif(torch.version.hip is not None, reason="checks the non-ROCm reason")
@pytest.mark.parametrize("name", ["aiter-asm", "aiter-gluon"])
def test_unavailable_without_rocm(name):
    ok, reason = get_backend(name).available()
    assert not ok
    assert "needs ROCm (AMD GPU" in reason


def test_missing_package_and_wrong_arch_reasons(monkeypatch, tmp_path):
    pretend_rocm(monkeypatch, device_arch="gfx942")
    install(monkeypatch, {"aiter": None})  # None in sys.modules makes the import fail
    ok, reason = get_backend("aiter-asm").available()
    assert not ok and "aiter" in reason and "amd-aiter" in reason
    install_fake_aiter(monkeypatch, tmp_path, "v0.1.20", gfx="gfx942")
    assert get_backend("aiter-asm").available() == (True, "")
    assert get_backend("aiter-gluon").available() == (False, "needs an AMD gfx950 GPU; found gfx942")
    monkeypatch.setenv("GPU_ARCHS", "gfx90a")  # AITER's get_gfx reads it: the ASM backend follows
    ok, reason = get_backend("aiter-asm").available()
    assert not ok and "reports gfx90a (GPU_ARCHS=gfx90a)" in reason


def test_supports_dtypes_and_heads():
    asm, gluon = get_backend("aiter-asm"), get_backend("aiter-gluon")
    assert asm.supports(shape_of()) == (True, "") and gluon.supports(shape_of()) == (True, "")
    fp16 = MLADecodeShape.create(num_heads=12, context_lens=(8,), q_dtype="float16", kv_dtype="float16")
    assert not asm.supports(fp16)[0] and "bf16" in asm.supports(fp16)[1]
    assert not gluon.supports(fp16)[0]
    assert not asm.supports(shape_of(heads=144))[0]
    assert gluon.supports(MLADecodeShape.uniform(64, 1024, 64)) == (True, "")
    assert "min_kv_seq_len > 784" in gluon.supports(MLADecodeShape.uniform(64, 512, 64))[1]


# ---- aiter-asm prepare ---------------------------------------------------------------------------
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("mode", ["zero", "repeat"])
def test_asm_prepare_calls_aiter_correctly(monkeypatch, tmp_path, page_size, mode):
    fake = install_fake_aiter(monkeypatch, tmp_path, "v0.1.20")
    inp = make_inputs(shape_of(page_size), device="cpu", seed=1)
    s = inp.shape
    call = prepared("aiter-asm", inp, head_padding=mode)
    assert torch.isnan(call.out).all()  # poisoned until fn runs

    info, = fake.calls_to("metadata_info")
    assert (info["batch_size"], info["max_seqlen_qo"], info["num_head_qo"]) == (3, 1, 16)
    assert info["q_dtype"] == torch.bfloat16 and info["is_sparse"] is False
    warm, timed = fake.calls_to("metadata")  # a warm-up, then the timed call
    assert (timed["num_heads_per_head_k"], timed["num_heads_k"], timed["is_causal"]) == (16, 1, True)
    assert timed["seqlens_kv_indptr"].tolist() == [0, 70, 75, 204]
    assert timed["work_info_set"].shape == (3 + 256 - 1, 8)  # bound by name: order is right
    assert timed["work_indptr"].shape == (257,) and timed["dtype_kv"] == torch.bfloat16
    assert fake.calls_to("decode") == []  # nothing runs before fn

    inp.q.copy_(torch.randn_like(inp.q))  # fn must pad the q it sees now, not the one at prepare
    out = call.fn()
    dec, = fake.calls_to("decode")
    assert torch.equal(dec["q"], pad_heads(inp.q, 16, mode)) and dec["q"].is_contiguous()
    assert dec["kv_buffer"].shape == ((s.num_pages + SPARE_PAGES) * page_size, 1, 1, 576)
    assert dec["kv_buffer"].data_ptr() == inp.kv_cache.data_ptr()
    assert dec["max_seqlen_q"] == 1 and dec["work_info_set"] is timed["work_info_set"]
    assert out is call.out and out.shape == (3, 12, 512)
    torch.testing.assert_close(out.float(), reference(inp), atol=2e-2, rtol=2e-2)
    eff = call.effective_params
    assert eff["kernel_heads"] == 16 and eff["head_padding"] == mode and eff["persistent"] is True
    assert eff["aiter_version"] == "0.1.20" and eff["aiter_behaves_like"] == "v0.1.20"


def test_asm_sixteen_heads_needs_no_padding(monkeypatch, tmp_path):
    fake = install_fake_aiter(monkeypatch, tmp_path, "v0.1.20")
    inp = make_inputs(shape_of(heads=16), device="cpu")
    call = prepared("aiter-asm", inp)
    call.fn()
    dec, = fake.calls_to("decode")
    assert dec["o"] is call.out and dec["q"].data_ptr() == inp.q.data_ptr()
    assert call.effective_params["head_padding"] == "none"
    torch.testing.assert_close(call.out.float(), reference(inp), atol=2e-2, rtol=2e-2)


# ---- aiter-gluon prepare -------------------------------------------------------------------------
@pytest.mark.parametrize("rng", ["v0.1.17", "v0.1.20"])
@pytest.mark.parametrize("page_size", [1, 64])
def test_gluon_prepare_calls_the_entry_point(monkeypatch, tmp_path, rng, page_size):
    fake = install_fake_aiter(monkeypatch, tmp_path, rng)
    inp = make_inputs(shape_of(page_size), device="cpu", seed=2)
    call = prepared("aiter-gluon", inp)
    out = call.fn()
    a, = fake.calls_to("gluon")
    assert a["q_nope"].shape == (3, 12, 512) and a["q_pe"].shape == (3, 12, 64)
    assert a["q_nope"].data_ptr() == inp.q.data_ptr()  # views of q, no copy
    assert a["kv_c"].shape == ((inp.shape.num_pages + SPARE_PAGES) * page_size, 576)
    assert a["o"] is call.out and a["use_2d_view"] is False and a["kv_pe_offset"] == 512
    assert a["seq_info"].tolist() == [0, 70, 75, 204] and a["page_table"].dtype == torch.int32
    assert a["min_kv_seq_len"] == 5  # AITER means the shortest context
    torch.testing.assert_close(out.float(), reference(inp), atol=2e-2, rtol=2e-2)
    eff = call.effective_params
    assert eff["api"] == ("mla_decode_gluon" if rng == "v0.1.17" else "mla_gluon")
    assert eff["split_rule_from"] == "installed source"
    assert eff["num_kv_splits_launched"] == fake.last["launched"]
