"""What run a run folder holds: :func:`run_kind`, the one place a run folder's kind is read.

New manifests say it (``"kind"``: one of :data:`~mlabench.run_files.RUN_KINDS`).  Runs recorded
before they did (every committed kernel, tuning and validation run up to issue 36) get a kind
derived once, from their manifest's configuration, by :func:`~mlabench.run_files.manifest_kind`
(in the run layer, so that readers below :mod:`mlabench.records`, the serve-bench one, apply the
same rule): ``config.tune`` is a tuning run, ``config.validate`` a validation run, anything else a
kernel sweep (serve-bench manifests have always said ``"kind": "serve-bench"``).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from pathlib import Path

from mlabench.errors import ResultsError
from mlabench.run_files import MANIFEST_FILE, SWEEP_KIND, manifest_kind


def run_kind(path: Path) -> str:
    """The kind of the run folder ``path`` (one of :data:`~mlabench.run_files.RUN_KINDS`), from its
    ``manifest.json`` (:func:`~mlabench.run_files.manifest_kind`).

    A folder whose manifest is missing, unreadable or not a JSON object reads as
    :data:`~mlabench.run_files.SWEEP_KIND`: reading it as a kernel run then says what is wrong.
    """
    try:
        manifest = json.loads((Path(path) / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return SWEEP_KIND
    return manifest_kind(manifest) if isinstance(manifest, dict) else SWEEP_KIND


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
    from mlabench.records.store import holds_run, run_folders  # store reads run_kind: imported here, not above

    *some, last = sorted(kinds)
    wanted = f"{', '.join(some)} or {last}" if some else last
    found: list[Path] = []
    for path in map(Path, paths):
        folders = run_folders([path], any_depth=True)
        kept = [f for f in folders if run_kind(f) in kinds]
        if holds_run(path) and not kept:
            raise ResultsError(f"{what} {path}: a {run_kind(path)} run, not a {wanted} run")
        if not kept:
            other = ", ".join(sorted({run_kind(f) for f in folders}))
            raise ResultsError(f"{what} {path}: no {wanted} run here or below (only {other} runs)")
        found.extend(kept)
    return list(dict.fromkeys(found))  # a run named twice, or also under a folder named, is read once
