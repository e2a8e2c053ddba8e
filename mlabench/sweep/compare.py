"""``mlabench compare`` over recorded runs: which records it reads, how backends pair up, and which
path wins at each number of query tokens per request.

Reads run folders through :func:`mlabench.records.store.records_of`, never through the sweep runner; the
pairwise table is :func:`mlabench.sweep.compare.compare_table`, the per-qo_len answer :func:`winners_table`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mlabench.backends import backend_names, get_backend
from mlabench.errors import MissingResultError
from mlabench.records.record import Record
from mlabench.records.store import describe_records, records_of
from mlabench.sweep.summary import best_ok
from mlabench.tables.table import ColumnStyle, Table, fmt, params_label, short_params

#: The two paths the 12-head question is about, by backend family.
PATHS = {"persistent": "padded persistent", "split-kv": "split-KV"}


def recorded_records(runs: Iterable[Path], batch: Sequence[int] | None = None,
                     context_lens: Sequence[int] | None = None,
                     backends: Sequence[str] | None = None,
                     qo_lens: Sequence[int] | None = None) -> list[Record]:
    """The records of ``runs`` (run folders, or folders holding runs), kept when their batch is in
    ``batch``, their longest context length in ``context_lens``, their backend in ``backends`` and
    their query tokens per request in ``qo_lens`` (each filter off when None or empty; records
    written before multi-token decode count as qo_len 1).

    Raises :class:`UnknownBackendError` for a backend name that is not registered (before reading
    anything), :class:`ResultsError` for a folder without runs or runs from different devices, and
    :class:`MissingResultError` when no record passes the filters (naming what the runs hold).
    """
    for name in backends or []:
        get_backend(name)
    everything = records_of(runs)
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


def backend_families() -> dict[str, str]:
    """``{backend name: family}`` of every registered backend (``persistent``, ``split-kv``, ...),
    which :func:`mlabench.sweep.compare.compare_table` uses to pair padded persistent kernels with
    split-KV ones."""
    return {name: get_backend(name).family for name in backend_names()}


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
    """Per batch and context bucket, which path wins at each qo_len: one column per qo_len
    (``qo=4``, ``qo=4 non-causal``) naming the faster path, its backend and time and how much
    faster it is than the other path's best (:func:`path_winner`; only ok records count).
    JSON and CSV carry the winner as ``{"path", "backend", "us", "margin"}``."""
    cells: dict[tuple[int, int], dict[Any, list[Record]]] = {}
    for r in records:
        cells.setdefault((r.batch, r.context_len), {}).setdefault(r.qo_label, []).append(r)
    qos = sorted({q for by_qo in cells.values() for q in by_qo}, key=lambda q: (int(str(q).split()[0]), str(q)))
    columns = [f"qo={q}" for q in qos]
    styles = {c: ColumnStyle(text=_winner_text) for c in columns}
    t = Table("Which path wins at each qo_len (query tokens per request)", ["batch", "context", *columns],
              styles=styles)
    for (batch, ctx), by_qo in sorted(cells.items()):
        t.rows.append([batch, ctx, *(path_winner(by_qo.get(q, []), families) for q in qos)])
    t.notes.append("each cell: the faster of the best padded persistent and the best split-KV configuration, "
                   "and the other's µs over the winner's; only configurations that passed the correctness check "
                   "count")
    return t


#: At a narrow terminal the compare table leaves out the persistent params, setup µs, then the
#: two % floor columns (the speedup and both times stay).
COMPARE_STYLES = {"params": ColumnStyle(text=short_params, drop=5), "setup µs": ColumnStyle(drop=4),
                  "% floor": ColumnStyle(drop=3), "split-KV % floor": ColumnStyle(drop=3)}


def compare_table(records: Sequence[Record], families: dict[str, str]) -> Table:
    """The 12-head question: each padded persistent backend against the best split count of each
    split-KV backend, per batch and context.

    ``families`` maps backend name -> family (``persistent`` / ``split-kv``).  ``speedup`` is
    split-KV µs / persistent µs: above 1 the padded persistent path is faster.  Only ok records
    count; a configuration with no ok record shows as a dash.  A backend whose every record at a
    batch, context and qo_len is ``unsupported`` is left out there (its rows would be all dashes),
    with a note naming it and why.
    """
    qo = any(r.qo_len != 1 for r in records)  # several query tokens: a qo_len column
    t = Table("Padded persistent vs best split-KV",
              ["batch", "context", *(["qo_len"] if qo else []), "persistent", "params", "µs", "% floor",
               "setup µs", "split-KV", "best splits", "split-KV µs", "split-KV % floor", "speedup"],
              styles=COMPARE_STYLES)
    cells: dict[tuple, dict[str, list[Record]]] = {}
    for r in records:
        cells.setdefault((r.batch, r.context_len, r.qo_len, not r.causal), {}).setdefault(r.backend, []).append(r)
    dropped = _drop_unsupported(cells)
    persistent = sorted({b for b, f in families.items() if f == "persistent"})
    splitkv = sorted({b for b, f in families.items() if f == "split-kv"})
    for (batch, ctx, *_qo), by_backend in sorted(cells.items()):
        qo_cell = [next(iter(by_backend.values()))[0].qo_label] if qo else []
        for p in [b for b in persistent if b in by_backend] or [None]:
            pb = best_ok(by_backend.get(p, [])) if p else None
            for s in [b for b in splitkv if b in by_backend] or [None]:
                sb = best_ok(by_backend.get(s, [])) if s else None
                speedup = sb.stats.median_us / pb.stats.median_us if pb and sb else None
                t.rows.append([
                    batch, ctx, *qo_cell, p, params_label(pb.params) if pb else None,
                    pb.stats.median_us if pb else None, pb.pct_of_floor if pb else None,
                    sum(pb.setup_us.values()) if pb and pb.setup_us else None, s, sb.effective_params.get("num_kv_splits", sb.params.get("num_kv_splits")) if sb else None,
                    sb.stats.median_us if sb else None, sb.pct_of_floor if sb else None, speedup,
                ])
    t.notes.append("speedup = split-KV µs / persistent µs (> 1: padding to 16 heads and running the "
                   "persistent kernel wins); only configurations that passed the correctness check count")
    t.notes.append("setup µs: scheduling metadata / work list built once per decode step outside the "
                   "timed call (wall clock, as servers share it across layers)")
    if any(r.floor_bandwidth == "copy" and r.floor_us for r in records):
        t.notes.append("% floor is against the measured device-to-device copy bandwidth (read + write); a "
                       "read-mostly kernel can exceed it by a few percent")
    else:
        t.notes.append("% floor is against the measured streaming read bandwidth (a large read-only reduction)")
    t.notes += dropped
    return t


def _drop_unsupported(cells: dict[tuple, dict[str, list[Record]]]) -> list[str]:
    """Take out of ``cells`` (``{(batch, context, qo_len, non-causal): {backend: records}}``) each
    backend whose every record in a cell is ``unsupported``; one note per backend taken out, naming
    where and the first record's reason."""
    gone: dict[str, list[Record]] = {}
    for key, by_backend in list(cells.items()):
        for name in [b for b, recs in by_backend.items() if all(r.status == "unsupported" for r in recs)]:
            gone.setdefault(name, []).append(by_backend.pop(name)[0])
        if not by_backend:
            del cells[key]
    notes = []
    for name, recs in sorted(gone.items()):
        qos = sorted({r.qo_label for r in recs}, key=lambda q: (int(str(q).split()[0]), str(q)))
        where = "; ".join(f"{label} {', '.join(map(str, values))}" for label, values in (
            ("batch", sorted({r.batch for r in recs})), ("context", sorted({r.context_len for r in recs})),
            ("qo_len", qos)))
        notes.append(f"left out: {name} in {len(recs)} cell{'s' * (len(recs) != 1)} ({where}), where every configuration recorded is "
                     f"unsupported ({recs[0].message or 'no reason recorded'})")
    return notes
