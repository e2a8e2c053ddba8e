"""The generic worker helpers: device pinning, liveness, shared appends, the record index."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mlabench.errors import ConfigError
from mlabench.results import ResultStore
from mlabench.tune_run import run_manifest
from mlabench.workers import (RecordIndex, append_shared, device_env, parse_devices, worker_alive, worker_id)


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
    from mlabench.measure import failed_record
    from mlabench.shapes import MLADecodeShape

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


def test_workers_start_apart_and_each_takes_every_study():
    from mlabench.tune_worker import study_order

    assert study_order(16, 0, 1) == list(range(16))
    assert study_order(16, 0, 2) == list(range(16))
    assert study_order(16, 1, 2) == [*range(8, 16), *range(8)]
    assert study_order(5, 2, 3) == [3, 4, 0, 1, 2]
    for workers in (1, 2, 3, 4, 8):
        firsts = [study_order(16, i, workers)[0] for i in range(workers)]
        assert len(set(firsts)) == workers  # no two workers start on one study
        assert all(sorted(study_order(16, i, workers)) == list(range(16)) for i in range(workers))
