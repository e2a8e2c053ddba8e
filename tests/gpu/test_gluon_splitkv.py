"""GPU tests of gluon-splitkv (skipped without an NVIDIA Hopper GPU): bf16 against the fp32
reference on ragged batches with empty splits and partial pages, every merge launch and ring
depth, and a captured graph replayed after the lengths changed."""

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _backend():
    from mlabench.backends import get_backend, gluon as _gluon  # noqa: F401  (registers gluon-splitkv)

    backend = get_backend("gluon-splitkv")
    ok, why = backend.available()
    if not ok:
        pytest.skip(why)
    return backend


def _inputs(lens, seed=0, poison=True):
    """Inputs whose unread cache slots (page tails, padding pages) hold NaN unless ``poison`` is
    False."""
    from mlabench.inputs import make_inputs
    from mlabench.shapes import MLADecodeShape

    return make_inputs(MLADecodeShape.create(num_heads=12, context_lens=lens, page_size=64),
                       seed=seed, poison=poison)


def _ref(x, lens):
    from mlabench.kernels.reference import mla_decode_reference

    return mla_decode_reference(x.q, x.kv_cache, x.block_table, list(lens), x.shape.scale)[0]


@pytest.mark.parametrize("lens,splits", [((4096,), 64), ((1, 1000, 4096, 777), 7),
                                         ((65, 130), 40), ((2, 3000), 512)])
@pytest.mark.parametrize("stages,pdl", [(2, 1), (2, 0), (2, 2), (1, 1)])
def test_bf16_matches_fp32(lens, splits, stages, pdl):
    backend = _backend()
    x = _inputs(lens)
    params = backend.resolve_params(x.shape, {"num_kv_splits": splits, "num_stages": stages,
                                              "pdl": pdl})
    out = backend.prepare(x, params).fn()  # the output was poisoned with NaN by prepare
    torch.cuda.synchronize()
    assert torch.allclose(out.float(), _ref(x, lens), atol=1e-2, rtol=1e-2)


def test_graph_follows_new_lengths():
    backend = _backend()
    x = _inputs((8192, 20000, 100), seed=11, poison=False)  # lengths grow into padding pages below
    call = backend.prepare(x, backend.resolve_params(x.shape, {"num_kv_splits": 64}))
    call.fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call.fn()
    new = [9000, 12000, 64]
    x.cache_seqlens.copy_(torch.tensor(new, dtype=torch.int32))
    call.out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.allclose(call.out.float(), _ref(x, new), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("splits", [1, 7, 64, 512])
def test_passes_every_input_set_on_poisoned_inputs(splits):
    """NaN in every page tail and padding page, needles at its page-granular split edges, the
    peaky and the flat sets: the check ``check`` and ``sweep`` take."""
    from mlabench.shapes import MLADecodeShape
    from mlabench.sweep.point import ShapeBench

    backend = _backend()
    shape = MLADecodeShape.create(num_heads=12, context_lens=(1, 1000, 4096, 777), page_size=64)
    call, verdict = ShapeBench(shape, seed=3, copies=1).check(backend, backend.resolve_params(
        shape, {"num_kv_splits": splits}))
    assert verdict.passed, verdict
    assert call.split_starts[2] == list(range(0, 4096, 64 * -(-64 // splits)))


@pytest.mark.parametrize("qo_len,causal", [(2, True), (3, True), (4, True), (6, False), (8, True),
                                           (8, False)])
@pytest.mark.parametrize("lens,splits", [((4096,), 64), ((1000, 70, 8, 3000), 7), ((65, 2000), 512)])
def test_multi_token_bf16_matches_fp32(qo_len, causal, lens, splits):
    """qo_len x 12 rows packed into tiles of 32 or 64 (two tiles past 64 rows), causal limits at
    every split edge, a request whose context holds just the block."""
    from mlabench.inputs import make_inputs
    from mlabench.kernels.reference import mla_decode_reference
    from mlabench.shapes import MLADecodeShape

    backend = _backend()
    lens = tuple(max(n, qo_len) for n in lens)
    shape = MLADecodeShape.create(num_heads=12, context_lens=lens, page_size=64, qo_len=qo_len,
                                  causal=causal)
    x = make_inputs(shape, seed=qo_len, poison=True)
    out = backend.prepare(x, backend.resolve_params(shape, {"num_kv_splits": splits})).fn()
    torch.cuda.synchronize()
    ref, _ = mla_decode_reference(x.q, x.kv_cache, x.block_table, list(lens), shape.scale,
                                  qo_len=qo_len, causal=causal)
    assert torch.isfinite(out).all()
    assert torch.allclose(out.float(), ref, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("qo_len", [1, 4])
def test_device_policy_graph_keeps_each_requests_count(tmp_path, qo_len):
    """One graph captured at 1 token with a device policy, replayed at long and ragged lengths
    after they change in place: right at every length, and the counts it reports are the
    policy's per request."""
    import json

    from mlabench.inputs import make_inputs
    from mlabench.kernels.reference import mla_decode_reference
    from mlabench.shapes import MLADecodeShape

    backend = _backend()
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"num_kv_splits": {"1": [[256, 1], [8192, 16], [1 << 20, 132]],
                                                    "4": [[4096, 3], [1 << 20, 33]]}}))
    lens = (20000, 64, 9000, 300)
    shape = MLADecodeShape.create(num_heads=12, context_lens=lens, page_size=64, qo_len=qo_len)
    x = make_inputs(shape, seed=5, poison=False)
    params = backend.resolve_params(shape, {"split_policy": f"device:{policy}"})
    call = backend.prepare(x, params)
    assert call.effective_params["num_kv_splits"] == 33  # the grid: batch 4's largest count
    assert [len(s) for s in call.split_starts] == [32, 1, 29, 3]  # non-empty splits
    x.cache_seqlens.fill_(qo_len)
    call.fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call.fn()
    for new in ([qo_len] * 4, list(lens), [64, 20000, 4096, 4097]):
        x.cache_seqlens.copy_(torch.tensor(new, dtype=torch.int32))
        call.out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref, _ = mla_decode_reference(x.q, x.kv_cache, x.block_table, new, shape.scale,
                                      qo_len=qo_len, causal=True)
        assert torch.allclose(call.out.float(), ref, atol=1e-2, rtol=1e-2), new
