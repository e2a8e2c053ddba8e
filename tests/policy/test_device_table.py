"""Split policies: validation, the lookup rule, the device table, both JSON layouts, and vLLM's
heuristic written as a table."""

from __future__ import annotations

import json

import pytest
import torch

from mlabench.errors import ConfigError
from mlabench.policy.device_table import INT32_MAX, SplitPolicy, heuristic_policy, load_split_policy
from mlabench.policy.heuristics import vllm_triton_splits
from mlabench.policy.tuned import BatchPolicy, Policy, PolicyEntry
from mlabench.shapes import MLADecodeShape

POLICY = SplitPolicy.create({1: [(4096, 4), (32768, 16), (131072, 64)], 16: [(16384, 2), (131072, 8)]})


@pytest.mark.parametrize("batch,length,splits", [
    (1, 1, 4), (1, 4096, 4), (1, 4097, 16), (1, 131072, 64), (1, 10**6, 64),  # past the last: last
    (8, 40000, 64),  # batch 8: the table of batch 1, the largest tuned size <= 8
    (16, 16384, 2), (64, 20000, 8),
])
def test_lookup(batch, length, splits):
    assert POLICY.lookup(batch, length) == splits


def test_smallest_table_below_every_tuned_batch():
    policy = SplitPolicy.create({4: [(100, 3)], 8: [(100, 5)]})
    assert policy.lookup(1, 50) == 3 and policy.max_splits(2) == 3


def test_device_table_pads_to_a_power_of_two():
    table = POLICY.device_table(1, "cpu")
    assert table.dtype == torch.int32 and table.shape == (4, 2)
    assert table.tolist() == [[4096, 4], [32768, 16], [131072, 64], [INT32_MAX, 64]]
    assert POLICY.device_table(16, "cpu").shape == (2, 2)  # already a power of two
    assert SplitPolicy.create({1: [(9, 1)]}).device_table(1, "cpu").tolist() == [[9, 1]]


@pytest.mark.parametrize("tables,match", [
    ({}, "no batch sizes"),
    ({1: []}, r"batch 1: no rows \(give at least one"),  # a review: it said "got []"
    ({1: [(100, 2), (100, 4)]}, "increase strictly"),
    ({1: [(0, 2)]}, "increase strictly"),
    ({1: [(100, 0)]}, "1..512"),
    ({1: [(100, 513)]}, "1..512"),
    ({0: [(100, 1)]}, "batch sizes must be >= 1"),
    ({1: [(100,)]}, "pairs of integers"),
])
def test_create_rejects(tables, match):
    with pytest.raises(ConfigError, match=match):
        SplitPolicy.create(tables)


def test_heuristic_table_is_vllms_rule():
    policy = heuristic_policy(num_sms=132)
    for length in [1, 511, 512, 1023, 1024, 1535, 1536, 2047, 2048, 4096, 5000, 65536, 100000,
                   131072, 135168, 10**6]:
        shape = MLADecodeShape.create(num_heads=12, context_lens=(length,))
        assert policy.lookup(1, length) == vllm_triton_splits(shape, 132), length
    assert policy.max_splits(1) == 264


def test_round_trip_and_both_layouts(tmp_path):
    path = tmp_path / "policy.json"
    path.write_text(POLICY.to_json())
    assert load_split_policy(path).tables == POLICY.tables
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps([[1000, 2], [5000, 8]]))
    assert load_split_policy(bare).lookup(32, 3000) == 8
    tune = tmp_path / "tune.json"  # the tune command's layout; other params are ignored
    entries = [PolicyEntry(max_context_len=8192, params={"num_kv_splits": 8, "block_n": 32}),
               PolicyEntry(max_context_len=131072, params={"num_kv_splits": 32, "block_n": 32})]
    tune.write_text(Policy(backend="triton-splitkv", shape={}, device="H200",
                           param_names=["num_kv_splits", "block_n"],
                           batches=[BatchPolicy(batch=1, entries=entries)]).to_json())
    assert load_split_policy(tune).tables == {1: ((8192, 8), (131072, 32))}


@pytest.mark.parametrize("text,match", [
    ("{", "split policy is not valid JSON"),
    ('{"x": 1}', "expected"),
    ('{"num_kv_splits": {"one": [[1, 1]]}}', "keys must be batch sizes"),
    ('{"backend": "x", "shape": {}, "device": "d", "param_names": ["block_n"], "batches": [{"batch": 1, '
     '"entries": [{"max_context_len": 9, "params": {"block_n": 16}}]}]}', "without num_kv_splits"),
    ('{"batches": []}', "batches"),
])
def test_load_rejects(tmp_path, text, match):
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_split_policy(path)
    with pytest.raises(ConfigError, match="not found"):
        load_split_policy(tmp_path / "missing.json")


def test_a_table_longer_than_the_kernel_holds_is_refused_when_read(tmp_path):
    """Issue 35 item 10: a 2,000,000-row table failed to compile after 90 s; more than
    MAX_POLICY_ROWS rows (or a tune policy's entries) of one batch size is one ConfigError line."""
    from mlabench.policy.rules import MAX_POLICY_ROWS

    rows = [(n, 1 + n % 4) for n in range(1, MAX_POLICY_ROWS + 1)]
    assert len(SplitPolicy.create({1: rows}).device_table(1, "cpu")) == MAX_POLICY_ROWS  # the most still reads
    with pytest.raises(ConfigError, match=f"batch 2: {MAX_POLICY_ROWS + 1} rows, more than the {MAX_POLICY_ROWS}"):
        SplitPolicy.create({1: rows, 2: rows + [(10**6, 2)]})
    entries = [PolicyEntry(max_context_len=n, params={"num_kv_splits": s}) for n, s in rows + [(10**6, 2)]]
    tuned = Policy(backend="triton-splitkv", shape={}, device="cpu", param_names=["num_kv_splits"],
                   batches=[BatchPolicy(batch=1, entries=entries)])
    path = tmp_path / "policy.json"
    path.write_text(tuned.to_json())
    with pytest.raises(ConfigError) as info:
        load_split_policy(path)
    assert str(info.value).startswith(f"{path}: batch 1: {MAX_POLICY_ROWS + 1} entries, more than the {MAX_POLICY_ROWS}")
