"""``mlabench compare`` over recorded runs: which records it reads, how backends pair up, and which
path wins at each number of query tokens per request.

Reads run folders through :func:`mlabench.records.store.records_of`, never through the sweep runner; the
pairwise table is :func:`mlabench.sweep.summary.compare_table`, the per-qo_len answer :func:`winners_table`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mlabench.backends import get_backend
from mlabench.errors import BackendUnavailableError, ConfigError, MissingResultError
from mlabench.records.record import Record
from mlabench.records.store import describe_records, records_of, runs_of_kinds
from mlabench.run_files import SWEEP_KIND, TUNE_KIND, VALIDATION_KIND
from mlabench.sweep.summary import axis_values, best_ok, compare_key, sortable, varying_axes
from mlabench.tables.table import ColumnStyle, Table, fmt

#: The kinds of run whose records compare reads (a serve-bench run's are no kernel timings).
RECORD_KINDS = (SWEEP_KIND, TUNE_KIND, VALIDATION_KIND)

#: The two paths the 12-head question is about, by backend family.
PATHS = {"persistent": "padded persistent", "split-kv": "split-KV"}


def recorded_records(runs: Iterable[Path], batch: Sequence[int] | None = None,
                     context_lens: Sequence[int] | None = None,
                     backends: Sequence[str] | None = None,
                     qo_lens: Sequence[int] | None = None) -> list[Record]:
    """The records of ``runs`` (run folders, or folders holding runs at any depth: the kernel, tuning
    and validation runs under them, :func:`~mlabench.records.store.runs_of_kinds`), kept when their
    batch is in ``batch``, their longest context length in ``context_lens``, their backend in
    ``backends`` and their query tokens per request in ``qo_lens`` (each filter off when None or empty; records
    written before multi-token decode count as qo_len 1).

    Raises :class:`UnknownBackendError` for a backend name that is not registered (before reading
    anything), :class:`ResultsError` for a folder without runs or runs from different devices, and
    :class:`MissingResultError` when no record passes the filters (naming what the runs hold).
    """
    for name in backends or []:
        get_backend(name)
    everything = records_of(runs_of_kinds(runs, RECORD_KINDS, "compare --from"))
    kept = [r for r in everything
            if (not batch or r.batch in batch) and (not context_lens or r.context_len in context_lens)
            and (not backends or r.backend in backends) and (not qo_lens or r.qo_len in qo_lens)]
    if not kept:
        asked = [f"{flag} {','.join(map(str, values))}" for flag, values in
                 (("--batch", batch), ("--context", context_lens), ("--backend", backends), ("--qo-len", qo_lens))
                 if values]
        raise MissingResultError(f"no recorded point matches {' '.join(asked) or 'anything'}: the runs hold "
                                 + describe_records(everything))
    return kept


def check_both_paths_run(running: Sequence[str], names: Sequence[str] | None, families: dict[str, str]) -> None:
    """Before ``compare`` measures: raise unless the backends that would run (``running``, of those
    asked for, ``names``, or by default every one) hold a padded persistent and a split-KV one, so
    that a sweep whose comparison cannot be made is refused in one line instead of measured first.

    :class:`ConfigError` (exit 2) when ``names`` hold no backend of a path (the flags or config
    leave it out); :class:`BackendUnavailableError` (exit 3) when they do but none of them runs here.
    """
    for family, what in PATHS.items():
        if any(families.get(b) == family for b in running):
            continue
        of_path = [b for b, f in families.items() if f == family]
        asked = [b for b in names or of_path if families.get(b) == family]
        if not asked:
            raise ConfigError(f"nothing to compare: compare needs a {what} backend ({', '.join(of_path)}) "
                              f"beside {', '.join(names or running)}; add one to --backend")
        raise BackendUnavailableError(f"nothing to compare here: no {what} backend runs on this machine "
                                      f"({', '.join(asked)}: `mlabench backends` says why); `mlabench compare "
                                      "--from RUN` compares runs recorded elsewhere")


def path_winner(records: Sequence[Record], families: dict[str, str]) -> dict[str, Any] | None:
    """Which path is fastest among ``records`` (one batch, context and qo_len): the best ok record
    of each family in :data:`PATHS`, compared.

    Returns ``{"path", "backend", "us", "margin"}`` -- ``margin`` the other path's best µs over the
    winner's (None when only one path has an ok record) -- or None when no record is ok.
    """
    best = {fam: best_ok(r for r in records if families.get(r.backend) == fam) for fam in PATHS}
    ranked = sorted(((b.stats.median_us, fam, b) for fam, b in best.items() if b is not None),
                    key=lambda x: x[0])
    if not ranked:
        return None
    us, fam, rec = ranked[0]
    return {"path": PATHS[fam], "backend": rec.backend, "us": us,
            "margin": ranked[1][0] / us if len(ranked) > 1 else None}


def _winner_text(w: dict[str, Any] | None) -> str:
    if w is None:
        return "(none ok)"
    margin = "only path ok" if w["margin"] is None else f"{w['margin']:.2f}x"
    return f"{w['path']}: {w['backend']} {fmt(w['us'])} µs ({margin})"


def winners_table(records: Sequence[Record], families: dict[str, str]) -> Table:
    """Per batch and context bucket (and heads, page size, ... where they vary), which path wins at each qo_len: one column per qo_len
    (``qo=4``, ``qo=4 non-causal``) naming the faster path, its backend and time and how much
    faster it is than the other path's best (:func:`path_winner`; only ok records count).
    JSON and CSV carry the winner as ``{"path", "backend", "us", "margin"}``."""
    axes = varying_axes(records)
    cells: dict[tuple, dict[Any, list[Record]]] = {}
    for r in records:
        cells.setdefault((r.batch, *axis_values(r, axes), r.context_len), {}).setdefault(r.qo_label, []).append(r)
    qos = sorted({q for by_qo in cells.values() for q in by_qo}, key=lambda q: (int(str(q).split()[0]), str(q)))
    columns = [f"qo={q}" for q in qos]
    styles = {c: ColumnStyle(text=_winner_text) for c in columns}
    t = Table("Which path wins at each qo_len (query tokens per request)", ["batch", *axes, "context", *columns],
              styles=styles)
    for key, by_qo in sorted(cells.items(), key=lambda kv: sortable(kv[0])):
        t.rows.append([*key, *(path_winner(by_qo.get(q, []), families) for q in qos)])
    t.notes.append("each cell: the faster of the best padded persistent and the best split-KV configuration, "
                   "and the other's µs over the winner's; only configurations that passed the correctness check "
                   "count")
    return t


def check_comparable(records: Sequence[Record], families: dict[str, str]) -> None:
    """Raise :class:`MissingResultError` (exit 1) unless ``records`` hold a correct record of a
    padded persistent backend and one of a split-KV backend: otherwise the comparison the command
    is for cannot be made, and ``compare`` prints this error alone, before any table (a table would
    be a column of dashes); also where both paths have records but at no common point
    (:func:`~mlabench.sweep.summary.compare_key`: another batch, context or shape).  The message says
    which side is missing and what the runs do hold."""
    ok = [r for r in records if r.status == "ok"]
    if not ok:
        raise MissingResultError(f"no correct record among the {len(records)} read: nothing to compare "
                                 "(mlabench check shows why points fail)")
    held = sorted({r.backend for r in ok})
    for family, what in (("persistent", "a padded persistent"), ("split-kv", "a split-KV")):
        if not any(families.get(b) == family for b in held):
            raise MissingResultError(f"nothing to compare: compare needs {what} backend with correct records; "
                                     f"these runs have {', '.join(held)}")
    paths = {}
    for r in ok:
        paths.setdefault(compare_key(r), set()).add(families.get(r.backend))
    if not any({"persistent", "split-kv"} <= found for found in paths.values()):
        side = lambda family: describe_records(r for r in ok if families.get(r.backend) == family)  # noqa: E731
        raise MissingResultError("nothing to compare: no point has correct records of both paths at the same batch, "
                                 f"context and shape (compare pairs them only there): padded persistent: "
                                 f"{side('persistent')}; split-KV: {side('split-kv')}")
