"""The serve-bench run folder read back: its manifest, configuration and latest result of each point.

The serve-bench run kind's reader (:func:`read_serve_folder`); :func:`mlabench.records.readers.read_serve_run`
calls it for report and plot, ``serve-bench --resume`` and ``--from-run`` through
:func:`read_run`.  It sits here, apart from :mod:`mlabench.serving.bench` (which writes the folder
and drives servers), so that reading a run imports no server or process machinery, and below
:mod:`mlabench.records`, which may import it (issue 36).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from mlabench.errors import ConfigError
from mlabench.files import read_json, read_text, validation_line
from mlabench.run_files import MANIFEST_FILE, RESULTS_FILE, SERVE_BENCH_KIND, manifest_kind, stored_file
from mlabench.serving.config import ServeConfig
from mlabench.serving.results import BenchResult, judge


def latest_results(results: list[BenchResult]) -> list[BenchResult]:
    """The last recorded result of each (variant, input length, concurrency, repeat), in file
    order: ``results.jsonl`` keeps every run (append-only), a resumed point's rerun supersedes it."""
    last = {(r.variant, r.input_len, r.concurrency, r.repeat): r for r in results}
    return list(last.values())


def recorded_result_files(run_dir: Path) -> set[str]:
    """The result files (names relative to ``run_dir``) that any line of its ``results.jsonl``
    names, superseded ones included; empty without the file.  A line that does not parse names
    none (:func:`read_serve_folder` is the reader that refuses it)."""
    path = run_dir / RESULTS_FILE
    if not path.is_file():
        return set()
    names = set()
    for line in read_text(path, "serve-bench run results").splitlines():
        try:
            name = json.loads(line).get("result_file")
        except (ValueError, AttributeError):
            continue
        if isinstance(name, str):
            names.add(name)
    return names


def read_serve_folder(run_dir: Path) -> tuple[dict[str, Any], ServeConfig, list[BenchResult]]:
    """Re-read a finished (or interrupted) serve-bench run folder once: its parsed manifest, its
    config and the latest result of each point in results.jsonl (:func:`latest_results`), each
    judged again (:func:`~mlabench.serving.results.judge`) with its variant's parameters, so that a
    run recorded before a check existed is shown as that check sees it.

    Raises :class:`~mlabench.errors.FileAccessError` for a manifest or results file that cannot be
    read, :class:`ConfigError` for a manifest of another kind of run or a run that does not parse.
    """
    manifest = read_json(run_dir / MANIFEST_FILE, "serve-bench run manifest")
    if isinstance(manifest, dict) and manifest_kind(manifest) != SERVE_BENCH_KIND:
        raise ConfigError(f"{run_dir} is a {manifest_kind(manifest)} run, not a serve-bench run")
    results_path = stored_file(run_dir / RESULTS_FILE)  # absent until the first point ends: nothing recorded yet
    lines = read_text(results_path, "serve-bench run results").splitlines() if results_path.exists() else []
    where = ""
    try:
        config = ServeConfig.model_validate(manifest["config"], context={"recorded": True})
        results = []
        for number, line in enumerate(lines, 1):
            where = f"{results_path.name} line {number}: "
            if line.strip():
                results.append(BenchResult.model_validate_json(line))
    except (ValidationError, KeyError, TypeError) as exc:
        why = validation_line(exc) if isinstance(exc, ValidationError) else f"no {exc}"
        raise ConfigError(f"{run_dir} is not a readable serve-bench run: {where}{why}") from None
    params = {v.name: config.bench_for(v) for v in config.variants}
    return manifest, config, [judge(r, params[r.variant].for_run(r.input_len, r.concurrency).min_output_tokens()
                                    if r.variant in params else None) for r in latest_results(results)]


def read_run(run_dir: Path) -> tuple[ServeConfig, list[BenchResult]]:
    """The config and judged latest results of the serve-bench run ``run_dir``
    (:func:`read_serve_folder` without the manifest); the same errors."""
    _, config, results = read_serve_folder(run_dir)
    return config, results


def recorded_launch_env(manifest: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    """Variant name -> variable -> the values its server's launch env had, one per distinct value in
    session order (the run's ``launch_env``, then each resume's: a resume that started the variant
    again with another value adds it); {} for a run recorded before manifests held ``launch_env``."""
    found: dict[str, dict[str, list[str]]] = {}
    for session in [manifest, *(manifest.get("resumes") or [])]:
        for variant, env in (session.get("launch_env") or {}).items():
            for name, value in env.items():
                values = found.setdefault(variant, {}).setdefault(name, [])
                if value not in values:
                    values.append(value)
    return found
