"""Recorded runs as plots and reports read them: kernel sweeps, tuning and validation runs,
serve-bench runs and graph-check results, side by side.

One function, :func:`load_runs`, reads every path named (a run folder, a folder holding runs at any
depth, or a graph-check JSON file) and sorts what it finds by kind:

- a ``serve-bench`` run (its ``manifest.json`` says ``"kind": "serve-bench"``);
- a tuning run (``mlabench tune``, kind ``tune``; trial records in the order measured, the exported
  ``policy.json`` beside them);
- a validation run (``mlabench tune --validate``, kind ``validation``; ``validation.json``);
- a kernel run (sweep, compare, kind ``sweep``: :class:`~mlabench.records.record.Record` lines),
  the only records the sweep figures and tables read;

each by its kind (:func:`mlabench.records.kinds.run_kind`: the manifest's ``kind``, or for runs
recorded before manifests said it, derived from their configuration) and read by that kind's
reader (:func:`mlabench.records.readers.read_run_folder`);
- a graph-check result: the JSON table ``mlabench graph-check --save FILE`` writes, named directly
  or found in a folder named or any folder under it.

Folders are searched down to the run folders (:func:`mlabench.records.store.folders_below`), never
inside one: ``results/h200/serving`` gives its serve-bench runs and the sweep runs of ``sweep/``.

Nothing here measures or writes; re-rendering a saved run needs no GPU.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlabench.errors import ResultsError
from mlabench.records.readers import KernelRun, ServeRun, TuneRun, ValidationRun, read_run_folder
from mlabench.records.record import Manifest, Record
from mlabench.records.store import folders_below, holds_run, once, records_of, run_folders

#: Columns every graph-check table has (``mlabench.checks.graph_check_table.graph_check_table``).
GRAPH_CHECK_COLUMNS = ("subject", "batch", "context", "graph_us", "tuned_us", "slowdown_pct", "correct", "flagged")
#: Largest JSON file probed for a graph-check table, bytes (the tables are a few tens of KB).
GRAPH_CHECK_MAX_BYTES = 4 << 20


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
class Runs:
    """Every run read: kernel runs with all their records, tuning, validation and serve-bench runs,
    and graph-check results."""

    kernel_runs: list[KernelRun] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    serve_runs: list[ServeRun] = field(default_factory=list)
    #: a serve config's ``[prediction]`` table and its words ("the [prediction] of CONFIG"), which
    #: replaces the serve runs' recorded one in the serving figure (``plot CONFIG``); None: the recorded one
    prediction: tuple[dict[str, Any], str] | None = None
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
    """Graph-check results at ``path``: the file itself, or the JSON files in the folder and in
    every folder under it (:func:`~mlabench.records.store.folders_below`: a run folder's own files,
    not its subfolders).  :class:`ResultsError` for a file that is not a graph-check table."""
    if path.is_file():
        found = read_graph_check(path)
        if found is None:
            raise ResultsError(f"{path}: not a graph-check result (the JSON table of `mlabench graph-check "
                               "--save FILE`) nor a run folder")
        return [found]
    if not path.is_dir():
        return []
    files = [f for folder in folders_below(path) for f in sorted(folder.glob("*.json"))]
    return [g for g in map(read_graph_check, files) if g is not None]


def _has_runs(path: Path) -> bool:
    return any(holds_run(p) for p in folders_below(path))


def load_runs(paths: Iterable[Path | str]) -> Runs:
    """Read the run folders and graph-check results named (or found at any depth under the folders named).

    Raises :class:`~mlabench.errors.ResultsError` for a path holding neither a run nor a
    graph-check result, an unreadable record, manifest or validation file, or runs from different
    devices; :class:`~mlabench.errors.ConfigError` for an unreadable serve-bench run or policy.
    """
    runs = Runs()
    with_runs = []
    for path in map(Path, paths):
        checks = graph_check_files(path)
        runs.graph_checks += checks
        if not checks or _has_runs(path):
            with_runs.append(path)
    # a result named twice, or also under a folder named, is read once
    runs.graph_checks = once(runs.graph_checks, lambda g: g.path)
    kinds = {KernelRun: runs.kernel_runs, TuneRun: runs.tune_runs, ValidationRun: runs.validation_runs,
             ServeRun: runs.serve_runs}
    for folder in once(run_folders(with_runs, any_depth=True) if with_runs else []):
        run = read_run_folder(folder)  # one reader per kind (mlabench.records.readers)
        kinds[type(run)].append(run)  # type: ignore[arg-type]
    kernel_folders = [k.path for k in runs.kernel_runs]
    if kernel_folders:
        runs.records = records_of(kernel_folders)
    devices = {str(m.device.get("name")) for m in runs.manifests}
    if len(devices) > 1:
        raise ResultsError("runs from different devices do not compare: " + ", ".join(sorted(devices)))
    _check_serving_devices(runs)
    return runs


def _check_serving_devices(runs: Runs) -> None:
    """ResultsError when a serve-bench run that names its GPUs served on another device than the
    kernel runs ran on (:func:`~mlabench.serving.gpus.serving_device_mismatch`: a CPU vLLM server's
    TPOT beside an H200 sweep's prediction, say)."""
    from mlabench.serving.gpus import serving_device_mismatch

    for run in runs.serve_runs:
        if why := serving_device_mismatch(run.manifest.get("gpus"), (m.device for m in runs.manifests)):
            raise ResultsError(f"runs from different devices do not compare: serve-bench run {run.name} {why}")
