"""aiter-asm / aiter-gluon on the CPU: availability reasons, shape support, and prepare() driving
fake AITER modules that record their arguments and compute real attention."""

from __future__ import annotations

import pytest
import torch

import mlabench.backends.aiter as aiter_backend
from mlabench.backends import get_backend
from mlabench.device import DeviceInfo
from mlabench.errors import BackendUnavailableError, UnsupportedShapeError
from mlabench.inputs import SPARE_PAGES, make_inputs
from mlabench.kernels.padding import pad_heads
from mlabench.kernels.reference import mla_decode_reference
from mlabench.shapes import MLADecodeShape
from tests.backends.fakes import Recorder, csr_attention, install, module

LENS = (70, 5, 129)
NUM_CU = 8


def shape_of(page_size=16, heads=12, lens=LENS):
    return MLADecodeShape.create(num_heads=heads, context_lens=lens, page_size=page_size)


def reference(inp):
    s = inp.shape
    out, _ = mla_decode_reference(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens, s.scale)
    return out


# ---- fake AITER ----------------------------------------------------------------------------------
def fake_aiter(monkeypatch, version="0.1.19", gluon_impl=None):
    def info_v1(batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype, is_sparse,
                fast_mode=True, num_kv_splits=32, intra_batch_mode=False):
        work = (batch_size + NUM_CU - 1) * max_seqlen_qo
        return (((2), torch.uint64), ((NUM_CU + 1), torch.int32), ((work, 8), torch.int32),
                ((batch_size + 1), torch.int32), ((batch_size, 2), torch.int32),
                (2 * NUM_CU, torch.int32))

    def metadata_v1(qo_indptr, kv_indptr, kv_last_page_lens, num_heads_per_head_k, num_heads_k,
                    is_causal, work_metadata_ptrs, work_info_set, work_indptr, reduce_indptr,
                    reduce_final_map, reduce_partial_map, page_size=1, kv_granularity=16,
                    max_seqlen_qo=-1, uni_seqlen_qo=-1, fast_mode=True, dtype_q=None,
                    dtype_kv=None):
        work_info_set.fill_(7)

    def decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens,
                   max_seqlen_q, page_size=1, nhead_kv=1, sm_scale=None, logit_cap=0.0,
                   num_kv_splits=None, num_kv_splits_indptr=None, work_meta_data=None,
                   work_indptr=None, work_info_set=None, reduce_indptr=None,
                   reduce_final_map=None, reduce_partial_map=None):
        rows = kv_buffer.view(-1, kv_buffer.shape[-1])
        o.copy_(csr_attention(q, rows, kv_indptr, kv_indices, sm_scale))
        return None, None

    def gluon(q_nope, q_pe, kv_c, o, page_table, seq_info, sm_scale, k_pe=None,
              kv_pe_offset=512, use_2d_view=True, kv_scale=1.0, min_kv_seq_len=1,
              return_lse=False):
        q = torch.cat([q_nope, q_pe], dim=-1)
        o.copy_(csr_attention(q, kv_c, seq_info, page_table, sm_scale))
        return o, None

    fakes = {
        "info": Recorder(info_v1), "meta": Recorder(metadata_v1),
        "fwd": Recorder(decode_fwd), "gluon": Recorder(gluon_impl or gluon),
    }
    install(monkeypatch, {
        "aiter": module("aiter", __version__=version, get_mla_metadata_info_v1=fakes["info"],
                        get_mla_metadata_v1=fakes["meta"]),
        "aiter.mla": module("aiter.mla", mla_decode_fwd=fakes["fwd"]),
        "aiter.ops.triton.gluon.mla_gluon": module("aiter.ops.triton.gluon.mla_gluon",
                                                   mla_gluon=fakes["gluon"]),
    })
    monkeypatch.setattr(aiter_backend, "package_version", lambda names: None)
    return fakes


# ---- availability and support --------------------------------------------------------------------
@pytest.mark.skipif(torch.version.hip is not None, reason="checks the non-ROCm reason")
@pytest.mark.parametrize("name", ["aiter-asm", "aiter-gluon"])
def test_unavailable_without_rocm(name):
    ok, reason = get_backend(name).available()
    assert not ok
    assert "needs ROCm (AMD GPU" in reason


def test_wrong_arch_and_missing_package_reasons(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "7.0.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    info = DeviceInfo("rocm", "cuda", "MI300X", 304, 0, "gfx942", 0)
    monkeypatch.setattr(aiter_backend, "current_device", lambda: info)
    install(monkeypatch, {"aiter": None})  # None in sys.modules makes the import fail
    ok, reason = get_backend("aiter-asm").available()
    assert not ok and "aiter" in reason and "amd-aiter" in reason
    fake_aiter(monkeypatch)
    assert get_backend("aiter-asm").available() == (True, "")
    ok, reason = get_backend("aiter-gluon").available()
    assert not ok and reason == "needs an AMD gfx950 GPU; found gfx942"


def test_supports():
    asm, gluon = get_backend("aiter-asm"), get_backend("aiter-gluon")
    assert asm.supports(shape_of())[0]
    fp16 = MLADecodeShape.create(num_heads=12, context_lens=(8,), q_dtype="float16", kv_dtype="float16")
    assert not asm.supports(fp16)[0] and "bf16" in asm.supports(fp16)[1]
    assert not gluon.supports(fp16)[0]
    assert gluon.supports(shape_of(heads=16))[0]
    assert not gluon.supports(shape_of(heads=32))[0]
    assert gluon.supports(MLADecodeShape.uniform(64, 512, 64))[0]
    assert not asm.supports(shape_of(heads=144))[0]


# ---- aiter-asm prepare -----------------------------------------------------------------------------
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("mode", ["zero", "repeat"])
def test_asm_prepare_calls_aiter_correctly(monkeypatch, page_size, mode):
    fakes = fake_aiter(monkeypatch)
    backend = get_backend("aiter-asm")
    inp = make_inputs(shape_of(page_size), device="cpu", seed=1)
    s = inp.shape
    call = backend.prepare(inp, backend.resolve_params(s, {"head_padding": mode}))
    assert torch.isnan(call.out).all()  # poisoned until fn runs

    (i_args, i_kw), = fakes["info"].calls
    assert i_args == (3, 1, 16, torch.bfloat16, torch.bfloat16)
    assert i_kw == {"is_sparse": False, "fast_mode": True}
    (m_args, m_kw), = fakes["meta"].calls
    assert m_args[3:6] == (16, 1, True)
    assert m_args[0].tolist() == [0, 1, 2, 3] and m_args[1].tolist() == [0, 70, 75, 204]
    assert m_args[2].tolist() == [1, 1, 1]
    meta, info_set, indptr = m_args[6], m_args[7], m_args[8]
    assert meta.shape == (2,) and meta.dtype == torch.uint64
    assert info_set.shape == (3 + NUM_CU - 1, 8)  # work_info_set comes before work_indptr
    assert indptr.shape == (NUM_CU + 1,)
    assert m_kw == {"page_size": 1, "kv_granularity": 16, "max_seqlen_qo": 1, "uni_seqlen_qo": 1,
                    "fast_mode": True, "dtype_q": torch.bfloat16, "dtype_kv": torch.bfloat16}
    assert call.setup_us["metadata_us"] >= 0
    assert fakes["fwd"].calls == []  # nothing runs before fn

    inp.q.copy_(torch.randn_like(inp.q))  # fn must pad the q it sees now, not the one at prepare
    out = call.fn()
    (f_args, f_kw), = fakes["fwd"].calls
    q_pad, kv, o_pad = f_args[:3]
    assert q_pad.shape == (3, 16, 576) and q_pad.is_contiguous()
    assert torch.equal(q_pad, pad_heads(inp.q, 16, mode))
    assert kv.shape == ((s.num_pages + SPARE_PAGES) * page_size, 1, 1, 576)
    assert kv.data_ptr() == inp.kv_cache.data_ptr()
    assert o_pad.shape == (3, 16, 512)
    assert f_args[7] == 1
    assert f_kw["work_info_set"] is info_set and f_kw["work_indptr"] is indptr
    assert f_kw["work_meta_data"] is meta
    assert f_kw["page_size"] == 1 and f_kw["nhead_kv"] == 1 and f_kw["sm_scale"] == s.scale
    assert out is call.out and out.shape == (3, 12, 512)
    torch.testing.assert_close(out.float(), reference(inp), atol=2e-2, rtol=2e-2)
    eff = call.effective_params
    assert eff["kernel_heads"] == 16 and eff["head_padding"] == mode
    assert eff["persistent"] is True and eff["persistent_max_batch"] == 32
    assert eff["aiter_version"] == "0.1.19"


def test_asm_persistent_gate_recorded(monkeypatch):
    fake_aiter(monkeypatch)
    monkeypatch.setenv("AITER_MLA_DECODE_PERSISTENT_MAX_BATCH", "2")
    info = DeviceInfo("rocm", "cuda", "MI355X", 256, 0, "gfx950", 0)
    monkeypatch.setattr(aiter_backend, "current_device", lambda: info)
    backend = get_backend("aiter-asm")
    inp = make_inputs(shape_of(), device="cpu")
    eff = backend.prepare(inp, backend.resolve_params(inp.shape)).effective_params
    assert eff["persistent"] is False and eff["persistent_max_batch"] == 2


def test_asm_sixteen_heads_needs_no_padding(monkeypatch):
    fakes = fake_aiter(monkeypatch)
    backend = get_backend("aiter-asm")
    inp = make_inputs(shape_of(heads=16), device="cpu")
    call = backend.prepare(inp, backend.resolve_params(inp.shape))
    call.fn()
    (f_args, _), = fakes["fwd"].calls
    assert f_args[2] is call.out and f_args[0].data_ptr() == inp.q.data_ptr()
    assert call.effective_params["head_padding"] == "none"
    torch.testing.assert_close(call.out.float(), reference(inp), atol=2e-2, rtol=2e-2)


# ---- aiter-gluon prepare ---------------------------------------------------------------------------
@pytest.mark.parametrize("page_size", [1, 64])
def test_gluon_prepare_calls_mla_gluon(monkeypatch, page_size):
    fakes = fake_aiter(monkeypatch, version="0.1.19")
    backend = get_backend("aiter-gluon")
    inp = make_inputs(shape_of(page_size), device="cpu", seed=2)
    s = inp.shape
    call = backend.prepare(inp, backend.resolve_params(s))
    out = call.fn()
    (args, kw), = fakes["gluon"].calls
    q_nope, q_pe, kv_c = args
    assert q_nope.shape == (3, 12, 512) and q_pe.shape == (3, 12, 64)
    assert q_nope.data_ptr() == inp.q.data_ptr()  # views of q, no copy
    assert q_pe.data_ptr() == inp.q[..., 512:].data_ptr()
    assert kv_c.shape == ((s.num_pages + SPARE_PAGES) * page_size, 576)
    assert kw["o"] is call.out and kw["use_2d_view"] is False and kw["kv_pe_offset"] == 512
    assert kw["seq_info"].tolist() == [0, 70, 75, 204] and kw["page_table"].dtype == torch.int32
    assert kw["min_kv_seq_len"] == 129 and "num_kv_splits" not in kw
    torch.testing.assert_close(out.float(), reference(inp), atol=2e-2, rtol=2e-2)
    eff = call.effective_params
    assert eff["num_kv_splits"] == 3  # min(256 // 3, cdiv(129, 64)) on 0.1.19
    assert eff["split_rule_from"] == "version" and eff["api"] == "mla_gluon"


def test_gluon_hazard_and_steering_on_old_aiter(monkeypatch):
    fakes = fake_aiter(monkeypatch, version="0.1.19")
    backend = get_backend("aiter-gluon")
    inp = make_inputs(MLADecodeShape.uniform(1, 4096, 12), device="cpu")
    hazard = backend.prepare(inp, backend.resolve_params(inp.shape, {"min_kv_seq_len": 1}))
    assert hazard.effective_params["num_kv_splits"] == 1
    steered = backend.prepare(inp, backend.resolve_params(inp.shape, {"num_kv_splits": 32}))
    steered.fn()
    assert fakes["gluon"].calls[-1][1]["min_kv_seq_len"] == 32 * 64
    assert steered.effective_params["num_kv_splits"] == 32
    default = backend.prepare(inp, backend.resolve_params(inp.shape))
    assert default.effective_params["num_kv_splits"] == 64  # cdiv(4096, 64)


def test_gluon_new_aiter_fixed_and_not_steerable(monkeypatch):
    fake_aiter(monkeypatch, version="0.1.20")
    backend = get_backend("aiter-gluon")
    inp = make_inputs(MLADecodeShape.uniform(1, 256, 12), device="cpu")
    call = backend.prepare(inp, backend.resolve_params(inp.shape, {"min_kv_seq_len": 1}))
    assert call.effective_params["num_kv_splits"] == 256
    with pytest.raises(UnsupportedShapeError, match="cannot be steered"):
        backend.prepare(inp, backend.resolve_params(inp.shape, {"num_kv_splits": 8}))


def test_gluon_num_kv_splits_argument_passed_when_accepted(monkeypatch):
    def gluon(q_nope, q_pe, kv_c, o, page_table, seq_info, sm_scale, k_pe=None, kv_pe_offset=512,
              use_2d_view=True, kv_scale=1.0, min_kv_seq_len=1, return_lse=False,
              num_kv_splits=None):
        return o, None

    fakes = fake_aiter(monkeypatch, version="0.1.22", gluon_impl=gluon)
    backend = get_backend("aiter-gluon")
    inp = make_inputs(MLADecodeShape.uniform(2, 256, 12), device="cpu")
    call = backend.prepare(inp, backend.resolve_params(inp.shape, {"num_kv_splits": 8}))
    call.fn()
    assert fakes["gluon"].calls[-1][1]["num_kv_splits"] == 8
    assert call.effective_params["num_kv_splits"] == 8
    assert call.workspace_bytes == 2 * 2 * 12 * 8 * (512 * 2 + 4)


def test_gluon_rule_read_from_installed_source(monkeypatch):
    def mla_gluon(q_nope, q_pe, kv_c, o, page_table, seq_info, sm_scale, k_pe=None,
                  kv_pe_offset=512, use_2d_view=True, min_kv_seq_len=1):
        splits = max(1, min(256 // q_nope.shape[0], triton.cdiv(min_kv_seq_len, 64)))  # noqa: F821
        return splits

    fake_aiter(monkeypatch, version="0.1.30")
    monkeypatch.setitem(__import__("sys").modules["aiter.ops.triton.gluon.mla_gluon"].__dict__,
                        "mla_gluon", mla_gluon)
    backend = get_backend("aiter-gluon")
    inp = make_inputs(MLADecodeShape.uniform(1, 256, 12), device="cpu")
    eff = backend.prepare(inp, backend.resolve_params(inp.shape, {"min_kv_seq_len": 1})).effective_params
    assert eff["split_rule_from"] == "installed source"
    assert eff["num_kv_splits"] == 1 and eff["split_rule"] == "bounded by min_kv_seq_len"


def test_gluon_missing_entry_point(monkeypatch):
    install(monkeypatch, {"aiter": module("aiter"),
                          "aiter.ops.triton.gluon.mla_gluon": None,
                          "aiter.ops.triton.gluon.mla_decode_gluon": None})
    with pytest.raises(BackendUnavailableError, match="Gluon MLA decode not found"):
        aiter_backend.resolve_gluon()
