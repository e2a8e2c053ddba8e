"""Validation of a policy on held-out lengths, and the ``tune`` command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from mlabench.errors import ConfigError
from mlabench.policy.exports import write_exports
from mlabench.policy.tuned import BatchPolicy, Policy, PolicyEntry
from mlabench.tune.validation import split_ladder, validate_policy, validation_lengths, validation_tables


def test_validation_lengths_avoid_edges_and_tuned_lengths():
    lengths = validation_lengths(48, 1024, 131072, {1024, 4096, 131072, 2048})
    assert len(set(lengths)) == 48 and lengths == sorted(lengths)
    assert not {1024, 4096, 131072, 2048} & set(lengths)
    assert 1024 < lengths[0] < 1030 and 131064 < lengths[-1] < 131072  # inside the range given, off its edges
    assert validation_lengths(2, 100, 103, {100, 103}) == [101, 102]
    with pytest.raises(ConfigError):
        validation_lengths(4, 100, 100, set())
    with pytest.raises(ConfigError):  # fewer free lengths than asked for
        validation_lengths(3, 100, 102, {101})


def test_split_ladder_has_powers_of_two_and_sm_multiples():
    assert split_ladder(1, 512, 132) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 132, 192, 256, 264,
                                         384, 396, 512]


def fast_wrong_policy(splits: int) -> Policy:
    return Policy(backend="test-fast-wrong", device="test", param_names=["num_kv_splits"],
                  shape={"num_heads": 2, "page_size": 16, "q_dtype": "bfloat16", "kv_dtype": "bfloat16"},
                  batches=[BatchPolicy(batch=1, entries=[PolicyEntry(max_context_len=64, params={"num_kv_splits": splits})])],
                  source={"buckets": [64], "lengths": [45]})


def test_validate_measures_regret_and_never_calls_a_wrong_config_best(tmp_path, tiny_timing):
    result = validate_policy(fast_wrong_policy(6), count=3, low=32, high=128, ladder=[1, 2, 4, 6, 8, 12, 16],
                             timing=tiny_timing, results_root=tmp_path)
    assert [p.context_len for p in result.points] == [32, 64 - 1, 128]  # off the bucket edge 64
    for p in result.points:
        assert p.best_params == {"num_kv_splits": 6}                 # 12+ are faster but wrong
        assert p.regret(p.policy_us) == 0.0
    bad = [h for h in result.heuristic_names if result.points[-1].heuristics[h]["num_kv_splits"] >= 12]
    assert bad and all(result.points[-1].heuristics[h]["us"] is None for h in bad)
    summary, detail = validation_tables(result)
    assert summary.rows[-1][:4] == ["all", 3, 0.0, 0.0] and len(detail.rows) == 3
    run = result.store.run_dir
    assert (run / "validation.md").read_text().count("|") > 10 and json.loads((run / "validation.json").read_text())
    assert {r.status for r in result.store.records()} == {"ok", "incorrect"}
    worse = validate_policy(fast_wrong_policy(1), count=1, low=40, high=50, ladder=[1, 6], timing=tiny_timing,
                            results_root=tmp_path)
    assert worse.points[0].regret(worse.points[0].policy_us) > 0.2


def test_cli_tune_validate_export(tmp_path):
    from mlabench.cli import app

    runner = CliRunner()
    args = ["tune", "--backend", "test-fast-wrong", "--heads", "2", "--buckets", "40,64", "--page-size", "16",
            "--trials", "16", "--sampler", "brute", "--lengths-per-bucket", "1", "--budget-s", "0.02", "--results-dir", str(tmp_path), "--json"]
    res = runner.invoke(app, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    tables = json.loads(res.stdout)
    # the live table (no newline of its own off a terminal) ends before the line naming the files
    assert "\nresults: " in res.stderr and "┘results" not in res.stderr
    assert "study.journal)" in res.stderr.replace("\n", "")
    assert [row["chosen"] for row in tables[0]["rows"]] == ["num_kv_splits=6", "num_kv_splits=6"]
    assert tables[1]["rows"] == [{"batch": 1, "max context": 64, "params": "num_kv_splits=6"}]  # merged
    run = next(tmp_path.glob("tune-*"))
    res = runner.invoke(app, ["tune", "--export", str(run), "--markdown"], catch_exceptions=False)
    assert res.exit_code == 0 and "num_kv_splits=6" in res.stdout
    res = runner.invoke(app, ["tune", "--validate", str(run / "policy.json"), "--lengths", "2", "--min-context", "30",
                              "--max-context", "70", "--ladder", "1,6,16", "--budget-s", "0.02",
                              "--results-dir", str(tmp_path), "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)[0]["rows"][-1]["policy worst %"] == 0.0


@pytest.mark.parametrize("args, message", [
    (["tune", "--heads", "2", "--buckets", "64"], "error: give --backend"),
    (["tune", "--backend", "torch-splitkv", "--heads", "2"], "error: give --buckets"),
    (["tune", "--backend", "torch-splitkv", "--heads", "2", "--buckets", "64", "--space", "num_kv_splits"], "--space takes"),
    (["tune", "--backend", "torch-splitkv", "--heads", "2", "--buckets", "64,32"], "buckets: must be increasing"),
    (["tune", "--validate", "missing.json"], "error: policy not found"),
])
def test_cli_errors_are_one_line(args, message):
    res = subprocess.run([sys.executable, "-m", "mlabench", *args], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr


def test_cli_import_does_not_load_optuna():
    code = "import sys, mlabench.cli; assert 'optuna' not in sys.modules, 'optuna imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_generated_python_policy_imports_without_mlabench(tmp_path):
    paths = write_exports(fast_wrong_policy(6), tmp_path)
    out = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, '.'); import policy; print(policy.lookup(1, 10))"],
                         cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "{'num_kv_splits': 6}" and paths["python"].name == "policy.py"
