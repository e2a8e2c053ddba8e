"""What run a run folder holds: :func:`run_kind`, the one place a run's kind is read or derived.

New manifests say it (``"kind"``: one of :data:`~mlabench.run_files.RUN_KINDS`).  Runs recorded
before they did (every committed kernel, tuning and validation run up to issue 36) get a kind
derived here, once, from their manifest's configuration: ``config.tune`` is a tuning run,
``config.validate`` a validation run, anything else a kernel sweep (serve-bench manifests have
always said ``"kind": "serve-bench"``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlabench.run_files import MANIFEST_FILE, RUN_KINDS, SWEEP_KIND, TUNE_KIND, VALIDATION_KIND

#: Key of a manifest's ``config`` -> the kind of a run whose manifest does not say it.
_KIND_OF_CONFIG_KEY = {"tune": TUNE_KIND, "validate": VALIDATION_KIND}


def manifest_kind(manifest: dict[str, Any]) -> str:
    """The kind of the run whose parsed ``manifest.json`` is ``manifest``: its ``kind`` when it is
    one of :data:`~mlabench.run_files.RUN_KINDS`, else derived from its ``config`` keys (module
    docstring); :data:`~mlabench.run_files.SWEEP_KIND` when neither says otherwise."""
    if manifest.get("kind") in RUN_KINDS:
        return str(manifest["kind"])
    config = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
    return next((kind for key, kind in _KIND_OF_CONFIG_KEY.items() if key in config), SWEEP_KIND)


def run_kind(path: Path) -> str:
    """The kind of the run folder ``path`` (one of :data:`~mlabench.run_files.RUN_KINDS`), from its
    ``manifest.json`` (:func:`manifest_kind`).

    A folder whose manifest is missing, unreadable or not a JSON object reads as
    :data:`~mlabench.run_files.SWEEP_KIND`: reading it as a kernel run then says what is wrong.
    """
    try:
        manifest = json.loads((Path(path) / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return SWEEP_KIND
    return manifest_kind(manifest) if isinstance(manifest, dict) else SWEEP_KIND
