"""Tuning runs with real worker processes: a real CPU backend end to end, resume after ``kill -9``,
two workers on one study (journal file and PostgreSQL), and a worker on another GPU refusing."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from mlabench.device import current_device
from mlabench.errors import ConfigError, GPURequiredError, MlabenchError, ResultsError, WorkerError
from mlabench.records.store import ResultStore
from mlabench.tune.manifest import run_manifest
from mlabench.tune.run import export_run, gpu_model, run_tune
from mlabench.tune.space import TuneConfig
from mlabench.tune.storage import open_storage, optuna_module
from mlabench.tune.studies import StudySpec, prepare_study
from mlabench.tune.trial_worker import worker_main
from tests.tune.fake_backends import PREPARE_ENV, TOGETHER_ENV


def study_trials(run_dir: Path, url: str | None = None) -> list:
    optuna = optuna_module()
    storage = open_storage(url, run_dir)
    names = [s.name for s in __import__("mlabench.tune.run", fromlist=["x"]).recorded_config(run_dir)[1]]
    return [t for name in names for t in optuna.load_study(study_name=name, storage=storage).trials]


def assert_nothing_lost_or_twice(run_dir: Path, url: str | None = None) -> list:
    """Every finished trial has its records (one per length measured) in the run folder, every
    record belongs to a trial; no configuration was measured twice at one length."""
    keys = [r.key for r in ResultStore(run_dir).records()]
    assert len(keys) == len(set(keys)), "a configuration was measured twice"
    trials = study_trials(run_dir, url)
    finished = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert all(len(t.user_attrs["record_keys"]) == len(t.user_attrs["points"]) for t in finished)
    trial_keys = {k for t in finished for k in t.user_attrs["record_keys"]}
    assert trial_keys == set(keys), "a trial has no record, or a record no trial"
    return trials


def fast_wrong_config(timing, **kw) -> TuneConfig:
    """One length per bucket (no tokens-per-split rule): 16 configurations, 16 records."""
    values = dict(backend="test-fast-wrong", heads=2, batch=[1], buckets=[48], page_size=16, timing=timing,
                  sampler="brute", trials=16, lengths_per_bucket=1)
    values.update(kw)
    return TuneConfig.model_validate(values)


def test_real_cpu_backend_end_to_end(tmp_path, tiny_timing):
    from mlabench.records.store import records_of

    cfg = TuneConfig(backend="torch-splitkv", heads=2, batch=[1, 2], buckets=[32, 96], page_size=16, trials=4,
                     space={"num_kv_splits": {"low": 1, "high": 6}}, timing=tiny_timing)
    result = run_tune(cfg, tmp_path)
    run_dir = result.store.run_dir
    trials = assert_nothing_lost_or_twice(run_dir)
    assert sum(t.state.name == "COMPLETE" for t in trials) >= 4 * 4 - 3      # repeats of a config are reused
    assert any("enqueued_as" in t.user_attrs for t in trials)                # the heuristics went first
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert all(isinstance(p["samples_us"], list) and p["verdict_passed"] for t in complete for p in t.user_attrs["points"])
    assert any(len(t.user_attrs["points"]) == 3 for t in complete)          # three lengths per bucket
    assert any("tokens_per_split" in t.params for t in complete)             # the rule was searched
    assert {p.name for p in run_dir.iterdir()} >= {"policy.json", "policy.h", "policy.py", "results.csv",
                                                   "study.journal", "manifest.json"}
    assert len(records_of([run_dir])) == len(ResultStore(run_dir).records())  # compare/plot read it
    assert [b.batch for b in result.policy.batches] == [1, 2]
    again = export_run(run_dir)
    assert again.policy.batches == result.policy.batches
    records = (run_dir / "results.jsonl").read_bytes()
    (run_dir / "study.journal").write_bytes(b"")  # fresh users' reviews: --resume then started every study over
    with pytest.raises(ResultsError, match=r"an empty study\.journal: the trials its studies ran are not there"):
        run_tune(cfg, tmp_path, resume=run_dir)
    (run_dir / "study.journal").unlink()
    with pytest.raises(ResultsError, match=r"no study\.journal: the trials its studies ran are not there"):
        run_tune(cfg, tmp_path, resume=run_dir)
    assert (run_dir / "results.jsonl").read_bytes() == records and not (run_dir / "study.journal").exists()


def test_resume_after_kill9_repeats_no_finished_trial(tmp_path, tiny_timing, monkeypatch):
    monkeypatch.setenv(PREPARE_ENV, "0.2")
    # a point samples until its CI is narrow (as in two_workers): on a loaded machine 0.02 s could
    # end at 3-5 samples with a CI that ties every configuration, and the fewest splits would win
    cfg = fast_wrong_config(tiny_timing.model_copy(update={"budget_s": 1.0, "max_samples": 50}))
    errors: list[BaseException] = []

    def first_run():
        try:
            run_tune(cfg, tmp_path)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    thread = threading.Thread(target=first_run)
    thread.start()
    killed, deadline = None, time.monotonic() + 120
    optuna = optuna_module()
    while killed is None and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.2)
        journals = list(tmp_path.glob("*/study.journal"))
        if not journals:
            continue
        storage = open_storage(None, journals[0].parent)
        names = optuna.get_all_study_names(storage)
        if not names:
            continue
        trials = optuna.load_study(study_name=names[0], storage=storage).trials
        running = [t for t in trials if t.state.name == "RUNNING" and "worker" in t.user_attrs]
        if sum(t.state.name in ("COMPLETE", "PRUNED") for t in trials) >= 3 and running:
            killed = running[0]
            os.kill(int(killed.user_attrs["worker"].split(":")[1]), signal.SIGKILL)
    thread.join(timeout=120)
    assert killed is not None, "no trial was running to kill"
    assert errors and isinstance(errors[0], MlabenchError) and "-9" in str(errors[0])
    run_dir = journals[0].parent
    before = {t.number: t.params for t in study_trials(run_dir) if t.state.name in ("COMPLETE", "PRUNED")}

    result = run_tune(cfg, tmp_path, resume=run_dir)
    trials = assert_nothing_lost_or_twice(run_dir)
    failed = [t for t in trials if t.state.name == "FAIL"]
    assert [t.number for t in failed] == [killed.number]
    assert any(t.user_attrs.get("retry_of") == killed.number for t in trials)     # its config was retried
    done = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert sorted(t.params["num_kv_splits"] for t in done if "repeat_of" not in t.user_attrs) == list(range(1, 17))
    after = {t.number: t.params for t in done}
    assert all(after[n] == p for n, p in before.items())                           # finished trials kept
    assert len(ResultStore(run_dir).records()) == 16
    assert result.policy.lookup(1, 48)["num_kv_splits"] == 6


def two_workers(tmp_path: Path, timing, url: str | None, monkeypatch) -> None:
    """Two workers on one study of 16 configurations: each measures some, none is lost or measured
    twice, and the choice is the fastest correct one.  Made for a loaded machine: each worker's
    first measurement waits for the other's to begin (``TOGETHER_ENV``; a worker started seconds
    late found every trial done), and a point samples until its median's CI is narrow (up to 50
    samples or 1 s: a sample descheduled for tens of ms ended ``timing``'s 0.02 s budget at 3-5
    samples, a CI so wide that every configuration tied with 6 splits and the fewest, 1, won)."""
    arrived = tmp_path / "arrived"
    arrived.mkdir()
    monkeypatch.setenv(PREPARE_ENV, "0.2")
    monkeypatch.setenv(TOGETHER_ENV, f"{arrived}:2")
    cfg = fast_wrong_config(timing.model_copy(update={"budget_s": 1.0, "max_samples": 50}), storage=url)
    result = run_tune(cfg, tmp_path, devices=[None, None])
    assert len(list(arrived.iterdir())) == 2                          # both began measuring
    trials = assert_nothing_lost_or_twice(result.store.run_dir, url)
    done = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert sorted({t.params["num_kv_splits"] for t in done}) == list(range(1, 17))
    assert len(result.store.records()) == 16                          # each configuration measured once
    assert not [t for t in trials if t.state.name in ("RUNNING", "WAITING", "FAIL")]
    assert len({t.user_attrs["worker"] for t in done}) == 2           # both workers took trials
    assert result.policy.lookup(1, 48)["num_kv_splits"] == 6


def test_two_workers_share_one_study_journal(tmp_path, tiny_timing, monkeypatch):
    two_workers(tmp_path, tiny_timing, None, monkeypatch)


def test_two_workers_share_one_study_postgresql(tmp_path, tiny_timing, monkeypatch, postgres_url):
    two_workers(tmp_path, tiny_timing, postgres_url, monkeypatch)
    manifest = json.loads(next(tmp_path.glob("*/manifest.json")).read_text())
    assert manifest["config"]["tune"]["storage"] == postgres_url          # no password to redact here


def test_worker_on_another_gpu_model_refuses(tmp_path, tiny_timing):
    store = ResultStore.create(tmp_path / "run", run_manifest("run", 1.0, {}))
    storage = open_storage(None, store.run_dir)
    spec = StudySpec(0, 48, 48, name="study", batch=1)
    elsewhere = f"{current_device().name} of another machine"  # never this process's device
    prepare_study(storage, spec, {"device": elsewhere}, [], elsewhere, store.run_dir)
    with pytest.raises(ResultsError, match="another GPU model"):
        prepare_study(storage, spec, {"device": "x"}, [], "AMD Instinct MI355X", store.run_dir)
    payload = {"config": fast_wrong_config(tiny_timing).model_dump(mode="json", by_alias=True),
               "run_dir": str(store.run_dir), "studies": [spec.__dict__]}
    with pytest.raises(ResultsError, match="does not join"):
        worker_main(payload, 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_gpus_need_gpus():
    with pytest.raises(GPURequiredError, match="needs GPUs") as info:  # cannot run here: exit 3, not 2
        gpu_model(["0", "1"])
    assert info.value.exit_code == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_gpus_must_exist_and_name_their_model():
    count = torch.cuda.device_count()
    with pytest.raises(ConfigError, match=f"GPU {count} does not exist"):
        gpu_model(["0", str(count)])
    assert gpu_model(["0"]) == torch.cuda.get_device_name(0)


def test_export_reads_an_archived_runs_gzipped_journal_and_resume_refuses_it(tmp_path):
    """A committed run keeps study.journal.gz: --export rebuilds its policy as committed (all but
    the time it was made) and writes no journal beside it; adding trials to it is refused."""
    import shutil

    from mlabench.errors import ConfigError
    from mlabench.tune.run import export_run
    from mlabench.tune.storage import open_storage

    committed = Path(__file__).resolve().parents[2] / "results/h200/deploy/qo4"
    run = tmp_path / "run"
    shutil.copytree(next(committed.glob("tune-*")), run)
    assert (run / "study.journal.gz").exists() and not (run / "study.journal").exists()
    before = json.loads((run / "policy.json").read_text())
    export_run(run)
    after = json.loads((run / "policy.json").read_text())
    for p in (before, after):
        p.get("source", {}).pop("created", None)
    assert after == before
    assert not (run / "study.journal").exists()
    with pytest.raises(ConfigError, match="gunzip it to add trials"):
        open_storage(None, run)


def test_a_failed_worker_names_the_command_that_resumes(tmp_path, tiny_timing, monkeypatch):
    """Issue 25 item 5: a worker that stopped on a full disk ends the run with its error and the
    resume command (the CSV is not rewritten: the disk is full)."""
    said = "worker 0 (this host's devices) exited with 3: error: run results could not be written: the disk is full"

    def supervise(workers, poll=None):
        raise WorkerError(said, 3)

    monkeypatch.setattr("mlabench.tune.run.start_workers", lambda *a, **k: [])
    monkeypatch.setattr("mlabench.tune.run.supervise", supervise)
    with pytest.raises(MlabenchError) as info:
        run_tune(fast_wrong_config(tiny_timing), tmp_path)
    (run_dir,) = list(tmp_path.iterdir())
    assert str(info.value) == f"{said}; trials so far are kept in {run_dir}; continue with: mlabench tune --resume {run_dir}"
    assert info.value.exit_code == 3  # a full disk: nothing wrong with the input
    # issue 25 item 7: a tuning run's manifest names its softmax scale too (12 heads, no model: 576 ** -0.5)
    assert ResultStore(run_dir).manifest().softmax_scale.startswith("softmax scale 0.041667 = 576 ** -0.5")


def test_two_workers_finish_a_grid_search(tmp_path, tiny_timing, monkeypatch):
    """Issue 35 item 8: Optuna's grid sampler shuffles its grid by its seed and its workers share
    trials by grid index, so workers seeded differently each took index i for another point: two
    workers on a 6-point grid stopped at 4-5 points ("not finished", and --resume added nothing).
    Every worker seeds a study's grid alike: two workers measure every point of a 16-point grid
    once.  Both begin measuring before either finishes (``TOGETHER_ENV``), as in two_workers."""
    arrived = tmp_path / "arrived"
    arrived.mkdir()
    monkeypatch.setenv(PREPARE_ENV, "0.2")
    monkeypatch.setenv(TOGETHER_ENV, f"{arrived}:2")
    cfg = fast_wrong_config(tiny_timing, sampler="grid", heuristics=False)
    result = run_tune(cfg, tmp_path, devices=[None, None])
    assert len(list(arrived.iterdir())) == 2                          # both began measuring
    trials = assert_nothing_lost_or_twice(result.store.run_dir)
    done = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert sorted({t.params["num_kv_splits"] for t in done}) == list(range(1, 17))
    assert len({t.user_attrs["worker"] for t in done}) == 2           # both workers took trials


@pytest.mark.parametrize("kind", ["sweep", None])
def test_tune_resume_of_a_sweep_names_the_command_that_continues_it(tmp_path, kind):
    """A fresh user's review: `tune --resume` of a kernel sweep said only that it is no tuning run."""
    from mlabench.tune.run import recorded_config

    from mlabench.tune.run import requested_config

    store = ResultStore.create(tmp_path / "sweep", run_manifest("sweep", 1.0, {"backends": ["torch-ref"]}, kind=kind))
    with pytest.raises(ResultsError, match=r"sweep is a sweep, not a tuning run; "
                                           r"continue it with: mlabench sweep --resume .*sweep$"):
        recorded_config(store.run_dir)
    os.rename(store.run_dir / "results.jsonl", store.run_dir / "results.jsonl.gz")  # archived: named, not unzipped
    with pytest.raises(ResultsError, match=r"is a sweep, not a tuning run; continue it with: mlabench sweep --resume"):
        requested_config({}, None, store.run_dir)
