"""The kernels' split-policy lookup (:func:`mlabench.kernels.common.policy_splits`, which the merge
and ``triton-splitkv`` run; the Gluon stage 1's :func:`~mlabench.kernels.gluon_blocks.lookup_splits`
is the same rule, checked by the GPU tests) against the host's
:func:`~mlabench.policy.device_table.table_splits` at every length around every row's bound.

The lookup finds the row whose range ``(previous max, own max]`` holds the length in one reduction
over at least 32 lanes, and divides only on a rule row: this checks that the masked lanes, the
padding rows, the last row's open range and the rule rows give the host's count, in the Triton
interpreter without a GPU.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from mlabench.kernels.common import policy_splits
from mlabench.policy.device_table import SplitPolicy, table_splits
from tests.kernels.helpers import DEVICE


@triton.jit
def _lookup_kernel(lens_ptr, policy_ptr, out_ptr, cap, POLICY_ROWS: tl.constexpr):
    i = tl.program_id(0)
    tl.store(out_ptr + i, policy_splits(tl.load(lens_ptr + i), policy_ptr, cap, POLICY_ROWS))


def kernel_counts(table: torch.Tensor, lengths: torch.Tensor, cap: int) -> torch.Tensor:
    """The kernel's count for each of ``lengths`` (int32, on the host), one program each."""
    lens = lengths.to(DEVICE, torch.int32)
    out = torch.empty_like(lens)
    _lookup_kernel[(lens.numel(),)](lens, table.to(DEVICE), out, cap, POLICY_ROWS=table.shape[0])
    return out.cpu()


def around_bounds(table: torch.Tensor) -> torch.Tensor:
    """1, 2, and each real row's ``max_context_len`` - 1, itself and + 1 (padding rows excluded)."""
    bounds = [int(x) for x in table[:, 0] if int(x) < 2**31 - 1]
    return torch.tensor(sorted({1, 2} | {b + d for b in bounds for d in (-1, 0, 1) if b + d >= 1}))


#: (rows of batch 1): one row; three (a 4-row table); a rule row between counts; 33 rows (64 lanes)
TABLES = {
    "one": [(4096, 24)],
    "three": [(1024, 16), (2048, 32), (1048576, 128)],
    "rule": [(64, 1), (128, 2), (192, 3), (256, 4), (320, 5), (1024, 16), (65536, 64)],
    "many": [(100 * (i + 1), i + 1) for i in range(32)] + [(131072, 66)],
}


@pytest.mark.parametrize("name", sorted(TABLES))
def test_lookup_matches_the_host_at_every_bound(name):
    policy = SplitPolicy.create({1: TABLES[name]}, source=name)
    table = policy.device_table(1, "cpu")
    lengths = around_bounds(table)
    for cap in (policy.max_splits(1), 8):  # the grid's count, and a cap below some rows' counts
        expect = table_splits(table, lengths.to(torch.int64), cap).to(torch.int32)
        assert torch.equal(kernel_counts(table, lengths, cap), expect), (name, cap)


def test_a_rule_row_is_a_row_of_the_table():
    """The "rule" table really holds a rule row (``-64``: 64 tokens a split), so its division ran."""
    table = SplitPolicy.create({1: TABLES["rule"]}, source="rule").device_table(1, "cpu")
    assert (table[:, 1] < 0).any()
