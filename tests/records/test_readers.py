"""One reader per run kind (:mod:`mlabench.records.readers`) and the side files' readers
(:mod:`mlabench.records.side_files`): every committed run read by its kind's reader, a validation's
points read or refused in one line (issue 36)."""

from __future__ import annotations

import json

import pytest

from mlabench.errors import ResultsError
from mlabench.records.kinds import run_kind
from mlabench.records.readers import READERS, KernelRun, ServeRun, TuneRun, ValidationRun, read_run_folder
from mlabench.records.side_files import PointResult, geomean_regret_pct, read_validation_points
from mlabench.run_files import RUN_KINDS, SERVE_BENCH_KIND, SWEEP_KIND, TUNE_KIND, VALIDATION_FILE, VALIDATION_KIND
from tests.records.test_run_kind import COMMITTED_RUNS, RESULTS

CLASS_OF_KIND = {SWEEP_KIND: KernelRun, TUNE_KIND: TuneRun, VALIDATION_KIND: ValidationRun, SERVE_BENCH_KIND: ServeRun}


def test_every_kind_has_one_reader():
    assert set(READERS) == set(RUN_KINDS) == set(CLASS_OF_KIND)


@pytest.mark.parametrize("run", COMMITTED_RUNS, ids=lambda p: str(p.relative_to(RESULTS)))
def test_every_committed_run_is_read_by_its_kinds_reader(run):
    read = read_run_folder(run)
    assert type(read) is CLASS_OF_KIND[run_kind(run)] and read.path == run
    if isinstance(read, ValidationRun):
        assert read.points and all(isinstance(p, PointResult) for p in read.points)


def test_validation_points_absent_read_or_refused(tmp_path):
    assert read_validation_points(tmp_path) is None  # an interrupted validation has none yet
    point = {"batch": 1, "context_len": 1000, "best_us": 10.0, "best_params": {}, "policy_params": {},
             "policy_us": 11.0}
    (tmp_path / VALIDATION_FILE).write_text(json.dumps([point]))
    assert read_validation_points(tmp_path)[0].regret(11.0) == pytest.approx(0.1)
    (tmp_path / VALIDATION_FILE).write_text(json.dumps([{"batch": 1}]))
    with pytest.raises(ResultsError, match="not the points of a validation run"):
        read_validation_points(tmp_path)


def test_geomean_regret_is_none_when_a_configuration_failed():
    assert geomean_regret_pct([0.1, 0.1]) == pytest.approx(10.0)
    assert geomean_regret_pct([0.1, None]) is None and geomean_regret_pct([]) is None


def test_reading_a_serve_bench_run_starts_no_server_machinery():
    """The serve-bench reader (:mod:`mlabench.serving.run_folder`) reads the folder without
    importing the bench driver or the server lifecycle; the CLI's name for it still works."""
    import subprocess
    import sys

    from mlabench.serving import bench, run_folder

    assert bench.read_run is run_folder.read_run
    run = next(r for r in COMMITTED_RUNS if run_kind(r) == SERVE_BENCH_KIND)
    code = ("import sys; from pathlib import Path; from mlabench.records.readers import read_run_folder; "
            f"r = read_run_folder(Path({str(run)!r})); assert r.results and r.manifest['kind'] == 'serve-bench'; "
            "print(sorted(m for m in sys.modules if m.startswith('mlabench.serving.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "mlabench.serving.bench" not in out and "mlabench.serving.lifecycle" not in out, out
