"""Which of ``tune``'s flags each of its modes reads (a search, ``--validate``, ``--export``), and
the refusal of a flag given to a mode that would not read it (it ran as if it were not there)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlabench.cli.options import refuse_results_dir_on_resume
from mlabench.errors import ConfigError

#: ``tune``'s parameters by what reads them: the search (a new run or ``--resume``), ``--validate``
#: and ``--export`` (the backend, --budget-s, --results-dir, --resume and the output flags are shared).
SEARCH_FLAGS = ("config", "model", "tp", "model_config", "heads", "batch", "buckets", "representative",
                "lengths_per_bucket", "combine", "max_waves", "tokens_per_split", "whole_tiles", "edges_per_octave",
                "device_policy", "page_size", "qo_len", "non_causal", "dtype", "sampler", "trials", "timeout",
                "space", "noise", "no_heuristics", "storage", "gpus", "workers")
VALIDATE_FLAGS = ("lengths", "context", "min_context", "max_context", "ladder", "seed", "tolerance", "from_run")
EXPORT_FLAGS = ("storage", "noise", "combine", "allow_incomplete", "pages_rule")
#: Why ``tune --export`` reads no flag of the other modes, appended to each refusal of one.
_EXPORT_READS = "tune --export reads the run's own settings and writes into its folder"


def refuse_unused_flags(given: dict[str, Any]) -> None:
    """ConfigError naming the flags given (not None or False) that the mode of ``tune`` does not
    read: ``--validate`` reads a policy, ``--export`` a run's studies, a search neither's flags.
    ``given``: the command's parameters by name (``--tolerance 0.05`` without ``--validate``, or
    ``--edges-per-octave 4`` with it, ran as if they were not there)."""
    modes = {"a tuning run": SEARCH_FLAGS, "--validate": VALIDATE_FLAGS, "--export": EXPORT_FLAGS}
    mode = "--validate" if given.get("validate") is not None else (
        "--export" if given.get("export") is not None else "a tuning run")
    by_owner: dict[str, list[str]] = {}
    for name in dict.fromkeys(n for names in modes.values() for n in names):
        if name not in modes[mode] and given.get(name) not in (None, False):
            owners = " or ".join(m for m, names in modes.items() if name in names)
            by_owner.setdefault(owners, []).append(f"--{name.replace('_', '-')}")
    if by_owner:
        raise ConfigError("; ".join(f"{', '.join(flags)} go{'es' if len(flags) == 1 else ''} with {owners}"
                                    for owners, flags in by_owner.items())
                          + f", not {'tune ' if mode.startswith('--') else ''}{mode}"
                          + (f": {_EXPORT_READS}" if mode == "--export" else ""))
    _refuse_shared_flags(given, mode)


def _refuse_shared_flags(given: dict[str, Any], mode: str) -> None:
    """ConfigError for the flags shared by the modes that ``mode`` would not read: ``--validate``
    with ``--export``; ``--export`` (which reads the run's own settings and writes into it) with
    ``--backend``, ``--budget-s``, ``--resume`` or ``--results-dir``; ``--resume`` (the run's folder)
    with ``--results-dir``.  Each ran as if it were not there."""
    if given.get("validate") is not None and given.get("export") is not None:
        raise ConfigError("--validate and --export are two modes of tune: give one")
    moved = given.get("results_dir") not in (None, Path("results"))
    if mode == "--export":
        stray = [f"--{n.replace('_', '-')}" for n in ("backend", "budget_s", "resume") if given.get(n) is not None]
        if stray or moved:
            flags = stray + ["--results-dir"] * moved
            raise ConfigError(f"{', '.join(flags)} go{'es' if len(flags) == 1 else ''} with a tuning run or --validate, "
                              f"not tune --export: {_EXPORT_READS}")
    else:
        refuse_results_dir_on_resume(given.get("resume"), given.get("results_dir"))
