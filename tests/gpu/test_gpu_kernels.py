"""GPU-only tests (skipped without a CUDA/ROCm GPU): graph capture that stays correct when the
context lengths change after capture.  The seed shape's bf16 check runs everywhere
(tests/kernels/test_seed_shape.py)."""

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")]


def _ref(x, lens):
    from mlabench.kernels.reference import mla_decode_reference

    out, _ = mla_decode_reference(x.q, x.kv_cache, x.block_table, lens, x.shape.scale)
    return out


@pytest.mark.parametrize("backend", ["triton-splitkv", "triton-persistent", "flashmla", "aiter-asm",
                                     "aiter-gluon", "gluon-splitkv"])
@pytest.mark.parametrize("qo_len, causal", [(2, True), (4, True), (4, False), (8, True), (8, False)])
def test_multi_token_bf16_matches_fp32(backend, qo_len, causal):
    """Speculative verify / MTP in bf16: a ragged batch whose shortest request holds just the
    block, every split count; refused shapes must say why."""
    from mlabench.backends import get_backend
    from mlabench.shapes import MLADecodeShape
    from mlabench.sweep.check import run_check

    if not get_backend(backend).available()[0]:
        pytest.skip(get_backend(backend).available()[1])
    shape = MLADecodeShape.create(num_heads=12, context_lens=(4096, qo_len, 70, 1000), page_size=64,
                                  qo_len=qo_len, causal=causal)
    records, _ = run_check([shape], [backend], splits=(1, 7, 64))
    if all(r.status == "unsupported" for r in records):
        pytest.skip(records[0].message)
    assert all(r.status == "ok" for r in records), [r.message for r in records]
    assert all(r.verdict.output_shape == [4 * qo_len, 12, 512] for r in records)


def _capture(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def _ragged_inputs():
    from mlabench.inputs import make_inputs
    from mlabench.shapes import MLADecodeShape

    shape = MLADecodeShape.create(num_heads=12, context_lens=(4096, 2048, 100, 1), page_size=64)
    return make_inputs(shape, seed=11)


NEW_LENS = [1000, 2048, 37, 1]


def test_splitkv_graph_follows_new_lengths():
    from mlabench.kernels.splitkv import alloc_splitkv_workspace, mla_decode_splitkv

    x = _ragged_inputs()
    out = x.new_output()
    po, pl = alloc_splitkv_workspace(4, 12, 48, x.device)
    g = _capture(lambda: mla_decode_splitkv(x.q, x.kv_cache, x.block_table, x.cache_seqlens, out, 48,
                                            x.shape.scale, partial_out=po, partial_lse=pl))
    x.cache_seqlens.copy_(torch.tensor(NEW_LENS, dtype=torch.int32))
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.allclose(out.float(), _ref(x, NEW_LENS).float(), atol=1e-2, rtol=1e-2)


def test_persistent_graph_with_work_list_follows_new_lengths():
    from mlabench.device import current_device
    from mlabench.kernels.padding import pad_heads
    from mlabench.kernels.persistent import alloc_persistent_workspace, mla_decode_persistent

    x = _ragged_inputs()
    q16 = pad_heads(x.q, 16, "zero")
    out16 = torch.empty((4, 16, 512), dtype=x.q.dtype, device=x.device)
    g_programs = current_device().num_sms
    po, pl = alloc_persistent_workspace(g_programs, 4, 16, x.device)
    # work=None: the work list is built inside the captured call, from the device-side lengths
    g = _capture(lambda: mla_decode_persistent(q16, x.kv_cache, x.block_table, x.cache_seqlens, out16,
                                               x.shape.scale, g_programs, partial_out=po, partial_lse=pl))
    x.cache_seqlens.copy_(torch.tensor(NEW_LENS, dtype=torch.int32))
    out16.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.allclose(out16[:, :12].float(), _ref(x, NEW_LENS).float(), atol=1e-2, rtol=1e-2)
