"""Validation of a policy on held-out lengths, and the ``tune`` command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from mlabench.backends import get_backend
from mlabench.errors import ConfigError
from mlabench.policy.exports import write_exports
from mlabench.policy.tuned import BatchPolicy, Policy, PolicyEntry
from mlabench.tune.validation import draw_lengths, reference_counts, split_ladder, validation_tables
from mlabench.tune.validation_run import validate_policy


def test_held_out_lengths_are_drawn_from_a_seed_one_per_stratum_off_the_tuned_lengths():
    avoid = {1024, 4096, 131072, 2048}
    lengths = draw_lengths(48, 1024, 131072, avoid, tile=32, seed=7)
    assert len(set(lengths)) == 48 and lengths == sorted(lengths)
    assert draw_lengths(48, 1024, 131072, avoid, tile=32, seed=7) == lengths  # the seed draws them again
    assert draw_lengths(48, 1024, 131072, avoid, tile=32, seed=8) != lengths  # another seed, other lengths
    assert all(abs(n - a) > 32 for n in lengths for a in avoid) and 1024 < lengths[0] and lengths[-1] < 131072
    edges = [1024 * 128 ** (i / 48) for i in range(49)]
    assert [sum(lo <= n < hi for n in lengths) for lo, hi in zip(edges, edges[1:])] == [1] * 48
    # one tile off is still too near; one token more is not
    assert draw_lengths(2, 100, 140, {120}, tile=10, seed=0)[0] < 110
    assert set(draw_lengths(4, 100, 140, {100, 120}, tile=10, seed=1)) <= set(range(111, 120)) | set(range(131, 141))
    with pytest.raises(ConfigError):
        draw_lengths(4, 100, 100, set(), tile=1, seed=0)
    with pytest.raises(ConfigError, match="more than 1 tokens"):  # fewer free lengths than asked for
        draw_lengths(3, 100, 104, {102}, tile=1, seed=0)


def test_reference_counts_are_every_count_to_a_small_wave_cap_else_the_ladder_and_windows():
    assert reference_counts(1, 512, 16, [1, 2, 4, 8, 16, 32], [7]) == list(range(1, 17))
    assert reference_counts(1, 512, 64, [1, 128], [7]) == list(range(1, 65))  # 64 counts: all of them
    # 65 counts: the ladder, and 1.5x either side of the policy's count (5-10) and the best ladder count
    assert reference_counts(1, 512, 65, [1, 2, 4, 8, 16, 32, 64], [7, 16]) == [
        1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 32, 64]
    assert reference_counts(1, 300, None, [256], [264]) == [176 + i for i in range(300 - 176 + 1)]  # capped at 300


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
                             timing=tiny_timing, results_root=tmp_path, seed=3)
    # more than a page (16 tokens) off the bucket edge 64 and the tuned length 45
    assert len(result.points) == 3 and all(80 < p.context_len <= 128 for p in result.points)
    assert result.seed == 3 and result.store.manifest().config["validate"]["seed"] == 3
    for p in result.points:
        assert p.best_params == {"num_kv_splits": 6}                 # 12+ are faster but wrong
        assert p.regret(p.policy_us) == 0.0
    bad = [h for h in result.heuristic_names if result.points[-1].heuristics[h]["num_kv_splits"] >= 12]
    assert bad and all(result.points[-1].heuristics[h]["us"] is None for h in bad)
    summary, detail = validation_tables(result)
    assert summary.rows[-1][:5] == ["all", 3, "10", 0.0, 0.0] and len(detail.rows) == 3  # the ladder and 4-9
    assert "best of the split counts measured" in summary.title and "seed 3" in " ".join(summary.notes)
    from mlabench.tables.render import min_width, to_rich

    detail.rows = detail.rows[:1]  # one held-out point (--lengths 1): no column is constant to move
    assert min_width(to_rich(detail, width=80)) <= 80  # the heuristics' columns go first, named
    run = result.store.run_dir
    assert (run / "validation.md").read_text().count("|") > 10 and json.loads((run / "validation.json").read_text())
    assert {r.status for r in result.store.records()} == {"ok", "incorrect"}
    spec = next(p for p in get_backend("test-fast-wrong").params if p.name == "num_kv_splits")
    with pytest.raises(ConfigError, match=rf"^--ladder {spec.high + 1}: test-fast-wrong takes num_kv_splits "
                                          rf"{spec.low or 1}-{spec.high}$"):  # it was left out, unmeasured
        validate_policy(fast_wrong_policy(6), count=1, low=32, high=128, ladder=[1, spec.high + 1],
                        timing=tiny_timing, results_root=tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    worse = validate_policy(fast_wrong_policy(1), count=1, low=90, high=100, ladder=[1, 6], timing=tiny_timing,
                            results_root=tmp_path)
    assert worse.points[0].regret(worse.points[0].policy_us) > 0.2


def test_validate_also_measures_the_lengths_asked_for_wherever_they_fall(tmp_path, tiny_timing):
    """A server's decode of 64-token prompts runs at 65 and on, beside the bucket edge 64 that the
    drawn lengths keep a page away from: --context measures such lengths too, and alone with 0."""
    policy = fast_wrong_policy(6)
    both = validate_policy(policy, count=2, low=80, high=128, ladder=[1, 6], timing=tiny_timing,
                           results_root=tmp_path, seed=3, extra_lengths=[65, 45])
    lens = [p.context_len for p in both.points]
    assert 45 in lens and 65 in lens and len(lens) == 4 and lens == sorted(lens)
    assert both.store.manifest().config["validate"]["lengths"] == lens  # recorded: --resume measures them again
    only = validate_policy(policy, count=0, low=80, high=128, ladder=[1, 6], timing=tiny_timing,
                           results_root=tmp_path, seed=3, extra_lengths=[65])
    assert [p.context_len for p in only.points] == [65]


def test_lengths_given_with_context_are_not_called_drawn_or_held_out(tmp_path, tiny_timing):
    """--lengths 0 --context 45,65: 45 is the policy's tuned length, nothing is drawn; the tables
    print no seed that "draws them again" and name the given lengths, the report's line counts them
    apart, and a resume keeps saying so."""
    from mlabench.report.run_text import validate_config_text

    policy = fast_wrong_policy(6)
    only = validate_policy(policy, count=0, ladder=[1, 6], timing=tiny_timing, results_root=tmp_path, seed=3,
                           extra_lengths=[65, 45, 65])
    cfg = only.store.manifest().config["validate"]
    assert cfg["context"] == [45, 65] and cfg["lengths"] == [45, 65]
    notes = " ".join(validation_tables(only)[0].notes)
    assert "seed" not in notes and "given with --context, not drawn" in notes and "45, 65" in notes
    assert "2 lengths per batch size (45-65 tokens: 0 held out, drawn; 2 given with --context)" in \
        validate_config_text(cfg)
    again = validate_policy(policy, resume=only.store.run_dir, timing=tiny_timing)
    assert again.given == (45, 65) and "seed" not in " ".join(validation_tables(again)[0].notes)
    both = validate_policy(policy, count=1, low=80, high=128, ladder=[1, 6], timing=tiny_timing,
                           results_root=tmp_path, seed=3, extra_lengths=[65])
    notes = " ".join(validation_tables(both)[0].notes)
    assert "drawn with seed 3" in notes and "given with --context, not drawn (held out only" in notes
    assert "held-out lengths per batch size" not in validate_config_text(both.store.manifest().config["validate"])
    assert "held-out lengths per batch size" in validate_config_text({**cfg, "context": []})  # none given: as before


def test_cli_validate_context_flag(tmp_path):
    from mlabench.cli import app

    path = tmp_path / "policy.json"
    path.write_text(fast_wrong_policy(6).model_dump_json())
    base = ["tune", "--validate", str(path), "--ladder", "1,6", "--budget-s", "0.02", "--results-dir", str(tmp_path)]
    res = CliRunner().invoke(app, [*base, "--lengths", "0", "--context", "65", "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert [r["context"] for r in json.loads(res.stdout)[1]["rows"]] == [65]
    for args, message in ((["--lengths", "0"], "--lengths >= 1 (or 0 with --context)"),
                          (["--context", "65,,90"], "--context")):
        res = subprocess.run([sys.executable, "-m", "mlabench", *base, *args], capture_output=True, text=True,
                             timeout=120)
        assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr


def test_cli_validate_context_past_the_policy_says_so_and_a_bad_one_leaves_no_folder(tmp_path):
    """--context 90 lies above the policy's last bucket (64), where it runs that bucket's choice:
    the note says so, as for --max-context 90; a length no shape takes is refused before a
    validation folder exists."""
    path = tmp_path / "policy.json"
    path.write_text(fast_wrong_policy(2).model_copy(update={"backend": "torch-splitkv"}).model_dump_json())
    base = [sys.executable, "-m", "mlabench", "tune", "--validate", str(path), "--ladder", "1,2", "--budget-s", "0.02",
            "--lengths", "0", "--results-dir", str(tmp_path / "res")]
    res = subprocess.run([*base, "--context", "90"], capture_output=True, text=True, timeout=120)
    assert res.returncode in (0, 1), res.stderr  # 1: the policy missed the target (a busy CPU)
    assert "above its last bucket (64) each batch size uses that bucket's choice" in " ".join(res.stderr.split())
    res = subprocess.run([*base, "--context", "90,99999999999"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "int32 lengths" in res.stderr and "Traceback" not in res.stderr
    assert len(list((tmp_path / "res").iterdir())) == 1  # the first run's only


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
    assert any(n.startswith("CPU run: a smoke test") for n in tables[0]["notes"])  # as sweep says it
    run = next(tmp_path.glob("tune-*"))
    res = runner.invoke(app, ["tune", "--export", str(run), "--markdown"], catch_exceptions=False)
    assert res.exit_code == 0 and "num_kv_splits=6" in res.stdout
    res = runner.invoke(app, ["tune", "--validate", str(run / "policy.json"), "--lengths", "2", "--min-context", "90",
                              "--max-context", "200", "--ladder", "1,6,16", "--budget-s", "0.02", "--seed", "11",
                              "--results-dir", str(tmp_path), "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)[0]["rows"][-1]["policy worst %"] == 0.0
    assert "seed 11" in " ".join(json.loads(res.stdout)[0]["notes"])
    assert "CPU run: a smoke test" in " ".join(json.loads(res.stdout)[0]["notes"])
    assert "note: lengths 90-200 reach outside the lengths the policy was tuned at" in " ".join(
        res.stderr.split())  # beyond the last bucket (64): said


def test_validate_on_a_full_disk_keeps_what_it_recorded_and_says_how_to_continue(tmp_path, tiny_timing, monkeypatch):
    """Issue 35 item 13: a disk filling up mid-validation ends it with the command that continues."""
    import errno
    import os

    from mlabench.errors import FileAccessError
    from mlabench.files import user_path
    from mlabench.records import store as store_module

    real, calls = store_module.append_text, []

    def append_text(path, text, what, sync=False):
        calls.append(path)
        if len(calls) > 2:
            with user_path(path, what):  # as append_text's write fails on a full disk
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, text, what, sync)

    monkeypatch.setattr(store_module, "append_text", append_text)
    with pytest.raises(FileAccessError) as info:
        validate_policy(fast_wrong_policy(6), count=2, low=90, high=128, ladder=[1, 6], timing=tiny_timing,
                        results_root=tmp_path, seed=3, policy_path=tmp_path / "policy.json")
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert str(info.value).startswith("run results could not be written: the disk is full")
    assert str(info.value).endswith(f"0 of 2 points are recorded in {run} (kept); once it can be written, continue "
                                    f"with: mlabench tune --validate {tmp_path / 'policy.json'} --resume {run}")
    assert info.value.exit_code == 3  # the re-worded error is still a full disk's (it exited 2)


def test_validate_finds_a_best_off_the_ladder_and_off_the_policys_window(tmp_path, tiny_timing):
    # ladder 1, 2, 4, 16 (16 wrong); the policy's 3 -> window 2-4; the best ladder count 4 -> window 3-6
    result = validate_policy(fast_wrong_policy(3), count=1, low=90, high=100, ladder=[1, 2, 4, 16],
                             timing=tiny_timing, results_root=tmp_path, seed=0)
    (p,) = result.points
    assert p.best_params == {"num_kv_splits": 6} and p.regret(p.policy_us) > 0.3  # 6: 200 µs, 3: 380 µs
    measured = {r.params["num_kv_splits"] for r in result.store.records()}
    assert {1, 2, 3, 4, 5, 6, 16} <= measured and p.counts_measured == len(measured)


def test_validate_measures_every_count_up_to_a_small_wave_cap(tmp_path, tiny_timing):
    policy = fast_wrong_policy(2).model_copy(update={"backend": "test-wave-trap"})
    result = validate_policy(policy, count=1, low=90, high=100, ladder=[1, 37], timing=tiny_timing,
                             results_root=tmp_path, seed=0)
    measured = {r.params["num_kv_splits"] for r in result.store.records()}
    # 8 resident programs, one per split at 2 heads: cap 8; every count 1-8, the ladder not needed
    assert set(range(1, 9)) <= measured and 37 not in measured
    # more splits are always faster here: the best is the most measured (a heuristic's count may be above the cap)
    assert result.points[0].best_params == {"num_kv_splits": max(measured)}


@pytest.mark.parametrize("args, message", [
    (["tune", "--heads", "2", "--buckets", "64"], "error: give --backend"),
    (["tune", "--backend", "torch-splitkv", "--heads", "2"], "error: give --buckets"),
    (["tune", "--backend", "torch-splitkv", "--heads", "2", "--buckets", "64", "--space", "num_kv_splits"], "--space takes"),
    (["tune", "--backend", "torch-splitkv", "--heads", "2", "--buckets", "64,32"], "buckets: must be increasing"),
    (["tune", "--validate", "missing.json"], "error: policy not found"),
    (["tune", "--backend", "torch-splitkv", "--buckets", "64", "--tolerance", "0.05"], "--tolerance goes with --validate"),
    (["tune", "--validate", "missing.json", "--tolerance", "-0.1"], "--tolerance is a fraction [0, 1)"),
    # a user typing 3 for 3% got a target every point met
    (["tune", "--validate", "missing.json", "--tolerance", "3"], "error: --tolerance is a fraction [0, 1) (0.03 or 3%), got '3'"),
    (["tune", "--validate", "missing.json", "--tolerance", "3 %x"], "error: --tolerance takes a fraction such as 0.03 or 3%"),
    # 3% is read as 0.03: the command goes on to the policy file
    (["tune", "--validate", "missing.json", "--tolerance", "3%"], "error: policy not found"),
    (["graph-check", "--tolerance", "five"], "error: --tolerance takes a fraction such as 0.03 or 3%, got 'five'"),
    # a fresh user's review: 5 meant as 5% switched the slowdown flag off (500%)
    (["graph-check", "--tolerance", "5"], "error: --tolerance 5 reads as 500%: give 0.05 or 5% for 5%"),
    (["tune", "--backend", "torch-splitkv", "--heads", "2", "--buckets", "64", "--edges-per-octave", "0"],
     "error: --edges-per-octave: Input should be greater than or equal to 1"),
    # flags another mode reads ran as if they were not there
    (["tune", "--validate", "missing.json", "--edges-per-octave", "4", "--device-policy", "--trials", "3"],
     "error: --edges-per-octave, --device-policy, --trials go with a tuning run, not tune --validate"),
    (["tune", "--export", "run", "--edges-per-octave", "4", "--seed", "1"],
     "error: --edges-per-octave goes with a tuning run; --seed goes with --validate, not tune --export: tune --export "
     "reads the run's own settings and writes into its folder"),
    # the last reviews: --heads and --backend with --export were refused in two wordings
    (["tune", "--export", "run", "--heads", "16"],
     "error: --heads goes with a tuning run, not tune --export: tune --export reads the run's own settings"),
    # a fresh user's review: the second mode, or a shared flag, ran as if it were not there
    (["tune", "--export", "run", "--validate", "p.json"], "error: --validate and --export are two modes of tune: give one"),
    (["tune", "--export", "run", "--resume", "run", "--backend", "x"],
     "error: --backend, --resume go with a tuning run or --validate, not tune --export: tune --export reads the run's "
     "own settings and writes into its folder"),
    (["tune", "--export", "run", "--budget-s", "1", "--results-dir", "elsewhere"],
     "error: --budget-s, --results-dir go with a tuning run or --validate, not tune --export: tune --export reads"),
    (["tune", "--export", "run", "--backend", "x"], "error: --backend goes with a tuning run or --validate, not tune"),
    (["tune", "--resume", "run", "--results-dir", "elsewhere"],
     "error: --results-dir: --resume continues in the run's own folder; leave it out"),
    # a fresh user's review of tune: flags that ran as something else, or messages that named the wrong thing
    (["tune", "--backend", "torch-splitkv,reference", "--heads", "2", "--buckets", "64"],
     "error: tune takes one backend a run, got --backend torch-splitkv,reference"),
    (["tune", "--backend", "torch-splitkv", "--heads", "2,4", "--buckets", "64"],
     "error: --heads takes one value when tuning, got 2,4"),
    (["tune", "--backend", "torch-splitkv", "--tp", "8", "--heads", "16", "--buckets", "64"],
     "error: --tp 8 divides a model's heads"),
    (["tune", "--backend", "torch-splitkv", "--heads", "2", "--buckets", "64", "--noise", "2"],
     "error: --noise is a fraction [0, 1) (0.03 or 3%), got '2'"),
    (["tune", "--backend", "torch-splitkv", "--heads", "2", "--buckets", "64", "--representative", "upper"],
     "error: --representative picks a bucket's one measured length: give it with --lengths-per-bucket 1"),
])
def test_cli_errors_are_one_line(args, message):
    res = subprocess.run([sys.executable, "-m", "mlabench", *args], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr


def test_graph_checks_tolerance_takes_100_percent_or_more_only_as_a_percentage():
    from mlabench.cli.options import fraction

    assert fraction("150%", "--tolerance", below_one=False) == pytest.approx(1.5)
    assert fraction("0.5", "--tolerance", below_one=False) == 0.5
    with pytest.raises(ConfigError, match="reads as 150%"):
        fraction("1.5", "--tolerance", below_one=False)


def test_cli_bad_policy_file_is_one_line_in_its_terms(tmp_path):
    """``tune --validate`` of a policy with a bad split count: one line naming the file, the batch,
    the entry and the key (not pydantic's ``batches.0.entries.0.params.num_kv_splits.int``), exit 2."""
    data = json.loads(fast_wrong_policy(6).to_json())
    data["batches"][0]["entries"][0]["params"]["num_kv_splits"] = 2.5
    bad = tmp_path / "policy.json"
    bad.write_text(json.dumps(data))
    res = subprocess.run([sys.executable, "-m", "mlabench", "tune", "--validate", str(bad)], capture_output=True,
                         text=True, timeout=120)
    length = data["batches"][0]["entries"][0]["max_context_len"]
    assert res.returncode == 2 and res.stderr.strip() == (
        f"error: {bad}: batch 1, entry 1 of 1 (max_context_len {length}), key params.num_kv_splits: expected an "
        "integer or a string, got 2.5"), res.stderr


def test_cli_refuses_a_policy_of_a_backend_without_split_counts_and_another_backend(tmp_path):
    """Issue 35 A2: the reference backend ignores num_kv_splits, so validating a policy of it measured
    every count alike and reported regret 0%; and --backend was ignored beside --validate."""
    data = json.loads(fast_wrong_policy(6).to_json())
    ref = tmp_path / "reference.json"
    ref.write_text(json.dumps({**data, "backend": "reference"}))
    fast = tmp_path / "fast.json"
    fast.write_text(json.dumps(data))
    for args, line in [
        ([str(ref)], "error: backend reference takes no num_kv_splits: there are no split counts to validate "
                     "(tune --backend reference has nothing to tune either)"),
        ([str(fast), "--backend", "torch-splitkv"], "error: tune --validate measures a policy on its own backend "
         "(test-fast-wrong), not --backend torch-splitkv: leave --backend out or give the policy of torch-splitkv"),
    ]:
        res = subprocess.run([sys.executable, "-m", "mlabench", "tune", "--results-dir", str(tmp_path / "r"),
                              "--validate", *args], capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and res.stderr.strip() == line, res.stderr
    assert not (tmp_path / "r").exists()


def test_cli_import_does_not_load_optuna():
    code = "import sys, mlabench.cli; assert 'optuna' not in sys.modules, 'optuna imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_generated_python_policy_imports_without_mlabench(tmp_path):
    paths = write_exports(fast_wrong_policy(6), tmp_path)
    out = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, '.'); import policy; print(policy.lookup(1, 10))"],
                         cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "{'num_kv_splits': 6}" and paths["python"].name == "policy.py"


def test_regrets_have_their_exact_values():
    """Issue 35 item 15: no test checked a regret's value, only its sign or a bound.  Two batch-1
    points: the policy 10% and 25% slower than the best (worst 25%, geometric mean
    sqrt(1.1 x 1.25) - 1 = 17.26%), a heuristic 50% slower at one and failed at the other."""
    from mlabench.tune.validation import PointResult, Validation, geomean_regret_pct, validation_tables

    points = [PointResult(1, 1000, 100.0, {"num_kv_splits": 8}, {"num_kv_splits": 4}, 110.0,
                          {"h": {"us": 150.0, "num_kv_splits": 2}}, counts_measured=5),
              PointResult(1, 2000, 200.0, {"num_kv_splits": 16}, {"num_kv_splits": 8}, 250.0,
                          {"h": {"us": None, "num_kv_splits": 1}}, counts_measured=7)]
    assert [p.regret(p.policy_us) for p in points] == [pytest.approx(0.10), pytest.approx(0.25)]
    assert points[0].regret(None) is None and PointResult(1, 1, None, {}, {}, 5.0).regret(5.0) is None
    geomean = 100 * ((1.10 * 1.25) ** 0.5 - 1)
    assert geomean_regret_pct([0.10, 0.25]) == pytest.approx(geomean) == pytest.approx(17.2604, abs=1e-4)
    assert geomean_regret_pct([0.10, None]) is None and geomean_regret_pct([]) is None
    summary, detail = validation_tables(Validation(store=None, points=points, heuristic_names=["h"]))
    assert summary.rows[0] == [1, 2, "5-7", pytest.approx(25.0), pytest.approx(geomean), None]
    assert [row[6] for row in detail.rows] == [pytest.approx(10.0), pytest.approx(25.0)]
    assert [row[7] for row in detail.rows] == ["miss", "miss"]  # both over the 3% target
    assert [row[8] for row in detail.rows] == ["50.0 (2)", "— (1)"]


def test_target_verdict_names_each_length_over_the_tolerance_and_a_failed_policy():
    """Issue 34 item 3: each held-out length against the best count measured there, 3% by default;
    one line says which lengths miss (a policy that failed misses too)."""
    from mlabench.tune.validation import PointResult, Validation, target_misses, target_verdict, validation_tables

    def point(batch: int, length: int, policy_us: float | None) -> PointResult:
        return PointResult(batch, length, 100.0, {"num_kv_splits": 8}, {"num_kv_splits": 4}, policy_us)

    points = [point(1, 1000, 102.9), point(1, 2000, 103.1), point(16, 3000, None), point(16, 4000, 100.0)]
    assert [p.context_len for p in target_misses(points, 0.03)] == [2000, 3000]
    assert target_verdict(points, 0.03) == ("target not met: every held-out length within 3% of the best count "
                                            "measured there: 2 of 4 points miss it (batch 1: 2000; batch 16: 3000)")
    assert target_verdict(points[:1] + points[3:], 0.03).startswith("target met: every held-out length within 3%")
    assert [p.context_len for p in target_misses(points, 0.05)] == [3000]  # the tolerance is the caller's
    summary, detail = validation_tables(Validation(store=None, points=points, heuristic_names=[], tolerance=0.05))
    assert [row[detail.columns.index("target")] for row in detail.rows] == ["ok", "ok", "miss", "ok"]
    assert "within 5%" in detail.title and any(n.startswith("target not met") for n in summary.notes)


def test_the_verdict_and_the_points_title_call_lengths_given_with_context_given():
    """A length given with ``--context`` (where a server decodes, e.g. just past a bucket edge) is
    not held out: the verdict and the table title say "given" for it, "held-out" only for drawn ones."""
    from mlabench.tune.validation import PointResult, Validation, target_verdict, validation_tables

    points = [PointResult(1, n, 100.0, {"num_kv_splits": 8}, {"num_kv_splits": 4}, 110.0) for n in (1000, 4160)]
    assert "every held-out length within 3%" in target_verdict(points, 0.03)
    assert "every length (held out or given) within 3%" in target_verdict(points, 0.03, (4160,))
    assert "every given length within 3%" in target_verdict(points[1:], 0.03, (4160,))
    titles = [validation_tables(Validation(None, pts, [], given=given))[1].title
              for pts, given in ((points, ()), (points, (4160,)), (points[1:], (4160,)))]
    assert [t.split(" (policy")[0] for t in titles] == ["Held-out points", "Points (held out or given)", "Given points"]


def test_a_validation_refused_for_memory_leaves_no_run_folder(tmp_path, tiny_timing):
    """A fresh user's review: `tune --validate P --max-context 100000000` was refused for memory at
    its first point and left a validate-* folder that --resume could only refuse again."""
    from mlabench.errors import OutOfMemoryError

    with pytest.raises(OutOfMemoryError, match="needs .* GiB"):
        validate_policy(fast_wrong_policy(2), count=1, low=10**8 - 10, high=10**8, timing=tiny_timing,
                        results_root=tmp_path, seed=0)
    assert list(tmp_path.iterdir()) == []


def test_a_policy_of_another_device_is_named_beside_the_verdict(tmp_path, tiny_timing):
    """A fresh user's review: a policy tuned on an H200 validated here said nothing of it, while
    docs/tuning.md says a policy is tuned for one GPU model."""
    from mlabench.device import current_device
    from mlabench.tune.validation import validation_tables

    here = current_device().name
    for device, said in (("NVIDIA H200", True), (here, False)):
        policy = fast_wrong_policy(2).model_copy(update={"device": device})
        result = validate_policy(policy, count=1, low=90, high=100, timing=tiny_timing,
                                 results_root=tmp_path / device.replace(" ", "-"), seed=0)
        notes = validation_tables(result)[0].notes
        assert any(n.startswith(f"the policy was tuned on NVIDIA H200 and is measured here on {here}:")
                   for n in notes) == said, notes

