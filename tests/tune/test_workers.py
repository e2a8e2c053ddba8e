"""The generic worker helpers: device pinning, liveness, shared appends, the record index."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.processes import survivors_of_sigkill

from mlabench.errors import ConfigError
from mlabench.records.store import ResultStore
from mlabench.tune.manifest import run_manifest
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
    from mlabench.bench.point import failed_record

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


def test_workers_take_the_longest_studies_first_then_join_the_one_with_most_left():
    from mlabench.tune.trial_worker import pick_study, study_cost

    costs = [1.0, 8.0, 2.0, 7.0, 3.0, 6.0]
    joined, remaining = [0] * 6, [4] * 6
    taken = []
    for _worker in range(6):  # six workers, one after the other: each a study of its own, longest first
        i = pick_study(costs, joined, remaining)
        taken.append(i)
        joined[i] += 1
    assert taken == [1, 3, 5, 4, 2, 0]
    # a worker done early joins the study with the most expected seconds left, not a finished one
    assert pick_study(costs, [1, 1, 0, 1, 1, 1], [1, 1, 0, 3, 1, 1]) == 3
    assert pick_study(costs, [0] * 6, [0] * 6) is None  # nothing left to start
    assert pick_study([1.0, 1.0], [0, 0], [2, 2]) == 0  # ties in position order
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
    from mlabench.errors import DiskFullError

    _log_on_a_full_disk()
    raise DiskFullError("run results could not be written: the disk is full (no space left on device): x.jsonl")


def crashing_worker(payload, index):
    """A worker entry that dies of an error nobody caught, its log on a full disk."""
    import errno

    _log_on_a_full_disk()
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("entry, said, code", [
    ("disk_full_worker", "exited with 3: error: run results could not be written: the disk is full", 3),
    ("crashing_worker", "exited with 1: OSError: [Errno 28] No space left on device", 1),
])
def test_a_worker_whose_log_cannot_be_written_still_reports_its_error(tmp_path, entry, said, code):
    """Issue 25 item 5: with the disk full the worker's log stays empty; its error reaches the
    parent anyway (through a pipe), not just its exit code.  Issue 35 item 9: a worker that crashed
    at run time exits 1 (the run stopped short), not 2 (bad input); an error of the user's keeps its code."""
    from mlabench.errors import MlabenchError
    from mlabench.tune.worker_pool import start_workers, supervise

    workers = start_workers(f"tests.tune.test_workers:{entry}", {}, [None], tmp_path / "workers")
    with pytest.raises(MlabenchError) as info:
        supervise(workers, interval_s=0.05)
    assert said in str(info.value), str(info.value)
    assert info.value.exit_code == code
    assert (tmp_path / "workers" / "worker-0.log").read_text() == ""


def sleeping_worker(payload, index):
    """A worker entry that writes its pid and sleeps (for the orphan test)."""
    import time
    from pathlib import Path

    Path(payload["folder"], f"{index}.pid").write_text(str(os.getpid()))
    time.sleep(600)


def test_kill_9_of_the_tuning_process_ends_its_workers(tmp_path):
    """Issue 25 item 6: workers measured on for a minute after ``kill -9`` of ``mlabench tune``."""
    import time
    from pathlib import Path

    parent_code = ("import sys\nfrom pathlib import Path\nfrom mlabench.tune.worker_pool import start_workers, supervise\n"
                   "folder = Path(sys.argv[1])\n"
                   "supervise(start_workers('tests.tune.test_workers:sleeping_worker', {'folder': str(folder)},"
                   " [None, None, None], folder / 'workers'))\n")
    repo = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen([sys.executable, "-c", parent_code, str(tmp_path)], cwd=repo)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("*.pid"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 3
    left = survivors_of_sigkill(parent, pids, 10)
    assert not left, f"{len(left)} of 3 workers outlived the tuning process"
