"""The policy type: lookup, merging, the JSON schema, and the C++/Python exports agreeing."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlabench.errors import ConfigError
from mlabench.policy.exports import to_cpp_header, write_exports
from mlabench.policy.rules import rule_splits, whole_tile_splits
from mlabench.policy.tuned import BatchPolicy, Policy, PolicyEntry, load_policy, merge_adjacent, split_count_rows
from tests.tune.helpers import export_lookups

#: H200 policies of schema versions 1 and 2 (tuning runs superseded since; files at commit 0849486 under
#: results/h200/tune-kimi-k3-tp8/first-attempt/ and wave-cap-attempt/).
OLD_POLICIES = {"first-attempt": Path(__file__).parents[2] / "tests/report/fixtures/h200-tune-first-attempt"
                / "tune-kimi-k3-tp8-20261130-161711-925/policy.json",
                "wave-cap-attempt": Path(__file__).parent / "fixtures/policy-v2-wave-cap-attempt.json"}


def entry(max_len: int, splits: int, tokens_per_split: int | None = None, tile_tokens: int | None = None,
          **launch) -> PolicyEntry:
    return PolicyEntry(max_context_len=max_len, params={"num_kv_splits": splits, "block_n": "32", **launch},
                       tokens_per_split=tokens_per_split, tile_tokens=tile_tokens)


def make_policy() -> Policy:
    """Fixed counts, tokens-per-split and whole-tile entries (each kind of rule the last of a batch size once)."""
    return Policy(backend="triton-splitkv", shape={"num_heads": 12, "page_size": 64, "kv_dtype": "bfloat16"},
                  device="test", param_names=["num_kv_splits", "block_n"],
                  batches=[BatchPolicy(batch=1, entries=[entry(1024, 32), entry(4096, 128, 32), entry(8192, 128),
                                                         entry(32768, 132, tile_tokens=32), entry(131072, 256)]),
                           BatchPolicy(batch=4, entries=[entry(8192, 66, tile_tokens=32),
                                                         entry(65536, 132, tile_tokens=32)]),
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
    assert p.lookup(1, 15898)["num_kv_splits"] == 125         # whole tiles: 125 splits of 4 32-token tiles
    assert p.lookup(1, 8193)["num_kv_splits"] == 129          # 2 tiles each
    assert p.lookup(4, 10**6)["num_kv_splits"] == 132         # the last entry's whole tiles go on
    assert p.lookup(16, 10**7)["num_kv_splits"] == 24          # the last entry's rule goes on, capped
    assert p.lookup(16, 65537)["num_kv_splits"] == 17
    assert p.lookup(1, 10**7)["num_kv_splits"] == 256          # past the last bucket: the last entry
    assert p.lookup(3, 2000)["num_kv_splits"] == 63            # largest tuned batch <= 3 is 1
    assert p.lookup(64, 100)["block_n"] == "64"                # largest tuned batch <= 64 is 16
    with pytest.raises(ValueError):
        p.lookup(0, 100)


def test_entry_is_the_one_lookup_reads():
    p = make_policy()
    assert p.entry(1, 15898).describe() == "num_kv_splits=tiles(L,32,132) block_n=32"
    assert p.entry(1, 4000).tokens_per_split == 32 and p.entry(3, 10**7).max_context_len == 131072
    assert p.entry(64, 100).params["block_n"] == "64" and p.entry(2, 100).max_context_len == 1024
    for batch in (1, 2, 4, 15, 16, 100):
        for length in (1, 1024, 1025, 8192, 15898, 65537, 10**6):
            e = p.entry(batch, length)
            assert p.lookup(batch, length)["block_n"] == e.params["block_n"]


def test_policy_rejects_unsorted_and_inconsistent_tables():
    with pytest.raises(ValueError, match="increase"):
        BatchPolicy(batch=1, entries=[entry(4096, 8), entry(1024, 4)])
    with pytest.raises(ValueError, match="param_names"):
        Policy(backend="b", shape={}, device="d", param_names=["num_kv_splits"],
               batches=[BatchPolicy(batch=1, entries=[entry(10, 1)])])
    with pytest.raises(ValueError, match="needs an integer num_kv_splits"):
        PolicyEntry(max_context_len=10, params={"block_n": "32"}, tokens_per_split=16)
    with pytest.raises(ValueError, match="tile_tokens needs an integer num_kv_splits"):
        PolicyEntry(max_context_len=10, params={"num_kv_splits": "8"}, tile_tokens=32)
    with pytest.raises(ValueError, match="exclude each other"):
        entry(10, 8, tokens_per_split=64, tile_tokens=32)
    with pytest.raises(ValueError, match="greater than 0"):
        entry(10, 8, tile_tokens=0)
    for bad in (-4, 0, 513):  # tune --validate measured -4 as an error at every point
        with pytest.raises(ValueError, match=r"num_kv_splits must be an integer in 1\.\.512"):
            PolicyEntry(max_context_len=10, params={"num_kv_splits": bad})


@pytest.mark.parametrize("length, tiles_splits", [
    (15898, 125), (1026, 33), (24242, 127),          # the H200's batch-1 examples (docs/tuning.md)
    (10425, 109), (1, 1), (32, 1), (33, 2), (4224, 132), (4225, 67), (10**6, 132)])
def test_whole_tile_splits_by_hand(length, tiles_splits):
    """g = 32, n = 132: k = ceil(L / 4224) tiles per split, ceil(L / 32k) splits (hand-computed:
    15898 / 4224 -> 4 tiles, 15898 / 128 -> 125; 4225 -> 2 tiles, 4225 / 64 -> 67)."""
    assert whole_tile_splits(length, 32, 132) == tiles_splits


def test_whole_tile_splits_are_fewest_whole_tiles():
    """At every length: at most n splits; cut as triton-splitkv cuts (ceil(L / S) rounded up to 16
    tokens), no split has more than k tiles, and one split fewer would need more."""
    from mlabench.kernels.splitkv_torch import split_starts

    for n in (1, 7, 66, 132):
        for length in [*range(1, 3000, 7), *range(4000, 40000, 97)]:
            s, k = whole_tile_splits(length, 32, n), -(-length // (32 * n))
            chunk = split_starts([length], s, 16)[0][1:2] or [length]
            assert s <= n and -(-chunk[0] // 32) <= k, (n, length)
            assert s == 1 or (s - 1) * 32 * k < length, (n, length)
    assert whole_tile_splits(0, 32, 132) == 1 and whole_tile_splits(5000, 32, 0) == 1


def test_merge_keeps_rules_apart():
    assert merge_adjacent([entry(10, 8, 16), entry(20, 8, 16), entry(30, 8)]) == [entry(20, 8, 16), entry(30, 8)]
    assert merge_adjacent([entry(10, 8, tile_tokens=32), entry(20, 8, tile_tokens=32), entry(30, 8, 32)]) == [
        entry(20, 8, tile_tokens=32), entry(30, 8, 32)]
    assert rule_splits(1, 64, 8) == 1 and rule_splits(65, 64, 8) == 2 and rule_splits(10**6, 64, 8) == 8


def test_split_count_rows_give_the_lookup_count_at_every_length():
    from mlabench.policy.device_table import SplitPolicy

    p = make_policy()
    for b in p.batches:
        table = SplitPolicy.create({1: split_count_rows(b.entries)})
        last = b.entries[-1]
        for n in [*range(1, 5000), *range(8000, 33000, 3), *range(60000, 70000, 7), 131072, 131073, 200000, 10**7]:
            # past a last whole-tile entry the table keeps its count at its max_context_len
            at = min(n, last.max_context_len) if last.tile_tokens else n
            assert table.lookup(1, n) == p.lookup(b.batch, at)["num_kv_splits"], (b.batch, n)


def test_json_round_trip_and_schema_errors(tmp_path):
    p = make_policy()
    paths = write_exports(p, tmp_path)
    assert load_policy(paths["json"]) == p
    assert '"tokens_per_split": 32' in p.to_json() and p.to_json().count("tokens_per_split") == 2  # fixed: absent
    assert p.to_json().count('"tile_tokens": 32') == 3 and '"schema_version": 3' in p.to_json()
    bad = tmp_path / "bad.json"
    bad.write_text(p.to_json().replace('"schema_version": 3', '"schema_version": 99'))
    with pytest.raises(ConfigError, match="schema_version 99"):
        load_policy(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_policy(tmp_path / "missing.json")


def _set(keys, value):
    """A change to a policy's JSON data: ``value`` at the path ``keys``."""
    def change(data):
        for key in keys[:-1]:
            data = data[key]
        data[keys[-1]] = value
    return change


def _drop(keys):
    def change(data):
        for key in keys[:-1]:
            data = data[key]
        del data[keys[-1]]
    return change


@pytest.mark.parametrize("change, message", [
    (_set(["batches", 0, "entries", 2, "params", "num_kv_splits"], 0),
     "batch 1, entry 3 of 5 (max_context_len 8192): num_kv_splits must be an integer in 1..512, got 0"),
    (_set(["batches", 0, "entries", 2, "params", "num_kv_splits"], [4]),
     "batch 1, entry 3 of 5 (max_context_len 8192), key params.num_kv_splits: expected an integer or a string, "
     "got [4]"),
    (_set(["batches", 2, "entries", 1, "max_context_len"], -5),
     "batch 16, entry 2 of 3 (max_context_len -5), key max_context_len: expected a value > 0, got -5"),
    (_set(["batches", 1, "entries", 0, "tile_tokns"], 32),
     "batch 4, entry 1 of 2 (max_context_len 8192), key tile_tokns: not a known key (misspelt?)"),
    (_drop(["batches", 1, "entries", 0, "params"]),
     "batch 4, entry 1 of 2 (max_context_len 8192), key params: missing (required)"),
    (_set(["batches", 0, "entries", 1, "tokens_per_split"], "a"),
     'batch 1, entry 2 of 5 (max_context_len 4096), key tokens_per_split: expected an integer, got "a"'),
    (_set(["batches", 0, "batch"], 0), "batch 0, key batch: expected a value > 0, got 0"),
    (_set(["batches", 0, "entries"], {}), "batch 1, key entries: expected a list, got {}"),
    (lambda data: data["batches"][2]["entries"].reverse(),
     "batch 16: max_context_len must increase strictly from entry to entry, got [131072, 65536, 4096]"),
    (_drop(["backend"]), "key backend: missing (required)"),
])
def test_schema_errors_name_the_entry_and_key_in_the_files_terms(tmp_path, change, message):
    """A fresh user's nit: a bad policy file was reported by pydantic's path
    (``batches.0.entries.2.params.num_kv_splits.int: Input should be a valid integer``).  The line
    names the batch, the entry (and its max_context_len), the key and what was expected, after the
    file's path; the same line for a policy read by ``split_policy=device:FILE``."""
    import json

    from mlabench.policy.device_table import load_split_policy

    data = json.loads(make_policy().to_json())
    change(data)
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(data))
    for load in (load_policy, load_split_policy):
        with pytest.raises(ConfigError) as info:
            load(path)
        assert str(info.value) == f"{path}: {message}"


@pytest.mark.parametrize("folder, version, lookups", [
    ("first-attempt", 1, {(1, 2381): 69, (16, 50000): 16}),            # before tokens_per_split
    ("wave-cap-attempt", 2, {(1, 15898): 112, (1, 1000): 36, (1, 2940): 46}),  # before tile_tokens
])
def test_older_versions_are_read(folder, version, lookups):
    """The committed H200 policies of schema versions 1 and 2 read as version 3, without rules
    they could not have (2940 tokens: min(ceil(2940 / 64), 64) = 46)."""
    path = OLD_POLICIES[folder]
    assert f'"schema_version": {version}' in path.read_text()
    p = load_policy(path)
    assert p.schema_version == 3 and all(e.tile_tokens is None for b in p.batches for e in b.entries)
    assert version > 1 or all(e.tokens_per_split is None for b in p.batches for e in b.entries)
    assert {key: p.lookup(*key)["num_kv_splits"] for key in lookups} == lookups


LENGTHS = [1, 63, 64, 1023, 1024, 1025, 1500, 4095, 4096, 4097, 8192, 8193, 8448, 8449, 10425, 15898, 16384, 16385,
           24242, 32768, 32769, 65537, 100000, 131072, 131073, 10**6]
BATCHES = [1, 2, 3, 4, 5, 15, 16, 17, 64]


def test_exports_agree(tmp_path):
    """The C++ header (compiled with g++), the Python module and the JSON give the same choice."""
    p = make_policy()
    got = export_lookups(p, tmp_path, BATCHES, LENGTHS)
    assert got["json"] == got["python"] == got["cpp"]
    assert got["json"][:2] == [(1, 1, 32, "32"), (1, 63, 32, "32")]
    assert [r[2] for r in got["json"] if r[0] == 1 and 1024 < r[1] <= 4096] == [33, 47, 128, 128]   # the rule
    assert [r[2] for r in got["json"] if r[0] == 1 and r[1] in (8193, 10425, 15898, 24242)] == [129, 109, 125, 127]
    assert [r[2] for r in got["json"] if r[0] == 4 and r[1] in (1, 8192, 8449, 10**6)] == [1, 64, 89, 132]
    assert "constexpr" in to_cpp_header(p)


def test_an_export_never_overwrites_another_policy(tmp_path):
    """`tune --export RUN --combine geomean` wrote over the run's policy files (a committed run's
    too): the policy that was there is kept as policy.prev.*, policy.prev-2.*...; the same policy
    again (only `created` newer) leaves the files as they were."""
    from mlabench.policy.exports import export_policy

    p = make_policy()
    paths, note = export_policy(p, tmp_path)
    assert note == "" and load_policy(paths["json"]) == p
    before = {k: v.read_bytes() for k, v in paths.items()}
    later = p.model_copy(update={"source": {**p.source, "created": "2099-01-01T00:00:00+00:00"}})
    assert "left unchanged" in export_policy(later, tmp_path)[1]
    assert {k: v.read_bytes() for k, v in paths.items()} == before
    other = p.model_copy(update={"device": "another GPU"})
    assert export_policy(other, tmp_path)[1].endswith(f"kept as {tmp_path / 'policy.prev'}.json (.h, .py)")
    assert (tmp_path / "policy.prev.json").read_bytes() == before["json"] and load_policy(paths["json"]) == other
    assert "policy.prev-2.json" in export_policy(p, tmp_path)[1]
    assert load_policy(tmp_path / "policy.prev-2.json") == other and load_policy(paths["json"]) == p
    noisier = p.model_copy(update={"source": {**p.source, "noise": 0.05}})  # --export --noise 0.05: same counts
    assert export_policy(noisier, tmp_path)[1].startswith("the same choices, another record of how they were made")
