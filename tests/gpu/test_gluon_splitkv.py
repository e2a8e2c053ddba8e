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
