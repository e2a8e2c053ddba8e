"""``tune --export RUN --pages-rule B`` (issue 34 item 3): split counts chosen across lengths by pages
per split, each a count that leaves no split without pages; on the committed qo1-k3 H200 run, scored
on its held-out validation, and the one-line errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlabench.errors import ConfigError
from mlabench.measure.stats import Stats
from mlabench.records.record import Record
from mlabench.tune.page_rule import TunedPoint, pages_per_split, rule_entries, tuned_points

DEPLOY = Path(__file__).resolve().parents[2] / "results/h200/deploy"


def record(batch: int, context_len: int, splits: int, us: float, stamp: str = "2026-01-01T00:00:00+00:00",
           status: str = "ok", pdl: int = 1) -> Record:
    stats = Stats(n=1, median_us=us, iqr_us=0.0, min_us=us, max_us=us, mean_us=us, median_rel_ci=0.0,
                  converged=True, noisy=False, samples_us=[us])
    params = {"num_kv_splits": splits, "pdl": pdl}
    return Record(key=f"{batch}-{context_len}-{splits}-{pdl}", run_id="r", backend="b", params=params,
                  shape={"context_lens": [context_len] * batch}, batch=batch, num_heads=2, context_len=context_len,
                  status=status, timestamp=stamp, stats=stats)


def test_the_count_leaves_no_split_without_pages_and_stays_under_the_cap():
    """113 pages at 2 a split: 57 splits (58-112 would also give 2 pages each, with empty splits);
    under a cap of 50 the next candidate, 3 pages a split (38 splits); where no candidate was
    measured, the most splits the cap allows (1 page a split for 3 pages; 8 for 1000 under 132)."""
    points = [TunedPoint(100.0, {1: 0.2, 2: 0.0, 3: 0.1})]
    assert pages_per_split(points, 113, 132) == 2 and -(-113 // 2) == 57
    assert pages_per_split(points, 113, 50) == 3
    assert [pages_per_split([TunedPoint(100.0, {7: 0.0})], p, 132) for p in (3, 1000)] == [1, 8]


def test_the_cost_is_interpolated_in_log_pages_between_the_tuned_points_around_the_length():
    """Pages per split 2 is best at 32 pages, 4 at 128: the rule moves from one to the other between
    them (at 48 pages 2 is nearer, at 100 pages 4), and beyond the points keeps the end's choice."""
    points = [TunedPoint(32.0, {2: 0.0, 4: 0.2}), TunedPoint(128.0, {2: 0.2, 4: 0.0})]
    assert [pages_per_split(points, p, 132) for p in (16, 48, 100, 400)] == [2, 2, 4, 4]


def test_tuned_points_pool_lengths_a_page_apart_and_read_regret_per_pages_per_split():
    """4096 and 4097 tokens (64 and 65 pages of 64) make one point; its cost of 2 pages a split is the
    mean of the two lengths' best regret among counts giving 2 pages; another pdl, a failed launch,
    another batch size and an older record of one launch are left out."""
    recs = [record(1, 4096, 32, 10.0), record(1, 4096, 16, 12.0), record(1, 4096, 64, 11.0),
            record(1, 4097, 33, 10.5), record(1, 4097, 48, 11.0), record(1, 4097, 32, 10.0),
            record(1, 4097, 33, 99.0, stamp="2025-01-01T00:00:00+00:00"), record(1, 4097, 40, 1.0, status="error"),
            record(1, 4097, 24, 1.0, pdl=0), record(16, 4097, 8, 1.0), record(1, 8192, 64, 20.0)]
    points = tuned_points(recs, 1, {"num_kv_splits": 32, "pdl": 1}, 64)
    assert [round(p.pages, 3) for p in points] == [round((64 * 65) ** 0.5, 3), 128.0]
    assert points[0].cost == pytest.approx({1: 0.1, 2: 0.025, 3: 0.0, 4: 0.2})
    entries = rule_entries(points, 8192, 64, 132, {"num_kv_splits": 1, "pdl": 1})
    at_4096 = next(e for e in entries if e.max_context_len >= 4096)  # 3 pages a split: 22 splits
    assert (at_4096.tokens_per_split, at_4096.params) == (192, {"num_kv_splits": -(-at_4096.max_context_len // 192),
                                                                "pdl": 1})


def qo1_k3_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(next((DEPLOY / "qo1-k3").glob("tune-*")), run)
    return run


def test_qo1_k3_batch_1_by_pages_beats_its_bucket_choice_on_the_held_out_validation(tmp_path):
    """The committed H200 run exported again with --pages-rule 1, scored on its validation's records:
    batch 1 within 3% at 21 of 27 held-out lengths, worst 6.2% (the bucket choice: 6 of 27, worst
    12.9%); batch 16 keeps its bucket choice (8 at every length, its ties settled by the neighbouring
    buckets); the per-bucket policy is kept beside it."""
    from mlabench.tune.rescore import recorded_validation
    from mlabench.tune.run import export_run

    run = qo1_k3_run(tmp_path)
    result = export_run(run, pages_rule=[1])
    assert (run / "policy.prev.json").is_file() and "batch 1: counts by pages per split" in result.note
    assert [result.policy.lookup(1, n)["num_kv_splits"] for n in (4784, 7222, 10823)] == [38, 57, 57]
    assert [e.params["num_kv_splits"] for e in result.policy.batches[1].entries] == [8]
    validation = next((DEPLOY / "qo1-k3").glob("validate-*"))
    for path, within, worst in ((run / "policy.json", 21, 0.062), (run / "policy.prev.json", 6, 0.13)):
        from mlabench.policy.tuned import load_policy

        scored, _notes = recorded_validation(load_policy(path), [validation], 0.03)
        regrets = [p.policy_us / p.best_us - 1 for p in scored.points if p.batch == 1]
        assert len(regrets) == 27 and scored.left_out == 0
        assert sum(r <= 0.03 for r in regrets) == within and max(regrets) == pytest.approx(worst, abs=0.002)


def test_pages_rule_errors_are_one_line(tmp_path):
    """A batch size the run did not tune, a run tuned without --device-policy (the qo1 run), a
    policy whose choices differ in more than a fixed count (qo1's, tuned with rules and pdl), and
    --pages-rule without --export: one line, exit 2."""
    from mlabench.tune.run import export_run

    run = qo1_k3_run(tmp_path)
    with pytest.raises(ConfigError, match=r"^--pages-rule 4: the run tuned batch sizes 1, 16$"):
        export_run(run, pages_rule=[4])
    qo1 = tmp_path / "qo1"
    shutil.copytree(next((DEPLOY / "qo1").glob("tune-*")), qo1)
    # a fresh user's review: a run tuned without --device-policy was exported with the rule (at most
    # 2 splits at batch 1, 34% worst regret on its own records where its policy had 5%)
    with pytest.raises(ConfigError, match=r"^--pages-rule reads the split ladder a --device-policy run measures .* "
                                          r"was tuned without --device-policy: export it without --pages-rule$"):
        export_run(qo1, pages_rule=[1])
    assert not (qo1 / "policy.prev.json").exists()
    from mlabench.policy.tuned import load_policy
    from mlabench.tune.page_rule import pages_rule_policy

    with pytest.raises(ConfigError, match="differ in more than a fixed count; tune with --device-policy"):
        pages_rule_policy(load_policy(qo1 / "policy.json"), [], [1], 64, {1: 132})
    for args, line in ((["tune", "--export", str(run), "--pages-rule", "0"],
                        "error: --pages-rule batch size must be > 0, got 0"),
                       (["tune", "--validate", str(run / "policy.json"), "--pages-rule", "1"],
                        "error: --pages-rule goes with --export, not tune --validate")):
        res = subprocess.run([sys.executable, "-m", "mlabench", *args], capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and res.stderr.strip() == line, res.stderr


def test_export_of_a_validation_run_says_it_is_no_tuning_run():
    """`tune --export VALIDATION_RUN` (the run folder beside the tuning run) said "continue it with:
    mlabench tune --validate /tmp/tune/qo1/.../policy.json --resume ...", the policy path of the H200
    machine and a command that does not export: it now says which run --export takes."""
    from mlabench.errors import ResultsError
    from mlabench.tune.run import export_run

    validation = next((DEPLOY / "qo1-k3").glob("validate-*"))
    with pytest.raises(ResultsError, match=r"is a validation run, not a tuning run: --export takes the tuning run"
                                           r" .*tune --validate POLICY --from-run") as caught:
        export_run(validation, pages_rule=[1])
    assert "continue it" not in str(caught.value) and "\n" not in str(caught.value)


def test_a_batch_size_named_twice_is_recorded_once(tmp_path):
    """`--pages-rule 1,1` wrote `"pages_rule": [1, 1]` into the policy's source, so exporting again
    with `--pages-rule 1` kept a 'changed' policy aside that differed in nothing else."""
    from mlabench.tune.run import export_run

    run = qo1_k3_run(tmp_path)
    export_run(run, pages_rule=[1, 1])
    assert json.loads((run / "policy.json").read_text())["source"]["pages_rule"] == [1]
    assert "same policy as before" in export_run(run, pages_rule=[1]).note
