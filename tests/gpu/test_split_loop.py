"""GPU tests of gluon-splitkv's persistent split loop (``split_loop=1``, skipped without an NVIDIA
Hopper GPU): the held-out inputs of tests/gpu/test_gluon_splitkv.py with the loop on.  Every case
uses a device policy whose largest count exceeds one wave of programs, so the loop kernel runs
(each test asserts it: the grid's split axis below the slots per request) and programs take two
or more splits: poisoned page tails and padding with needles at every split edge, ragged
batches, causal and non-causal 2-8 tokens, a 1-page ring, the fused and the wide merge, graphs
captured at one length and replayed at others, and eight calls in one graph sharing a workspace.
"""

import json

import pytest
import torch

from tests.gpu.test_gluon_splitkv import _backend, _inputs, _repeated_calls

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

#: Largest counts of 33 (batch 16), 132 (batch 4) and 300 (batch 1): one wave holds 8, 33 and
#: 132 programs a request at one 16-row tile a program, so long requests loop over 2-5 splits.
POLICY = {"num_kv_splits": {"1": [[1024, 16], [8192, 64], [1 << 20, 300]],
                            "4": [[256, 1], [4096, 7], [1 << 20, 132]],
                            "16": [[256, 1], [2048, 5], [8192, 12], [1 << 20, 33]]}}


def _params(backend, shape, tmp_path, **extra):
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(POLICY))
    return backend.resolve_params(shape, {"split_policy": f"device:{path}", "split_loop": 1, **extra})


def _shape(lens, qo_len=1, causal=True):
    from mlabench.shapes import MLADecodeShape

    lens = tuple(max(n, qo_len) for n in lens)
    return MLADecodeShape.create(num_heads=12, context_lens=lens, page_size=64, qo_len=qo_len,
                                 causal=causal)


def _ref(x, lens, qo_len=1, causal=True, q=None):
    from mlabench.kernels.reference import mla_decode_reference

    return mla_decode_reference(x.q if q is None else q, x.kv_cache, x.block_table, list(lens),
                                x.shape.scale, qo_len=qo_len, causal=causal)[0]


def _assert_loops(call):
    eff = call.effective_params
    assert eff["split_loop"] == 1 and eff["grid_splits"] < eff["num_kv_splits"], eff


RAGGED_16 = (1, 63, 64, 65, 300, 1000, 2047, 4096, 5000, 8192, 9000, 20000, 32768, 70000, 100000,
             131072)


@pytest.mark.parametrize("lens,stages,fused", [
    (RAGGED_16, 2, 1), (RAGGED_16, 2, 0), (RAGGED_16, 1, 0),
    ((131072, 1, 4097, 20000), 2, 0), ((100000, 9000, 64, 300), 2, 1),
    ((131072,), 2, 0), ((70000,), 2, 1),
])
def test_loop_passes_every_input_set_on_poisoned_inputs(tmp_path, lens, stages, fused):
    """The check ``sweep`` and ``check`` run: NaN in every page tail and padding page, needles at
    every split edge, the peaky and the flat sets; each request at its own count."""
    from mlabench.bench.shape_bench import ShapeBench

    backend = _backend()
    shape = _shape(lens)
    params = _params(backend, shape, tmp_path, num_stages=stages, fused_merge=fused)
    call, verdict = ShapeBench(shape, seed=13, copies=1).check(backend, params)
    _assert_loops(call)
    assert verdict.passed, verdict


@pytest.mark.parametrize("qo_len,causal", [(2, True), (3, True), (4, True), (4, False),
                                           (6, False), (8, True), (8, False)])
@pytest.mark.parametrize("lens", [(131072, 70, 8, 3000), RAGGED_16])
def test_loop_multi_token_matches_fp32(tmp_path, qo_len, causal, lens):
    """qo_len x 12 rows in tiles of 32 or 64 (two past 64 rows), causal limits at every split
    edge, on poisoned ragged inputs."""
    from mlabench.inputs import make_inputs

    backend = _backend()
    shape = _shape(lens, qo_len, causal)
    x = make_inputs(shape, seed=qo_len + 31, poison=True)
    call = backend.prepare(x, _params(backend, shape, tmp_path))
    _assert_loops(call)
    out = call.fn()
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    assert torch.allclose(out.float(), _ref(x, shape.context_lens, qo_len, causal), atol=1e-2,
                          rtol=1e-2)


@pytest.mark.parametrize("qo_len,fused", [(1, 1), (1, 0), (4, 1), (8, 0)])
def test_loop_graph_captured_at_one_length_replays_at_others(tmp_path, qo_len, fused):
    """One graph captured with every request at qo_len tokens, replayed after the lengths change
    in place (short, long, ragged, back): right each time."""
    from mlabench.inputs import make_inputs

    backend = _backend()
    lens = RAGGED_16
    shape = _shape(lens, qo_len)
    x = make_inputs(shape, seed=qo_len + 41, poison=False)  # lengths grow into tails and padding
    call = backend.prepare(x, _params(backend, shape, tmp_path, fused_merge=fused))
    _assert_loops(call)
    x.cache_seqlens.fill_(qo_len)
    call.fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call.fn()
    for new in ([qo_len] * 16, list(shape.context_lens), list(reversed(shape.context_lens)),
                [131072] * 16, [max(qo_len, 1000)] * 16):
        x.cache_seqlens.copy_(torch.tensor(new, dtype=torch.int32))
        call.out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.allclose(call.out.float(), _ref(x, new, qo_len), atol=1e-2, rtol=1e-2), new


@pytest.mark.parametrize("fused", [False, True])
def test_loop_graph_of_repeated_calls_follows_new_lengths(tmp_path, fused):
    """Eight calls in one graph (stage 1 a programmatic dependent of the merge before), alternating
    two queries over one workspace and one set of counters, replayed at new lengths: a stage 1 that
    wrote a partial before the merge before it had read it would mix the two queries."""
    from mlabench.kernels.gluon_splitkv import KernelVariant, merge_sync_shape
    from mlabench.policy.device_table import load_split_policy

    _backend()
    lens = (131072, 300, 20000, 64) * 4
    x = _inputs(lens, seed=17, poison=False)
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(POLICY))
    table = load_split_policy(path).device_table(16, x.q.device)
    sync = torch.zeros(merge_sync_shape(16, 12), dtype=torch.int32, device=x.q.device)
    variant = KernelVariant(pdl_prologue=True, fused_merge=fused, split_loop=True)
    calls, outs, queries = _repeated_calls(x, 33, 1, variant, table, sync if fused else None)
    calls()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    for new in ([9000, 64, 131072, 1] * 4, list(lens)):
        x.cache_seqlens.copy_(torch.tensor(new, dtype=torch.int32))
        for out in outs:
            out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for i, out in enumerate(outs):
            assert torch.allclose(out.float(), _ref(x, new, q=queries[i % 2]), atol=1e-2,
                                  rtol=1e-2), (new, i)
    if fused:
        assert int((sync & 0xFFFF).sum()) == 0  # every barrier left its count at 0
