"""aiter-asm and aiter-gluon with several query tokens per request, through the manifest's fakes:
which AITER takes which qo_len and mask (and why not), and what the adapters pass."""

from __future__ import annotations

import pytest
import torch

from mlabench.backends import get_backend
from mlabench.backends.aiter.manifest import load_manifest
from mlabench.backends.aiter.rules import asm_qo_len_reason, gluon_qo_len_reason
from mlabench.inputs import make_inputs
from mlabench.kernels.padding import pad_heads
from mlabench.kernels.reference import mla_decode_reference
from mlabench.policy.heuristics import gluon_bh16_cap
from mlabench.shapes import MLADecodeShape
from tests.backends.aiter.fakes import install_fake_aiter, pretend_rocm

LENS = (70, 8, 129)


def mtp_shape(qo_len, causal=True, page_size=16, heads=12):
    return MLADecodeShape.create(num_heads=heads, context_lens=LENS, page_size=page_size,
                                 qo_len=qo_len, causal=causal)


def reference(inp):
    s = inp.shape
    out, _ = mla_decode_reference(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens, s.scale,
                                  qo_len=s.qo_len, causal=s.causal)
    return out


def prepared(name, inp, **params):
    backend = get_backend(name)
    return backend.prepare(inp, backend.resolve_params(inp.shape, params))


# ---- the rules, as pure functions ------------------------------------------------------------------
def test_asm_rule_pads_up_to_four_tokens():
    assert asm_qo_len_reason(1, True, "gfx942", False) is None
    for qo_len in (2, 3, 4):
        assert asm_qo_len_reason(qo_len, True, "gfx942", False) is None
    assert "1-4 query tokens (padded to 4" in asm_qo_len_reason(5, True, "gfx950", True)
    assert "no causal argument" in asm_qo_len_reason(2, False, "gfx950", False)
    assert "msk0" in asm_qo_len_reason(2, False, "gfx942", True)
    assert asm_qo_len_reason(2, False, "gfx950", True) is None


def test_gluon_rule_follows_the_installed_entry():
    assert gluon_qo_len_reason("one_token", 1, True) is None
    assert "v0.1.19" in gluon_qo_len_reason("one_token", 2, True)
    assert gluon_qo_len_reason("mtp_4d", 8, True) is None
    assert "causal tail mask" in gluon_qo_len_reason("mtp_4d", 2, False)
    assert "cannot tell" in gluon_qo_len_reason(None, 2, True)
    # the Gluon budget shares its 256 workgroups among the query positions too
    assert gluon_bh16_cap(3, 12, 4) == 256 // 12


def test_manifest_dates_the_gluon_multi_token_entry():
    m = load_manifest()
    rules = {r.name: r.rules["gluon_qo_len"] for r in m.ranges}
    assert rules["v0.1.18"] == "one_token" and rules["v0.1.19"] == "mtp_4d"
    assert rules["v0.1.20"] == "mtp_4d" and rules["v0.1.16"] == "one_token"


# ---- supports, per installed AITER -----------------------------------------------------------------
@pytest.mark.parametrize("rng, gfx, qo_len, causal, refusal", [
    ("v0.1.20", "gfx950", 4, True, None),
    ("v0.1.20", "gfx950", 5, True, "1-4 query tokens"),
    ("v0.1.20", "gfx950", 2, False, None),
    ("v0.1.20", "gfx942", 2, False, "msk0"),
    ("v0.1.19.post2", "gfx950", 2, False, "no causal argument"),
    ("v0.1.17", "gfx942", 3, True, None),
])
def test_asm_supports(monkeypatch, tmp_path, rng, gfx, qo_len, causal, refusal):
    pretend_rocm(monkeypatch, device_arch=gfx)
    install_fake_aiter(monkeypatch, tmp_path, rng, gfx=gfx)
    ok, why = get_backend("aiter-asm").supports(mtp_shape(qo_len, causal))
    assert ok == (refusal is None) and (refusal or "") in why


@pytest.mark.parametrize("rng, qo_len, causal, refusal", [
    ("v0.1.18", 2, True, "3-D q"), ("v0.1.18", 1, True, None), ("v0.1.19", 4, True, None),
    ("v0.1.20", 8, True, None), ("v0.1.20", 2, False, "causal tail mask"),
])
def test_gluon_supports(monkeypatch, tmp_path, rng, qo_len, causal, refusal):
    pretend_rocm(monkeypatch)
    install_fake_aiter(monkeypatch, tmp_path, rng)
    ok, why = get_backend("aiter-gluon").supports(mtp_shape(qo_len, causal))
    assert ok == (refusal is None) and (refusal or "") in why


# ---- prepare and run --------------------------------------------------------------------------------
@pytest.mark.parametrize("rng, gfx, causal", [("v0.1.20", "gfx950", True), ("v0.1.20", "gfx950", False),
                                               ("v0.1.20", "gfx942", True), ("v0.1.17", "gfx942", True)])
@pytest.mark.parametrize("qo_len", [2, 4])
def test_asm_prepare_multi_token(monkeypatch, tmp_path, rng, gfx, causal, qo_len):
    pretend_rocm(monkeypatch, device_arch=gfx)
    fake = install_fake_aiter(monkeypatch, tmp_path, rng, gfx=gfx)
    inp = make_inputs(mtp_shape(qo_len, causal), device="cpu", seed=qo_len)
    call = prepared("aiter-asm", inp, head_padding="repeat")
    info, = fake.calls_to("metadata_info")
    assert (info["max_seqlen_qo"], info["num_head_qo"]) == (qo_len, 16)
    timed = fake.calls_to("metadata")[-1]
    assert (timed["max_seqlen_qo"], timed["uni_seqlen_qo"], timed["is_causal"]) == (qo_len, qo_len, causal)
    out = call.fn()
    dec, = fake.calls_to("decode")
    assert dec["qo_indptr"].tolist() == [0, qo_len, 2 * qo_len, 3 * qo_len] and dec["max_seqlen_q"] == qo_len
    assert torch.equal(dec["q"], pad_heads(inp.q, 16, "repeat"))  # 12 -> 16 heads of every token
    assert dec["q"].shape == (3 * qo_len, 16, 576)
    assert dec.get("causal", True) is causal  # passed where mla_decode_fwd has it (v0.1.20)
    assert out.shape == (3 * qo_len, 12, 512)
    torch.testing.assert_close(out.float(), reference(inp), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("rng", ["v0.1.19", "v0.1.20"])
def test_gluon_prepare_passes_the_4d_entry(monkeypatch, tmp_path, rng):
    pretend_rocm(monkeypatch)
    fake = install_fake_aiter(monkeypatch, tmp_path, rng)
    inp = make_inputs(mtp_shape(4), device="cpu", seed=5)
    call = prepared("aiter-gluon", inp)
    out = call.fn()
    a, = fake.calls_to("gluon")
    assert a["q_nope"].shape == (3, 4, 12, 512) and a["q_pe"].shape == (3, 4, 12, 64)
    assert a["q_nope"].data_ptr() == inp.q.data_ptr()  # views of q, no copy
    assert a["o"].shape == (3, 4, 12, 512) and a["o"].data_ptr() == call.out.data_ptr()
    assert out is call.out
    torch.testing.assert_close(out.float(), reference(inp), atol=2e-2, rtol=2e-2)
    assert call.effective_params["num_kv_splits_launched"] == fake.last["launched"]
    if rng == "v0.1.20":  # the budget rule: 256 // (B * qlen * ceil(H/16))
        assert fake.last["launched"] == 256 // (3 * 4)
