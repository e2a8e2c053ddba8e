"""One reader per run kind: a run folder read back as the run it is (issue 36).

:func:`read_run_folder` reads a folder's kind (:func:`mlabench.records.kinds.run_kind`) and calls
that kind's reader (:data:`READERS`): a kernel sweep (:class:`KernelRun`), a tuning run
(:class:`TuneRun`), a validation run (:class:`ValidationRun`) or a serve-bench run
(:class:`ServeRun`).  Report, plot and diff read runs only through here and
:mod:`mlabench.records.side_files`, never through the package that ran them, so reading a run
imports no runner, worker or server.  Nothing here measures or writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Union

from mlabench.records.kinds import run_kind
from mlabench.records.record import Manifest, Record
from mlabench.records.side_files import PointResult, read_validation_points
from mlabench.records.store import ResultStore
from mlabench.run_files import POLICY_FILE, SERVE_BENCH_KIND, SWEEP_KIND, TUNE_KIND, VALIDATION_KIND
from mlabench.serving.config import ServeConfig
from mlabench.serving.results import BenchResult
from mlabench.serving.run_folder import read_serve_folder, recorded_launch_env


@dataclass
class KernelRun:
    """A kernel run folder (``mlabench sweep`` / ``compare``) and its manifest (its records are
    read for all kernel runs at once: :func:`mlabench.records.store.records_of`)."""

    path: Path
    manifest: Manifest


@dataclass
class TuneRun:
    """A ``mlabench tune`` run folder: its manifest, every trial's record in the order measured, and
    the exported policy (a :class:`mlabench.policy.tuned.Policy`; None until the run finished or was
    exported with ``tune --export``)."""

    path: Path
    manifest: Manifest
    records: list[Record]
    policy: Any = None

    @property
    def name(self) -> str:
        """The run id."""
        return self.manifest.run_id

    @property
    def config(self) -> dict[str, Any]:
        """The tuning configuration as run (``TuneConfig`` fields)."""
        return self.manifest.config["tune"]

    @property
    def studies(self) -> list[dict[str, Any]]:
        """One dict per study: ``batch``, bucket ``lo``/``hi`` (tokens, ``(lo, hi]``), measured ``length``."""
        return list(self.manifest.config.get("studies") or [])


@dataclass
class ValidationRun:
    """A ``mlabench tune --validate`` run folder: its manifest, records, and the points of its
    ``validation.json`` (:class:`~mlabench.records.side_files.PointResult`; None when the file is
    absent, e.g. an interrupted validation)."""

    path: Path
    manifest: Manifest
    records: list[Record]
    points: list[PointResult] | None = None

    @property
    def name(self) -> str:
        """The run id."""
        return self.manifest.run_id

    @property
    def policy_run_id(self) -> str | None:
        """The tuning run whose policy was validated (from the policy's ``source``), when recorded."""
        return (self.manifest.config["validate"].get("policy_source") or {}).get("run_id")


@dataclass
class ServeRun:
    """A ``mlabench serve-bench`` run folder: its configuration, manifest and results."""

    path: Path
    manifest: dict[str, Any]
    config: ServeConfig
    results: list[BenchResult]

    @property
    def name(self) -> str:
        """The run folder's name."""
        return self.path.name

    @property
    def launch_env(self) -> dict[str, dict[str, list[str]]]:
        """Variant -> variable -> the values its server's launch env had in this run
        (:func:`~mlabench.serving.run_folder.recorded_launch_env`), for ``{env:NAME}`` in ``[prediction]``."""
        return recorded_launch_env(self.manifest)


AnyRun = Union[KernelRun, TuneRun, ValidationRun, ServeRun]


def read_kernel_run(folder: Path) -> KernelRun:
    """The kernel run in ``folder``; :class:`~mlabench.errors.ResultsError` for an unreadable manifest."""
    return KernelRun(folder, ResultStore(folder).manifest())


def read_tune_run(folder: Path) -> TuneRun:
    """The tuning run in ``folder`` with its trials' records and, when exported, its policy.
    :class:`~mlabench.errors.ResultsError` for an unreadable manifest or record,
    :class:`~mlabench.errors.ConfigError` for an unreadable ``policy.json``."""
    from mlabench.policy.tuned import load_policy

    store = ResultStore(folder)
    policy = load_policy(folder / POLICY_FILE) if (folder / POLICY_FILE).is_file() else None
    return TuneRun(folder, store.manifest(), store.records(), policy)


def read_validation_run(folder: Path) -> ValidationRun:
    """The validation run in ``folder`` with its records and ``validation.json``'s points
    (:func:`~mlabench.records.side_files.read_validation_points`); :class:`~mlabench.errors.ResultsError`
    for an unreadable manifest, record or points file."""
    store = ResultStore(folder)
    return ValidationRun(folder, store.manifest(), store.records(), read_validation_points(folder))


def read_serve_run(folder: Path) -> ServeRun:
    """The serve-bench run in ``folder``: its manifest, configuration and latest result of each
    point, read once (:func:`mlabench.serving.run_folder.read_serve_folder`);
    :class:`~mlabench.errors.ConfigError` for an unreadable run."""
    return ServeRun(folder, *read_serve_folder(folder))


#: The reader of each run kind (:data:`~mlabench.run_files.RUN_KINDS`).
READERS: dict[str, Callable[[Path], AnyRun]] = {
    SWEEP_KIND: read_kernel_run, TUNE_KIND: read_tune_run, VALIDATION_KIND: read_validation_run,
    SERVE_BENCH_KIND: read_serve_run,
}


def read_run_folder(folder: Path) -> AnyRun:
    """The run in ``folder``, read by the reader of its kind (:func:`~mlabench.records.kinds.run_kind`)."""
    return READERS[run_kind(folder)](Path(folder))
