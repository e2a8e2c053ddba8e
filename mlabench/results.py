"""Result records, the append-only JSONL store, reading run folders, CSV export and the run manifest.

A run folder ``results/<run-id>/`` holds ``manifest.json`` (identity: device, driver, library
versions, git revision, command line; measured read and copy bandwidth; warm-up and drift),
``results.jsonl`` (one :class:`Record` per line, appended and fsync'ed, never rewritten),
``results.csv`` (regenerated from the JSONL) and, for sweeps, ``sentinel.jsonl`` (the sentinel
point's re-measurements).  Resuming refuses a folder whose identity differs from this process's, and skips
points whose key is already recorded.  A last line cut short by an interrupted write is dropped on
resume (the file is truncated back to its last complete line before appending).  Readers of
recorded runs (``compare --from``, reports, tuning) use :func:`records_of`, not the sweep runner.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mlabench.configfile import validation_line
from mlabench.errors import ResultsError
from mlabench.files import append_text, make_dir, read_text, user_path, write_text
from mlabench.measure.stats import Stats
from mlabench.verdict import Verdict

SCHEMA_VERSION = 1
Status = Literal["ok", "unsupported", "incorrect", "error", "timeout"]


class Record(BaseModel):
    """One measured configuration: backend + params on one shape.  Failures are rows too."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(description="Identity of the point (backend, params, shape); resume skips recorded keys.")
    run_id: str = Field(description="Run folder this record belongs to.")
    backend: str = Field(description="Backend name.")
    params: dict[str, Any] = Field(description="Parameters asked for.")
    effective_params: dict[str, Any] = Field(default_factory=dict, description="What actually ran (e.g. a library's own split count).")
    shape: dict[str, Any] = Field(description="MLADecodeShape fields.")
    batch: int = Field(description="Requests in the batch.")
    num_heads: int = Field(description="Local query heads.")
    context_len: int = Field(description="Longest context length in the batch, tokens.")
    qo_len: int = Field(1, description="Query tokens per request (1: plain decode; records before multi-token "
                                       "decode are 1).")
    causal: bool = Field(True, description="Query token t sees the prefix and block tokens 0..t (False: all "
                                           "cached tokens).")
    status: Status = Field(description="ok / unsupported / incorrect / error / timeout.")
    message: str = Field("", description="Why the status is not ok.")
    verdict: Verdict | None = Field(None, description="Correctness on this point's own inputs.")
    timing_mode: str = Field("", description="graph (replay), eager, or wall (CPU clock).")
    stats: Stats | None = Field(None, description="Per-call time of the primary mode (graph on GPU), µs.")
    eager_stats: Stats | None = Field(None, description="Eager per-call time on a GPU, µs.")
    cold_cache_copies: int = Field(1, description="Input copies rotated per sample.")
    bytes_moved: int = Field(0, description="Fewest bytes the call must move (KV + q + out).")
    workspace_bytes: int = Field(0, description="Intermediate bytes the backend reports (split partials).")
    achieved_tbps: float | None = Field(None, description="bytes_moved / median time, TB/s.")
    copy_bandwidth_tbps: float | None = Field(None, description="Measured device copy bandwidth (read + write), TB/s.")
    read_bandwidth_tbps: float | None = Field(None, description="Measured streaming read bandwidth, TB/s.")
    floor_bandwidth: Literal["read", "copy"] = Field(
        "copy", description="Which measured bandwidth floor_us divides by (copy in runs recorded before read was).")
    floor_us: float | None = Field(None, description="bytes_moved / the floor_bandwidth one, µs.")
    pct_of_floor: float | None = Field(None, description="100 * floor_us / median time.")
    setup_us: dict[str, float] = Field(default_factory=dict, description="Untimed setup steps, µs.")
    refresh_us: float | None = Field(None, description="Untimed per-step rebuild of the call's length-dependent metadata (work list, scheduler), median wall µs; a server pays it once per step for all layers, not per layer. 0 when the call reads the lengths only on the device.")
    visit_medians_us: list[float] | None = Field(
        None, description="Median of each visit when the point was timed in several visits over the run "
                          "(stats pools their samples); None: one visit.")
    gpu_state: dict[str, Any] = Field(default_factory=dict, description="Clocks, temperature, power read after timing.")
    gpu_state_before: dict[str, Any] = Field(default_factory=dict, description="The same, read just before timing.")
    clock_below_steady: bool | None = Field(
        None, description="SM clock before or after timing below the run's steady clock (None: not known).")
    timestamp: str = Field(description="UTC time the record was written, ISO 8601.")

    @property
    def median_us(self) -> float | None:
        return self.stats.median_us if self.stats else None

    @property
    def qo_label(self) -> int | str:
        """Query tokens per request as tables show them: ``4``, or ``"4 non-causal"``."""
        return self.qo_len if self.causal else f"{self.qo_len} non-causal"


class Manifest(BaseModel):
    """Identity and provenance of a run."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    run_id: str
    created: str
    command: list[str]
    git_revision: str
    git_dirty: bool
    host: str
    device: dict[str, Any]
    gpu_state: dict[str, Any] = Field(default_factory=dict, description="Clocks, temperature, power at the start.")
    driver: str
    versions: dict[str, str | None]
    copy_bandwidth_tbps: float
    read_bandwidth_tbps: float | None = Field(None, description="Streaming read bandwidth (the floor's), TB/s.")
    datasheet_bandwidth_tbps: float | None = Field(None, description="The vendor's memory bandwidth figure, TB/s.")
    config: dict[str, Any] = Field(default_factory=dict, description="The sweep configuration as run.")
    warmups: list[dict[str, Any]] = Field(
        default_factory=list, description="GPU warm-up to steady clocks, one per session (start, each resume).")
    drift: dict[str, Any] | None = Field(None, description="Sentinel re-measurements and the drift they show.")

    def visit_settings(self) -> dict[str, Any]:
        """The sweep's ``visits``, ``max_visits`` and ``visit_rel_se`` as ``config`` recorded them
        (:mod:`mlabench.sweep.visits`); a run recorded before a setting existed measured each point once
        (``visits`` 1) and no more than its ``visits`` (``max_visits``), with no ``visit_rel_se``."""
        visits = self.config.get("visits") or 1
        return {"visits": visits, "max_visits": self.config.get("max_visits") or visits,
                "visit_rel_se": self.config.get("visit_rel_se")}

    def identity(self) -> dict[str, Any]:
        """What must match to append to this run: device, driver, versions, git revision, schema."""
        return {"schema_version": self.schema_version, "device": self.device.get("name"),
                "driver": self.driver, "versions": self.versions, "git_revision": self.git_revision}


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def new_run_id(prefix: str = "run") -> str:
    """``<prefix>-YYYYmmdd-HHMMSS-<pid>``: unique per process and second."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{prefix}-{stamp}-{os.getpid()}"


def point_key(backend: str, params: dict[str, Any], shape: dict[str, Any]) -> str:
    """Stable 16-hex-digit key of a point."""
    blob = json.dumps({"b": backend, "p": params, "s": shape}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def git_revision(repo: Path | None = None) -> tuple[str, bool]:
    """``(revision, dirty)`` of the mlabench checkout; outside one (an installed wheel) the
    package version, ``("mlabench-0.1.0", False)``.

    Only a git work tree whose top level is ``repo`` (default: the folder above the package)
    counts, so a wheel installed in a virtual environment inside some other repository does not
    record that repository's revision.  ``$MLABENCH_GIT_REVISION`` (``<sha>`` or ``<sha>-dirty``)
    overrides it, for copies of the tree made without ``.git`` (e.g. a working tree shipped to a
    GPU machine).
    """
    from mlabench import __version__

    env = os.environ.get("MLABENCH_GIT_REVISION")
    if env:
        return env.removesuffix("-dirty"), env.endswith("-dirty")
    repo = (repo or Path(__file__).resolve().parent.parent).resolve()
    no_git = (f"mlabench-{__version__}", False)
    try:
        top = subprocess.run(["git", "-C", str(repo), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=10)
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != repo:
            return no_git
        rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        # Only code that can change a measurement counts (not the serving driver).
        paths = ["mlabench", ":!mlabench/serving", ":!mlabench/cli/serve.py"]
        dirty = bool(subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", *paths],
                                    capture_output=True, text=True, timeout=10).stdout.strip())
        return rev, dirty
    except (OSError, subprocess.SubprocessError):
        return no_git


#: A run's records, and the same gzipped: an archived run (committed results kept small), read as
#: it is and never appended to (``gunzip`` it to resume it).
RESULTS_FILE, ARCHIVED_RESULTS_FILE = "results.jsonl", "results.jsonl.gz"


def holds_run(path: Path) -> bool:
    """Whether ``path`` is a run folder: it has ``results.jsonl`` or, archived, ``results.jsonl.gz``."""
    return (path / RESULTS_FILE).is_file() or (path / ARCHIVED_RESULTS_FILE).is_file()


def is_archived(run_dir: Path) -> bool:
    """Whether ``run_dir`` is an archived run: ``results.jsonl.gz`` and no ``results.jsonl``."""
    return not (run_dir / RESULTS_FILE).exists() and (run_dir / ARCHIVED_RESULTS_FILE).is_file()


def refuse_archived(run_dir: Path) -> None:
    """Raise :class:`ResultsError` when ``run_dir`` is an archived run (:func:`is_archived`): it is
    read as it is and never written to, so it cannot be resumed."""
    if is_archived(run_dir):
        raise ResultsError(f"{run_dir} is archived ({ARCHIVED_RESULTS_FILE}): gunzip it to add to it")


class ResultStore:
    """Append-only JSONL records of one run folder (read-only when archived: :data:`ARCHIVED_RESULTS_FILE`)."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.jsonl = self.run_dir / RESULTS_FILE
        self.archived = is_archived(self.run_dir)
        if self.archived:
            self.jsonl = self.run_dir / ARCHIVED_RESULTS_FILE
        self.manifest_path = self.run_dir / "manifest.json"

    # ---- lifecycle -----------------------------------------------------------------------------
    @classmethod
    def create(cls, run_dir: Path, manifest: Manifest) -> ResultStore:
        """Make a new run folder; :class:`ResultsError` if it already holds results."""
        store = cls(run_dir)
        if store.manifest_path.exists():
            raise ResultsError(f"{run_dir} already holds a run; use --resume to continue it")
        make_dir(store.run_dir, "run folder")
        store._write_manifest(manifest)
        return store

    def _write_manifest(self, manifest: Manifest) -> None:
        write_text(self.manifest_path, manifest.model_dump_json(indent=2) + "\n", "run manifest", atomic=True)

    def update_manifest(self, **fields: Any) -> Manifest:
        """Rewrite ``manifest.json`` with ``fields`` replaced (a temporary file replaces it whole).

        For the run's summaries (``warmups``, ``drift``); fields of :meth:`Manifest.identity` are
        refused with ValueError, since resuming compares them.
        """
        fixed = set(fields) & {"schema_version", "device", "driver", "versions", "git_revision", "run_id"}
        if fixed:
            raise ValueError(f"the manifest's identity does not change: {sorted(fixed)}")
        manifest = self.manifest().model_copy(update=fields)
        self._write_manifest(Manifest.model_validate(manifest.model_dump()))
        return manifest

    @classmethod
    def open_existing(cls, run_dir: Path, identity: dict[str, Any] | None = None) -> ResultStore:
        """Reopen a run to resume it; :class:`ResultsError` for a folder with no manifest, an
        archived one (:func:`refuse_archived`), or one whose identity differs from ``identity``."""
        store = cls(run_dir)
        if not store.manifest_path.exists():
            raise ResultsError(f"{run_dir}: no manifest.json, nothing to resume")
        refuse_archived(run_dir)
        if identity is not None:
            theirs = store.manifest().identity()
            diff = sorted(k for k in identity if identity[k] != theirs.get(k))
            if diff:
                raise ResultsError(
                    f"{run_dir} was recorded with another {', '.join(diff)} "
                    f"({theirs[diff[0]]} vs {identity[diff[0]]}); start a new run instead"
                )
        store._drop_partial_line()
        return store

    def manifest(self) -> Manifest:
        text = read_text(self.manifest_path, "run manifest")
        try:
            return Manifest.model_validate_json(text)
        except ValidationError as exc:
            raise ResultsError(f"{self.manifest_path}: unreadable manifest ({validation_line(exc)})") from None

    # ---- records -------------------------------------------------------------------------------
    def append(self, record: Record) -> None:
        """Append one record as a JSON line, flushed and fsync'ed before returning; raises
        :class:`ResultsError` for an archived run."""
        refuse_archived(self.run_dir)
        append_text(self.jsonl, record.model_dump_json() + "\n", "run results", sync=True)

    def records(self) -> list[Record]:
        """Every complete record, in order; a cut-short last line is ignored."""
        return read_jsonl(self.jsonl, Record, "record")

    def finished_keys(self) -> set[str]:
        return {r.key for r in self.records()}

    def _drop_partial_line(self) -> None:
        if self.archived or not self.jsonl.exists():
            return
        with user_path(self.jsonl, "run results"):
            data = self.jsonl.read_bytes()
            if data and not data.endswith(b"\n"):
                with open(self.jsonl, "r+b") as fh:
                    fh.truncate(data.rfind(b"\n") + 1)

    # ---- exports -------------------------------------------------------------------------------
    def write_csv(self, path: Path | None = None) -> Path:
        """Flatten the records into ``results.csv`` (regenerated, never appended); returns its path."""
        path = path or self.run_dir / "results.csv"
        rows = [csv_row(r) for r in self.records()]
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\r\n")
        writer.writeheader()
        writer.writerows(rows)
        return write_text(path, buf.getvalue(), "results CSV", atomic=True)


M = TypeVar("M", bound=BaseModel)


def read_jsonl(path: Path, model: type[M], what: str) -> list[M]:
    """Every line of a JSONL file as ``model``, in order; [] when the file does not exist.

    A last line cut short (an interrupted write: no newline after it) is ignored; a bad line
    elsewhere raises :class:`ResultsError` naming the file, the line and ``what`` it should be.
    """
    if not path.exists():
        return []
    lines = read_text(path, f"{what}s file").split("\n")
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(model.model_validate_json(line))
        except ValidationError:
            if i == len(lines) - 1:
                break
            raise ResultsError(f"{path}:{i + 1}: not a valid {what}") from None
    return out


def run_folders(paths: Iterable[Path]) -> list[Path]:
    """Run folders named, or found one level inside the folders named (e.g. ``results/h200/x``).

    Raises :class:`ResultsError` for a path that holds no run, naming the folders further down
    that hold runs, or saying that a ``records.jsonl`` without a manifest is a script's output.
    """
    found: list[Path] = []
    for path in map(Path, paths):
        if holds_run(path):
            found.append(path)
            continue
        inner = sorted(p for p in path.iterdir() if p.is_dir() and holds_run(p)) if path.is_dir() else []
        if not inner:
            raise ResultsError(f"{path}: no run folder (results.jsonl, manifest.json) here or one level down"
                               + _no_run_hint(path))
        found.extend(inner)
    return found


def _no_run_hint(path: Path) -> str:
    """Why ``path`` holds no run folder, and where the runs are when they lie deeper."""
    if not path.is_dir():
        return " (not a folder)"
    if (path / "records.jsonl").is_file():
        return "; its records.jsonl is a script's output, not a run (its README.md says what reads it)"
    deeper = sorted({str(p.parent.parent) for depth in ("*/*/", "*/*/*/") for name in (RESULTS_FILE, ARCHIVED_RESULTS_FILE)
                     for p in path.glob(depth + name)})
    return "; folders with runs one level down: " + ", ".join(deeper) if deeper else ""


def describe_records(records: Iterable[Record]) -> str:
    """What ``records`` cover, for an error naming what a filter could have matched: e.g.
    ``backends flashmla, triton-splitkv; batch 1, 16; qo_len 1; context 1024-131072 (8 lengths)``."""
    records = list(records)
    if not records:
        return "no records"
    lengths = sorted({r.context_len for r in records})
    context = ", ".join(map(str, lengths)) if len(lengths) <= 4 else f"{lengths[0]}-{lengths[-1]} ({len(lengths)} lengths)"
    return (f"backends {', '.join(sorted({r.backend for r in records}))}; "
            f"batch {', '.join(map(str, sorted({r.batch for r in records})))}; "
            f"qo_len {', '.join(map(str, sorted({r.qo_len for r in records})))}; context {context}")


def records_of(runs: Iterable[Path]) -> list[Record]:
    """Every record of the given run folders (read-only).

    Runs recorded on different devices are refused (:class:`ResultsError`): their times do not
    compare.
    """
    out: list[Record] = []
    devices: dict[str, Path] = {}
    for run in run_folders(runs):
        store = ResultStore(run)
        devices.setdefault(str(store.manifest().device.get("name")), run)
        out.extend(store.records())
    if len(devices) > 1:
        raise ResultsError("runs from different devices do not compare: "
                           + "; ".join(f"{d} ({p})" for d, p in devices.items()))
    return out


CSV_FIELDS = [
    "backend", "params", "effective_params", "batch", "num_heads", "context_len", "qo_len", "causal", "page_size",
    "kv_dtype", "status", "verdict_passed", "max_abs_err", "timing_mode", "median_us", "iqr_us",
    "min_us", "n_samples", "median_rel_ci", "noisy", "eager_median_us", "refresh_us",
    "achieved_tbps", "floor_us", "pct_of_floor", "cold_cache_copies", "bytes_moved", "workspace_bytes",
    "message", "key", "calls_per_sample", "floor_bandwidth", "clock_below_steady", "rel_rmse", "rel_max_err",
]


def csv_row(r: Record) -> dict[str, Any]:
    s, e, v = r.stats, r.eager_stats, r.verdict
    return {
        "backend": r.backend, "params": json.dumps(r.params, sort_keys=True),
        "effective_params": json.dumps(r.effective_params, sort_keys=True), "batch": r.batch,
        "num_heads": r.num_heads, "context_len": r.context_len, "qo_len": r.qo_len, "causal": r.causal,
        "page_size": r.shape.get("page_size"),
        "kv_dtype": r.shape.get("kv_dtype"), "status": r.status,
        "verdict_passed": v.passed if v else "", "max_abs_err": v.max_abs_err if v else "",
        "rel_rmse": _blank(v.rel_rmse if v else None), "rel_max_err": _blank(v.rel_max_err if v else None),
        "timing_mode": r.timing_mode, "median_us": s.median_us if s else "",
        "iqr_us": s.iqr_us if s else "", "min_us": s.min_us if s else "", "n_samples": s.n if s else "",
        "median_rel_ci": s.median_rel_ci if s else "", "noisy": s.noisy if s else "",
        "eager_median_us": e.median_us if e else "",
        "refresh_us": "" if r.refresh_us is None else r.refresh_us, "achieved_tbps": r.achieved_tbps or "",
        "floor_us": r.floor_us or "", "pct_of_floor": r.pct_of_floor or "",
        "cold_cache_copies": r.cold_cache_copies, "bytes_moved": r.bytes_moved,
        "workspace_bytes": r.workspace_bytes, "message": r.message, "key": r.key,
        "calls_per_sample": s.calls_per_sample if s and s.calls_per_sample else "",
        "floor_bandwidth": r.floor_bandwidth,
        "clock_below_steady": "" if r.clock_below_steady is None else r.clock_below_steady,
    }


def _blank(value: Any) -> Any:
    return "" if value is None else value


def library_versions(packages: Mapping[str, Sequence[str]]) -> dict[str, str | None]:
    """Versions of python, torch (with its CUDA/HIP), mlabench, and each of ``packages``.

    ``packages`` maps a manifest key to distribution names, the first installed one counting
    (``{"triton": ("triton", "pytorch-triton-rocm")}``); callers pass what the registered backends
    declare (:func:`mlabench.backends.registry.backend_packages`).  A missing package is None.
    """
    import torch

    from mlabench import __version__
    from mlabench.extras import package_version

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        **{key: package_version(tuple(names)) for key, names in packages.items()},
        "mlabench": __version__,
    }


def command_line() -> list[str]:
    """``sys.argv`` with the program shown as ``mlabench`` (also under ``python -m mlabench``)."""
    prog = Path(sys.argv[0]).name
    return ["mlabench" if prog in ("__main__.py", "mlabench") else prog, *sys.argv[1:]]
