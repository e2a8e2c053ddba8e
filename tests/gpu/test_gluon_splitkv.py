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


def _inputs(lens, seed=0, poison=True, qo_len=1):
    """Inputs (``qo_len`` causal tokens a request) whose unread cache slots (page tails, padding
    pages) hold NaN unless ``poison`` is False."""
    from mlabench.inputs import make_inputs
    from mlabench.shapes import MLADecodeShape

    return make_inputs(MLADecodeShape.create(num_heads=12, context_lens=lens, page_size=64,
                                             qo_len=qo_len), seed=seed, poison=poison)


def _ref(x, lens):
    from mlabench.kernels.reference import mla_decode_reference

    return mla_decode_reference(x.q, x.kv_cache, x.block_table, list(lens), x.shape.scale)[0]


def _repeated_calls(x, splits, pdl, variant, split_policy=None, merge_sync=None):
    """Eight calls over one workspace, alternating q and q with its heads reversed, each into its
    own NaN-filled output: ``(calls, outs, queries)``."""
    from mlabench.kernels.gluon_splitkv import kv_descriptors, mla_decode_gluon_splitkv
    from mlabench.kernels.workspace import splitkv_workspace_shapes

    queries = [x.q, torch.flip(x.q, dims=(1,)).contiguous()]
    qo_len = x.shape.qo_len
    o_shape, l_shape = splitkv_workspace_shapes(x.block_table.shape[0], 12 * qo_len, splits)
    part_o = torch.empty(o_shape, dtype=torch.float32, device=x.q.device)
    part_lse = torch.empty(l_shape, dtype=torch.float32, device=x.q.device)
    outs = [torch.full_like(x.new_output(), float("nan")) for _ in range(8)]
    descs = kv_descriptors(x.kv_cache)

    def calls():
        for i, out in enumerate(outs):
            mla_decode_gluon_splitkv(queries[i % 2], x.kv_cache, x.block_table, x.cache_seqlens,
                                     out, splits, x.shape.scale, partial_out=part_o,
                                     partial_lse=part_lse, descriptors=descs, pdl=pdl,
                                     split_policy=split_policy, merge_sync=merge_sync,
                                     variant=variant, qo_len=qo_len)

    return calls, outs, queries


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
    from mlabench.bench.shape_bench import ShapeBench

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
@pytest.mark.parametrize("multi_token", [0, 1, 2])
def test_device_policy_graph_keeps_each_requests_count(tmp_path, qo_len, multi_token):
    """One graph captured at 1 token with a device policy, replayed at long and ragged lengths
    after they change in place: right at every length, and the counts it reports are the
    policy's per request (``multi_token`` 1 and 2: the multi-token stage 1 at qo_len 4)."""
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
    params = backend.resolve_params(shape, {"split_policy": f"device:{policy}",
                                            "multi_token": multi_token})
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


@pytest.mark.parametrize("o_split,lazy_sum", [("n", 0), ("m", 0), ("n", 1)])
@pytest.mark.parametrize("qo_len,lens,splits", [(1, (1, 1000, 4096, 777), 7), (2, (4096, 70), 64),
                                                (4, (1000, 70, 8, 3000), 7), (8, (65, 2000), 512)])
def test_kernel_variants_match_fp32(o_split, lazy_sum, qo_len, lens, splits):
    """The other layouts of :class:`KernelVariant` (the output product's warps on its rows,
    ``o_split`` n; the denominator summed once a page, ``lazy_sum`` 0): right on poisoned ragged
    inputs, as the default is in every other test."""
    from mlabench.inputs import make_inputs
    from mlabench.kernels.reference import mla_decode_reference
    from mlabench.shapes import MLADecodeShape

    backend = _backend()
    lens = tuple(max(n, qo_len) for n in lens)
    shape = MLADecodeShape.create(num_heads=12, context_lens=lens, page_size=64, qo_len=qo_len)
    x = make_inputs(shape, seed=qo_len + 7, poison=True)
    params = backend.resolve_params(shape, {"num_kv_splits": splits, "o_split": o_split,
                                            "lazy_sum": lazy_sum})
    out = backend.prepare(x, params).fn()
    torch.cuda.synchronize()
    ref, _ = mla_decode_reference(x.q, x.kv_cache, x.block_table, list(lens), shape.scale,
                                  qo_len=qo_len, causal=True)
    assert torch.isfinite(out).all()
    assert torch.allclose(out.float(), ref, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("pdl", [0, 1, 2])
@pytest.mark.parametrize("qo_len,multi_token", [(1, 0), (8, 1), (8, 2)])
def test_pdl_prologue_graph_of_repeated_calls(pdl, qo_len, multi_token):
    """Stage 1 launched as a programmatic dependent of the previous call's merge: eight calls in
    one graph sharing one workspace, alternating two queries, each output right (a stage 1 that
    wrote its partials before the merge before it had read them would mix the two); at 8 tokens
    the multi-token stage 1."""
    from mlabench.kernels.gluon_splitkv import KernelVariant

    _backend()
    lens = (4096, 300, 20000)
    x = _inputs(lens, seed=4, poison=False, qo_len=qo_len)
    calls, outs, queries = _repeated_calls(x, 33, pdl, KernelVariant(pdl_prologue=True,
                                                                     multi_token=multi_token))
    calls()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    for out in outs:
        out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    from mlabench.kernels.reference import mla_decode_reference

    refs = [mla_decode_reference(q, x.kv_cache, x.block_table, list(lens), x.shape.scale,
                                 qo_len=qo_len, causal=True)[0] for q in queries]
    for i, out in enumerate(outs):
        assert torch.allclose(out.float(), refs[i % 2], atol=1e-2, rtol=1e-2), i


@pytest.mark.parametrize("qo_len,lens,splits", [
    (1, (4096,), 16), (1, (131072,), 132), (1, (1, 1000, 4096, 777), 7), (1, (65, 130), 33),
    (1, (32768,) * 16, 8), (4, (1000, 70, 8, 3000), 7), (8, (65, 2000), 32), (8, (4096, 300), 32),
])
def test_fused_merge_matches_fp32(qo_len, lens, splits):
    """No merge launch: the written splits of each (request, row tile) meet at the arrival
    barrier and merge their column shares; poisoned ragged inputs, short requests whose last
    splits own no page, causal multi-token tiles, the counters reused by a second call."""
    from mlabench.inputs import make_inputs
    from mlabench.kernels.reference import mla_decode_reference
    from mlabench.shapes import MLADecodeShape

    backend = _backend()
    lens = tuple(max(n, qo_len) for n in lens)
    shape = MLADecodeShape.create(num_heads=12, context_lens=lens, page_size=64, qo_len=qo_len)
    x = make_inputs(shape, seed=qo_len + 21, poison=True)
    call = backend.prepare(x, backend.resolve_params(shape, {"num_kv_splits": splits,
                                                             "fused_merge": 1}))
    ref, _ = mla_decode_reference(x.q, x.kv_cache, x.block_table, list(lens), shape.scale,
                                  qo_len=qo_len, causal=True)
    for _ in range(2):
        call.out.fill_(float("nan"))
        out = call.fn()
        torch.cuda.synchronize()
        assert torch.isfinite(out).all()
        assert torch.allclose(out.float(), ref, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("split_policy", [None, "device"])
def test_fused_merge_graph_of_repeated_calls_follows_new_lengths(tmp_path, split_policy):
    """One graph of eight fused calls (each a programmatic dependent of the one before), alternating
    two queries over one workspace and one set of counters, replayed three times at new lengths
    (a device policy changing each request's count between replays): every output right."""
    import json

    from mlabench.kernels.gluon_splitkv import KernelVariant, merge_sync_shape
    from mlabench.kernels.reference import mla_decode_reference
    from mlabench.policy.device_table import load_split_policy

    _backend()
    lens = (4096, 300, 20000)
    x = _inputs(lens, seed=9, poison=False)
    table = None
    if split_policy:
        path = tmp_path / "policy.json"
        path.write_text(json.dumps({"num_kv_splits": {"3": [[256, 1], [8192, 16], [1 << 20, 40]]}}))
        table = load_split_policy(path).device_table(3, x.q.device)
    sync = torch.zeros(merge_sync_shape(len(lens), 12), dtype=torch.int32, device=x.q.device)
    calls, outs, queries = _repeated_calls(
        x, 40, 1, KernelVariant(pdl_prologue=True, fused_merge=True), table, sync)
    calls()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    for new in ([9000, 64, 20000], [1, 8193, 300], list(lens)):
        x.cache_seqlens.copy_(torch.tensor(new, dtype=torch.int32))
        for out in outs:
            out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        refs = [mla_decode_reference(q, x.kv_cache, x.block_table, new, x.shape.scale)[0]
                for q in queries]
        for i, out in enumerate(outs):
            assert torch.allclose(out.float(), refs[i % 2], atol=1e-2, rtol=1e-2), (new, i)
    assert int((sync & 0xFFFF).sum()) == 0  # every barrier left its count at 0
    assert int((sync >> 16).min()) == 4 * 8  # one generation a call: 8 eager, 3 replays of 8


def test_fused_merge_falls_back_where_the_grid_cannot_be_resident():
    """16 requests x 16 splits = 256 programs on 132 SMs: the backend runs the wide merge and says
    so in its effective parameters; the kernel entry point refuses such a launch outright."""
    from mlabench.kernels.gluon_splitkv import KernelVariant, mla_decode_gluon_splitkv

    backend = _backend()
    lens = (4096,) * 16
    x = _inputs(lens)
    call = backend.prepare(x, backend.resolve_params(x.shape, {"num_kv_splits": 16,
                                                               "fused_merge": 1}))
    assert call.effective_params["fused_merge"] == 0
    out = call.fn()
    torch.cuda.synchronize()
    assert torch.allclose(out.float(), _ref(x, lens), atol=1e-2, rtol=1e-2)
    fits = backend.prepare(x, backend.resolve_params(x.shape, {"num_kv_splits": 8}))
    assert fits.effective_params["fused_merge"] == 1  # the default from batch 16
    with pytest.raises(ValueError, match="fused_merge needs the whole grid resident: 256"):
        mla_decode_gluon_splitkv(x.q, x.kv_cache, x.block_table, x.cache_seqlens,
                                 x.new_output(), 16, x.shape.scale, partial_out=None,
                                 partial_lse=None, variant=KernelVariant(fused_merge=True))


@pytest.mark.parametrize("variant_kw", [{}, {"fused_merge": True, "pdl_prologue": True}])
def test_vllm_query_halves_in_a_graph_replayed_at_new_lengths(variant_kw):
    """vLLM's query halves read where they lie (``q_rope``: a transposed bmm-output view and a
    slice, strides of 16 requests): right eagerly, and in a graph captured there and replayed at
    new lengths after new query values are written into the same two buffers."""
    from mlabench.kernels.gluon_splitkv import (
        KernelVariant, kv_descriptors, merge_sync_shape, mla_decode_gluon_splitkv,
    )
    from mlabench.kernels.reference import mla_decode_reference
    from mlabench.kernels.workspace import splitkv_workspace_shapes
    from tests.kernels.helpers import vllm_query_halves

    _backend()
    lens = (4096,) * 12 + (1, 777, 20000, 65)
    x = _inputs(lens, seed=13, poison=False)  # lengths shrink below: no NaN in what they read
    nope, pe = vllm_query_halves(x.q)
    assert nope.stride() == (512, 16 * 512, 1)
    variant = KernelVariant(**variant_kw)
    sync = torch.zeros(merge_sync_shape(16, 12), dtype=torch.int32, device="cuda")
    o_shape, l_shape = splitkv_workspace_shapes(16, 12, 8)
    part_o, part_lse = torch.empty(o_shape, device="cuda"), torch.empty(l_shape, device="cuda")
    out, descs = torch.full_like(x.new_output(), float("nan")), kv_descriptors(x.kv_cache)

    def call():
        mla_decode_gluon_splitkv(nope, x.kv_cache, x.block_table, x.cache_seqlens, out, 8,
                                 x.shape.scale, partial_out=part_o, partial_lse=part_lse,
                                 descriptors=descs, variant=variant, q_rope=pe,
                                 merge_sync=sync if variant.fused_merge else None)

    call()
    torch.cuda.synchronize()
    assert torch.allclose(out.float(), _ref(x, lens), atol=1e-2, rtol=1e-2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for seed, new in ((1, [64] * 8 + [4000, 1, 4096, 300, 1, 700, 19999, 64]), (2, list(lens))):
        q = torch.randn(x.q.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
        q = q.to(x.q.dtype)
        nope.copy_(q[..., :512])
        pe.copy_(q[..., 512:])
        x.cache_seqlens.copy_(torch.tensor(new, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = mla_decode_reference(q, x.kv_cache, x.block_table, new, x.shape.scale)[0]
        assert torch.allclose(out.float(), ref, atol=1e-2, rtol=1e-2), new


def test_query_halves_at_several_tokens_match_fp32():
    """qo_len 4 (48 packed rows, one 64-row tile): a latent view of q and a RoPE slice of a wider
    tensor, each token stride H times its head stride."""
    from mlabench.inputs import make_inputs
    from mlabench.kernels.gluon_splitkv import mla_decode_gluon_splitkv
    from mlabench.kernels.reference import mla_decode_reference
    from mlabench.shapes import MLADecodeShape
    from tests.kernels.helpers import vllm_query_halves

    _backend()
    lens = (1000, 70, 8, 3000)
    shape = MLADecodeShape.create(num_heads=12, context_lens=lens, page_size=64, qo_len=4)
    x = make_inputs(shape, seed=17, poison=True)
    out = mla_decode_gluon_splitkv(x.q[..., :512], x.kv_cache, x.block_table, x.cache_seqlens,
                                   x.new_output(), 7, shape.scale, partial_out=None,
                                   partial_lse=None, qo_len=4, q_rope=vllm_query_halves(x.q)[1])
    torch.cuda.synchronize()
    ref, _ = mla_decode_reference(x.q, x.kv_cache, x.block_table, list(lens), shape.scale,
                                  qo_len=4, causal=True)
    assert torch.isfinite(out).all()
    assert torch.allclose(out.float(), ref, atol=1e-2, rtol=1e-2)
