"""Tuning on several machines through one PostgreSQL database (issue 28): two processes with a
core each stand for two machines.  They take the studies between them (≤ 0.6x one machine's wall
time, the same policy, nothing measured twice), five simultaneous starts are clean, and when one
is killed with SIGKILL and never comes back the other retries its trial and finishes every study.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from mlabench.tune.storage import GRACE_ENV, open_storage, optuna_module
from mlabench.tune.worker_pool import IMPORTS_ENV
from tests.tune.fake_backends import MODULE, PREPARE_ENV

REPO = Path(__file__).resolve().parents[2]
#: One machine: registers the test backends, tunes the configuration given as JSON, prints its wall time.
MACHINE = """
import json, sys, time
from pathlib import Path
t0 = time.monotonic()
import tests.tune.fake_backends as fb
fb.register_all()
from mlabench.tune.run import run_tune
from mlabench.tune.space import TuneConfig
result = run_tune(TuneConfig.model_validate(json.loads(sys.argv[1])), Path(sys.argv[2]))
print(json.dumps({"wall_s": time.monotonic() - t0, "run_dir": str(result.store.run_dir),
                  "policy": [[e.max_context_len, e.params] for b in result.policy.batches for e in b.entries]}))
"""
#: Four studies of 8 split counts of test-fast-wrong, each measurement 1 s (its prepare sleeps):
#: the job is measuring, not computing, so that a loaded CI machine still shows how it scales.
BUCKETS = [48, 96, 160, 256]
SPLITS = 8
PREPARE_S = "1.0"


def job(url: str, timing) -> dict:
    return {"backend": "test-fast-wrong", "heads": 2, "batch": [1], "buckets": BUCKETS, "page_size": 16,
            "lengths_per_bucket": 1, "sampler": "brute", "trials": SPLITS, "storage": url,
            "space": {"num_kv_splits": {"low": 1, "high": SPLITS}},
            "timing": timing.model_dump(mode="json")}


def start_machine(cfg: dict, results: Path, core: int, grace_s: int = 60) -> subprocess.Popen:
    """One machine: a process on one core (``taskset``, where there are two cores or more)."""
    pin = ["taskset", "-c", str(core % os.cpu_count())] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []
    env = {**os.environ, PREPARE_ENV: PREPARE_S, IMPORTS_ENV: MODULE, GRACE_ENV: str(grace_s),
           "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([*pin, sys.executable, "-c", MACHINE, json.dumps(cfg), str(results)], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout_s: float = 300) -> dict:
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def all_trials(url: str) -> list:
    optuna = optuna_module()
    storage = open_storage(url, Path("."))
    return [t for s in optuna.get_all_study_summaries(storage)
            for t in optuna.load_study(study_name=s.study_name, storage=storage).trials]


def record_keys(*run_dirs: str) -> list[str]:
    from mlabench.records.store import ResultStore

    return [r.key for d in run_dirs for r in ResultStore(Path(d)).records()]


def measuring_s(trials: list) -> float:
    """Seconds from the first trial's start to the last one's end: the job once the machines are up."""
    return (max(t.datetime_complete for t in trials) - min(t.datetime_start for t in trials)).total_seconds()


def test_two_machines_take_half_the_time_of_one_same_policy_nothing_measured_twice(
        tmp_path, tiny_timing, new_database):
    """The wall time asserted is the measuring (first trial start to last trial end): each machine's
    start-up (imports, the copy-bandwidth measurement, its worker's imports, 10-20 s on a loaded
    two-core machine) is the same alone or with others and does not shrink; both are printed."""
    alone = new_database()
    one = finish(start_machine(job(alone, tiny_timing), tmp_path / "alone", 0))
    shared = new_database()
    machines = [start_machine(job(shared, tiny_timing), tmp_path / f"m{i}", i) for i in range(2)]
    both = [finish(m) for m in machines]
    trials, trials_alone = all_trials(shared), all_trials(alone)
    ratio = measuring_s(trials) / measuring_s(trials_alone)
    wall = max(b["wall_s"] for b in both) / one["wall_s"]
    print(f"measuring: one machine {measuring_s(trials_alone):.1f} s, two {measuring_s(trials):.1f} s ({ratio:.2f}x); "
          f"wall: {one['wall_s']:.1f} s, {max(b['wall_s'] for b in both):.1f} s ({wall:.2f}x)")
    assert ratio <= 0.6
    assert both[0]["policy"] == both[1]["policy"] == one["policy"]
    keys = record_keys(*(b["run_dir"] for b in both))
    assert len(keys) == len(set(keys)) == SPLITS * len(BUCKETS)       # each configuration measured once
    assert not [t for t in trials if t.state.name != "COMPLETE" and t.state.name != "PRUNED"]
    seeds = sum("enqueued_as" in t.user_attrs for t in trials)
    assert seeds == sum("enqueued_as" in t.user_attrs for t in trials_alone)  # seeded once per study
    workers = {t.user_attrs["worker"].split(":")[1] for t in trials if "repeat_of" not in t.user_attrs}
    assert len(workers) == 2                                          # both machines measured


def test_five_simultaneous_starts_are_clean(tmp_path, tiny_timing, fresh_database):
    cfg = {**job(fresh_database, tiny_timing), "buckets": [48, 96], "trials": 4,
           "space": {"num_kv_splits": {"low": 1, "high": 4}}}
    machines = [start_machine(cfg, tmp_path / f"m{i}", i) for i in range(5)]
    results = [finish(m) for m in machines]
    assert len({json.dumps(r["policy"]) for r in results}) == 1
    keys = record_keys(*(r["run_dir"] for r in results))
    assert len(keys) == len(set(keys)) == 8


def test_a_machine_killed_for_good_has_its_trial_retried_by_the_other(tmp_path, tiny_timing, fresh_database):
    grace_s = 4
    first, second = (start_machine(job(fresh_database, tiny_timing), tmp_path / f"m{i}", i, grace_s)
                     for i in range(2))
    optuna = optuna_module()
    storage = open_storage(fresh_database, tmp_path)
    killed, deadline = None, time.monotonic() + 120
    while killed is None and time.monotonic() < deadline:
        time.sleep(0.3)
        for summary in optuna.get_all_study_summaries(storage):
            trials = optuna.load_study(study_name=summary.study_name, storage=storage).trials
            done = sum(t.state.name in ("COMPLETE", "PRUNED") for t in trials)
            for t in trials:
                pid = t.user_attrs.get("worker", "::").split(":")[1]
                if done >= 3 and t.state.name == "RUNNING" and pid and parent_of(int(pid)) == second.pid:
                    killed = (summary.study_name, t.number)
                    os.kill(second.pid, signal.SIGKILL)  # its worker follows it (no orphans)
                    break
            if killed:
                break
    assert killed is not None, "no trial of the second machine was running to kill"
    second.wait()
    killed_at, killed_clock = time.monotonic(), datetime.datetime.now()
    finish(first)
    print(f"the other machine finished {time.monotonic() - killed_at:.1f} s after the kill")
    for summary in optuna.get_all_study_summaries(storage):
        trials = optuna.load_study(study_name=summary.study_name, storage=storage).trials
        assert not [t for t in trials if t.state.name in ("RUNNING", "WAITING")]
        configs = {t.params["num_kv_splits"] for t in trials if t.state.name in ("COMPLETE", "PRUNED")}
        assert configs == set(range(1, SPLITS + 1)), summary.study_name       # every study finished
        if summary.study_name == killed[0]:
            dead = next(t for t in trials if t.number == killed[1])
            assert dead.state.name == "FAIL"
            noticed_s = (dead.datetime_complete - killed_clock).total_seconds()
            assert noticed_s <= grace_s + 3, noticed_s                     # found dead once its heartbeat stopped
            retry = [t for t in trials if t.system_attrs.get("failed_trial") == killed[1]]
            assert [t.state.name for t in retry] in (["COMPLETE"], ["PRUNED"])  # retried once, by the other


def parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None

