"""The vLLM plugin's decode call on a Hopper GPU (skipped elsewhere): vLLM's cache layout
``[pages, 64, 576]`` against the fp32 reference, in device and host mode, the query whole or in
vLLM's halves (a transposed bmm-output view and a slice, as ``forward_mqa`` receives them), one
graph captured at short lengths and replayed at long ones (device mode keeps the policy's count
per request), and the FA3 call that runs a step with short extends (where vLLM's FlashAttention
build is installed)."""

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

POLICY_ROWS = {1: [(1024, 8), (8192, 33), (131072, 132)], 4: [(4096, 4), (131072, 16)]}


def _served(mode, max_batch=4):
    from mlabench.backends.gluon import hopper_gluon_available
    from mlabench.deploy.served_decode import ServedDecode
    from mlabench.policy.device_table import SplitPolicy

    ok, why = hopper_gluon_available()
    if not ok:
        pytest.skip(why)
    return ServedDecode(SplitPolicy.create(POLICY_ROWS), mode, 12, max_batch, "cuda")


def _inputs(lens, seed=0, poison=True):
    from mlabench.inputs import make_inputs
    from mlabench.shapes import MLADecodeShape

    return make_inputs(MLADecodeShape.create(num_heads=12, context_lens=lens, page_size=64), seed=seed,
                       poison=poison)


def _err(x, out, lens):
    from mlabench.kernels.reference import mla_decode_reference

    ref = mla_decode_reference(x.q, x.kv_cache, x.block_table, list(lens), x.shape.scale)[0]
    return ((out.float() - ref).norm() / ref.norm()).item()


def _query(x, halves):
    """x.q as ServedDecode gets it: whole, or vLLM's ``(ql_nope, q_pe)`` holding its values."""
    from tests.kernels.helpers import vllm_query_halves

    return vllm_query_halves(x.q) if halves else x.q


@pytest.mark.parametrize("mode", ["device", "host"])
@pytest.mark.parametrize("lens", [[700], [3000, 65, 20000, 9000]])
@pytest.mark.parametrize("halves", [False, True])
def test_vllm_layout_against_the_reference(mode, lens, halves):
    served, x = _served(mode), _inputs(lens)
    out = served(_query(x, halves), x.kv_cache.squeeze(2), x.block_table, x.cache_seqlens, max(lens), x.shape.scale)
    assert out.shape == (len(lens), 12, 512) and out.dtype == x.q.dtype
    assert _err(x, out, lens) < 1e-2


@pytest.mark.parametrize("halves", [False, True])
def test_one_graph_captured_short_is_right_long_in_device_mode(halves):
    served, x = _served("device"), _inputs([40000, 40000, 40000, 40000], seed=1)
    q = _query(x, halves)
    cache, short = x.kv_cache.squeeze(2), torch.tensor([100, 900, 64, 3000], dtype=torch.int32, device="cuda")
    long = x.cache_seqlens.clone()
    x.cache_seqlens.copy_(short)
    served(q, cache, x.block_table, x.cache_seqlens, 3000, x.shape.scale)  # warm-up, as vLLM does
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = served(q, cache, x.block_table, x.cache_seqlens, 3000, x.shape.scale)
    for lens in (short, long, torch.tensor([40000, 1, 20000, 5000], dtype=torch.int32, device="cuda")):
        x.cache_seqlens.copy_(lens)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert _err(x, out, lens.tolist()) < 1e-2


@pytest.mark.parametrize("halves", [False, True])
def test_a_step_with_short_extends_runs_fa3_varlen_against_the_reference(halves):
    from mlabench.backends.vllm_fa3 import VLLM_FA_MODULE, fa3_mla_decode
    from mlabench.extras import optional_import
    from mlabench.kernels.reference import mla_decode_reference
    from tests.kernels.helpers import vllm_query_halves

    fa, why = optional_import(VLLM_FA_MODULE)
    if fa is None or not fa.is_fa_version_supported(3):
        pytest.skip(why or "no FA3 in vLLM's FlashAttention build")
    lens, qlens = [3000, 700, 20000, 513], [1, 7, 300, 1]
    # Unpoisoned: FA3 (vLLM's kernel, not ours) multiplies the masked tail of a request's last page
    # by a zero weight, so a NaN there is NaN in its output; vLLM's cache never holds NaN (zeroed at
    # start-up, then finite values of earlier requests).  This checks the call, not FA3's masking.
    x = _inputs(lens, seed=2, poison=False)
    q = torch.randn(sum(qlens), 12, 576, dtype=x.q.dtype, device="cuda")
    starts = torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    out = fa3_mla_decode(fa, vllm_query_halves(q) if halves else q, x.kv_cache, x.block_table,
                         x.cache_seqlens, starts, max(qlens), max(lens), x.shape.scale)
    assert out.shape == (sum(qlens), 12, 512) and out.dtype == q.dtype
    for b, (n, first) in enumerate(zip(qlens, starts.tolist())):
        ref = mla_decode_reference(q[first:first + n], x.kv_cache, x.block_table[b:b + 1], [lens[b]],
                                   x.shape.scale, qo_len=n, causal=True)[0]
        got = out[first:first + n].float()
        assert ((got - ref).norm() / ref.norm()).item() < 1e-2, (b, n)
