"""Recorded runs as plots and reports read them: kernel sweeps, tuning and validation runs,
serve-bench runs and graph-check results, side by side.

One function, :func:`load_runs`, reads every path named (a run folder, a folder holding runs one
level down, or a graph-check JSON file) and sorts what it finds by kind:

- a ``serve-bench`` run (its ``manifest.json`` says ``"kind": "serve-bench"``);
- a tuning run (``mlabench tune``, kind ``tune``; trial records in the order measured, the exported
  ``policy.json`` beside them);
- a validation run (``mlabench tune --validate``, kind ``validation``; ``validation.json``);
- a kernel run (sweep, compare, kind ``sweep``: :class:`~mlabench.records.record.Record` lines),
  the only records the sweep figures and tables read;

each by its kind (:func:`mlabench.records.kinds.run_kind`: the manifest's ``kind``, or for runs
recorded before manifests said it, derived from their configuration);
- a graph-check result: the JSON table ``mlabench graph-check --save FILE`` writes, named directly
  or found in a folder named (or one level inside it).

Nothing here measures or writes; re-rendering a saved run needs no GPU.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlabench.errors import ResultsError
from mlabench.files import read_json
from mlabench.records.kinds import run_kind
from mlabench.records.record import Manifest, Record
from mlabench.records.store import ResultStore, holds_run, records_of, run_folders
from mlabench.run_files import MANIFEST_FILE, POLICY_FILE, SERVE_BENCH_KIND, TUNE_KIND, VALIDATION_FILE, VALIDATION_KIND
from mlabench.serving.config import ServeConfig
from mlabench.serving.results import BenchResult

#: Columns every graph-check table has (``mlabench.checks.graph_check_table.graph_check_table``).
GRAPH_CHECK_COLUMNS = ("subject", "batch", "context", "graph_us", "tuned_us", "slowdown_pct", "correct", "flagged")
#: Largest JSON file probed for a graph-check table, bytes (the tables are a few tens of KB).
GRAPH_CHECK_MAX_BYTES = 4 << 20


@dataclass
class KernelRun:
    """A kernel run folder (``mlabench sweep`` / ``compare``) and its manifest."""

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
    ``validation.json`` (:class:`mlabench.tune.validation.PointResult`; None when the file is absent,
    e.g. an interrupted validation)."""

    path: Path
    manifest: Manifest
    records: list[Record]
    points: list[Any] | None = None

    @property
    def name(self) -> str:
        """The run id."""
        return self.manifest.run_id

    @property
    def policy_run_id(self) -> str | None:
        """The tuning run whose policy was validated (from the policy's ``source``), when recorded."""
        return (self.manifest.config["validate"].get("policy_source") or {}).get("run_id")


@dataclass
class GraphCheckRun:
    """A graph-check result: the table of ``mlabench graph-check --save FILE``.

    ``rows`` are dicts with the table's columns (``subject``, ``batch``, ``context`` tokens,
    ``graph_us`` and ``tuned_us`` µs per call, ``slowdown_pct`` %, ``correct``, ``flagged``, ...).
    """

    path: Path
    title: str
    rows: list[dict[str, Any]]
    notes: list[str]

    @property
    def name(self) -> str:
        """The file's name without ``.json``."""
        return self.path.stem


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


@dataclass
class Runs:
    """Every run read: kernel runs with all their records, tuning, validation and serve-bench runs,
    and graph-check results."""

    kernel_runs: list[KernelRun] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    serve_runs: list[ServeRun] = field(default_factory=list)
    tune_runs: list[TuneRun] = field(default_factory=list)
    validation_runs: list[ValidationRun] = field(default_factory=list)
    graph_checks: list[GraphCheckRun] = field(default_factory=list)

    @property
    def manifests(self) -> list[Manifest]:
        """The manifests of the kernel, tuning and validation runs, in that order."""
        return ([k.manifest for k in self.kernel_runs] + [t.manifest for t in self.tune_runs]
                + [v.manifest for v in self.validation_runs])

    @property
    def device_name(self) -> str | None:
        """The GPU (or CPU) of the runs with a manifest (one device: mixed devices are refused on reading)."""
        return str(self.manifests[0].device.get("name")) if self.manifests else None


def read_graph_check(path: Path) -> GraphCheckRun | None:
    """The graph-check table in the JSON file ``path``; None when the file holds something else
    (another table, a manifest, a policy) or is too large to be one."""
    try:
        if path.stat().st_size > GRAPH_CHECK_MAX_BYTES:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    table = data[0] if isinstance(data, list) and len(data) == 1 and isinstance(data[0], dict) else {}
    rows = table.get("rows")
    if (not str(table.get("title", "")).startswith("graph-check") or not isinstance(rows, list)
            or any(c not in table.get("columns", ()) for c in GRAPH_CHECK_COLUMNS)
            or not all(isinstance(r, dict) for r in rows)):
        return None
    return GraphCheckRun(path, table["title"], rows, [str(n) for n in table.get("notes") or []])


def graph_check_files(path: Path) -> list[GraphCheckRun]:
    """Graph-check results at ``path``: the file itself, or the JSON files in the folder and one
    level inside it.  :class:`ResultsError` for a file that is not a graph-check table."""
    if path.is_file():
        found = read_graph_check(path)
        if found is None:
            raise ResultsError(f"{path}: not a graph-check result (the JSON table of `mlabench graph-check "
                               "--save FILE`) nor a run folder")
        return [found]
    if not path.is_dir():
        return []
    files = sorted(path.glob("*.json")) + sorted(path.glob("*/*.json"))
    return [g for g in map(read_graph_check, files) if g is not None]


def _has_runs(path: Path) -> bool:
    return path.is_dir() and (holds_run(path) or any(p.is_dir() and holds_run(p) for p in path.iterdir()))


def _tune_run(folder: Path) -> TuneRun:
    from mlabench.policy.tuned import load_policy

    store = ResultStore(folder)
    policy = load_policy(folder / POLICY_FILE) if (folder / POLICY_FILE).is_file() else None
    return TuneRun(folder, store.manifest(), store.records(), policy)


def _validation_run(folder: Path) -> ValidationRun:
    from mlabench.tune.validation import PointResult

    store = ResultStore(folder)
    points = None
    if (folder / VALIDATION_FILE).is_file():
        raw = read_json(folder / VALIDATION_FILE, "validation results")
        try:
            points = [PointResult(**p) for p in raw]
        except TypeError:
            raise ResultsError(f"{folder / VALIDATION_FILE}: not the points of a validation run") from None
    return ValidationRun(folder, store.manifest(), store.records(), points)


def load_runs(paths: Iterable[Path | str]) -> Runs:
    """Read the run folders and graph-check results named (or found one level inside the folders named).

    Raises :class:`~mlabench.errors.ResultsError` for a path holding neither a run nor a
    graph-check result, an unreadable record, manifest or validation file, or runs from different
    devices; :class:`~mlabench.errors.ConfigError` for an unreadable serve-bench run or policy.
    """
    from mlabench.serving.bench import read_run

    runs = Runs()
    with_runs = []
    for path in map(Path, paths):
        checks = graph_check_files(path)
        runs.graph_checks += checks
        if not checks or _has_runs(path):
            with_runs.append(path)
    kernel_folders = []
    for folder in dict.fromkeys(run_folders(with_runs) if with_runs else []):
        kind = run_kind(folder)
        if kind == SERVE_BENCH_KIND:
            config, results = read_run(folder)
            manifest = read_json(folder / MANIFEST_FILE, "serve-bench run manifest")
            runs.serve_runs.append(ServeRun(folder, manifest, config, results))
        elif kind == TUNE_KIND:
            runs.tune_runs.append(_tune_run(folder))
        elif kind == VALIDATION_KIND:
            runs.validation_runs.append(_validation_run(folder))
        else:
            kernel_folders.append(folder)
            runs.kernel_runs.append(KernelRun(folder, ResultStore(folder).manifest()))
    if kernel_folders:
        runs.records = records_of(kernel_folders)
    devices = {str(m.device.get("name")) for m in runs.manifests}
    if len(devices) > 1:
        raise ResultsError("runs from different devices do not compare: " + ", ".join(sorted(devices)))
    return runs
