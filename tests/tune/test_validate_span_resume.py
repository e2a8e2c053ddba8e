"""``tune --validate``: held-out lengths within the policy's span by default, Ctrl-C and --resume,
and the policy's own numbers kept in the summary table."""

from __future__ import annotations

import pytest

from mlabench.bench.shape_bench import ShapeBench
from mlabench.errors import ConfigError, Interrupted, ResultsError
from mlabench.policy.tuned import BatchPolicy, Policy, PolicyEntry
from mlabench.records.store import ResultStore
from mlabench.tune.validation import policy_span, span_note, validation_tables
from mlabench.tune.validation_run import validate_policy


def span_policy(splits: int = 6) -> Policy:
    """Tuned at buckets 64 and 256 (shortest tuned length 45): a span wide enough to draw from."""
    return Policy(backend="test-fast-wrong", device="test", param_names=["num_kv_splits"],
                  shape={"num_heads": 2, "page_size": 16, "q_dtype": "bfloat16", "kv_dtype": "bfloat16"},
                  batches=[BatchPolicy(batch=1, entries=[PolicyEntry(max_context_len=256,
                                                                     params={"num_kv_splits": splits})])],
                  source={"buckets": [64, 256], "lengths": [45, 128, 256]})


def test_held_out_lengths_default_to_the_span_the_policy_was_tuned_for(tmp_path, tiny_timing):
    policy = span_policy()
    assert policy_span(policy) == (45, 256) and span_note(policy, 45, 256) is None
    assert "last bucket (256)" in span_note(policy, 90, 1000)
    result = validate_policy(policy, count=2, ladder=[1, 6], timing=tiny_timing, results_root=tmp_path, seed=1)
    assert all(45 <= p.context_len <= 256 for p in result.points)  # not 1024-131072, far beyond the last bucket


def test_an_interrupted_validation_keeps_its_points_and_resumes_without_measuring_them_again(
        tmp_path, tiny_timing, monkeypatch):
    from mlabench.tune.run import recorded_config

    policy, path = span_policy(), tmp_path / "policy.json"
    path.write_text(policy.to_json())

    def stop(done: int, total: int, label: str) -> None:
        if done == 1:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted, match=r"interrupted: 1 of 2 points recorded in .*validate-.*continue with: "
                                          r"mlabench tune --validate .*policy\.json --resume .*validate-"):
        validate_policy(policy, count=2, ladder=[1, 6], timing=tiny_timing, results_root=tmp_path, progress=stop,
                        seed=1, policy_path=path)
    run = next(tmp_path.glob("validate-*"))
    before = [r.key for r in ResultStore(run).records()]
    with pytest.raises(ResultsError, match=r"validation run, not a tuning run; continue it with: mlabench tune --validate .*--resume"):
        recorded_config(run)  # `tune --resume` of a validation folder names the command that continues it
    with pytest.raises(ConfigError, match="another policy"):
        other = span_policy()
        validate_policy(other.model_copy(update={"source": {**other.source, "run_id": "another"}}), resume=run,
                        results_root=tmp_path)
    measured: list[int] = []
    real = ShapeBench.run
    monkeypatch.setattr(ShapeBench, "run", lambda self, backend, params, **kw: measured.append(
        self.shape.max_context_len) or real(self, backend, params, **kw))
    result = validate_policy(policy, resume=run, results_root=tmp_path)
    keys = [r.key for r in result.store.records()]
    assert keys[:len(before)] == before and len(set(keys)) == len(keys)  # appended to, nothing measured twice
    assert len(result.points) == 2 and measured and result.points[0].context_len not in measured
    assert (run / "validation.json").exists()


def test_the_policys_numbers_stay_in_the_summary_with_one_batch_size(tmp_path, tiny_timing):
    from mlabench.tables.render import to_rich

    result = validate_policy(span_policy(), count=1, ladder=[1, 6], timing=tiny_timing, results_root=tmp_path)
    summary = validation_tables(result)[0]  # rows batch 1 and "all": the same numbers in both
    table = to_rich(summary, width=80)
    headers = [str(c.header).replace("\n", " ") for c in table.columns]
    assert "policy worst %" in headers and "policy geomean %" in headers, headers
    assert "policy worst" not in str(table.caption)


def test_resume_of_a_sweep_folder_is_refused_as_no_validation_run_before_the_backend_is_asked(tmp_path):
    """A fresh user's review: `tune --validate P --resume <sweep>` with a GPU backend's policy on a
    CPU said the backend is not available here (exit 3), not what the folder is."""
    from mlabench.backends import gluon as _gluon  # noqa: F401  (registers gluon-splitkv)
    from mlabench.tune.manifest import run_manifest

    store = ResultStore.create(tmp_path / "sweep", run_manifest("sweep", 1.0, {"backends": ["torch-ref"]}, kind="sweep"))
    policy = span_policy().model_copy(update={"backend": "gluon-splitkv"})
    with pytest.raises(ResultsError, match=r"sweep is a sweep, not a validation run; continue it with: mlabench sweep --resume .*sweep$"):
        validate_policy(policy, resume=store.run_dir, results_root=tmp_path)


def test_resume_with_other_counts_of_the_same_tuning_run_is_refused(tmp_path, tiny_timing):
    """A fresh user's review: `tune --validate OTHER --resume RUN`, OTHER the same tuning run's
    policy with one count changed, rewrote RUN's validation.json with OTHER's scores (its manifest
    still naming the first policy)."""
    result = validate_policy(span_policy(6), count=1, ladder=[1, 6], timing=tiny_timing, results_root=tmp_path, seed=1)
    run = result.store.run_dir
    before = (run / "validation.json").read_bytes()
    with pytest.raises(ConfigError, match=r"validated another policy; give that policy's file, or start a new "
                                          r"validation \(tune --validate POLICY --from-run .* scores this one"):
        validate_policy(span_policy(3), resume=run, results_root=tmp_path)
    assert (run / "validation.json").read_bytes() == before
    again = validate_policy(span_policy(6), resume=run, results_root=tmp_path)  # its own policy resumes
    assert [p.context_len for p in again.points] == [p.context_len for p in result.points]
