"""A live worker paused past the grace period (issue 35 item 9): its trial is failed as stale and
retried by the other worker; when it goes on, its late result is dropped with a notice and the run
finishes (before: "Cannot tell a FAIL trial" ended the run, exit 2, no policy)."""

from __future__ import annotations

import pytest

from mlabench.tune.run import run_tune
from mlabench.tune.storage import GRACE_ENV
from tests.tune.fake_backends import PREPARE_ENV, STALL_ENV, TOGETHER_ENV
from tests.tune.test_tune_run import assert_nothing_lost_or_twice, fast_wrong_config

GRACE_S = 2


def test_a_worker_paused_past_the_grace_period_has_its_late_result_dropped_and_the_run_finishes(
        tmp_path, tiny_timing, monkeypatch):
    arrived, stalled = tmp_path / "arrived", tmp_path / "stalled"
    arrived.mkdir()
    monkeypatch.setenv(PREPARE_ENV, "0.3")
    monkeypatch.setenv(TOGETHER_ENV, f"{arrived}:2")   # both workers measure before one stalls
    monkeypatch.setenv(STALL_ENV, f"{stalled}:{4 * GRACE_S}")
    monkeypatch.setenv(GRACE_ENV, str(GRACE_S))
    url = f"sqlite:///{tmp_path}/studies.db"
    cfg = fast_wrong_config(tiny_timing, storage=url, trials=8, space={"num_kv_splits": {"low": 1, "high": 8}})
    result = run_tune(cfg, tmp_path, devices=[None, None])
    trials = assert_nothing_lost_or_twice(result.store.run_dir, url)
    pid = stalled.read_text()
    stale = [t for t in trials if t.user_attrs.get("worker", "").split(":")[1:2] == [pid] and t.state.name == "FAIL"]
    assert stale  # (a loaded machine may miss a heartbeat elsewhere too: such a trial is retried alike)
    for t in [t for t in trials if t.state.name == "FAIL"]:
        retry = [r for r in trials if r.system_attrs.get("failed_trial") == t.number]
        assert [r.state.name for r in retry] in (["COMPLETE"], ["PRUNED"]), t.number
    done = {t.params["num_kv_splits"] for t in trials if t.state.name in ("COMPLETE", "PRUNED")}
    assert done == set(range(1, 9))
    assert not [t for t in trials if t.state.name in ("RUNNING", "WAITING")]
    logs = " ".join(p.read_text() for p in (result.store.run_dir / "workers").glob("worker-*.log"))
    assert f"notice: trial {stale[0].number} " in logs and "dropped" in logs
    assert result.policy.lookup(1, 48)["num_kv_splits"] == 6


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_sqlite_stale_trial_cleanup_waits_for_a_stalled_writer(tmp_path, monkeypatch):
    """A worker stopped while it held SQLite's write lock: the other worker's stale-trial cleanup
    waits for it (up to twice the grace period), where the driver's 5 s ended in "database is locked"."""
    import sqlite3
    import threading
    import time

    from mlabench.tune.storage import fail_stale, open_storage, optuna_module

    monkeypatch.setenv(GRACE_ENV, str(GRACE_S))
    url = f"sqlite:///{tmp_path}/studies.db"
    study = optuna_module().create_study(study_name="s", storage=open_storage(url, tmp_path))
    trial = study.ask()  # RUNNING, its heartbeat never beats: stale once the grace period passes
    study._storage.record_heartbeat(trial._trial_id)
    time.sleep(GRACE_S + 1)
    held = threading.Event()

    def stalled_writer():
        conn = sqlite3.connect(tmp_path / "studies.db")
        conn.execute("BEGIN IMMEDIATE")
        held.set()
        time.sleep(6.5)
        conn.rollback()
        conn.close()

    thread = threading.Thread(target=stalled_writer)
    thread.start()
    held.wait()
    fail_stale(study)
    thread.join()
    assert study.trials[0].state.name == "FAIL"
