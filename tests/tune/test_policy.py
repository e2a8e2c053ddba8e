"""The policy type: lookup, merging, the JSON schema, and the C++/Python exports agreeing."""

from __future__ import annotations

import pytest

from mlabench.errors import ConfigError
from mlabench.policy import (BatchPolicy, Policy, PolicyEntry, load_policy, merge_adjacent, rule_splits,
                             split_count_rows, to_cpp_header, write_exports)
from tests.tune.helpers import export_lookups


def entry(max_len: int, splits: int, tokens_per_split: int | None = None, **launch) -> PolicyEntry:
    return PolicyEntry(max_context_len=max_len, params={"num_kv_splits": splits, "block_n": "32", **launch},
                       tokens_per_split=tokens_per_split)


def make_policy() -> Policy:
    """Fixed counts and tokens-per-split entries (one of them the last of its batch size)."""
    return Policy(backend="triton-splitkv", shape={"num_heads": 12, "page_size": 64, "kv_dtype": "bfloat16"},
                  device="test", param_names=["num_kv_splits", "block_n"],
                  batches=[BatchPolicy(batch=1, entries=[entry(1024, 32), entry(4096, 128, 32),
                                                         entry(16384, 128), entry(131072, 256)]),
                           BatchPolicy(batch=16, entries=[entry(4096, 8, block_n="64"), entry(65536, 16),
                                                          entry(131072, 24, 4096)])])


def test_merge_adjacent_keeps_coverage():
    merged = merge_adjacent([entry(1024, 32), entry(4096, 64), entry(8192, 64), entry(16384, 64),
                             entry(32768, 128), entry(65536, 64)])
    assert [(e.max_context_len, e.params["num_kv_splits"]) for e in merged] == [
        (1024, 32), (16384, 64), (32768, 128), (65536, 64)]
    assert merge_adjacent([entry(10, 1), entry(20, 1)]) == [entry(20, 1)]


def test_lookup_rule():
    p = make_policy()
    assert p.lookup(1, 1)["num_kv_splits"] == 32
    assert p.lookup(1, 1024)["num_kv_splits"] == 32
    assert p.lookup(1, 1025)["num_kv_splits"] == 33            # ceil(1025 / 32): scales with the length
    assert p.lookup(1, 4096)["num_kv_splits"] == 128           # ... up to its num_kv_splits
    assert p.lookup(1, 4097)["num_kv_splits"] == 128
    assert p.lookup(16, 10**7)["num_kv_splits"] == 24          # the last entry's rule goes on, capped
    assert p.lookup(16, 65537)["num_kv_splits"] == 17
    assert p.lookup(1, 10**7)["num_kv_splits"] == 256          # past the last bucket: the last entry
    assert p.lookup(8, 2000)["num_kv_splits"] == 63            # largest tuned batch <= 8 is 1
    assert p.lookup(64, 100)["block_n"] == "64"                # largest tuned batch <= 64 is 16
    with pytest.raises(ValueError):
        p.lookup(0, 100)


def test_policy_rejects_unsorted_and_inconsistent_tables():
    with pytest.raises(ValueError, match="increase"):
        BatchPolicy(batch=1, entries=[entry(4096, 8), entry(1024, 4)])
    with pytest.raises(ValueError, match="param_names"):
        Policy(backend="b", shape={}, device="d", param_names=["num_kv_splits"],
               batches=[BatchPolicy(batch=1, entries=[entry(10, 1)])])
    with pytest.raises(ValueError, match="needs an integer num_kv_splits"):
        PolicyEntry(max_context_len=10, params={"block_n": "32"}, tokens_per_split=16)


def test_merge_keeps_rules_apart():
    assert merge_adjacent([entry(10, 8, 16), entry(20, 8, 16), entry(30, 8)]) == [entry(20, 8, 16), entry(30, 8)]
    assert rule_splits(1, 64, 8) == 1 and rule_splits(65, 64, 8) == 2 and rule_splits(10**6, 64, 8) == 8


def test_split_count_rows_give_the_lookup_count_at_every_length():
    from mlabench.split_policy import SplitPolicy

    p = make_policy()
    for b in p.batches:
        table = SplitPolicy.create({1: split_count_rows(b.entries)})
        for n in [*range(1, 5000), *range(60000, 70000, 7), 131072, 131073, 200000, 10**7]:
            assert table.lookup(1, n) == p.lookup(b.batch, n)["num_kv_splits"], (b.batch, n)


def test_json_round_trip_and_schema_errors(tmp_path):
    p = make_policy()
    paths = write_exports(p, tmp_path)
    assert load_policy(paths["json"]) == p
    assert '"tokens_per_split": 32' in p.to_json() and p.to_json().count("tokens_per_split") == 2  # fixed: absent
    bad = tmp_path / "bad.json"
    bad.write_text(p.to_json().replace('"schema_version": 2', '"schema_version": 99'))
    with pytest.raises(ConfigError, match="schema_version 99"):
        load_policy(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_policy(tmp_path / "missing.json")


def test_version_1_file_is_read():
    """A policy written before tokens_per_split (the committed first H200 attempt) reads as version 2."""
    from pathlib import Path

    path = Path(__file__).parents[2] / "results/h200/tune-kimi-k3-tp8/first-attempt/policy.json"
    assert '"schema_version": 1' in path.read_text()
    p = load_policy(path)
    assert p.schema_version == 2 and all(e.tokens_per_split is None for b in p.batches for e in b.entries)
    assert p.lookup(1, 2381)["num_kv_splits"] == 69 and p.lookup(16, 50000)["num_kv_splits"] == 16


LENGTHS = [1, 63, 64, 1023, 1024, 1025, 1500, 4095, 4096, 4097, 16384, 16385, 65537, 100000, 131072, 131073,
           10**6]
BATCHES = [1, 2, 15, 16, 17, 64]


def test_exports_agree(tmp_path):
    """The C++ header (compiled with g++), the Python module and the JSON give the same choice."""
    p = make_policy()
    got = export_lookups(p, tmp_path, BATCHES, LENGTHS)
    assert got["json"] == got["python"] == got["cpp"]
    assert got["json"][:2] == [(1, 1, 32, "32"), (1, 63, 32, "32")]
    assert [r[2] for r in got["json"] if r[0] == 1 and 1024 < r[1] <= 4096] == [33, 47, 128, 128]   # the rule
    assert "constexpr" in to_cpp_header(p)
