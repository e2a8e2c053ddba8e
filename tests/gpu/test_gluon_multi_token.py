"""GPU tests of gluon-splitkv's multi-token stage 1 (``multi_token=1``; skipped without an NVIDIA
Hopper GPU): bf16 against the fp32 reference on the held-out inputs of the one-token kernel's
tests (NaN-poisoned page tails and padding pages, ragged lengths, splits that own no page, causal
and non-causal blocks of 2-8 tokens).  The graphs replayed at other lengths with a device policy
and the programmatic dependent launches over one workspace are tests/gpu/test_gluon_splitkv.py's,
run there with the variant on as well."""

import pytest
import torch

from tests.gpu.test_gluon_splitkv import _backend

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _case(qo_len, lens, causal=True, seed=0, poison=True):
    from mlabench.inputs import make_inputs
    from mlabench.shapes import MLADecodeShape

    lens = tuple(max(n, qo_len) for n in lens)
    shape = MLADecodeShape.create(num_heads=12, context_lens=lens, page_size=64, qo_len=qo_len,
                                  causal=causal)
    return shape, make_inputs(shape, seed=seed, poison=poison)


def _ref(x, lens, qo_len, causal=True, q=None):
    from mlabench.kernels.reference import mla_decode_reference

    return mla_decode_reference(x.q if q is None else q, x.kv_cache, x.block_table, list(lens),
                                x.shape.scale, qo_len=qo_len, causal=causal)[0]


@pytest.mark.parametrize("qo_len,causal", [(2, True), (3, True), (4, True), (4, False),
                                           (6, False), (8, True), (8, False)])
@pytest.mark.parametrize("lens,splits,stages", [((4096,), 64, 2), ((1000, 70, 8, 3000), 7, 2),
                                                ((65, 2000), 512, 2), ((1000, 70, 8, 3000), 7, 1)])
@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.parametrize("rows_m", [0, 2, 3])  # 1: the poisoned-input test below
def test_multi_token_matches_fp32(qo_len, causal, lens, splits, stages, mode, rows_m):
    """32- and 64-row tiles (two past 64 rows), causal limits at split edges, a request whose
    context holds just the block, more splits than pages (splits that own none), both rings,
    both orders of the softmax warpgroup (2 runs as 1 on the 1-page ring), the products with
    the rows as N or M (``rows_as_m``: 64-row tiles only, qo_len 3 up)."""
    backend = _backend()
    shape, x = _case(qo_len, lens, causal, seed=qo_len)
    call = backend.prepare(x, backend.resolve_params(shape, {"num_kv_splits": splits,
                                                             "num_stages": stages,
                                                             "multi_token": mode,
                                                             "rows_as_m": rows_m}))
    assert call.effective_params["multi_token"] == (mode if stages == 2 else 1)
    assert call.effective_params.get("rows_as_m", 0) == (rows_m if qo_len > 2 else 0)
    assert call.effective_params["fused_merge"] == 0
    out = call.fn()  # the output was poisoned with NaN by prepare
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    assert torch.allclose(out.float(), _ref(x, shape.context_lens, qo_len, causal),
                          atol=1e-2, rtol=1e-2)


def test_one_token_ignores_the_variant():
    backend = _backend()
    shape, x = _case(1, (4096, 300))
    call = backend.prepare(x, backend.resolve_params(shape, {"num_kv_splits": 8,
                                                             "multi_token": 1}))
    assert call.effective_params["multi_token"] == 0  # asked, not run: compare shows "0 (asked 1)"


@pytest.mark.parametrize("qo_len,causal,mode,rows_m", [(4, True, 1, 0), (8, False, 1, 0),
                                                       (8, True, 2, 0), (4, True, 1, 1),
                                                       (8, True, 1, 2), (8, False, 2, 2),
                                                       (8, True, 1, 3), (4, True, 2, 3)])
@pytest.mark.parametrize("splits", [1, 7, 64])
def test_passes_every_input_set_on_poisoned_inputs(qo_len, causal, mode, rows_m, splits):
    """The check ``check`` and ``sweep`` take (NaN tails and padding pages, needles at the
    page-granular split edges, the peaky and the flat sets) with the variant on."""
    from mlabench.bench.shape_bench import ShapeBench
    from mlabench.shapes import MLADecodeShape

    backend = _backend()
    shape = MLADecodeShape.create(num_heads=12, context_lens=(8, 1000, 4096, 777), page_size=64,
                                  qo_len=qo_len, causal=causal)
    _call, verdict = ShapeBench(shape, seed=3, copies=1).check(backend, backend.resolve_params(
        shape, {"num_kv_splits": splits, "multi_token": mode, "rows_as_m": rows_m}))
    assert verdict.passed, verdict


@pytest.mark.parametrize("isolate", ["products", "copies"])
@pytest.mark.parametrize("rows_m", [0, 2, 3])
def test_isolated_sides_run_to_the_end(isolate, rows_m):
    """``KernelVariant.isolate`` (timing only, scripts/h200_mt_profile.py): each side alone
    completes (no partition waits on a barrier the other side no longer signals) and writes
    finite partials; copies alone merge to zeros."""
    from mlabench.kernels.gluon_splitkv import KernelVariant, mla_decode_gluon_splitkv

    shape, x = _case(8, (4096, 1000, 70), poison=False)
    batch, splits, dev = len(shape.context_lens), 7, x.q.device
    out = torch.empty((batch * 8, 12, 512), dtype=x.q.dtype, device=dev)
    mla_decode_gluon_splitkv(
        x.q, x.kv_cache, x.block_table, x.cache_seqlens, out, splits, shape.scale,
        partial_out=torch.empty((batch * splits, 8 * 12, 512), device=dev),
        partial_lse=torch.empty((batch * splits, 8 * 12), device=dev), qo_len=8,
        variant=KernelVariant(multi_token=1, rows_as_m=rows_m, isolate=isolate))
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    if isolate == "copies":
        assert not out.any()
