"""The tuning storage: checked before a run folder exists, a torn or corrupt journal, any number
of machines opening one empty PostgreSQL database at once, seeding once, the study's identity, an
export that refuses a study still running, and a measured point published before its claim goes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlabench.errors import ConfigError, ResultsError
from mlabench.records.store import ResultStore
from mlabench.tune.manifest import run_manifest
from mlabench.tune.run import export_run, recorded_config, run_tune
from mlabench.tune.space import TuneConfig
from mlabench.tune.storage import check_journal, journal_copy, open_storage, optuna_module
from mlabench.tune.studies import StudySpec, prepare_study

REPO = Path(__file__).resolve().parents[2]


def small_config(timing, **kw) -> TuneConfig:
    values = dict(backend="test-fast-wrong", heads=2, batch=[1], buckets=[48], page_size=16, timing=timing,
                  sampler="brute", trials=4, lengths_per_bucket=1, space={"num_kv_splits": {"low": 1, "high": 4}})
    values.update(kw)
    return TuneConfig.model_validate(values)


@pytest.mark.parametrize("url", ["sqlite:///{tmp}/missing/folder/x.db", "postgresql+psycopg2://u@127.0.0.1:9/x"])
def test_a_storage_that_cannot_be_opened_leaves_no_run_folder(tmp_path, tiny_timing, url):
    results = tmp_path / "results"
    with pytest.raises(ConfigError, match="cannot open"):
        run_tune(small_config(tiny_timing, storage=url.format(tmp=tmp_path)), results)
    assert not results.exists() or not list(results.iterdir())


def test_a_storage_whose_driver_is_not_installed_exits_3_and_leaves_no_run_folder(tmp_path, tiny_timing,
                                                                                  monkeypatch):
    """Issue 35 item 13: a package missing here is exit 3 (README), not 2 (bad input)."""
    import sys

    from mlabench.errors import DependencyError

    monkeypatch.setitem(sys.modules, "pymysql", None)  # import pymysql fails, as where it is not installed
    results = tmp_path / "results"
    with pytest.raises(DependencyError, match="the database driver pymysql is not installed") as info:
        run_tune(small_config(tiny_timing, storage="mysql+pymysql://u@127.0.0.1:9/x"), results)
    assert info.value.exit_code == 3
    assert not results.exists() or not list(results.iterdir())


def journal_with_trials(run_dir: Path) -> Path:
    optuna = optuna_module()
    run_dir.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(study_name="s", storage=open_storage(None, run_dir))
    for n in range(3):
        study.enqueue_trial({"x": n})
    study.optimize(lambda t: float(t.suggest_int("x", 0, 9)), n_trials=3)
    return run_dir / "study.journal"


def test_a_torn_last_journal_line_is_cut_off_with_a_notice(tmp_path, capsys):
    journal = journal_with_trials(tmp_path / "run")
    whole = journal.read_bytes()
    journal.write_bytes(whole[:-40])                              # a crash mid-write
    storage = open_storage(None, journal.parent)
    assert "torn" in capsys.readouterr().err
    assert journal.read_bytes() == whole[:whole[:-40].rfind(b"\n") + 1]  # cut at the last whole line
    optuna_module().load_study(study_name="s", storage=storage).get_trials()  # reads cleanly
    assert check_journal(journal) == 0


def test_reading_a_journal_with_a_torn_line_leaves_the_file_as_it_is(tmp_path, capsys):
    journal = journal_with_trials(tmp_path / "run")
    torn = journal.read_bytes()[:-40]                              # a run still writing its last line
    journal.write_bytes(torn)
    (tmp_path / "scratch").mkdir()
    copy = journal_copy(journal.parent, tmp_path / "scratch")
    err = capsys.readouterr().err
    assert str(journal) in err and "left as it is" in err
    assert journal.read_bytes() == torn                            # the run's own file is untouched
    trials = optuna_module().load_study(study_name="s", storage=open_storage(None, copy)).get_trials()
    assert len(trials) >= 2


@pytest.mark.parametrize("garbage", [b"\xff\xfe not utf-8\n", b'{"op_code": 1, \n', b"[1, 2]\n"])
def test_a_bad_journal_line_elsewhere_is_refused_naming_it_and_nothing_is_written(tmp_path, garbage):
    journal = journal_with_trials(tmp_path / "run")
    lines = journal.read_bytes().splitlines(keepends=True)
    broken = b"".join(lines[:2] + [garbage] + lines[2:])
    journal.write_bytes(broken)
    with pytest.raises(ResultsError, match="line 3 is not a journal record"):
        open_storage(None, journal.parent)
    assert journal.read_bytes() == broken


def test_resume_and_export_of_a_corrupt_journal_fail_in_one_line(tmp_path, tiny_timing):
    result = run_tune(small_config(tiny_timing), tmp_path)
    journal = result.store.run_dir / "study.journal"
    lines = journal.read_bytes().splitlines(keepends=True)
    broken = b"".join(lines[:1] + [b"\x00\xff\n"] + lines[1:])
    journal.write_bytes(broken)
    cfg = recorded_config(result.store.run_dir)[0]
    with pytest.raises(ResultsError, match="line 2"):
        run_tune(cfg, tmp_path, resume=result.store.run_dir)
    with pytest.raises(ResultsError, match="line 2"):
        export_run(result.store.run_dir)
    assert journal.read_bytes() == broken


@pytest.mark.parametrize("name", ["study.journal", "study.journal.gz"])
def test_export_of_an_empty_journal_fails_in_one_line(tmp_path, tiny_timing, name):
    """An empty journal (plain, or an archived run's 0-byte ``.gz``) holds none of the run's studies:
    export says so in one line (Optuna's KeyError traceback before: a fresh user's review)."""
    result = run_tune(small_config(tiny_timing), tmp_path)
    (result.store.run_dir / "study.journal").unlink()
    (result.store.run_dir / name).write_bytes(b"")
    with pytest.raises(ResultsError, match=r"study journal holds 0 of the run's 1 studies \(first missing") as exc:
        export_run(result.store.run_dir)
    assert "\n" not in str(exc.value) and str(exc.value).endswith("; restore it, or start a new run")
    # tune --resume says what export says, not that it measures the studies again (a fresh user's review);
    # a gzipped journal is to be gunzipped, not called missing
    refusal = "an empty study.journal: the trials" if name == "study.journal" else r"study.journal.gz: .*gunzip it"
    with pytest.raises((ResultsError, ConfigError), match=refusal):
        run_tune(small_config(tiny_timing), tmp_path, resume=result.store.run_dir)


def test_a_study_made_another_way_is_refused_naming_what_differs(tmp_path):
    store = ResultStore.create(tmp_path / "run", run_manifest("run", 1.0, {}))
    storage = open_storage(None, store.run_dir)
    spec = StudySpec(0, 48, 48, name="study", batch=1)
    mine = {"device": "cpu", "timing": {"budget_s": 0.1, "eager": False}, "revision": "abc", "run_id": "a"}
    prepare_study(storage, spec, mine, [], "cpu", store.run_dir)
    prepare_study(storage, spec, {**mine, "run_id": "b"}, [], "cpu", store.run_dir)  # another run: joins
    other = {**mine, "timing": {"budget_s": 0.05, "eager": False}, "revision": "def"}
    with pytest.raises(ResultsError) as exc:
        prepare_study(storage, spec, other, [], "cpu", store.run_dir)
    line = str(exc.value)
    assert "\n" not in line and "timing.budget_s 0.1 there, 0.05 here" in line and "revision abc there, def here" in line


def test_a_short_id_of_the_studys_revision_joins_it(tmp_path):
    """$MLABENCH_GIT_REVISION may name the commit a study was made at by a short id."""
    store = ResultStore.create(tmp_path / "run", run_manifest("run", 1.0, {}))
    storage = open_storage(None, store.run_dir)
    spec = StudySpec(0, 48, 48, name="study", batch=1)
    mine = {"device": "cpu", "timing": {"budget_s": 0.1, "eager": False}, "run_id": "a",
            "revision": "a54eaac2af3b6ac3cdd0410e74ade6f18c129448"}
    prepare_study(storage, spec, mine, [], "cpu", store.run_dir)
    prepare_study(storage, spec, {**mine, "revision": "a54eaac"}, [], "cpu", store.run_dir)
    with pytest.raises(ResultsError, match="revision a54eaac2af3b6ac3cdd0410e74ade6f18c129448 there, a54eaad here"):
        prepare_study(storage, spec, {**mine, "revision": "a54eaad"}, [], "cpu", store.run_dir)


def test_seeds_are_enqueued_once_per_study_whoever_comes_first(tmp_path):
    store = ResultStore.create(tmp_path / "run", run_manifest("run", 1.0, {}))
    storage = open_storage(None, store.run_dir)
    spec = StudySpec(0, 48, 48, name="study", batch=1)
    seeds = [("a", {"x": 1}), ("b", {"x": 2})]
    first = prepare_study(storage, spec, {}, seeds, "cpu", store.run_dir)
    first.optimize(lambda t: float(t.suggest_int("x", 0, 9)), n_trials=2)   # both seeds measured
    again = prepare_study(storage, spec, {}, seeds, "cpu", store.run_dir)
    assert [t.state.name for t in again.trials] == ["COMPLETE", "COMPLETE"]


OPEN_AND_SEED = """
import sys, time
from pathlib import Path
from mlabench.tune.storage import open_storage
from mlabench.tune.studies import StudySpec, prepare_study
url, start, folder = sys.argv[1], float(sys.argv[2]), Path(sys.argv[3])
time.sleep(max(0.0, start - time.time()))
storage = open_storage(url, folder)
for name in ("one", "two"):
    prepare_study(storage, StudySpec(0, 48, 48, name=name, batch=1), {"device": "cpu"},
                  [("a", {"x": 1}), ("b", {"x": 2}), ("c", {"x": 3})], "cpu", folder)
"""


def test_five_machines_opening_an_empty_database_at_once_all_start_and_seed_once(tmp_path, fresh_database):
    start = time.time() + 4.0  # after every interpreter has started
    procs = [subprocess.Popen([sys.executable, "-c", OPEN_AND_SEED, fresh_database, str(start), str(tmp_path / str(i))],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(5)]
    for i in range(5):
        (tmp_path / str(i)).mkdir()
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 5, "\n".join(outputs)
    optuna = optuna_module()
    storage = open_storage(fresh_database, tmp_path)
    for name in ("one", "two"):
        trials = optuna.load_study(study_name=name, storage=storage).trials
        assert sorted(t.system_attrs["fixed_params"]["x"] for t in trials) == [1, 2, 3]


def test_export_refuses_a_study_with_a_trial_still_running(tmp_path, tiny_timing):
    result = run_tune(small_config(tiny_timing), tmp_path)
    run_dir = result.store.run_dir
    spec = recorded_config(run_dir)[1][0]
    study = optuna_module().load_study(study_name=spec.name, storage=open_storage(None, run_dir))
    study.ask()                                                    # a worker somewhere, still measuring
    with pytest.raises(ResultsError, match=r"4/4 trials, 1 running.*--allow-incomplete"):
        export_run(run_dir)
    assert export_run(run_dir, allow_incomplete=True).policy.lookup(1, 48)["num_kv_splits"] == 4
    assert json.loads((run_dir / "policy.json").read_text())["backend"] == "test-fast-wrong"


def test_a_machine_tuning_another_way_is_refused_before_its_run_folder(tmp_path, tiny_timing):
    """Issue 28 item 5: a machine at another timing budget and without the tokens-per-split rule
    joined the studies of one with the defaults, and both exited 0."""
    url = f"sqlite:///{tmp_path}/shared.db"
    run_tune(small_config(tiny_timing, storage=url, lengths_per_bucket=2), tmp_path / "first")
    other = small_config(tiny_timing.model_copy(update={"budget_s": 0.05}), storage=url, lengths_per_bucket=2,
                         tokens_per_split=None)
    with pytest.raises(ResultsError) as exc:
        run_tune(other, tmp_path / "second")
    assert "timing.budget_s 0.02 there, 0.05 here" in str(exc.value) and "search.tokens_per_split" in str(exc.value)
    assert str(exc.value).endswith("go back to the revision and versions it names, or start a new run (with a "
                                   "shared --storage: another one)")  # advice for a resume too, not only a join
    assert not (tmp_path / "second").exists()


def test_a_study_with_fewer_configurations_than_trials_or_a_timeout_ends(tmp_path, tiny_timing):
    """A worker takes a study again only for its waiting trials: a sampler that ran out of
    configurations (brute force over 3 counts, --trials 8), or a --timeout, does not make it loop."""
    cfg = small_config(tiny_timing, trials=8, space={"num_kv_splits": {"low": 1, "high": 3}})
    result = run_tune(cfg, tmp_path / "few")
    assert result.choices[0].finished == 3
    timed = small_config(tiny_timing, sampler="tpe", trials=50, timeout_s=3.0,
                         space={"num_kv_splits": {"low": 1, "high": 16}})
    started = time.monotonic()
    run_tune(timed, tmp_path / "timed")
    assert time.monotonic() - started < 60


def test_a_measured_point_is_published_before_its_claim_is_given_up(tmp_path, tiny_timing, monkeypatch):
    """A machine finds a point in the study (a trial's ``points_so_far``) or a claim on it (a
    running trial's ``measuring``); a moment when neither shows lets it measure the point again
    (five machines once measured one configuration twice).  So the measuring trial publishes the
    point before it gives up the claim."""
    from tests.tune.helpers import run_in_process, tiny_config

    trial_cls = optuna_module().trial.Trial
    calls: list[tuple[str, str]] = []
    original = trial_cls.set_user_attr

    def spy(self, key, value):
        calls.append((key, json.dumps(value)))
        original(self, key, value)

    monkeypatch.setattr(trial_cls, "set_user_attr", spy)
    _, store = run_in_process(tmp_path, tiny_config("test-fast-wrong", tiny_timing, sampler="brute", trials=3))
    keys = [r.key for r in store.records()]
    assert len(keys) == 3
    for key in keys:
        claimed = calls.index(("measuring", json.dumps(key)))
        released = calls.index(("measuring", "null"), claimed)
        published = next(i for i, (k, v) in enumerate(calls) if k == "points_so_far" and key in v)
        assert claimed < published < released, calls[claimed:released + 2]
