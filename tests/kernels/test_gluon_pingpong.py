"""CPU tests of gluon-splitkv's ping-pong stage 1 (``multi_token=3``): compiled for sm_90 here
(Triton bundles ptxas and cuobjdump; no GPU, no interpreter), its PTX and SASS checked for the
structure it relies on.  tests/gpu/test_gluon_multi_token.py runs it against the fp32 reference."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton.experimental.gluon")
import triton  # noqa: E402

from mlabench.kernels.gluon_splitkv import KernelVariant  # noqa: E402

#: Local-memory accesses (LDL/STL) a page loop may hold: none under Triton 3.6, what the H200
#: runs; 3.9 spills 104 bytes and keeps 20-24 of them in one warpgroup's loop.
LOOP_LOCAL_MAX = 0 if triton.__version__.startswith("3.6") else 24

_COMPILE = """
import json, re, sys
from mlabench.kernels.offline_compile import compile_pingpong_sm90, mma_loops
k = compile_pingpong_sm90(int(sys.argv[1]), causal=sys.argv[2] == "1", policy_rows=int(sys.argv[3]))
ptx = k.asm["ptx"]
print(json.dumps({"shared": k.metadata.shared, "loops": mma_loops(k.asm["cubin"]),
                  "wgmma": re.findall(r"wgmma\\.mma_async\\.sync\\.aligned\\.(m64n\\d+k16)", ptx),
                  "regs": re.findall(r"setmaxnreg\\.(inc|dec)\\.sync\\.aligned\\.u32\\s+(\\d+)", ptx),
                  "reqntid": re.search(r"\\.reqntid (\\d+)", ptx).group(1)}))
"""


def _compile(qo_len: int, causal: bool, policy_rows: int) -> dict:
    """Compile in a fresh process (no interpreter state)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                         env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", _COMPILE, str(qo_len), str(int(causal)),
                          str(policy_rows)], capture_output=True, text=True, env=env, timeout=600)
    if run.returncode != 0 and "ptxas" in run.stderr and "not found" in run.stderr:
        pytest.skip("this Triton build has no ptxas")
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("qo_len,causal,policy_rows", [(8, True, 0), (4, False, 16)])
def test_pingpong_compiles_two_math_warpgroups(qo_len, causal, policy_rows):
    """Each math warpgroup's page: the scores as 36 ``m64n64k16`` (rows as M, 576 deep), its 256
    output columns as 4 ``m64n256k16`` a page (3 score chains: warpgroup 0's first page, then
    each warpgroup's loop; 7 output chains: the first page, each loop's two, each warpgroup's
    last page of the other's); 240 registers a math warpgroup and 24 the loader in 12 warps;
    the shared memory within the 227 KB a block may have; no local memory in either loop."""
    k = _compile(qo_len, causal, policy_rows)
    counts = {shape: k["wgmma"].count(shape) for shape in set(k["wgmma"])}
    assert counts == {"m64n64k16": 3 * 36, "m64n256k16": 7 * 4}
    assert k["reqntid"] == "384"
    regs = {tuple(r) for r in k["regs"]}
    assert {("inc", "240"), ("dec", "240"), ("dec", "24")} <= regs
    assert k["shared"] <= 227 * 1024
    page_loops = [loop for loop in k["loops"] if loop[1] == 36 + 8]  # scores, other's, own
    assert len(page_loops) == 2, k["loops"]
    assert max(loop[2] for loop in page_loops) <= LOOP_LOCAL_MAX, k["loops"]


@pytest.mark.parametrize("rows,stages,want", [(12, 2, None), (24, 2, 1), (48, 2, 3), (96, 1, 3)])
def test_pingpong_runs_on_64_row_tiles_only(rows, stages, want):
    variant = KernelVariant(multi_token=3)
    assert variant.multi_token_runs(rows, stages) == want
    assert variant.pingpong_runs(rows) == (want == 3)
    assert KernelVariant(multi_token=3, rows_as_m=2).rows_as_m_runs(rows) == 0
    assert KernelVariant(multi_token=2).multi_token_runs(96, 1) == 1
    assert KernelVariant(multi_token=2).multi_token_runs(96, 2) == 2
