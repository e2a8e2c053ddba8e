"""The wide merge's programmatic-dependent-launch wait, compiled for sm_90 without a GPU: the
count of a request's written splits (the divisions of ``written_splits``) is computed before
``griddepcontrol.wait`` (SASS ``ACQBULK``), where its latency overlaps stage 1.  Under Triton
3.6 ptxas sank two of the three divisions' reciprocals past a plain ``gdc_wait``; on an H100 the
pinned order took 0.10-0.22 us off a batch-1 call (results/h100/deploy/merge-pin/)."""

from __future__ import annotations

import json

import pytest

from tests.kernels.helpers import run_compile_script

_COMPILE = """
import json, sys
from mlabench.kernels.offline_compile import compile_wide_merge_sm90, sass_instructions
k = compile_wide_merge_sm90(int(sys.argv[1]), pdl=sys.argv[2] == "1")
print(json.dumps([t for _, t in sass_instructions(k.asm["cubin"])]))
"""


def _sass(policy_rows: int, pdl: bool) -> list[str]:
    """The merge's SASS instructions, compiled in a fresh process (no interpreter state)."""
    out = run_compile_script(_COMPILE, policy_rows, int(pdl))
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("policy_rows", [16, 64])
def test_written_count_is_computed_before_the_wait(policy_rows):
    """Every reciprocal of the integer divisions (a ``MUFU.RCP`` of an ``I2F.RP``: the policy
    rule's, pages per split, written splits; not the output's fp32 normalisation) precedes the
    one ``ACQBULK``, and a partial or lse load follows it."""
    sass = _sass(policy_rows, pdl=True)
    waits = [i for i, t in enumerate(sass) if "ACQBULK" in t]
    assert len(waits) == 1, waits
    rcp = [i for i, t in enumerate(sass)
           if "MUFU.RCP" in t and any("I2F.RP" in u for u in sass[max(0, i - 12):i])]
    assert len(rcp) == 3 and max(rcp) < waits[0], (rcp, waits)
    loads = [i for i, t in enumerate(sass) if "LDG" in t]
    assert any(i > waits[0] for i in loads)


def test_no_wait_without_pdl():
    assert not any("ACQBULK" in t for t in _sass(16, pdl=False))


_SHARED = """
import sys
from mlabench.kernels.offline_compile import compile_wide_merge_sm90
print(compile_wide_merge_sm90(16, from_lengths=sys.argv[1] == "1").metadata.shared)
"""


def test_the_slot_tiers_take_no_shared_memory_of_their_own():
    """The merge with its 32-slot tier (the lengths given) holds no more shared memory a program
    than the one-tier merge: a 64-slot tier's loop of its own (74e251b) took 33.8 KB at batch 1
    against 17.4 (one merge program beside a stage-1 CTA instead of three) and cost batch 1 at 132
    splits from the host 1.8-2.9 us on an H100 (results/h100/deploy/README.md, bisect-132).  Fails
    on that kernel (33792 against 17408 bytes under Triton 3.9)."""
    tiered, one_tier = (int(run_compile_script(_SHARED, flag).strip().splitlines()[-1]) for flag in (1, 0))
    assert tiered == one_tier, (tiered, one_tier)
