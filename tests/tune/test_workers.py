"""The generic worker helpers: device pinning, liveness, shared appends, the record index."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mlabench.errors import ConfigError
from mlabench.records.store import ResultStore
from mlabench.tune.run import run_manifest
from mlabench.tune.worker_pool import RecordIndex, append_shared, device_env, parse_devices, worker_alive, worker_id


def test_parse_devices():
    assert parse_devices(None) == [None]
    assert parse_devices("0, 1,3") == ["0", "1", "3"]
    for bad in ("", "a", "0,0", "-1"):
        with pytest.raises(ConfigError):
            parse_devices(bad)


def test_device_env_sets_exactly_one_visibility_variable():
    base = {"CUDA_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "0,1", "X": "y"}
    assert device_env("1", rocm=False, base=base) == {"CUDA_VISIBLE_DEVICES": "1", "X": "y"}
    assert device_env("1", rocm=True, base=base) == {"HIP_VISIBLE_DEVICES": "1", "X": "y"}
    assert device_env(None, rocm=False, base=base) == base


def test_worker_liveness_survives_pid_reuse_and_other_hosts():
    assert worker_alive(worker_id()) is True
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    host = worker_id().split(":")[0]
    assert worker_alive(f"{host}:{proc.pid}:1") is False
    assert worker_alive(f"{host}:{os.getpid()}:1") is False          # a pid reused by another process
    assert worker_alive("another-host:1:1") is None


def test_record_index_reads_only_complete_lines(tmp_path):
    from mlabench.shapes import MLADecodeShape
    from mlabench.sweep.point import failed_record

    store = ResultStore.create(tmp_path / "run", run_manifest("run", 1.0, {}))
    index = RecordIndex(store)
    shape = MLADecodeShape.uniform(1, 16, 2, page_size=16)
    first = failed_record("b", {"n": 1}, shape, "run", None, "x")
    append_shared(store, first)
    assert index.get(first.key)["status"] == "error"
    second = failed_record("b", {"n": 2}, shape, "run", None, "y")
    line = second.model_dump_json()
    with open(store.jsonl, "a") as fh:
        fh.write(line[:40])                                           # a write cut short
    assert index.get(second.key) is None
    with open(store.jsonl, "a") as fh:
        fh.write(line[40:] + "\n")
    assert index.get(second.key)["message"] == "y"


def test_workers_take_the_longest_studies_first_and_each_takes_every_study():
    from mlabench.tune.trial_worker import deal_studies, study_cost, study_order

    costs = [1.0, 8.0, 2.0, 7.0, 3.0, 6.0]  # ranked longest first: 1, 3, 5, 4, 2, 0
    assert study_order(costs, 0, 1) == [1, 3, 5, 4, 2, 0]
    # longest first to the least loaded: 1 (8) | 3 (7) | 5 -> second (13) | 4 -> first (11) |
    # 2 -> first (13) | 0 -> first, a tie at 13 going to the lower index (14 against 13)
    assert deal_studies(costs, 2) == [[1, 4, 2, 0], [3, 5]]
    assert study_order(costs, 0, 2) == [1, 4, 2, 0, 5, 3]  # then the other's, its last first
    assert study_order(costs, 1, 2) == [3, 5, 0, 2, 4, 1]
    for workers in (1, 2, 3, 4, 8):
        shares = deal_studies(costs, workers)
        assert sorted(i for share in shares for i in share) == list(range(6))  # each dealt once
        orders = [study_order(costs, i, workers) for i in range(workers)]
        assert all(sorted(o) == list(range(6)) for o in orders)  # every worker can reach every study
        starts = [o[0] for o in orders[:6]]
        assert len(set(starts)) == len(starts)  # no two workers start on one study
    # balance: 16 studies of 1..16 s on two workers end within 1 s of each other (68 and 68)
    loads = [sum(range(1, 17)[i] for i in share) for share in deal_studies([float(c) for c in range(1, 17)], 2)]
    assert abs(loads[0] - loads[1]) <= 1
    assert study_order([1.0, 1.0], 1, 2) == [1, 0]  # ties in position order
    with pytest.raises(ValueError):
        study_order(costs, 2, 2)
    b16_128k = {"batch": 16, "lo": 100000, "hi": 131072, "length": 114000, "lengths": [100001, 131072]}
    b1_128k = {**b16_128k, "batch": 1}
    b16_32k = {"batch": 16, "lo": 16384, "hi": 32768, "length": 23000, "lengths": [16385, 32768]}
    assert study_cost(b16_128k) > study_cost(b1_128k) > study_cost(b16_32k) > study_cost({"batch": 1, "hi": 1024})
    assert 17 < study_cost(b16_128k) < 21 and 5 < study_cost({"batch": 1, "hi": 1024}) < 8  # measured 18.0 s, 6.8 s


def _log_on_a_full_disk() -> None:
    """Make this process's stdout and stderr a full disk (``/dev/full``), as a worker's log is when
    the disk fills."""
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, 1)
    os.dup2(full, 2)


def disk_full_worker(payload, index):
    """A worker entry whose log cannot be written and whose store append fails on a full disk."""
    from mlabench.errors import FileAccessError

    _log_on_a_full_disk()
    raise FileAccessError("run results could not be written: the disk is full (no space left on device): x.jsonl")


def crashing_worker(payload, index):
    """A worker entry that dies of an error nobody caught, its log on a full disk."""
    import errno

    _log_on_a_full_disk()
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("entry, said", [
    ("disk_full_worker", "exited with 2: error: run results could not be written: the disk is full"),
    ("crashing_worker", "exited with 1: OSError: [Errno 28] No space left on device"),
])
def test_a_worker_whose_log_cannot_be_written_still_reports_its_error(tmp_path, entry, said):
    """Issue 25 item 5: with the disk full the worker's log stays empty; its error reaches the
    parent anyway (through a pipe), not just its exit code."""
    from mlabench.errors import MlabenchError
    from mlabench.tune.worker_pool import start_workers, supervise

    workers = start_workers(f"tests.tune.test_workers:{entry}", {}, [None], tmp_path / "workers")
    with pytest.raises(MlabenchError) as info:
        supervise(workers, interval_s=0.05)
    assert said in str(info.value), str(info.value)
    assert (tmp_path / "workers" / "worker-0.log").read_text() == ""
