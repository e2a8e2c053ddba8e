"""The run folder: the append-only JSONL store of records, its manifest, and finding and reading runs.

A run folder ``results/<run-id>/`` holds ``manifest.json`` (identity: device, driver, library
versions, git revision, command line; measured read and copy bandwidth; warm-up and drift),
``results.jsonl`` (one :class:`Record` per line, appended and fsync'ed, never rewritten),
``results.csv`` (regenerated from the JSONL) and, for sweeps, ``sentinel.jsonl`` (the sentinel
point's re-measurements).  Committed runs keep these two gzipped (``.jsonl.gz``), read as they are
(:func:`stored_file`).  Resuming refuses a folder whose identity differs from this process's, and
skips points whose key is already recorded.  A last line cut short by an interrupted write is
dropped on resume (the file is truncated back to its last complete line before appending).  Readers of
recorded runs (``compare --from``, reports, tuning) use :func:`records_of`, not the sweep runner.
"""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from mlabench.errors import FileAccessError, ResultsError
from mlabench.files import append_text, file_in_the_way, make_dir, read_text, user_path, validation_line, write_text
from mlabench.records.csv_rows import CSV_FIELDS, csv_row
from mlabench.records.kinds import run_kind
from mlabench.records.provenance import same_commit
from mlabench.records.record import Manifest, Record
from mlabench.run_files import stored_file  # noqa: F401  (re-exported: readers import it from here)
from mlabench.run_files import (ARCHIVED_JSONL_GLOB, ARCHIVED_RESULTS_FILE, GZIP_SUFFIX, MANIFEST_FILE,
                                RESULTS_CSV_FILE, RESULTS_FILE, SCRIPT_RECORDS_FILE, SERVE_BENCH_KIND)


def holds_run(path: Path) -> bool:
    """Whether ``path`` is a run folder: it has ``results.jsonl`` or, archived, ``results.jsonl.gz``."""
    return (path / RESULTS_FILE).is_file() or (path / ARCHIVED_RESULTS_FILE).is_file()


def is_archived(run_dir: Path) -> bool:
    """Whether ``run_dir`` is an archived run: ``results.jsonl.gz`` and no ``results.jsonl``."""
    return stored_file(run_dir / RESULTS_FILE).name == ARCHIVED_RESULTS_FILE


def refuse_serve_bench_run(run_dir: Path) -> None:
    """Raise :class:`ResultsError` when ``run_dir`` is a serve-bench run (:func:`run_kind`): its
    manifest and records are of another form, which a kernel, tuning or validation reader would
    report as an unreadable manifest (``started_utc: unknown key``) or, resuming, as archived."""
    if run_kind(run_dir) == SERVE_BENCH_KIND:
        raise ResultsError(f"{run_dir} is a serve-bench run, not a sweep, tuning or validation run "
                           f"(`mlabench serve-bench --from-run {run_dir}` reads it)")


def refuse_archived(run_dir: Path) -> None:
    """Raise :class:`ResultsError` when ``run_dir`` is an archived run (:func:`is_archived`): it is
    read as it is and never written to, so it cannot be resumed.  Also when any other raw file is
    still gzipped (``sentinel.jsonl.gz`` without ``sentinel.jsonl``): a resumed run would append
    to a new plain file, which readers then take instead of the gzipped records.  First, when it
    is a serve-bench run (:func:`refuse_serve_bench_run`): that, not the gzip, is what stops it."""
    refuse_serve_bench_run(run_dir)
    if is_archived(run_dir):
        raise ResultsError(f"{run_dir} is archived ({ARCHIVED_RESULTS_FILE}): gunzip it to add to it")
    left = sorted(p.name for p in Path(run_dir).glob(ARCHIVED_JSONL_GLOB) if not p.with_suffix("").exists())
    if left:
        raise ResultsError(f"{run_dir}: {left[0]} is still gzipped: gunzip it too before resuming")


def _refuse_no_run_folder(run_dir: Path) -> None:
    """:class:`ResultsError` where ``run_dir`` (no manifest in it) is a file, missing, or a folder holding runs
    one level down: a fresh user's review, told "run manifest is not a folder" for a policy file and
    "run manifest not found" for a folder of runs."""
    if not run_dir.is_dir():  # a name not there said "run manifest not found: X/manifest.json"
        raise ResultsError(f"{run_dir} is a file, not a run folder" if run_dir.exists() else f"{run_dir}: no such folder")
    inner = runs_one_level_down(run_dir)
    if inner:
        raise ResultsError(f"{run_dir} is no run folder; it holds runs (name one): " + ", ".join(map(str, inner)))


def _identity_difference(field: str, recorded: Any, here: Any) -> str:
    """``field (recorded there, here)``; of a mapping (``versions``) each differing key's values."""
    if isinstance(recorded, dict) and isinstance(here, dict):
        keys = sorted(k for k in recorded.keys() | here.keys() if recorded.get(k) != here.get(k))
        return f"{field} (" + "; ".join(f"{k} {recorded.get(k)} there, {here.get(k)} here" for k in keys) + ")"
    return f"{field} ({recorded} there, {here} here)"


class ResultStore:
    """Append-only JSONL records of one run folder (read-only when archived: :data:`ARCHIVED_RESULTS_FILE`)."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.jsonl = stored_file(self.run_dir / RESULTS_FILE)
        self.archived = self.jsonl.name == ARCHIVED_RESULTS_FILE
        self.manifest_path = self.run_dir / MANIFEST_FILE

    # ---- lifecycle -----------------------------------------------------------------------------
    @classmethod
    def create(cls, run_dir: Path, manifest: Manifest) -> ResultStore:
        """Make a new run folder: its manifest and an empty ``results.jsonl``, so a run stopped
        before its first record is still a run folder that ``report`` and ``--resume`` find;
        :class:`ResultsError` if it already holds results.

        When the manifest cannot be written (:class:`FileAccessError`, e.g. a full disk), a folder
        made here is removed again and the error says so: no run folder without a manifest is left.
        """
        store = cls(run_dir)
        if store.manifest_path.exists():
            raise ResultsError(f"{run_dir} already holds a run; use --resume to continue it")
        made = not store.run_dir.exists()
        make_dir(store.run_dir, "run folder")
        try:
            store._write_manifest(manifest)
            append_text(store.jsonl, "", "run results")
        except FileAccessError as exc:
            left = "it holds no run"
            if made:
                try:
                    store.run_dir.rmdir()
                    left = "the run folder was removed"
                except OSError:
                    left = "the run folder could not be removed: delete it"
            raise type(exc)(f"{exc} (nothing was recorded; {left})") from None  # a full disk stays one (exit 3)
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
    def open_existing(cls, run_dir: Path, identity: dict[str, Any] | None = None,
                      repair: bool = True) -> ResultStore:
        """Reopen a run to resume it; :class:`ResultsError` for a folder with no manifest, one whose
        identity differs from ``identity``, or then an archived one (:func:`refuse_archived`).
        ``repair``: cut a torn last record off now (:meth:`drop_torn_line`); a caller with more to
        check first passes False and calls it once the resume is accepted."""
        store = cls(run_dir)
        if not store.manifest_path.exists():
            raise ResultsError(f"{run_dir}: no {MANIFEST_FILE}, nothing to resume")
        if identity is not None:  # before the archive: a copy of another GPU's run was to be gunzipped first
            theirs = store.manifest().identity()
            diff = sorted(k for k in identity if identity[k] != theirs.get(k)
                          and not (k == "git_revision" and same_commit(str(identity[k]), str(theirs.get(k)))))
            if diff == ["git_dirty"]:
                raise ResultsError(
                    f"{run_dir} was recorded at {theirs['git_revision'][:12]} "
                    + ("with uncommitted changes, and the code here has none" if theirs["git_dirty"] else
                       "without uncommitted changes, and the code here has some")
                    + ": its points would mix two versions of the code; resume with the code it was recorded "
                    "with, or start a new run")
            if diff:
                raise ResultsError(f"{run_dir} was recorded with another "
                                   f"{', '.join(_identity_difference(k, theirs.get(k), identity[k]) for k in diff)}; "
                                   "start a new run instead")
        refuse_archived(run_dir)
        if repair:
            store.drop_torn_line()
        return store

    def manifest(self) -> Manifest:
        """The run's manifest; :class:`ResultsError` for a path that is a file or a folder of runs
        (naming them), :class:`FileAccessError` for a missing or unreadable one."""
        if not self.manifest_path.exists():
            _refuse_no_run_folder(self.run_dir)
        text = read_text(self.manifest_path, "run manifest")
        try:
            return Manifest.model_validate_json(text)
        except ValidationError as exc:
            refuse_serve_bench_run(self.run_dir)
            raise ResultsError(f"{self.manifest_path}: unreadable manifest ({validation_line(exc)})") from None

    # ---- records -------------------------------------------------------------------------------
    def append(self, record: Record) -> None:
        """Append one record as a JSON line, flushed and fsync'ed before returning; raises
        :class:`ResultsError` for an archived run."""
        refuse_archived(self.run_dir)
        append_text(self.jsonl, record.model_dump_json() + "\n", "run results", sync=True)

    def records(self) -> list[Record]:
        """Every complete record, in order; a cut-short last line is ignored.  A ``results.jsonl.gz``
        beside the plain file that is not a whole gzip file is named in a ``notice:`` on stderr
        (the plain file is read; the archive would not restore the run)."""
        gzipped = self.run_dir / ARCHIVED_RESULTS_FILE
        if not self.archived and self.jsonl.exists() and gzipped.is_file():
            try:
                read_text(gzipped, "archived run results")
            except FileAccessError as exc:
                print(f"notice: {exc}; {self.jsonl.name} beside it is read", file=sys.stderr, flush=True)
        return read_jsonl(self.jsonl, Record, "record")

    def finished_keys(self) -> set[str]:
        return {r.key for r in self.records()}

    def drop_torn_line(self) -> None:
        """Cut a torn last line (no newline after it: a write cut short) off ``results.jsonl``
        before appending, with a ``notice:`` on stderr naming the bytes cut (the point it recorded,
        if whole, is measured again), as ``tune`` does for its journal."""
        if self.archived or not self.jsonl.exists():
            return
        with user_path(self.jsonl, "run results"):
            data = self.jsonl.read_bytes()
            if data and not data.endswith(b"\n"):
                end = data.rfind(b"\n") + 1
                with open(self.jsonl, "r+b") as fh:
                    fh.truncate(end)
                print(f"notice: {self.jsonl}: its last line was torn ({len(data) - end} bytes, a write cut "
                      f"short) and is cut off; the point it recorded is measured again", file=sys.stderr, flush=True)

    # ---- exports -------------------------------------------------------------------------------
    def write_csv(self, path: Path | None = None) -> Path:
        """Flatten the records into ``results.csv`` (regenerated, never appended); returns its path."""
        path = path or self.run_dir / RESULTS_CSV_FILE
        rows = [csv_row(r) for r in self.records()]
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\r\n")
        writer.writeheader()
        writer.writerows(rows)
        return write_text(path, buf.getvalue(), "results CSV", atomic=True)


M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


def read_jsonl(path: Path, model: type[M], what: str) -> list[M]:
    """Every line of a JSONL file as ``model``, in order; [] when the file does not exist.

    A last line cut short (an interrupted write: no newline after it) is left out, with a
    ``notice:`` on stderr naming the file (a reader must not take a run that lost its last point
    for a whole one); a bad line elsewhere raises :class:`ResultsError` naming the file, the line
    and ``what`` it should be.
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
                print(f"notice: {path}: its last line is cut short ({len(line.encode())} bytes, an interrupted "
                      f"write) and is left out", file=sys.stderr, flush=True)
                break
            raise ResultsError(f"{path}:{i + 1}: not a valid {what}") from None
    return out


def folders_below(path: Path) -> list[Path]:
    """``path`` and every folder under it, at any depth, in sorted order, without entering a run
    folder (one with records, :func:`holds_run`, or a ``manifest.json``: its subfolders are its own),
    a folder whose name starts with ``.``, or a linked folder (no cycles).  Empty when ``path`` is
    not a folder."""
    if not path.is_dir():
        return []
    found = [path]
    if holds_run(path) or (path / MANIFEST_FILE).is_file():
        return found
    try:
        inner = sorted(p for p in path.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith("."))
    except OSError:
        return found
    for sub in inner:
        found.extend(folders_below(sub))
    return found


def run_folders(paths: Iterable[Path], *, any_depth: bool = False) -> list[Path]:
    """Run folders named, or found one level inside the folders named (e.g. ``results/h200/x``);
    with ``any_depth``, found at any depth under them (:func:`folders_below`: never inside a run
    folder), as ``report``, ``plot``, ``compare --from`` and ``serve-bench --predict-from`` read
    them (:func:`runs_of_kinds`; ``diff``, one run per argument, keeps one level).

    Raises :class:`ResultsError` for a path that holds no run, naming the folders further down
    that hold runs, or saying that a ``records.jsonl`` without a manifest is a script's output.
    """
    found: list[Path] = []
    for path in map(Path, paths):
        if holds_run(path):
            found.append(path)
            continue
        inner = [p for p in folders_below(path) if holds_run(p)] if any_depth else runs_one_level_down(path)
        if not inner:
            raise ResultsError(f"{path}: no run folder ({RESULTS_FILE}, {MANIFEST_FILE}) "
                               + ("here or below" if any_depth else "here or one level down") + _no_run_hint(path))
        found.extend(inner)
    return found


def runs_one_level_down(path: Path) -> list[Path]:
    """The folders directly inside ``path`` that hold a run (:func:`holds_run`), sorted ([] for no folder)."""
    return sorted(p for p in path.iterdir() if p.is_dir() and holds_run(p)) if path.is_dir() else []


def _no_run_hint(path: Path) -> str:
    """Why ``path`` holds no run folder, and where the runs are when they lie deeper."""
    if not path.exists():  # a typo'd name read as the wrong kind of file (a fresh user's review)
        return f" (not found: {file_in_the_way(path) or 'no such file or folder'})"
    if not path.is_dir():
        return " (not a folder)"
    if (path / SCRIPT_RECORDS_FILE).is_file():
        return f"; its {SCRIPT_RECORDS_FILE} is a script's output, not a run (its README.md says what reads it)"
    deeper = sorted({str(p.parent) for depth in ("*/*/", "*/*/*/") for name in (RESULTS_FILE, ARCHIVED_RESULTS_FILE)
                     for p in path.glob(depth + name)})
    return ("; run folders further down (name one, or the folder just above it): " + ", ".join(deeper)
            if deeper else "")


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
    compare; so are two folders holding the same run (one run id: a copy, e.g. one unpacked to be
    resumed beside the committed one), whose records would count twice.
    """
    stores = [ResultStore(run) for run in once(run_folders(runs))]  # a folder named twice is read once
    manifests = [store.manifest() for store in stores]
    devices: dict[str, Path] = {}
    for store, manifest in zip(stores, manifests):
        devices.setdefault(str(manifest.device.get("name")), store.run_dir)
    if len(devices) > 1:
        raise ResultsError("runs from different devices do not compare: "
                           + "; ".join(f"{d} ({p})" for d, p in devices.items()))
    ids: dict[str, Path] = {}
    for store, manifest in zip(stores, manifests):
        first = ids.setdefault(manifest.run_id, store.run_dir)
        if first != store.run_dir:
            raise ResultsError(f"{first} and {store.run_dir} hold the same run ({manifest.run_id}): one is a copy "
                               f"of the other and its records would count twice; give one of them")
    return [r for store in stores for r in store.records()]


def runs_of_kinds(paths: Iterable[Path], kinds: Collection[str], what: str) -> list[Path]:
    """The run folders named, or found at any depth under the folders named, as ``report`` finds
    them (:func:`~mlabench.records.store.run_folders` with ``any_depth``: never inside a run
    folder), keeping those whose :func:`run_kind` is one of ``kinds``.  A run of another kind
    found under a folder is passed over: ``results/h200/serving`` holds serve-bench runs beside the
    sweep runs of ``sweep/``, and a command reading kernel records (``what``, said in errors: e.g.
    ``compare --from``) reads the sweeps.

    Raises :class:`ResultsError` for a run of another kind named directly, a folder holding runs
    of other kinds only (naming them), and :func:`~mlabench.records.store.run_folders`' errors (a
    path with no run here or below).
    """
    *some, last = sorted(kinds)
    wanted = f"{', '.join(some)} or {last}" if some else last
    found: list[Path] = []
    for path in map(Path, paths):
        try:
            folders = run_folders([path], any_depth=True)
        except ResultsError as exc:  # the path's own line, named by the option that gave it
            raise ResultsError(f"{what} {exc}") from None
        kept = [f for f in folders if run_kind(f) in kinds]
        if holds_run(path) and not kept:
            raise ResultsError(f"{what} {path}: a {run_kind(path)} run, not a {wanted} run")
        if not kept:
            other = ", ".join(sorted({run_kind(f) for f in folders}))
            raise ResultsError(f"{what} {path}: no {wanted} run here or below (only {other} runs)")
        found.extend(kept)
    return once(found)  # a run named twice, or also under a folder named, is read once


def once(items: Iterable[T], path: Callable[[T], Path] = lambda p: p) -> list[T]:
    """``items`` (paths, or things ``path`` gives the path of) without repeats, by the place each
    path names (``val`` and ``/tmp/r/val`` from ``/tmp/r`` are one run), each kept as first spelled."""
    seen: set[Path] = set()
    kept = []
    for item in items:
        place = path(item).resolve()
        if place not in seen:
            seen.add(place)
            kept.append(item)
    return kept
