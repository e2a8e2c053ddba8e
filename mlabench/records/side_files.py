"""A run's files beside its records, their schemas and their readers: the sentinel's measurements
of a sweep (``sentinel.jsonl``) and the points of a validation run (``validation.json``).

Their writers sit with the runs that measure them (:mod:`mlabench.sweep.sentinel`,
:mod:`mlabench.tune.validation`); the readers are here, in the run layer, so that a reader of runs
(diff, report) never imports the package that runs them (issue 36).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mlabench.errors import ResultsError
from mlabench.files import read_json
from mlabench.records.record import Record
from mlabench.records.store import read_jsonl, stored_file
from mlabench.run_files import RESULTS_FILE, SENTINEL_FILE, VALIDATION_FILE, VISITS_FILE


class SentinelMeasurement(BaseModel):
    """One measurement of the sentinel point (one line of ``sentinel.jsonl``)."""

    model_config = ConfigDict(extra="forbid")

    after_points: int = Field(description=f"Records in {RESULTS_FILE} when it was taken (with several visits "
                                          f"per point: visits in {VISITS_FILE}).")
    record: Record = Field(description="The sentinel point as measured then.")


def read_sentinels(run_dir: Path) -> list[SentinelMeasurement]:
    """The sentinel measurements of a run, in order; [] when it has none (e.g. older runs).

    Reads ``sentinel.jsonl``, or ``sentinel.jsonl.gz`` when only that is there (a committed run:
    :func:`mlabench.records.store.stored_file`).  A cut-short last line is ignored; raises
    :class:`ResultsError` for a bad line elsewhere.
    """
    path = stored_file(Path(run_dir) / SENTINEL_FILE)
    return read_jsonl(path, SentinelMeasurement, "sentinel measurement")


@dataclass
class PointResult:
    """One validated point (an entry of ``validation.json``): the best measured configuration and
    each rule's time (µs; None failed)."""

    batch: int
    context_len: int
    best_us: float | None
    best_params: dict[str, Any]
    policy_params: dict[str, Any]
    policy_us: float | None
    heuristics: dict[str, dict[str, Any]] = field(default_factory=dict)
    counts_measured: int = 0  # distinct split counts measured at the point (the best is of these)

    def regret(self, us: float | None) -> float | None:
        """``us / best_us - 1`` (None when either failed)."""
        return us / self.best_us - 1 if us is not None and self.best_us else None


def geomean_regret_pct(values: list[float | None]) -> float | None:
    """``100 * (geometric mean of (1 + regret) - 1)``, percent; None when ``values`` is empty or holds
    a None (a configuration that failed)."""
    vals = [v for v in values if v is not None]
    if not vals or len(vals) < len(values):
        return None
    return 100 * (math.exp(sum(math.log1p(v) for v in vals) / len(vals)) - 1)


def read_validation_points(run_dir: Path) -> list[PointResult] | None:
    """The points of a validation run's ``validation.json``; None when the file is absent (an
    interrupted validation writes it only at its end).  Raises :class:`ResultsError` when it is not
    a list of points, :class:`~mlabench.errors.FileAccessError` when it cannot be read as JSON."""
    path = Path(run_dir) / VALIDATION_FILE
    if not path.is_file():
        return None
    raw = read_json(path, "validation results")
    try:
        return [PointResult(**p) for p in raw]
    except TypeError:
        raise ResultsError(f"{path}: not the points of a validation run") from None
