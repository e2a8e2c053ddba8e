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
from pathlib import Path

from mlabench.errors import ResultsError
from mlabench.run_files import MANIFEST_FILE, SWEEP_KIND, TUNE_KIND, VALIDATION_KIND, manifest_kind


def run_kind(path: Path) -> str:
    """The kind of the run folder ``path`` (one of :data:`~mlabench.run_files.RUN_KINDS`), from its
    ``manifest.json`` (:func:`~mlabench.run_files.manifest_kind`).

    A folder whose manifest is missing, unreadable or not a JSON object reads as
    :data:`~mlabench.run_files.SWEEP_KIND`: reading it as a kernel run then says what is wrong.
    """
    return manifest_kind(_manifest(path))


def _manifest(path: Path) -> dict:
    """The parsed ``manifest.json`` of the folder ``path``; {} where it is missing, unreadable or
    not a JSON object."""
    try:
        manifest = json.loads((Path(path) / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def validation_resume_command(policy_path: str | Path | None, run_dir: Path) -> str:
    """The command that continues the ``tune --validate`` folder ``run_dir`` of the policy file
    ``policy_path`` (None: not recorded, shown as ``POLICY``)."""
    return f"mlabench tune --validate {policy_path or 'POLICY'} --resume {run_dir}"


def recording_script(config: dict) -> str | None:
    """The script that recorded a kernel run (its manifest's ``config["script"]["path"]``, e.g.
    ``scripts/h200_hopper_kernel.py``); None for a run of a command (``mlabench sweep``)."""
    script = config.get("script")
    return script.get("path") if isinstance(script, dict) else None


_RUN_NOUNS = {SWEEP_KIND: "a sweep", TUNE_KIND: "a tuning run", VALIDATION_KIND: "a validation run"}


def refuse_search_run_folder(run_dir: Path, reader: str = SWEEP_KIND) -> None:
    """:func:`refuse_search_runs` of the folder ``run_dir``'s own manifest, before anything else is
    read (an archived tuning run was told to be gunzipped, then refused as a tuning run).  A folder
    whose manifest is missing or unreadable passes: reading it as ``reader``'s run says what is wrong."""
    manifest = _manifest(run_dir)
    if manifest:
        config = manifest.get("config")
        refuse_search_runs(manifest_kind(manifest), config if isinstance(config, dict) else {}, run_dir, reader)


def refuse_search_runs(kind: str, config: dict, run_dir: Path, reader: str = SWEEP_KIND) -> None:
    """:class:`~mlabench.errors.ResultsError` naming the command that continues ``run_dir`` when its
    ``kind`` (:func:`~mlabench.run_files.manifest_kind`; ``config``: its manifest's configuration,
    which names a validation run's policy) is a sweep, a tuning or a validation run's and ``reader``
    (the kind of run the caller continues: :data:`~mlabench.run_files.SWEEP_KIND`,
    :data:`~mlabench.run_files.TUNE_KIND` or :data:`~mlabench.run_files.VALIDATION_KIND`) is another
    (``sweep --resume`` of a tuning run said "unknown key (a typo?)"; ``tune --resume`` of a sweep,
    only that it is no tuning run: fresh users' reviews).  Other kinds (serve-bench) pass: their
    readers refuse them.  One wording for every reader: "X is a validation run, not a sweep;
    continue it with: mlabench tune --validate POLICY --resume X"."""
    if kind == reader or kind not in _RUN_NOUNS:
        return
    script = recording_script(config)  # a script's kernel run (scripts/h200_hopper_kernel.py): nothing continues it
    if kind == SWEEP_KIND and script:
        raise ResultsError(f"{run_dir} is a kernel run of {script}, not {_RUN_NOUNS[reader]}: it cannot be resumed")
    if kind == SWEEP_KIND:
        command = f"mlabench sweep --resume {run_dir}"
    elif kind == TUNE_KIND:
        command = f"mlabench tune --resume {run_dir}"
    else:
        policy = (config.get("validate") or {}).get("policy")  # named where it is a file here, not elsewhere's
        command = validation_resume_command(policy if policy and Path(policy).is_file() else None, run_dir)
    raise ResultsError(f"{run_dir} is {_RUN_NOUNS[kind]}, not {_RUN_NOUNS[reader]}; continue it with: {command}")
