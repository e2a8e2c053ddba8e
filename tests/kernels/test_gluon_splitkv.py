"""CPU tests of the Hopper Gluon split-KV backend's parts.

The Gluon kernel has no CPU interpreter: here it is compiled for sm_90 (Triton bundles ptxas) and
its PTX is checked for the instructions the design relies on; the wide merge runs on partials
computed in torch over page-granular splits (compiled on a GPU, in Triton's interpreter without
one).  tests/gpu/ runs the kernel.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mlabench.backends import get_backend
from mlabench.backends import gluon as _gluon_backend  # noqa: F401  (registers gluon-splitkv)
from mlabench.backends.gluon import default_gluon_splits
from mlabench.kernels.wide_merge import merge_blocks, wide_merge
from mlabench.shapes import MLADecodeShape
from tests.kernels.helpers import DEVICE, INTERPRETED, make_case, max_err

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
import json, sys
from mlabench.kernels.gluon_splitkv import compile_stage1_sm90
k = compile_stage1_sm90(int(sys.argv[1]))
print(json.dumps({"ptx": k.asm["ptx"], "shared": k.metadata.shared}))
"""


def _compile_stage1(num_stages: int) -> dict:
    """Compile stage 1 for sm_90 in a fresh process (no interpreter state, no GPU needed)."""
    pytest.importorskip("triton.experimental.gluon")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                         env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", _COMPILE, str(num_stages)], capture_output=True,
                         text=True, env=env, timeout=300)
    if run.returncode != 0 and "ptxas" in run.stderr and "not found" in run.stderr:
        pytest.skip("this Triton build has no ptxas")
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


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
