"""CPU tests of the multi-token stage 1 of gluon-splitkv (``KernelVariant.multi_token``).

The kernel has no CPU interpreter: it is compiled here for sm_90 (Triton bundles ptxas and
cuobjdump) and its PTX and SASS are checked for the structure the design relies on (warp
specialisation, TMA, mbarriers, wgmma with every row as N, no local memory in the output
product's loop).  tests/gpu/test_gluon_multi_token.py runs it against the fp32 reference.
"""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("triton.experimental.gluon")

from mlabench.kernels.gluon_multi_token import multi_token_tiling, p_buffers  # noqa: E402
from mlabench.kernels.gluon_splitkv import KernelVariant  # noqa: E402
from mlabench.kernels.row_tiling import RowTiling  # noqa: E402
from tests.kernels.helpers import run_compile_script  # noqa: E402

#: The cache's bulk tensor copy, completing on an mbarrier: Triton 3.9 names the CTA's shared
#: memory as the destination, 3.6 (the H200's) the cluster's (the same for a CTA without a cluster)
TMA_COPY = re.compile(r"cp\.async\.bulk\.tensor\.2d\.shared::(cta|cluster)\.global"
                      r"\.mbarrier::complete_tx::bytes")

#: A wgmma instruction's N and its two transpose flags (A, B), the last immediates in PTX
WGMMA_FLAGS = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16\.f32\.bf16\.bf16 "
                         r"[^;]*, (\d), (\d);")

_COMPILE = """
import json, sys
from mlabench.kernels.offline_compile import compile_multi_token_sm90, mma_loops
k = compile_multi_token_sm90(int(sys.argv[1]), int(sys.argv[2]), causal=sys.argv[3] == "1",
                             policy_rows=int(sys.argv[4]), scores_first=sys.argv[5] == "1",
                             rows_as_m=int(sys.argv[6]))
print(json.dumps({"ptx": k.asm["ptx"], "shared": k.metadata.shared,
                  "loops": mma_loops(k.asm["cubin"])}))
"""


def _compile(block_rows: int, qo_len: int, causal: bool, policy_rows: int,
             scores_first: bool, rows_as_m: int = 0) -> dict:
    """Compile the multi-token stage 1 for sm_90 in a fresh process (no interpreter state)."""
    out = run_compile_script(_COMPILE, block_rows, qo_len, int(causal), policy_rows,
                             int(scores_first), rows_as_m)
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("rows,want", [
    (12, None), (16, None),                 # one token: the one-token kernel, variant on or off
    (24, RowTiling(32, 1, 8)),              # qo_len 2
    (48, RowTiling(64, 1, 8)),              # qo_len 4
    (96, RowTiling(64, 2, 8)),              # qo_len 8: two CTAs, as RowTiling cuts them
])
def test_multi_token_tiling_keeps_row_tiling_counts(rows, want):
    tiling = multi_token_tiling(rows)
    assert tiling == want
    if tiling is not None:
        assert tiling.row_tiles == RowTiling.for_rows(rows).row_tiles


def test_variant_is_off_by_default_and_never_takes_one_token():
    assert KernelVariant().multi_token == 0
    with pytest.raises(ValueError, match="multi_token must be 0, 1 or 2"):
        KernelVariant(multi_token=3)
    assert KernelVariant().multi_token_tiling(96) is None
    assert KernelVariant(multi_token=True).multi_token_tiling(12) is None
    assert KernelVariant(multi_token=True).multi_token_tiling(96) == RowTiling(64, 2, 8)


def test_p_buffers_fit_shared_memory():
    assert p_buffers(32) == 2 and p_buffers(64) == 1


@pytest.mark.parametrize("block_rows,qo_len,causal,policy_rows,scores_first", [
    (32, 2, True, 0, False),
    (64, 4, True, 16, False),  # a device split policy
    (64, 8, False, 0, False),
    (64, 8, True, 0, False),
    (64, 8, True, 0, True),    # multi_token 2: the next page's scores first
    (32, 2, True, 0, True),
])
def test_multi_token_stage1_compiles_warp_specialised(block_rows, qo_len, causal, policy_rows,
                                                      scores_first):
    """The design in PTX and SASS: the cache by bulk tensor copies completing on mbarriers, the
    partitions' register budgets set by ``setmaxnreg``, one wgmma shape with all the tile's rows
    as N (36 for a page's scores in the softmax warpgroup, twice with the next page's scores
    first, their first page before the loop; 16 for each output warpgroup's 256 x 64 x 64
    update), shared memory within the 227 KB a block may have, no local memory in the output
    product's loop and at most 2 accesses in the softmax loop.  Triton 3.6 (the H200's) spilled
    36-54 a page in the 64-row softmax loop before the query's descriptors were computed in it
    (Triton 3.9: 0-2, and 16-21 with the next page's scores first); 0 now, 0-2 under 3.9."""
    kernel = _compile(block_rows, qo_len, causal, policy_rows, scores_first)
    ptx = kernel["ptx"]
    assert TMA_COPY.search(ptx), "no bulk tensor copy completing on an mbarrier"
    assert "mbarrier.try_wait.parity" in ptx and "mbarrier.arrive" in ptx
    assert "setmaxnreg.inc.sync.aligned.u32" in ptx and "setmaxnreg.dec.sync.aligned.u32" in ptx
    shapes = {m: ptx.count(m) for m in
              re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16", ptx)}
    scores = 36 * (2 if scores_first else 1)
    assert shapes == {f"wgmma.mma_async.sync.aligned.m64n{block_rows}k16.f32.bf16.bf16": scores + 16}
    assert "mma.sync" not in ptx
    assert kernel["shared"] <= 227 * 1024
    output_loop = min(kernel["loops"])  # the smallest loop with tensor-core products
    assert output_loop[1] == 16 and output_loop[2] == 0, kernel["loops"]
    softmax_loop = min(loop for loop in kernel["loops"] if loop[1] == 36)
    assert softmax_loop[2] <= 2, kernel["loops"]


@pytest.mark.parametrize("rows_as_m,qo_len,causal,scores_first", [
    (1, 8, True, False), (1, 4, True, False), (1, 8, True, True),
    (2, 8, True, False), (2, 8, False, False), (2, 4, True, True),
    (3, 8, True, False), (3, 4, True, True),
])
def test_rows_as_m_compiles_rows_as_the_wgmma_m(rows_as_m, qo_len, causal, scores_first):
    """``rows_as_m``: each output warpgroup's page update is 8 ``m64n128k16`` (``O [64, 512] +=
    P V``, the rows as M, two 128-column halves of its 256 columns over 4 token steps) instead
    of 16 ``m64n64k16``, with 3 four ``m64n256k16`` (its 256 columns in one instruction a step)
    on 12 warps (no loader warp) at a register target of 168, which ptxas needs for that
    instruction (at 152 it refuses); the softmax warpgroup's 36 score products keep their shape
    (``S^T`` or, from 2, ``S``: both 64 x 64); no local memory in either loop.  With 2 the
    softmax loop loses its cross-warp reductions: fewer instructions than with 1."""
    kernel = _compile(64, qo_len, causal, 0, scores_first, rows_as_m=rows_as_m)
    ptx = kernel["ptx"]
    n_out, per_page = (256, 4) if rows_as_m == 3 else (128, 8)
    shapes = {m: ptx.count(m) for m in
              re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16", ptx)}
    assert shapes == {"wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16":
                      36 * (2 if scores_first else 1),
                      f"wgmma.mma_async.sync.aligned.m64n{n_out}k16.f32.bf16.bf16": per_page}
    assert (".reqntid 384" in ptx and ".maxnreg 168" in ptx) == (rows_as_m == 3)
    assert kernel["shared"] <= 227 * 1024
    output_loop = min(kernel["loops"])
    assert output_loop[1] == per_page and output_loop[2] == 0, kernel["loops"]
    softmax_loop = min(loop for loop in kernel["loops"] if loop[1] == 36)
    assert softmax_loop[2] <= 2, kernel["loops"]
    # the operands' orientations (the transpose flags, PTX's last two immediates): the scores'
    # A and B K-major either way (K Q^T with 1, Q K^T with 2); the output product's B the page's
    # latent tile as stored (N-major), its A the P tile read transposed (1: P^T) or as stored (2)
    flags: dict[str, set[tuple[int, int]]] = {}
    for m in WGMMA_FLAGS.finditer(ptx):
        flags.setdefault(m.group(1), set()).add((int(m.group(2)), int(m.group(3))))
    assert flags == {"64": {(0, 0)}, str(n_out): {(1 if rows_as_m == 1 else 0, 1)}}
    if rows_as_m == 2:
        by_n = _compile(64, qo_len, causal, 0, scores_first, rows_as_m=1)
        assert softmax_loop[0] < min(loop for loop in by_n["loops"] if loop[1] == 36)[0]


def test_rows_as_m_runs_only_on_64_row_multi_token_tiles():
    assert KernelVariant(multi_token=1, rows_as_m=2).rows_as_m_runs(96) == 2
    assert KernelVariant(multi_token=2, rows_as_m=1).rows_as_m_runs(48) == 1
    assert KernelVariant(multi_token=1, rows_as_m=2).rows_as_m_runs(24) == 0  # 32-row tile
    assert KernelVariant(multi_token=1, rows_as_m=1).rows_as_m_runs(12) == 0  # one token
    assert KernelVariant(multi_token=0, rows_as_m=1).rows_as_m_runs(96) == 0
    assert KernelVariant(multi_token=1).rows_as_m_runs(96) == 0
    with pytest.raises(ValueError, match="rows_as_m must be 0, 1, 2 or 3"):
        KernelVariant(rows_as_m=4)


def test_isolate_is_off_by_default_and_only_with_multi_token():
    """``isolate`` (timing only, wrong output) is no backend parameter; the variant refuses an
    unknown side and either side without the multi-token stage 1."""
    from mlabench.backends.gluon import GluonSplitKVBackend

    assert KernelVariant().isolate == "" and KernelVariant(multi_token=1, isolate="copies")
    for bad in (KernelVariant, lambda **k: KernelVariant(multi_token=1, **k)):
        with pytest.raises(ValueError, match="isolate must be"):
            bad(isolate="pages")
    with pytest.raises(ValueError, match="isolate must be"):
        KernelVariant(isolate="products")
    assert "isolate" not in {p.name for p in GluonSplitKVBackend.params}


@pytest.mark.parametrize("isolate", [1, 2])
def test_isolated_sides_compile_without_the_other(isolate):
    """``isolate`` 1 (products alone): the ring's first pages are still copied and both products
    stay; 2 (copies alone): the copies stay and no wgmma is left."""
    code = ("import sys; from mlabench.kernels.offline_compile import compile_multi_token_sm90; "
            "print(compile_multi_token_sm90(64, 8, rows_as_m=2, isolate=int(sys.argv[1])).asm['ptx'])")
    ptx = run_compile_script(code, isolate)
    assert TMA_COPY.search(ptx)
    assert bool(WGMMA_FLAGS.search(ptx)) == (isolate == 1)


def test_backend_parameter_is_off_by_default_and_not_searched():
    """gluon-splitkv's ``multi_token`` parameter: 0 by default and left out of a point's
    parameters there (records before it pair with the points that run the one-token kernel),
    never swept by ``tune`` unless ``--space`` names it."""
    from mlabench.backends.gluon import GluonSplitKVBackend
    from mlabench.shapes import MLADecodeShape

    spec = {p.name: p for p in GluonSplitKVBackend.params}["multi_token"]
    shape = MLADecodeShape.create(num_heads=12, context_lens=(32768,) * 16, qo_len=8)
    assert spec.default_for(shape) == 0 and spec.left_out(0, shape) and not spec.searched


@pytest.mark.parametrize("qo_len,multi_token,want", [(8, 1, RowTiling(64, 2, 8)),
                                                     (2, 2, RowTiling(32, 1, 8)),
                                                     (1, 2, None), (8, 0, None)])
@pytest.mark.parametrize("rows_as_m", [0, 2])
def test_entry_point_routes_multi_token_shapes_to_their_stage1(monkeypatch, qo_len, multi_token,
                                                               want, rows_as_m):
    """``mla_decode_gluon_splitkv`` launches the multi-token stage 1 exactly where the variant is
    on and a request has more than 16 rows, with the wide merge after it even when the variant
    asks for a fused merge (no sync workspace needed there); elsewhere the one-token stage 1."""
    import torch

    from mlabench.kernels import gluon_multi_token, gluon_splitkv

    launched = []
    monkeypatch.setattr(gluon_multi_token, "launch_multi_token_stage1",
                        lambda tiling, *a: launched.append(("multi", tiling, *a[-5:])))
    monkeypatch.setattr(gluon_splitkv, "_gluon_splitkv_stage1",
                        type("K", (), {"__getitem__": lambda self, grid: (
                            lambda *a, **k: launched.append(("one", k["BLOCK_R"])))})())
    monkeypatch.setattr(gluon_splitkv, "wide_merge", lambda *a, **k: launched.append(("merge",)))
    monkeypatch.setattr(gluon_splitkv, "_check_fused", lambda variant, *a: launched.append(
        ("fused", variant.fused_merge)))
    heads, batch, splits = 12, 2, 4
    q = torch.zeros((batch * qo_len, heads, 576), dtype=torch.bfloat16)
    cache = torch.zeros((8, 64, 1, 576), dtype=torch.bfloat16)
    table = torch.arange(8, dtype=torch.int32).view(batch, 4)
    lens = torch.full((batch,), 200, dtype=torch.int32)
    out = torch.zeros((batch * qo_len, heads, 512), dtype=torch.bfloat16)
    po = torch.zeros((batch * splits, qo_len * heads, 512))
    pl = torch.zeros((batch * splits, qo_len * heads))
    variant = gluon_splitkv.KernelVariant(fused_merge=True, multi_token=multi_token,
                                          rows_as_m=rows_as_m)
    gluon_splitkv.mla_decode_gluon_splitkv(q, cache, table, lens, out, splits, 0.1,
                                           partial_out=po, partial_lse=pl, descriptors=(1, 2),
                                           qo_len=qo_len, variant=variant)
    if want is None:
        assert launched[0] == ("fused", True) and launched[1][0] == "one"
    else:  # (tiling, pdl, pdl_prologue, scores first, rows_as_m asked: the launch keeps it to
        # 64-row tiles, isolate off); the fused merge dropped for the wide one
        assert launched == [("fused", False), ("multi", want, 1, False, multi_token == 2,
                                               rows_as_m, 0), ("merge",)]


def test_split_loop_and_multi_token_are_refused_together(tmp_path):
    """``split_loop`` and ``multi_token`` (both off by default) do not run together: the
    multi-token stage 1 has no split loop, so the variant refuses the pair (ValueError) and the
    backend reports the point unsupported in one line; each alone still prepares."""
    import json

    from mlabench.backends import get_backend, gluon as _gluon  # noqa: F401
    from mlabench.errors import UnsupportedShapeError
    from mlabench.inputs import make_inputs
    from mlabench.shapes import MLADecodeShape

    with pytest.raises(ValueError, match="split_loop and multi_token do not run together"):
        KernelVariant(split_loop=True, multi_token=1)
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"num_kv_splits": {"16": [[4096, 8], [1 << 20, 16]]}}))
    backend = get_backend("gluon-splitkv")
    shape = MLADecodeShape.create(num_heads=12, context_lens=(4096,) * 16, page_size=64, qo_len=4)
    x = make_inputs(shape, seed=0)
    device = {"split_policy": f"device:{policy}"}
    both = backend.resolve_params(shape, {"split_loop": 1, "multi_token": 2, **device})
    with pytest.raises(UnsupportedShapeError, match="split_loop=1 and multi_token=1 or 2"):
        backend.prepare(x, both)
    for one in ({"split_loop": 1}, {"multi_token": 2}):
        call = backend.prepare(x, backend.resolve_params(shape, {**one, **device}))
        assert all(call.effective_params[k] == v for k, v in one.items())
