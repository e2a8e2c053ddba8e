"""Recorded runs as plots and reports read them: kernel sweeps and serve-bench runs, side by side.

One function, :func:`load_runs`, reads every folder named (or the run folders one level inside
it) and sorts them by kind: a ``serve-bench`` run (its ``manifest.json`` says ``"kind":
"serve-bench"``) or a kernel run (sweep, compare: :class:`~mlabench.results.Record` lines). Nothing
here measures or writes; re-rendering a saved run needs no GPU.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlabench.files import read_json
from mlabench.results import Manifest, Record, ResultStore, records_of, run_folders
from mlabench.serving.config import ServeConfig
from mlabench.serving.results import BenchResult


@dataclass
class KernelRun:
    """A kernel run folder (``mlabench sweep`` / ``compare``) and its manifest."""

    path: Path
    manifest: Manifest


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
    """Every run read: kernel runs with all their records, and serve-bench runs."""

    kernel_runs: list[KernelRun] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    serve_runs: list[ServeRun] = field(default_factory=list)

    @property
    def device_name(self) -> str | None:
        """The GPU (or CPU) of the kernel runs (one device: mixed devices are refused on reading)."""
        return str(self.kernel_runs[0].manifest.device.get("name")) if self.kernel_runs else None


def is_serve_run(path: Path) -> bool:
    """True when ``path/manifest.json`` is a serve-bench manifest."""
    try:
        return json.loads((path / "manifest.json").read_text()).get("kind") == "serve-bench"
    except (OSError, ValueError, AttributeError):
        return False


def load_runs(paths: Iterable[Path | str]) -> Runs:
    """Read the run folders named (or found one level inside the folders named).

    Raises :class:`~mlabench.errors.ResultsError` for a path holding no run, an unreadable record
    or manifest, or kernel runs from different devices; :class:`~mlabench.errors.ConfigError` for
    an unreadable serve-bench run.
    """
    from mlabench.serving.bench import read_run

    folders = run_folders([Path(p) for p in paths])
    runs = Runs()
    kernel_folders = []
    for folder in dict.fromkeys(folders):
        if is_serve_run(folder):
            config, results = read_run(folder)
            manifest = read_json(folder / "manifest.json", "serve-bench run manifest")
            runs.serve_runs.append(ServeRun(folder, manifest, config, results))
        else:
            kernel_folders.append(folder)
            runs.kernel_runs.append(KernelRun(folder, ResultStore(folder).manifest()))
    if kernel_folders:
        runs.records = records_of(kernel_folders)
    return runs


def backend_families() -> dict[str, str]:
    """Backend name -> family (``split-kv``, ``persistent``, ...) of every registered backend."""
    from mlabench.backends import backend_names, get_backend

    return {name: get_backend(name).family for name in backend_names()}
