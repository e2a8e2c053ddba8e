"""What a tuning or a validation run records about itself: its manifest (:func:`run_manifest`) and
a fresh run id (:func:`fresh_run_id`).

Shared by :mod:`.run` and :mod:`.validation_run`; it imports neither the studies nor the worker
processes.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from mlabench.backends.registry import backend_packages
from mlabench.device import current_device
from mlabench.measure.observers import driver_version, gpu_state
from mlabench.records.provenance import command_line, git_revision, library_versions
from mlabench.records.record import Manifest, new_run_id, utc_now
from mlabench.tune.storage import redact_url


def run_manifest(run_id: str, copy_bw: float, config: dict[str, Any], device: str | None = None,
                 kind: str | None = None) -> Manifest:
    """The manifest of a tuning or validation run (database passwords in the command line redacted);
    ``kind`` is :data:`~mlabench.run_files.TUNE_KIND` or :data:`~mlabench.run_files.VALIDATION_KIND`."""
    rev, dirty = git_revision()
    dev = dict(current_device().__dict__, name=device or current_device().name)
    command = [redact_url(x) if "://" in x else x for x in command_line()]
    return Manifest(run_id=run_id, created=utc_now(), command=command, git_revision=rev, git_dirty=dirty,
                    host=socket.gethostname(), device=dev, gpu_state=gpu_state(), driver=driver_version(),
                    versions=library_versions(backend_packages()), copy_bandwidth_tbps=copy_bw, config=config,
                    kind=kind)


def fresh_run_id(results_root: Path, prefix: str) -> str:
    """:func:`new_run_id`, with ``-2``, ``-3``... appended when a run of this process already took it
    (two runs started within one second)."""
    run_id = base = new_run_id(prefix)
    n = 1
    while (results_root / run_id).exists():
        n += 1
        run_id = f"{base}-{n}"
    return run_id
