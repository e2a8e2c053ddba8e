"""GPU tests of gluon-splitkv's multi-token stage 1 (``multi_token=1``; skipped without an NVIDIA
Hopper GPU): bf16 against the fp32 reference on the held-out inputs of the one-token kernel's
tests (NaN-poisoned page tails and padding pages, ragged lengths, splits that own no page, causal
and non-causal blocks of 2-8 tokens, a device split policy, graphs replayed at other lengths,
programmatic dependent launches over one workspace)."""

import json

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
def test_multi_token_matches_fp32(qo_len, causal, lens, splits, stages):
    """32- and 64-row tiles (two past 64 rows), causal limits at split edges, a request whose
    context holds just the block, more splits than pages (splits that own none), both rings."""
    backend = _backend()
    shape, x = _case(qo_len, lens, causal, seed=qo_len)
    call = backend.prepare(x, backend.resolve_params(shape, {"num_kv_splits": splits,
                                                             "num_stages": stages,
                                                             "multi_token": 1}))
    assert call.effective_params["multi_token"] == 1 and call.effective_params["fused_merge"] == 0
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
    assert "multi_token" not in call.effective_params


@pytest.mark.parametrize("qo_len,causal", [(4, True), (8, False)])
@pytest.mark.parametrize("splits", [1, 7, 64])
def test_passes_every_input_set_on_poisoned_inputs(qo_len, causal, splits):
    """The check ``check`` and ``sweep`` take (NaN tails and padding pages, needles at the
    page-granular split edges, the peaky and the flat sets) with the variant on."""
    from mlabench.bench.shape_bench import ShapeBench
    from mlabench.shapes import MLADecodeShape

    backend = _backend()
    shape = MLADecodeShape.create(num_heads=12, context_lens=(8, 1000, 4096, 777), page_size=64,
                                  qo_len=qo_len, causal=causal)
    _call, verdict = ShapeBench(shape, seed=3, copies=1).check(backend, backend.resolve_params(
        shape, {"num_kv_splits": splits, "multi_token": 1}))
    assert verdict.passed, verdict


@pytest.mark.parametrize("qo_len", [2, 4, 8])
def test_device_policy_graph_follows_new_lengths(tmp_path, qo_len):
    """One graph captured with a device policy at the block's own length, replayed at long,
    ragged and page-edge lengths after they change in place: right every time."""
    backend = _backend()
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"num_kv_splits": {"4": [[4096, 3], [1 << 20, 33]]}}))
    lens = (20000, 64, 9000, 300)
    shape, x = _case(qo_len, lens, seed=5, poison=False)
    call = backend.prepare(x, backend.resolve_params(shape, {"split_policy": f"device:{policy}",
                                                             "multi_token": 1}))
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
        assert torch.allclose(call.out.float(), _ref(x, new, qo_len), atol=1e-2, rtol=1e-2), new


@pytest.mark.parametrize("pdl", [0, 1, 2])
def test_pdl_prologue_graph_of_repeated_calls(pdl):
    """Eight calls of an 8-token step in one graph over one workspace, each stage 1 a
    programmatic dependent of the merge before, alternating two queries: each output right."""
    from mlabench.kernels.gluon_splitkv import (
        KernelVariant, kv_descriptors, mla_decode_gluon_splitkv,
    )
    from mlabench.kernels.workspace import splitkv_workspace_shapes

    _backend()
    lens, splits = (4096, 300, 20000), 33
    shape, x = _case(8, lens, seed=4, poison=False)
    queries = [x.q, torch.flip(x.q, dims=(1,)).contiguous()]
    o_shape, l_shape = splitkv_workspace_shapes(len(lens), 8 * 12, splits)
    part_o = torch.empty(o_shape, dtype=torch.float32, device=x.q.device)
    part_lse = torch.empty(l_shape, dtype=torch.float32, device=x.q.device)
    outs = [torch.full_like(x.new_output(), float("nan")) for _ in range(8)]
    descs = kv_descriptors(x.kv_cache)
    variant = KernelVariant(pdl_prologue=True, multi_token=True)

    def calls():
        for i, out in enumerate(outs):
            mla_decode_gluon_splitkv(queries[i % 2], x.kv_cache, x.block_table, x.cache_seqlens,
                                     out, splits, shape.scale, partial_out=part_o,
                                     partial_lse=part_lse, descriptors=descs, pdl=pdl, qo_len=8,
                                     variant=variant)

    calls()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    for out in outs:
        out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    refs = [_ref(x, lens, 8, q=q) for q in queries]
    for i, out in enumerate(outs):
        assert torch.allclose(out.float(), refs[i % 2], atol=1e-2, rtol=1e-2), i
