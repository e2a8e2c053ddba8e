"""Row tiles of 16, 32 and 64 packed query rows in the Triton kernels (one pass over the cache for
up to 64 rows of a request): the tile choice, correctness compiled on a GPU or in the interpreter
without one (fp16: the interpreter's bf16 dots are wrong), and the sm_90 compile of each tile's
default launch without spills in the token loop.

Contexts include lengths shorter than ``qo_len + 1`` (under the causal mask the first query tokens
of such a request see one key, or none) and more splits than short requests have tokens (empty
splits); every workspace, output and unread cache slot is poisoned with NaN.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mlabench.backends import get_backend
from mlabench.backends.triton import ROWS_PER_TILE, resolve_rows_per_tile
from mlabench.errors import ConfigError
from mlabench.inputs import make_inputs
from mlabench.kernels.persistent import alloc_persistent_workspace, mla_decode_persistent
from mlabench.kernels.reference import mla_decode_reference
from mlabench.kernels.triton_launch import (
    CUDA_LAUNCH, ROCM_LAUNCH, ROW_TILES, choose_rows_per_tile, default_launch_for, row_tiles,
)
from mlabench.kernels.splitkv import mla_decode_splitkv
from mlabench.kernels.worklist import build_work_list
from mlabench.shapes import MLADecodeShape
from mlabench.policy.device_table import SplitPolicy
from tests.kernels.helpers import DEVICE, TOL, max_err
from tests.kernels.test_splitkv_policy import assert_own_counts

#: One token, a block's worth, one past it, and several 16-token pages.
LENS = (1, 3, 8, 9, 37, 70)


def test_auto_tile_is_the_smallest_that_holds_the_rows():
    assert [choose_rows_per_tile(r) for r in (1, 12, 16, 17, 24, 32, 33, 48, 64, 65, 96)] == \
        [16, 16, 16, 32, 32, 32, 64, 64, 64, 64, 64]
    assert choose_rows_per_tile(12, 64) == 64 and choose_rows_per_tile(96, 16) == 16
    assert [row_tiles(r, t) for r, t in ((12, 16), (48, 16), (48, 64), (96, 64), (96, 32))] == [1, 3, 1, 2, 3]
    for bad in (8, 48, 128):
        with pytest.raises(ValueError, match="rows_per_tile must be one of"):
            choose_rows_per_tile(48, bad)
    with pytest.raises(ValueError, match="at least one query row"):
        choose_rows_per_tile(0)


def test_one_token_keeps_the_launch_of_before():
    """Up to 16 rows: the 16-row tile and the launch timed on the H200 (32-token tiles, 4 warps,
    6 stages; 2 stages on ROCm)."""
    from mlabench.kernels.common import DEFAULT_BLOCK_N, DEFAULT_NUM_STAGES, DEFAULT_NUM_WARPS, ROCM_NUM_STAGES

    assert (DEFAULT_BLOCK_N, DEFAULT_NUM_WARPS, DEFAULT_NUM_STAGES, ROCM_NUM_STAGES) == (32, 4, 6, 2)
    assert default_launch_for(16, rocm=False) == (32, 4, 6)
    assert default_launch_for(16, rocm=True) == (32, 4, 2)
    assert set(CUDA_LAUNCH) == set(ROCM_LAUNCH) == set(ROW_TILES)


def test_backend_parameter():
    assert ROWS_PER_TILE.validate("auto") == "auto"
    assert ROWS_PER_TILE.validate(64) == "64" and ROWS_PER_TILE.validate(" 32") == "32"
    for bad in ("48", "sixty", 8, ""):
        with pytest.raises(ConfigError, match="rows_per_tile must be auto or one of 16, 32, 64"):
            ROWS_PER_TILE.validate(bad)
    assert not ROWS_PER_TILE.choices  # tune and check keep it at its default
    be = get_backend("triton-splitkv")
    for qo_len, tile, programs, tokens in ((1, 16, 1, 32), (2, 32, 1, 32), (4, 64, 1, 16), (8, 64, 2, 16)):
        s = MLADecodeShape.create(num_heads=12, context_lens=(100,), qo_len=qo_len)
        params = be.resolve_params(s, {"rows_per_tile": "auto"})
        assert resolve_rows_per_tile(params, qo_len * 12) == tile
        assert be.split_programs(s, params) == programs
        assert be.split_tile_tokens(s, params) == tokens
        default = be.resolve_params(s)  # 16-row tiles: faster on an H200 at batch 16
        assert resolve_rows_per_tile(default, qo_len * 12) == 16
        assert be.split_programs(s, default) == -(-qo_len * 12 // 16)


def case(qo_len: int, heads: int, lens=LENS, seed: int = 0):
    """fp16 inputs on :data:`DEVICE` (built non-causal: contexts may be shorter than the block)
    and the fp32 references of both masks, ``{causal: [B * qo_len, H, 512]}``."""
    shape = MLADecodeShape.create(num_heads=heads, context_lens=lens, qo_len=qo_len, causal=False,
                                  page_size=16, q_dtype="float16", kv_dtype="float16")
    inp = make_inputs(shape, device=DEVICE, seed=seed)
    refs = {c: mla_decode_reference(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens,
                                    shape.scale, qo_len=qo_len, causal=c)[0] for c in (True, False)}
    return inp, refs


def run_splitkv(inp, qo_len, causal, splits, tile, policy=None):
    """Split-KV decode at the tile's default launch; the partials are the first slots of a
    NaN-filled buffer one slot longer, so a write past the ``[B * S, rows, 512]`` workspace shows.
    Returns ``(out, partial_lse, spare slot)``."""
    rows = qo_len * inp.shape.num_heads
    slots = inp.shape.batch * splits
    buf_o = torch.full(((slots + 1) * rows * 512,), float("nan"), device=DEVICE)
    buf_l = torch.full(((slots + 1) * rows,), float("nan"), device=DEVICE)
    part_o, part_lse = buf_o[:slots * rows * 512].view(slots, rows, 512), buf_l[:slots * rows].view(slots, rows)
    out = inp.new_output()
    mla_decode_splitkv(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens, out, splits,
                       inp.shape.scale, partial_out=part_o, partial_lse=part_lse, split_policy=policy,
                       qo_len=qo_len, causal=causal, rows_per_tile=tile)
    return out, part_lse, (buf_o[slots * rows * 512:], buf_l[slots * rows:])


@pytest.mark.parametrize("qo_len, heads, tile", [
    (1, 12, None),   # 12 rows: the 16-row tile
    (2, 12, None),   # 24 rows in a 32-row tile
    (4, 12, None),   # 48 rows in a 64-row tile
    (8, 12, None),   # 96 rows: a full 64-row tile and a partial one
    (4, 16, None),   # 64 rows: one full tile
    (2, 16, 16),     # 32 rows in two 16-row tiles (the tiles of before)
    (4, 12, 32),     # 48 rows in a full and a partial 32-row tile
    (1, 12, 64),     # one token in a 64-row tile
])
def test_splitkv_row_tiles(qo_len, heads, tile):
    """Both masks, with empty splits (6 splits of 1- to 9-token requests); no write past the
    workspace."""
    inp, refs = case(qo_len, heads)
    for causal in (True, False):
        out, _lse, (spare_o, spare_l) = run_splitkv(inp, qo_len, causal, 6, tile)
        assert max_err(out, refs[causal]) < TOL["float16"], causal
        assert torch.isnan(spare_o).all() and torch.isnan(spare_l).all()


def test_splitkv_row_tiles_see_the_causal_mask():
    """The 64-row tile without the mask is wrong on the rows the mask changes, and right on each
    request's last token (which sees every key either way)."""
    inp, refs = case(4, 12)
    out, _, _ = run_splitkv(inp, 4, False, 2, None)
    assert max_err(out, refs[False]) < TOL["float16"]
    assert max_err(out, refs[True]) > 0.05
    last = torch.arange(3, 4 * len(LENS), 4, device=DEVICE)
    assert max_err(out[last], refs[True][last]) < TOL["float16"]


def test_splitkv_device_policy_with_two_64_row_tiles():
    """qo_len 8 x 12 heads = 96 rows, two 64-row tiles, each request's own split count looked up
    on the device: only its own slots are written and read."""
    lens = (9, 37, 70, 300)
    inp, refs = case(8, 12, lens=lens, seed=1)
    policy = SplitPolicy.create({4: [[16, 1], [64, 3], [100000, 5]]}, "test")
    out, lse, _ = run_splitkv(inp, 8, True, 6, None, policy=policy.device_table(4, DEVICE))
    assert max_err(out, refs[True]) < TOL["float16"]
    assert_own_counts(lse, [policy.lookup(4, n) for n in lens], cap=6)


def run_persistent(inp, qo_len, causal, programs, tile):
    """The persistent kernel on unpadded packed rows, NaN-poisoned output and partials."""
    rows = qo_len * inp.shape.num_heads
    out = inp.new_output()
    part_o, part_lse = alloc_persistent_workspace(programs, inp.shape.batch, rows, DEVICE)
    part_o.fill_(float("nan"))
    part_lse.fill_(float("nan"))
    work = build_work_list(inp.cache_seqlens, programs, 16)
    return mla_decode_persistent(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens, out,
                                 inp.shape.scale, programs, work=work, partial_out=part_o,
                                 partial_lse=part_lse, qo_len=qo_len, causal=causal,
                                 rows_per_tile=tile)


@pytest.mark.parametrize("qo_len, tile", [(2, None), (4, None), (8, None), (4, 16)])
def test_persistent_row_tiles_without_padding(qo_len, tile):
    """12 heads unpadded: 24, 48 or 96 rows in 32- or 64-row tiles (48 in three 16-row ones),
    5 programs whose segments cross request boundaries."""
    inp, refs = case(qo_len, 12)
    for causal in (True, False):
        assert max_err(run_persistent(inp, qo_len, causal, 5, tile), refs[causal]) < TOL["float16"], causal


@pytest.mark.parametrize("name, params", [("triton-splitkv", {"num_kv_splits": 3}),
                                          ("triton-persistent", {"programs_per_sm": 1})])
@pytest.mark.parametrize("rows_per_tile", ["auto", "16", None])
def test_backends_take_the_row_tile(name, params, rows_per_tile):
    """qo_len 4 x 12 heads through the backends: one 64-row tile with auto, three 16-row ones
    asked for or by default (None); the persistent backend no longer pads heads at several
    tokens."""
    shape = MLADecodeShape.create(num_heads=12, context_lens=(4, 70), qo_len=4, page_size=16,
                                  q_dtype="float16", kv_dtype="float16")
    inp = make_inputs(shape, device=DEVICE, seed=3)
    ref, _ = mla_decode_reference(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens,
                                  shape.scale, qo_len=4, causal=True)
    be = get_backend(name)
    assert be.supports(shape) == (True, "")
    asked = params if rows_per_tile is None else {**params, "rows_per_tile": rows_per_tile}
    call = be.prepare(inp, be.resolve_params(shape, asked))
    assert call.out.shape == (8, 12, 512) and torch.isnan(call.out).all()
    assert max_err(call.fn(), ref) < TOL["float16"]
    assert call.effective_params["rows_per_tile"] == (64 if rows_per_tile == "auto" else 16)
    if name == "triton-persistent":
        assert call.effective_params["padded_heads"] == 12
        assert call.effective_params["block_n"] == (16 if rows_per_tile == "auto" else 32)


_COMPILE = """
import dataclasses, json
from mlabench.kernels.offline_compile import stage1_resources
from mlabench.kernels.triton_launch import ROW_TILES
rows = [dataclasses.asdict(stage1_resources(kernel, tile, policy_rows=policy))
        for tile in ROW_TILES for kernel, policy in (("splitkv", 0), ("splitkv", 8), ("persistent", 0))]
print(json.dumps(rows))
"""


def test_default_launches_do_not_spill_in_the_token_loop_on_sm90():
    """Each row tile's default launch compiled for sm_90 (Triton's bundled ptxas, no GPU needed,
    in a process without the interpreter): the split-KV kernel spills nothing, the persistent one
    nothing in its token loop (its 64-row tile spills outside it, once per segment), and one
    program fits in an H200 SM's 227 KB of shared memory."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, env=env,
                         timeout=300)
    if run.returncode != 0 and "ptxas" in run.stderr and ("not found" in run.stderr or "No such file" in run.stderr):
        pytest.skip("this Triton build has no ptxas")
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(rows) == 3 * len(ROW_TILES)
    for r in rows:
        assert tuple(r["launch"]) == CUDA_LAUNCH[r["rows_per_tile"]]
        assert r["token_loop_spills"] == 0, r
        assert r["shared_bytes"] <= 227 * 1024, r
        if r["kernel"] == "splitkv":
            assert r["spill_bytes"] == 0, r

