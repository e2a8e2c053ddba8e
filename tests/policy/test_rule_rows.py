"""Device tables store a run of tokens-per-split rows as one rule row ``(max_context_len, -t)``
(:func:`mlabench.policy.device_table.rule_rows`): the kernels' lookup on such a table
(:func:`~mlabench.policy.device_table.table_splits`) must give :meth:`SplitPolicy.lookup`'s count at
every length.  Why: the rule policy's 324 rows at batch 1 made a 512-row table, which ran 1.0-1.7
µs a call slower on an H200 than a 12-row table choosing the same counts (at 1K, 4K and 8K)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mlabench.policy.device_table import INT32_MAX, SplitPolicy, load_split_policy, rule_rows, table_splits
from mlabench.policy.tuned import BatchPolicy, Policy, PolicyEntry

DEPLOY = Path(__file__).resolve().parents[2] / "results" / "h200" / "deploy" / "qo1-k3"
RULE = DEPLOY / "rule" / "policy.json"
BUCKETS = DEPLOY / "tune-kimi-k3-tp8-20261205-122236-527" / "policy.json"


def expanded_counts(policy: SplitPolicy, batch: int, lengths: np.ndarray) -> np.ndarray:
    """:meth:`SplitPolicy.lookup` at every length, on the policy's own (expanded) rows, vectorised
    (checked against ``lookup`` itself at a sample of lengths)."""
    rows = np.array(policy.rows_for(batch), dtype=np.int64)
    counts = rows[np.minimum(np.searchsorted(rows[:, 0], lengths, side="left"), len(rows) - 1), 1]
    for i in range(0, len(lengths), 997):
        assert counts[i] == policy.lookup(batch, int(lengths[i])), lengths[i]
    return counts


def assert_exact(policy: SplitPolicy, batch: int, lengths: np.ndarray) -> torch.Tensor:
    """The device table of ``batch`` decodes to the lookup's count at every one of ``lengths``,
    with the grid's cap at the policy's largest count and past it; returns the table."""
    table = policy.device_table(batch, "cpu")
    size = table.shape[0]
    assert size & (size - 1) == 0 and size >= len(rule_rows(policy.rows_for(batch)))
    expect = torch.from_numpy(expanded_counts(policy, batch, lengths))
    for cap in (policy.max_splits(batch), 512):
        assert torch.equal(table_splits(table, torch.from_numpy(lengths), cap), expect), cap
    return table


LENGTHS = np.concatenate([np.arange(1, 140_001), [10**6, INT32_MAX]]).astype(np.int64)


def test_rule_policy_table_is_one_row_per_entry_and_exact():
    policy = load_split_policy(RULE)
    assert len(policy.rows_for(1)) == 324  # expanded: one row per count
    compressed = rule_rows(policy.rows_for(1))
    assert len(compressed) == 18 and compressed[-1] == (131072, 128)  # the last row stays a count
    table = assert_exact(policy, 1, LENGTHS)
    assert table.shape == (32, 2)  # was 512 rows
    assert table[len(compressed):].tolist() == [[INT32_MAX, 128]] * (32 - len(compressed))
    assert_exact(policy, 16, LENGTHS)
    assert rule_rows(policy.rows_for(16)) == list(policy.rows_for(16))  # fixed counts: no run


def test_per_bucket_policy_table_is_unchanged():
    policy = load_split_policy(BUCKETS)
    for batch in policy.tables:
        assert rule_rows(policy.rows_for(batch)) == list(policy.rows_for(batch))
        assert_exact(policy, batch, LENGTHS)


def test_rule_entries_in_the_middle_and_at_the_end(tmp_path):
    """A fixed entry, a tokens-per-split one, a fixed one, a tokens-per-split last one: each rule
    becomes one row; the last entry's final row (its cap, kept past its length) stays a count."""
    entries = [PolicyEntry(max_context_len=1000, params={"num_kv_splits": 4}),
               PolicyEntry(max_context_len=5000, params={"num_kv_splits": 40}, tokens_per_split=256),
               PolicyEntry(max_context_len=6000, params={"num_kv_splits": 12}),
               PolicyEntry(max_context_len=20000, params={"num_kv_splits": 64}, tokens_per_split=512)]
    path = tmp_path / "policy.json"
    path.write_text(Policy(backend="gluon-splitkv", shape={}, device="H200", param_names=["num_kv_splits"],
                           batches=[BatchPolicy(batch=1, entries=entries)]).to_json())
    policy = load_split_policy(path)
    assert rule_rows(policy.rows_for(1)) == [(1024, 4), (5000, -256), (6144, 12), (32256, -512), (32257, 64)]
    table = assert_exact(policy, 1, LENGTHS)
    assert table.shape == (8, 2) and policy.lookup(1, 10**6) == 64


@pytest.mark.parametrize("rows,compressed", [
    ([(64, 1), (128, 2), (192, 3)], [(128, -64), (192, 3)]),  # never the final row
    ([(64, 1), (128, 2)], [(64, 1), (128, 2)]),  # a run of one row stays as it is
    # 1..100 is not ceil(L / 64), 101..164 not either
    ([(100, 2), (164, 3), (228, 4), (300, 9)], [(100, 2), (164, 3), (228, 4), (300, 9)]),
    ([(100, 1), (200, 2), (300, 3), (350, 7), (400, 5)], [(300, -100), (350, 7), (400, 5)]),
    ([(100, 1), (200, 2), (300, 3), (350, 4), (400, 5)], [(350, -100), (400, 5)]),  # 301..350: 4 too
])
def test_rule_rows(rows, compressed):
    assert rule_rows(rows) == compressed
    assert_exact(SplitPolicy.create({1: rows}), 1, np.arange(1, 1000, dtype=np.int64))
