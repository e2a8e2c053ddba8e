"""The issue's stale-graph case on a GPU, for every backend available there (skipped without one).

Prepare on 12 heads, lengths [8192, 20000, 100], page 64; capture the timed call; write
[9000, 12000, 64] into the same ``cache_seqlens``; refresh; replay: the output must be the
reference of the new lengths for every ``graph_safe`` call (before refresh existed,
triton-persistent was off by 0.64 and flashmla by 0.09).
"""

from __future__ import annotations

import pytest
import torch

from mlabench.backends import backend_names, get_backend

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")]

LENS = (8192, 20000, 100)
NEW_LENS = (9000, 12000, 64)
#: Extra parameter sets beyond the defaults: the split-KV kernel's policy modes.
VARIANTS = {"triton-splitkv": [{"split_policy": "device"}, {"split_policy": "host"}]}


@pytest.mark.parametrize("name", backend_names())
def test_graph_replayed_after_refresh_follows_new_lengths(name):
    from mlabench.checks.verdict import compare_outputs
    from mlabench.inputs import make_inputs
    from mlabench.kernels.reference import mla_decode_reference
    from mlabench.measure.timing import capture_graph
    from mlabench.shapes import MLADecodeShape

    backend = get_backend(name)
    ok, why = backend.available()
    if not ok:
        pytest.skip(why)
    shape = MLADecodeShape.create(num_heads=12, context_lens=LENS, page_size=64)
    if not backend.supports(shape)[0]:
        pytest.skip(backend.supports(shape)[1])
    for params in [{}] + VARIANTS.get(name, []):
        inputs = make_inputs(shape, seed=5, poison=False)  # the lengths grow into page tails and padding
        call = backend.prepare(inputs, backend.resolve_params(shape, params))
        graph = capture_graph([call.fn]) if call.graph_safe else None  # else: eager after refresh
        inputs.cache_seqlens.copy_(torch.tensor(NEW_LENS, dtype=torch.int32))
        call.refresh_for_new_lengths()
        call.out.fill_(float("nan"))
        graph.replay() if graph is not None else call.fn()
        torch.cuda.synchronize()
        ref, _ = mla_decode_reference(inputs.q, inputs.kv_cache, inputs.block_table, NEW_LENS,
                                      shape.scale)
        verdict = compare_outputs(call.out, ref)
        assert verdict.passed, (params, verdict)
