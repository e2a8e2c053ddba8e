"""CPU tests of the Hopper Gluon split-KV backend's parts.

The Gluon kernel has no CPU interpreter: here it is compiled for sm_90 (Triton bundles ptxas) and
its PTX is checked for the instructions the design relies on; the wide merge runs on partials
computed in torch over page-granular splits (compiled on a GPU, in Triton's interpreter without
one).  tests/gpu/ runs the kernel.
"""

from __future__ import annotations

import json
import re
import math

import pytest
import torch

from mlabench.backends import get_backend
from mlabench.backends import gluon as _gluon_backend  # noqa: F401  (registers gluon-splitkv)
from mlabench.backends.gluon import default_gluon_splits
from mlabench.kernels.wide_merge import merge_blocks, wide_merge
from mlabench.shapes import MLADecodeShape
from tests.kernels.helpers import DEVICE, INTERPRETED, make_case, max_err, run_compile_script

LOG2E = 1.4426950408889634


def page_split_partials(inp, splits: int, page: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 partials ``[B*S, H, 512]`` and base-2 lse ``[B*S, H]`` of page-granular splits:
    split ``s`` owns pages ``[s*P, (s+1)*P)`` with ``P = ceil(pages / S)``, as the kernel does."""
    from mlabench.kernels.reference import gather_kv

    batch, heads, _ = inp.q.shape
    po = torch.zeros((batch * splits, heads, 512), device=inp.device)
    pl = torch.full((batch * splits, heads), float("-inf"), device=inp.device)
    for b, n in enumerate(inp.cache_seqlens.tolist()):
        k = gather_kv(inp.kv_cache, inp.block_table, n, b).float()
        per = math.ceil(math.ceil(n / page) / splits)
        for s in range(splits):
            lo, hi = min(s * per * page, n), min((s + 1) * per * page, n)
            if hi <= lo:
                continue
            scores = inp.q[b].float() @ k[lo:hi].T * inp.shape.scale
            po[b * splits + s] = torch.softmax(scores, -1) @ k[lo:hi, :512]
            pl[b * splits + s] = torch.logsumexp(scores, -1) * LOG2E
    return po, pl


@pytest.mark.parametrize("lens,splits,block_dv", [
    ((300, 64, 1), 3, 32),      # last split of the 1-token request and of 64 are empty
    ((700,), 16, 64),           # more splits than pages (11 pages): 5 empty splits
    ((130, 2000), 40, 128),     # 40 slots: two slot blocks of 32 per merge program
])
def test_wide_merge_of_page_splits_matches_reference(lens, splits, block_dv):
    inp, ref = make_case(12, lens, 64)
    po, pl = page_split_partials(inp, splits)
    out = inp.new_output()  # NaN-poisoned
    wide_merge(po, pl, out, splits, block_dv=block_dv)
    assert max_err(out, ref) < 2e-3


def test_wide_merge_all_empty_request_gives_zero_row():
    po = torch.zeros((4, 12, 512), device=DEVICE)
    pl = torch.full((4, 12), float("-inf"), device=DEVICE)
    out = torch.full((2, 12, 512), float("nan"), device=DEVICE)
    wide_merge(po, pl, out, 2)
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("kwargs,match", [({"num_kv_splits": 0}, "num_kv_splits"),
                                          ({"num_kv_splits": 2, "block_dv": 48}, "block_dv"),
                                          ({"num_kv_splits": 9}, "too small")])
def test_wide_merge_rejects_bad_arguments(kwargs, match):
    po, pl = torch.zeros((16, 12, 512), device=DEVICE), torch.zeros((16, 12), device=DEVICE)
    with pytest.raises(ValueError, match=match):
        wide_merge(po, pl, torch.empty((2, 12, 512), device=DEVICE), **kwargs)


@pytest.mark.parametrize("batch,splits,want", [
    (1, 132, (32, 64)),    # 12 heads x 16 column blocks = 192 programs, 64 slots a step
    (16, 8, (256, 8)),     # 192 x 2 = 384 programs, all 8 slots at once
    (4, 33, (128, 64)),
    (64, 2, (512, 2)),     # many requests: whole rows
])
def test_merge_blocks_fill_about_two_programs_per_sm(batch, splits, want):
    block_dv, block_s = merge_blocks(batch, 12, splits, 132)
    assert (block_dv, block_s) == want
    assert block_s * block_dv <= 8192


@pytest.mark.parametrize("batch,ctx,want", [(1, 1024, 16), (1, 4096, 64), (1, 8192, 132),
                                            (1, 131072, 132), (16, 1024, 8), (16, 131072, 8),
                                            (200, 4096, 1), (1, 64, 1)])
def test_default_splits_are_pages_or_one_wave(batch, ctx, want):
    shape = MLADecodeShape.uniform(batch, ctx, 12)
    assert default_gluon_splits(shape, num_sms=132) == want


def test_fused_merge_default_never_pairs_with_a_wide_record():
    """fused_merge defaults to 1 from batch 16 and is left out of a point's parameters at 0, the
    wide merge every record before it ran: a default batch-16 point carries fused_merge=1 (a new
    key), an explicit 0 is the old point, and tune leaves it out at every batch size (it measures
    the wide merge, as every earlier tune did, unless --space names it: one parameter set for the
    whole policy)."""
    from mlabench.backends.gluon import FUSED_MERGE
    from mlabench.tune.space import search_space

    backend = get_backend("gluon-splitkv")
    b1 = MLADecodeShape.create(num_heads=12, context_lens=(4096,))
    b16 = MLADecodeShape.create(num_heads=12, context_lens=(4096,) * 16)
    p1, p16 = backend.resolve_params(b1), backend.resolve_params(b16)
    wide16 = backend.resolve_params(b16, {"fused_merge": 0})
    assert "fused_merge" not in p1 and p16["fused_merge"] == 1 and "fused_merge" not in wide16
    assert wide16 == {k: v for k, v in p16.items() if k != "fused_merge"}
    assert [FUSED_MERGE.value_in(p, s) for p, s in ((p1, b1), (p16, b16), (wide16, b16))] == [0, 1, 0]
    assert backend.resolve_params(b1, {"fused_merge": 1})["fused_merge"] == 1
    assert all("fused_merge" not in search_space(backend, s)[1] for s in (b1, b16))


def test_backend_says_why_not_here_and_which_shapes():
    backend = get_backend("gluon-splitkv")
    ok, reason = backend.available()
    if INTERPRETED or not torch.cuda.is_available():
        assert not ok and ("Hopper" in reason or "interpreter" in reason)
    elif torch.cuda.get_device_capability() == (9, 0) and torch.version.hip is None:
        assert ok, reason  # compiled on a Hopper GPU: nothing stands in the way
    shape = MLADecodeShape.create(num_heads=12, context_lens=(100,), page_size=16)
    ok, reason = backend.supports(shape)
    assert not ok and "page size" in reason
    assert backend.supports(MLADecodeShape.create(num_heads=12, context_lens=(100,)))[0]
    fp32 = MLADecodeShape.create(num_heads=12, context_lens=(100,), q_dtype="float32",
                                 kv_dtype="float32")
    assert not backend.supports(fp32)[0]


_COMPILE = """
import json, os, subprocess, sys, tempfile
import triton
from mlabench.kernels.gluon_splitkv import KernelVariant
from mlabench.kernels.offline_compile import compile_stage1_sm90
k = compile_stage1_sm90(int(sys.argv[1]), block_rows=int(sys.argv[2]), qo_len=int(sys.argv[3]),
                        causal=sys.argv[4] == "1", policy_rows=int(sys.argv[5]),
                        variant=KernelVariant(o_split=sys.argv[6], fused_merge=sys.argv[7] == "1",
                                              split_loop=sys.argv[9] == "1"),
                        num_splits=int(sys.argv[8]))
usage = ""
tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
if os.path.exists(tool) and "cubin" in k.asm:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"]); f.flush()
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
from mlabench.kernels.offline_compile import token_loop_spills
print(json.dumps({"ptx": k.asm["ptx"], "shared": k.metadata.shared, "usage": usage,
                  "token_loop_spills": token_loop_spills(k.asm["cubin"]) if usage else None}))
"""


def _compile_stage1(num_stages: int, block_rows: int = 16, qo_len: int = 1, causal: bool = False,
                    policy_rows: int = 0, o_split: str = "m", fused_merge: bool = False,
                    num_splits: int = 132, split_loop: bool = False) -> dict:
    """Compile stage 1 for sm_90 in a fresh process (no interpreter state, no GPU needed);
    ``split_loop``: the kernel of the persistent split loop."""
    pytest.importorskip("triton.experimental.gluon")
    out = run_compile_script(_COMPILE, num_stages, block_rows, qo_len, int(causal), policy_rows,
                             o_split, int(fused_merge), num_splits, int(split_loop), timeout=300)
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("num_stages,max_shared", [(1, 100_000), (2, 227 * 1024)])
def test_stage1_compiles_to_tma_and_wgmma(num_stages, max_shared):
    """The design in PTX: page tiles by bulk tensor copies, products by m64n16k16 wgmma (36 for
    the scores of a 576-wide page, 32 for the 512 x 64 x 16 output update), shared memory that
    fits the intended CTAs per SM (two at 1 stage, one at 2)."""
    kernel = _compile_stage1(num_stages)
    ptx = kernel["ptx"]
    assert "cp.async.bulk.tensor.2d" in ptx
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16") == 36 + 32
    assert "mma.sync" not in ptx
    assert kernel["shared"] <= max_shared


@pytest.mark.parametrize("block_rows,qo_len,causal,policy_rows,o_split,counts", [
    # o_split m (the default): the scores' two warpgroups side by side on the rows (36 m64n16 or
    # m64n32 a page), the output update's stacked on its 512 rows (16 m64n32 or m64n64 each)
    (32, 2, True, 0, "m", {"m64n16k16": 36, "m64n32k16": 16}),
    (64, 4, True, 16, "m", {"m64n32k16": 36, "m64n64k16": 16}),  # a device policy table
    (64, 8, False, 0, "m", {"m64n32k16": 36, "m64n64k16": 16}),
    # o_split n: both products side by side on the rows, 36 + 32 of the same instruction
    (32, 2, True, 0, "n", {"m64n16k16": 36 + 32}),
    (64, 8, False, 0, "n", {"m64n32k16": 36 + 32}),
])
def test_multi_row_tiles_compile_without_spills(block_rows, qo_len, causal, policy_rows, o_split,
                                                counts):
    """The 32- and 64-row tiles of a multi-token step: two warpgroups, each running the same
    wgmma code on its half of a product (instruction shapes and counts per page below), no local
    memory (no spills), and shared memory within the 227 KB an H200 block may have."""
    from mlabench.kernels.row_tiling import stage1_shared_bytes

    kernel = _compile_stage1(2, block_rows, qo_len, causal, policy_rows, o_split)
    ptx = kernel["ptx"]
    found = {m.group(1): ptx.count(m.group(0)) for m in re.finditer(
        r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.f32\.bf16\.bf16", ptx)}
    assert found == counts
    assert "mma.sync" not in ptx
    assert stage1_shared_bytes(block_rows, 2) <= kernel["shared"] <= 227 * 1024
    if kernel["usage"]:
        assert "LOCAL:0" in kernel["usage"] and "STACK:0" in kernel["usage"], kernel["usage"]


_SASS = """
import json, sys
from mlabench.kernels.offline_compile import compile_stage1_sm90, sass_instructions
k = compile_stage1_sm90(2, policy_rows=int(sys.argv[1]))
print(json.dumps([t for _, t in sass_instructions(k.asm["cubin"])]))
"""


@pytest.mark.parametrize("policy_rows, exits_first", [(0, False), (16, True)])
def test_an_empty_split_of_a_device_policy_exits_before_its_barriers(policy_rows, exits_first):
    """With a device policy (``policy_rows`` > 0) a split that owns no page exits before the page
    ring's mbarriers are set up (SASS ``SYNCS.EXCH``) or a thread barrier: such set-up in empty
    programs lengthened the merge's end after stage 1's at batch 1 (results/h100/deploy/README.md,
    ``empty-exit/``).  With a host count it runs on: the exit made 132 splits at batch 1 3.4 us
    slower (``bisect-132/host-exit/``), so no exit may come before the set-up."""
    pytest.importorskip("triton.experimental.gluon")
    sass = json.loads(run_compile_script(_SASS, policy_rows, timeout=300).strip().splitlines()[-1])
    exits = [i for i, t in enumerate(sass) if re.fullmatch(r"@!?U?P\d+ EXIT", t.strip())]
    setup = next(i for i, t in enumerate(sass) if "SYNCS.EXCH" in t or "BAR.SYNC" in t)
    assert (bool(exits) and exits[0] < setup) == exits_first, (exits, setup)


_SASS_VARIANT = """
import json, sys
from mlabench.kernels.gluon_splitkv import KernelVariant
from mlabench.kernels.offline_compile import compile_stage1_sm90, sass_instructions
fused = sys.argv[1] == "1"
k = compile_stage1_sm90(2, policy_rows=8, variant=KernelVariant(pdl_prologue=True, fused_merge=fused), num_splits=8)
print(json.dumps([t for _, t in sass_instructions(k.asm["cubin"])]))
"""


@pytest.mark.parametrize("fused, loads", [(False, 1), (True, 4)])
def test_a_device_policys_table_is_loaded_before_the_length_with_the_fused_merge_only(fused, loads):
    """Under a device policy (8 rows, the batch-16 table) the stage 1 of the fused merge issues
    the table's three loads beside the length's, before its first branch (the empty split's): on
    an H100 that took batch 16 at 1K from +3.5% to +0.9-1.6% of the best count.  With the wide
    merge the length's load comes alone and the table's follow in a split that owns pages: loaded
    first, batch 1 ran 2.9-4.1 us slower from 64K (results/h100/deploy/README.md, "The table's
    rows before the length"; both kernels measured there compile to these instructions)."""
    pytest.importorskip("triton.experimental.gluon")
    sass = json.loads(run_compile_script(_SASS_VARIANT, int(fused), timeout=300).strip().splitlines()[-1])
    branch = next(i for i, t in enumerate(sass) if re.fullmatch(r"@!?U?P\d+ (BRA|EXIT).*", t.strip()))
    assert sum(t.lstrip("@!UP0123456789 ").startswith("LDG") for t in sass[:branch]) == loads, sass[:branch]


#: The spellings of a gpu-scope release add in PTX (issue 35 item 6): Triton 3.9 writes the add
#: whose result is unused as ``red.global.gpu.release.add.u32``, Triton 3.8 (and 3.5-3.7) as
#: ``atom.global.gpu.release.add.u32`` with a result no one reads; both order every earlier store
#: of the thread before the add.  A relaxed add after a ``fence.acq_rel.gpu`` / ``fence.sc.gpu``
#: (``membar.gl``) would too.
_RELEASE_ADD = re.compile(r"(?:red|atom)\.global\.gpu\.release\.add\.u32")
_FENCED_ADD = re.compile(r"(?:fence\.(?:acq_rel|sc)\.gpu|membar\.gl);[^\n]*\n(?:\s*//[^\n]*\n)*\s*(?:@%p\d+\s+)?"
                         r"(?:red|atom)(?:\.relaxed)?\.global\.gpu\.add\.u32")


def release_adds(ptx: str) -> int:
    """How many gpu-scope adds of ``ptx`` release (any spelling of :data:`_RELEASE_ADD`, or a
    relaxed add right after a gpu-scope fence)."""
    return len(_RELEASE_ADD.findall(ptx)) + len(_FENCED_ADD.findall(ptx))


def test_release_adds_counts_every_spelling_and_nothing_without_a_release():
    assert release_adds("@%p55 red.global.gpu.release.add.u32 [ %rd272 + 0 ], %r1091;") == 1  # Triton 3.9
    assert release_adds("@%p55 atom.global.gpu.release.add.u32 %r1037, [ %rd177 + 0 ], %r1038;") == 1  # 3.8
    assert release_adds("fence.acq_rel.gpu;\n\t@%p5 red.global.gpu.add.u32 [ %rd2 + 0 ], %r9;") == 1
    for unordered in ("@%p55 red.global.gpu.relaxed.add.u32 [ %rd272 + 0 ], %r1091;",
                      "@%p55 atom.global.gpu.relaxed.add.u32 %r1, [ %rd1 + 0 ], %r2;",
                      "red.global.gpu.add.u32 [ %rd2 + 0 ], %r9;", "atom.global.gpu.acquire.add.u32 %r1, [%rd1], %r2;"):
        assert release_adds(unordered) == 0, unordered


@pytest.mark.parametrize("block_rows,qo_len,splits,wgmma", [
    (16, 1, 132, {"m64n16k16": 36 + 32}), (16, 1, 8, {"m64n16k16": 36 + 32}),
    (64, 4, 8, {"m64n32k16": 36, "m64n64k16": 16}), (64, 8, 2, {"m64n32k16": 36, "m64n64k16": 16}),
])
def test_fused_merge_compiles_to_one_barrier_without_spills(block_rows, qo_len, splits, wgmma):
    """The fused merge in PTX: one acq_rel arrival (a single thread's atom, its result shared),
    the last arrival's release add (count to 0, generation + 1), the others' volatile spin and an
    acquire fence; the page products unchanged; no local memory."""
    kernel = _compile_stage1(2, block_rows, qo_len, qo_len > 1, 0, "m", True, splits)
    ptx = kernel["ptx"]
    assert len(re.findall(r"atom\.global\.gpu\.acq_rel\.add\.u32", ptx)) == 1
    assert release_adds(ptx) == 1
    assert len(re.findall(r"atom\.global", ptx)) == 1 + ptx.count("atom.global.gpu.release.add.u32")
    assert ptx.count("ld.volatile.global.b32") == 2 and ptx.count("fence.acq_rel.gpu") == 1
    found = {m.group(1): ptx.count(m.group(0)) for m in re.finditer(
        r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.f32\.bf16\.bf16", ptx)}
    assert found == wgmma
    assert kernel["shared"] <= 227 * 1024
    if kernel["usage"]:
        assert "LOCAL:0" in kernel["usage"] and "STACK:0" in kernel["usage"], kernel["usage"]
    plain = _compile_stage1(2, block_rows, qo_len, qo_len > 1, 0, "m", False, splits)["ptx"]
    assert "atom.global" not in plain and "fence.acq_rel" not in plain


@pytest.mark.parametrize("block_rows,splits,warps,cols,per_step", [
    (16, 132, 4, 4, 128), (16, 128, 4, 4, 128), (16, 8, 4, 64, 8), (16, 16, 4, 32, 16),
    (16, 1, 4, 512, 1), (64, 8, 8, 64, 4), (64, 2, 8, 256, 1), (32, 40, 8, 8, 64),
])
def test_merge_tiling_gives_each_participant_about_one_chunk(block_rows, splits, warps, cols,
                                                             per_step):
    """Chunks of ``512 / next_pow2(S)`` columns (at least 4), every chunk merged by exactly one
    of the ``S`` participants (or of fewer, when short requests write fewer splits), a loop step
    within 2048 partial elements a warp, and a warp's 32 lanes on the tile with no lane idle."""
    from mlabench.kernels.gluon_fused_merge import MERGE_TILE_PER_WARP, MergeTiling

    mt = MergeTiling.for_launch(block_rows, splits, warps)
    assert (mt.cols, mt.splits) == (cols, per_step)
    assert mt.splits * block_rows * mt.cols <= max(MERGE_TILE_PER_WARP * warps,
                                                   mt.threads[0] * mt.warps[0] * block_rows * 4)
    t_s, t_r, t_c = mt.threads
    assert t_s * t_r * t_c == 32 and t_c * 4 <= mt.cols and t_r * mt.warps[1] <= block_rows
    assert mt.warps[0] * mt.warps[1] == warps
    for participants in {splits, max(1, splits // 3), 1}:
        chunks = sorted(c for p in range(participants) for c in mt.chunks_of(p, participants))
        assert chunks == list(range(512 // mt.cols))


def test_merge_tiling_rejects_bad_tiles():
    from mlabench.kernels.gluon_fused_merge import MergeTiling, fused_merge_fits

    with pytest.raises(ValueError, match="power-of-two row tile"):
        MergeTiling.for_launch(12, 8, 4)
    with pytest.raises(ValueError, match=">= 1 split"):
        MergeTiling.for_launch(16, 0, 4)
    assert fused_merge_fits(132, 132) and not fused_merge_fits(133, 132)
    assert not fused_merge_fits(0, 132)


@pytest.mark.parametrize("rows,want", [(12, (16, 1, 4)), (16, (16, 1, 4)), (24, (32, 1, 8)),
                                       (48, (64, 1, 8)), (64, (64, 1, 8)), (96, (64, 2, 8)),
                                       (129, (64, 3, 8))])
def test_row_tiling_reads_the_cache_once_per_64_rows(rows, want):
    from mlabench.kernels.row_tiling import RowTiling

    tiling = RowTiling.for_rows(rows)
    assert (tiling.block_rows, tiling.row_tiles, tiling.num_warps) == want
    assert tiling.block_rows * tiling.row_tiles >= rows > tiling.block_rows * (tiling.row_tiles - 1)


def test_row_tiling_rejects_no_rows():
    from mlabench.kernels.row_tiling import RowTiling

    with pytest.raises(ValueError, match="at least one"):
        RowTiling.for_rows(0)


def _policy_file(tmp_path):
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"num_kv_splits": {"1": [[256, 1], [8192, 16], [1 << 20, 132]],
                                                  "4": [[4096, 3], [1 << 20, 33]]}}))
    return path


@pytest.mark.parametrize("mode,grid,starts", [("device", 33, [32, 1, 29, 3]),
                                              ("host", 33, [32, 1, 29, 5])])
def test_policy_sizes_workspace_for_its_largest_count(tmp_path, mode, grid, starts):
    """Batch 4 at qo_len 4 (48 packed rows): the grid and the workspace take batch 4's largest
    count (33); each request's split starts follow its own count (device: 20000 -> 33 splits of
    10 pages, 64 -> 3, 9000 -> 33 of 5 pages, 300 -> 3) or the step's one count from the longest
    context (host: 33 for all, so 300 tokens take 5 one-page splits)."""
    from mlabench.inputs import make_inputs

    backend = get_backend("gluon-splitkv")
    shape = MLADecodeShape.create(num_heads=12, context_lens=(20000, 64, 9000, 300), page_size=64,
                                  qo_len=4)
    call = backend.prepare(make_inputs(shape, seed=0),
                           backend.resolve_params(shape, {"split_policy": f"{mode}:{_policy_file(tmp_path)}"}))
    assert call.effective_params["num_kv_splits"] == grid
    assert call.effective_params["split_policy"] == mode
    assert [len(s) for s in call.split_starts] == starts
    assert (call.refresh is None) == (mode == "device")


def test_workspace_shapes_and_fixed_count():
    from mlabench.kernels.workspace import splitkv_workspace_shapes

    assert splitkv_workspace_shapes(4, 48, 33) == ((132, 48, 512), (132, 48))
    backend = get_backend("gluon-splitkv")
    shape = MLADecodeShape.create(num_heads=12, context_lens=(4096, 100), page_size=64, qo_len=8)
    assert backend.supports(shape)[0] and backend.split_programs(shape, {}) == 2


def test_wide_merge_never_reads_an_empty_splits_partial():
    """Stage 1 leaves the partials of a row's empty (last) splits unwritten: NaN there must not
    reach the output, and the merge must still weigh every non-empty split."""
    inp, ref = make_case(12, (300, 64, 1), 64)
    po, pl = page_split_partials(inp, 4)
    po[pl == float("-inf")] = float("nan")
    assert torch.isnan(po).any()  # 64 and 1 token: one page, three empty splits each
    out = inp.new_output()
    wide_merge(po, pl, out, 4, block_dv=64, block_s=2)  # two slot blocks: the bound stops early
    assert max_err(out, ref) < 2e-3


@pytest.mark.parametrize("lens,splits,policy_rows", [
    ((300, 64, 1, 2000), 16, None),
    ((300, 64, 1, 2000), 16, [[256, 1], [1024, 16], [1 << 20, 5]]),
    # Issue 35 item 14: lengths where ceil(pages / S) pages a split leave the last splits empty, so
    # the written count differs from min(pages, S): 32 pages in 12 splits of 3 write 11, 10 pages
    # in 8 splits of 2 write 5, 5 pages in 4 splits of 2 write 3.  At the lengths above every
    # request has the same count either way, and a wrong rule passed.
    ((2000, 640, 320, 1), 12, None),
    ((2000, 640, 320, 1), 12, [[400, 4], [700, 8], [1 << 20, 12]]),
    # a rule row (SplitPolicy.device_table's run of tokens-per-split rows): ceil(L / 128) up to 1024
    ((300, 640, 1, 2000), 16, [[1024, -128], [1536, 9], [1 << 20, 12]]),
    # a workspace of 132 slots a request (a device table's largest count): 1024 tokens write 16,
    # 3000 write 24 (both merged with FEW_SLOTS-sized tiles), 9000 write 71 (the workspace's)
    ((1024, 3000, 1, 9000), 132, [[1024, 16], [4096, 40], [1 << 20, 132]]),
    # 3500 tokens write 55 of the 132 (the workspace's tiles), 2000 write 32 (FEW_SLOTS')
    ((2000, 3500, 1, 9000), 132, [[2048, 32], [3200, 40], [1 << 20, 132]]),
])
def test_wide_merge_from_lengths_reads_only_written_splits(lens, splits, policy_rows):
    """With the lengths (and the device table stage 1 read) the merge reads only the splits that
    own pages: the slots of the others, lse included, may hold NaN (stage 1 writes nothing there),
    and a request of length 0 gets a zero row."""
    inp, ref = make_case(12, lens, 64)
    table, own = None, [splits] * len(lens)
    if policy_rows is not None:  # 4 rows (a power of two), the last repeated as the table pads
        table = torch.tensor(policy_rows + policy_rows[-1:], dtype=torch.int32, device=DEVICE)
        own = [next(count if count > 0 else -(-n // -count) for n_max, count in policy_rows if n <= n_max)
               for n in lens]
    po = torch.full((len(lens) * splits, 12, 512), float("nan"), device=DEVICE)
    pl = torch.full((len(lens) * splits, 12), float("nan"), device=DEVICE)
    discriminating: list[bool] = []
    for b, (n, count) in enumerate(zip(lens, own)):
        p_all, l_all = page_split_partials(inp, count)
        pages = -(-n // 64)
        written = -(-pages // -(-pages // count))  # splits that own a page
        discriminating.append(written != min(pages, count))
        po[b * splits:b * splits + written] = p_all[b * count:b * count + written]
        pl[b * splits:b * splits + written] = l_all[b * count:b * count + written]
    out = inp.new_output()
    wide_merge(po, pl, out, splits, block_dv=64, cache_seqlens=inp.cache_seqlens,
               split_policy=table)
    assert max_err(out, ref) < 2e-3
    assert any(discriminating) or lens == (300, 64, 1, 2000)
    inp.cache_seqlens[2] = 0
    wide_merge(po, pl, out, splits, block_dv=64, cache_seqlens=inp.cache_seqlens,
               split_policy=table)
    assert torch.equal(out[2], torch.zeros_like(out[2]))
