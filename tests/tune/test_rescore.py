"""``tune --validate POLICY --from-run RUN``: a policy scored on recorded measurements (no GPU)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
QO1 = REPO / "results/h200/deploy/qo1"
POLICY = QO1 / "tune-kimi-k3-tp8-20261201-152425-462/policy.json"
VALIDATION = QO1 / "validate-20261201-152911-787"


def _two_pages_policy(tmp_path: Path) -> Path:
    """The committed policy's identity with one rule a batch size: 128 tokens (2 pages) a split, at
    most 128 splits at batch 1 and 8 at batch 16, the other parameters at gluon-splitkv's defaults."""
    data = json.loads(POLICY.read_text())
    data["batches"] = [{"batch": b, "entries": [{"max_context_len": 131072, "tokens_per_split": 128, "params": {
        "num_kv_splits": cap, "split_policy": "", "num_stages": 2, "pdl": pdl}}]} for b, cap, pdl in ((1, 128, 1), (16, 8, 0))]
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(data))
    return path


def test_the_policy_a_validation_measured_scores_as_that_validation_did():
    """On its own validation run's records, the committed policy gets, at each of the 32 points,
    the best and the policy times the live validation wrote in validation.json."""
    from mlabench.policy.tuned import load_policy
    from mlabench.records.store import records_of
    from mlabench.tune.rescore import recorded_points

    score = recorded_points(load_policy(POLICY), records_of([VALIDATION]))
    measured = {(p["batch"], p["context_len"]): p for p in json.loads((VALIDATION / "validation.json").read_text())}
    assert score.unscored == [] and len(score.points) == len(measured) == 32
    for p in score.points:
        want = measured[(p.batch, p.context_len)]
        assert (p.best_us, p.policy_us, p.policy_params) == (want["best_us"], want["policy_us"], want["policy_params"])


def test_another_policy_is_scored_where_its_launch_was_recorded_and_the_rest_is_named(tmp_path):
    """A rule the validation did not measure: scored at the points where its count at the defaults
    was recorded, the others left out by name; the best launch shows the parameters it differs in
    (128 splits at pdl 0 beat the rule's 128 at pdl 1 at 35941 tokens); nothing is written; exit 1
    because a point misses 3%."""
    from mlabench.cli import app

    res = CliRunner().invoke(app, ["tune", "--validate", str(_two_pages_policy(tmp_path)), "--from-run",
                                   str(VALIDATION), "--results-dir", str(tmp_path / "runs"), "--json"])
    assert res.exit_code == 1, res.output
    summary, detail = json.loads(res.stdout)
    rows = {(r["batch"], r["context"]): r for r in detail["rows"]}
    assert len(rows) == 25 and (1, 1026) not in rows and rows[(16, 5161)]["policy %"] == 0
    assert rows[(1, 35941)]["best splits"] == "128 (pdl=0)" and rows[(1, 35941)]["policy splits"] == 128
    notes = " ".join(summary["notes"])
    assert "7 recorded points left out" in notes and "batch 1: 1026, 2702, 3734, 5161, 7131, 9855, 13619" in notes
    assert "every recorded length where the policy's launch was recorded within 3%" in " ".join(res.stderr.split())
    assert detail["title"].startswith("Recorded points") and not (tmp_path / "runs").exists()


def _mlabench(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "mlabench", *args], capture_output=True, text=True, timeout=120)


def test_from_run_takes_none_of_the_measuring_flags():
    """One error line, exit 2, for a flag that measures (the recorded points are the grid)."""
    for extra in (["--lengths", "4"], ["--context", "4160"], ["--resume", str(VALIDATION)]):
        res = _mlabench("tune", "--validate", str(POLICY), "--from-run", str(VALIDATION), *extra)
        assert res.returncode == 2 and "--from-run scores the policy at the recorded points" in res.stderr
        assert "Traceback" not in res.stderr


def test_runs_without_the_policys_launch_are_refused_naming_what_they_hold():
    """A sweep of other backends holds no point of the policy's launch: one error line, exit 2.  It
    has no point of the policy's backend and shape at all, which the line said as "no recorded point
    ... holds its own launch (0 points without it; ...)"; now it says no point is recorded there."""
    sweep = next((REPO / "results/h200/kimi-k3-tp8").glob("kimi-k3-tp8-*"))
    res = _mlabench("tune", "--validate", str(POLICY), "--from-run", str(sweep))
    assert res.returncode == 2 and "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert "no point of gluon-splitkv is recorded at the policy's shape (" in res.stderr
    assert "holds its own launch" not in res.stderr and "0 points" not in res.stderr
    assert "the records cover backends" in res.stderr


def test_records_run_under_a_split_policy_are_named_as_why_none_scores():
    """A fresh user's review: a sweep of the policy in device mode at its own shape was refused as
    holding no point at that shape, while the records' coverage it listed matched it field for
    field; the split policy they ran under is why."""
    res = _mlabench("tune", "--validate", str(POLICY), "--from-run", str(REPO / "results/h200/deploy/qo1-k3/pdl"))
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert res.stderr.strip().endswith("; 72 of its records ran under a split_policy, whose num_kv_splits is not "
                                       "the count that ran: they are not scored")


def test_serve_bench_runs_under_the_folder_are_passed_over():
    """results/h200/serving holds serve-bench runs beside the sweeps of sweep/: they are not read
    as kernel runs (no manifest error); the sweeps ran the policy in device mode, not its host
    launch (those records are no split counts), and the host sweeps fixed counts (108 and 16, then
    qo1-k3's 96 and 8), not this policy's at their lengths, so no point scores."""
    import re

    res = _mlabench("tune", "--validate", str(POLICY), "--from-run", str(REPO / "results/h200/serving"))
    assert res.returncode == 2 and "Traceback" not in res.stderr and "manifest" not in res.stderr
    assert "no recorded point of gluon-splitkv" in res.stderr
    assert re.search(r"\([1-9]\d* points? at that shape without it", res.stderr)


def test_a_point_where_no_launch_ran_correctly_is_a_miss_not_dropped(tmp_path):
    """The validation's records with every launch at batch 1, 1026 tokens marked incorrect: the
    point stays (32 points, none left out), with no best and no policy time, and misses the target,
    as a live validation keeps a point where nothing ran correctly."""
    import gzip
    import shutil

    from mlabench.policy.tuned import load_policy
    from mlabench.records.store import records_of
    from mlabench.tune.rescore import recorded_points
    from mlabench.tune.validation import target_misses

    run = tmp_path / VALIDATION.name
    shutil.copytree(VALIDATION, run)
    lines = [json.loads(line) for line in gzip.open(run / "results.jsonl.gz", "rt")]
    for rec in lines:
        if (rec["batch"], rec["context_len"]) == (1, 1026):
            rec["status"], rec["message"] = "incorrect", "poisoned for the test"
    with gzip.open(run / "results.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(rec) + "\n" for rec in lines))
    score = recorded_points(load_policy(POLICY), records_of([run]))
    assert len(score.points) == 32 and score.unscored == []
    point = next(p for p in score.points if (p.batch, p.context_len) == (1, 1026))
    assert point.best_us is None and point.policy_us is None and point in target_misses(score.points, 0.03)


def test_a_met_target_with_points_left_out_claims_only_the_scored_lengths(tmp_path):
    """The two-pages rule within 20% wherever its launch was recorded: target met, exit 0, but the
    verdict says it holds where the launch was recorded and how many points were left out (it said
    "every recorded length" with 7 of them unscored)."""
    from mlabench.cli import app

    res = CliRunner().invoke(app, ["tune", "--validate", str(_two_pages_policy(tmp_path)), "--from-run",
                                   str(VALIDATION), "--tolerance", "0.2", "--json"])
    assert res.exit_code == 0, res.output
    notes = " ".join(json.loads(res.stdout)[0]["notes"])
    assert ("target met: every recorded length where the policy's launch was recorded within 20% of the best "
            "count measured there (25 points; 7 left out)") in notes


def test_a_policy_of_another_head_count_is_refused_naming_both_shapes(tmp_path):
    """The committed policy relabelled 16 heads: one error line that names the policy's head count
    and page size and those the records hold (it named only backends, batches and lengths)."""
    data = json.loads(POLICY.read_text())
    data["shape"]["num_heads"] = 16
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(data))
    res = _mlabench("tune", "--validate", str(path), "--from-run", str(VALIDATION))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    line = " ".join(res.stderr.split())
    assert "at the policy's shape (16 heads, page 64, qo_len 1, bfloat16)" in line and "heads 12; page 64" in line


def test_records_launched_under_a_split_policy_are_not_split_counts(tmp_path):
    """results/h200/serving/sweep holds gluon-splitkv launched in device mode (its params say 256
    splits, num_kv_splits being ignored there; 16 ran at batch 16) beside fixed counts 16 and 108:
    the device launch was the best at batch 16, 4096 tokens, shown as "256 (split_policy=device:...)"
    with 3 counts.  Only the fixed counts are scored now."""
    data = json.loads(POLICY.read_text())
    data["batches"] = [{"batch": b, "entries": [{"max_context_len": 131072, "params": {
        "num_kv_splits": 16, "split_policy": "", "num_stages": 2, "pdl": pdl}}]} for b, pdl in ((1, 1), (16, 0))]
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(data))
    res = CliRunner().invoke(app_of(), ["tune", "--validate", str(path), "--from-run",
                                        str(REPO / "results/h200/serving/sweep"), "--json"])
    rows = {(r["batch"], r["context"]): r for r in json.loads(res.stdout)[1]["rows"]}
    assert set(rows) == {(1, 4096), (16, 4096)}, rows
    assert (rows[(16, 4096)]["best splits"], rows[(16, 4096)]["counts"], rows[(16, 4096)]["policy %"]) == (16, 2, 0)
    assert rows[(1, 4096)]["best splits"] == 108 and res.exit_code == 1


def app_of():
    from mlabench.cli import app

    return app


def test_runs_of_several_revisions_pooled_are_said_so():
    """results/h200/deploy holds runs of several mlabench revisions (five since qo1-k3/, at least the
    four before it): a point's best may be another kernel version's, and a note says so (one run
    named: no such note)."""
    from mlabench.policy.tuned import load_policy
    from mlabench.tune.rescore import recorded_validation

    _, notes = recorded_validation(load_policy(POLICY), [REPO / "results/h200/deploy"], 0.03)
    pooled = [int(n.split()[2]) for n in notes if re.match(r"records of \d+ mlabench revisions pooled", n)]
    assert pooled and pooled[0] >= 4
    assert not any("revisions pooled" in n for n in recorded_validation(load_policy(POLICY), [VALIDATION], 0.03)[1])
