"""Tables of recorded sweeps, importing no backend (so ``plot`` and ``report`` load no torch): the
sweep's summary (per backend, batch and context, the best correct configuration beside its time at
each split count swept) and the compare table (each padded persistent backend against the best split
count of each split-KV one)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from mlabench.records.record import CPU_RUN_NOTE
from mlabench.tables.table import PARAMS, ColumnStyle, Table, fmt, params_label, short_params

if TYPE_CHECKING:  # records are only read here; importing results would load torch for the CLI
    from mlabench.records.record import Record


#: Shape axes besides batch, context and qo_len that a run, or runs read together, may vary (a
#: ``--heads 8,12,16`` sweep; runs at two page sizes): every table groups by each of them and shows a
#: column for each that varies (:func:`varying_axes`).
SHAPE_AXES: dict[str, Callable[[Record], Any]] = {
    "heads": lambda r: r.num_heads, "page": lambda r: r.shape.get("page_size"),
    "kv dtype": lambda r: r.shape.get("kv_dtype"), "kv_lora_rank": lambda r: r.shape.get("kv_lora_rank"),
    # records of several runs (report --from A --from B) are never pooled: a point of each run
    "run": lambda r: r.run_id,
}


def varying_axes(records: Iterable[Record]) -> list[str]:
    """The names of :data:`SHAPE_AXES` that take more than one value among ``records``, in order."""
    records = list(records)
    return [name for name, get in SHAPE_AXES.items() if len({get(r) for r in records}) > 1]


def axis_values(record: Record, axes: Sequence[str]) -> tuple:
    """``record``'s value on each of ``axes`` (names of :data:`SHAPE_AXES`), for a row."""
    return tuple(SHAPE_AXES[a](record) for a in axes)


def sortable(key: tuple) -> tuple:
    """``key`` with None ordered first and never compared with a number or a string."""
    return tuple((v is not None, 0 if v is None else v) for v in key)


def best_ok(records: Iterable[Record]) -> Record | None:
    """Fastest record whose status is ok (a fast wrong answer never wins)."""
    ok = [r for r in records if r.status == "ok" and r.stats is not None]
    return min(ok, key=lambda r: r.stats.median_us) if ok else None


def ran_params(record: Record) -> dict[str, Any]:
    """``record``'s params with the ``num_kv_splits`` that ran: under a split policy (a non-empty
    ``split_policy``) the policy's count, from ``effective_params`` (it may differ from the count asked
    for, e.g. asked 64, ran 32); a point without a policy keeps its params as they are."""
    ran = record.effective_params.get("num_kv_splits")
    if not record.params.get("split_policy") or ran is None:
        return record.params
    return {**record.params, "num_kv_splits": ran}


def split_count(record: Record) -> int | None:
    """The ``num_kv_splits`` ``record`` ran (:func:`ran_params`); None for a backend without one."""
    return ran_params(record).get("num_kv_splits")


def ran_note(records: Iterable[Record]) -> list[str]:
    """The note of a table whose params are :meth:`Record.shown_params`, where a point ran another
    value than it asked for (``fused_merge=0 (asked 1)``); else []."""
    for r in records:
        shown = r.shown_params()
        name = next((k for k in shown if shown[k] != r.params[k]), None)
        if name is not None:
            return [f"params: X (asked Y) is the value that ran (effective_params) where it is not the one asked "
                    f"for, e.g. {r.backend} {name}={shown[name]}"]
    return []


def against_run_ceiling(records: Sequence[Record]) -> tuple[list[Record], list[str]]:
    """``records`` with every read floor against its run's ceiling: the highest read ceiling among
    the run's records, or the highest TB/s a correct record of the run reached where that is higher
    (issue 27 item 1: a ceiling a point beats is no ceiling, and no point shows more than 100%).
    A sweep raises its ceiling as it goes (:meth:`mlabench.sweep.runner.SweepRunner._within_ceiling`),
    so its earlier points carry a lower one; runs recorded before that can hold points above 100%.
    Returns the records (copy floors and untimed ones as they are) and one note per run whose
    ceiling a point beat."""
    top: dict[str, float] = {}
    for r in records:
        if r.floor_bandwidth == "read" and r.read_bandwidth_tbps:
            top[r.run_id] = max(top.get(r.run_id, 0.0), r.read_bandwidth_tbps)
    beat: dict[str, Record] = {}
    for r in records:
        if r.run_id in top and r.status == "ok" and r.achieved_tbps and r.achieved_tbps > top[r.run_id]:
            beat[r.run_id] = r if r.run_id not in beat or r.achieved_tbps > beat[r.run_id].achieved_tbps else beat[r.run_id]
    notes = [f"{run}: {r.backend} {params_label(r.shown_params())} B={r.batch} L={r.context_len} read {fmt(r.achieved_tbps)} TB/s, "
             f"above the measured read ceiling {fmt(top[run])}: % floor is against {fmt(r.achieved_tbps)}"
             for run, r in beat.items()]
    top.update({run: r.achieved_tbps for run, r in beat.items()})
    out = []
    for r in records:
        ceiling = top.get(r.run_id)
        if r.floor_bandwidth == "read" and r.read_bandwidth_tbps and ceiling and r.read_bandwidth_tbps < ceiling:
            floor_us = r.bytes_moved / (ceiling * 1e6)
            r = r.model_copy(update={"read_bandwidth_tbps": ceiling, "floor_us": floor_us, "pct_of_floor": (
                100 * floor_us / r.stats.median_us if r.stats else None)})
        out.append(r)
    return out, notes


def floor_notes(records: Sequence[Record]) -> list[str]:
    """Which bandwidth ``records``' % floor is against, and where a point reads above 100% of its
    floor, how many, how far and why: runs before the read ceiling put it at the device-to-device
    copy bandwidth (read + write), which a read-mostly kernel beats."""
    copy = any(r.floor_bandwidth == "copy" and r.floor_us for r in records)
    notes = ["% floor is against the measured device-to-device copy bandwidth (read + write); a "
             "read-mostly kernel can exceed it by a few percent" if copy else
             "% floor is against the measured streaming read bandwidth (a large read-only reduction)"]
    over = [r for r in records if r.status == "ok" and (r.pct_of_floor or 0) > 100]
    if over:
        bws = sorted({fmt(r.copy_bandwidth_tbps if r.floor_bandwidth == "copy" else r.read_bandwidth_tbps)
                      for r in over})
        kinds = " / ".join(sorted({r.floor_bandwidth or "?" for r in over}))
        notes.append(f"{len(over)} point{'s' * (len(over) != 1)} read above 100% of the floor (up to "
                     f"{max(r.pct_of_floor for r in over):.1f}%): {'its' if len(over) == 1 else 'their'} run"
                     f" put the floor at the {kinds} bandwidth ({', '.join(bws)} TB/s)"
                     + (", which a kernel that mostly reads can beat (the copy also writes); runs that "
                        "measure the streaming read ceiling never show more than 100%" if "copy" in kinds else ""))
    return notes


def sweep_summary(records: Sequence[Record], splits: Sequence[int] | None = None) -> Table:
    """Per (backend, batch, context): best configuration and its µs / TB/s / % of floor (against
    the run's highest read ceiling, :func:`against_run_ceiling`), beside the µs at each split count
    that ran (:func:`split_count`; or at ``splits``, those of them run), and how many points were
    not ok or noisy.  At a narrow terminal the TB/s, then the split columns (from the right), then
    ``noisy`` are left out (:class:`ColumnStyle` ``drop``)."""
    measured = records[0] if records else None  # the floor note gives the ceiling measured
    records, raised = against_run_ceiling(records)
    swept = sorted({split_count(r) for r in records} - {None})
    swept = [s for s in swept if splits is None or s in splits]
    at = {f"µs @{s} splits": ColumnStyle(header=f"µs @{s}", drop=2) for s in swept}
    styles = {"best params": PARAMS, "TB/s": ColumnStyle(drop=3), **at, "noisy": ColumnStyle(drop=1)}
    qo = any(r.qo_len != 1 for r in records)  # several query tokens: a qo_len column
    axes = varying_axes(records)
    cols = ["backend", "batch", *axes, "context", *(["qo_len"] if qo else []), "best params", "µs", "TB/s",
            "% floor", *at, "not ok", "noisy"]
    table = Table("Sweep: best configuration per backend, batch and context", cols, styles=styles)
    groups: dict[tuple, list[Record]] = {}
    for r in records:
        groups.setdefault((r.backend, *compare_key(r)), []).append(r)
    for key, recs in sorted(groups.items(), key=lambda kv: sortable(kv[0])):
        best = best_ok(recs)
        row: list[Any] = [key[0], key[1], *axis_values(recs[0], axes), recs[0].context_len,
                          *([recs[0].qo_label] if qo else [])]
        row += [params_label(best.shown_params()), best.stats.median_us, best.achieved_tbps, best.pct_of_floor] \
            if best else ["(none ok)", None, None, None]
        for s in swept:
            hit = best_ok(r for r in recs if split_count(r) == s)
            row.append(hit.stats.median_us if hit else None)
        bad = [r for r in recs if r.status != "ok"]
        row.append(", ".join(sorted({f"{r.status}" for r in bad})) + f" ({len(bad)})" if bad else "")
        noisy = [r for r in recs if r.stats is not None and r.stats.noisy]
        row.append(f"{len(noisy)}{' incl. best' if best in noisy else ''}" if noisy else "")
        table.rows.append(row)
    noisy = sum(1 for r in records if r.stats is not None and r.stats.noisy)
    if noisy:
        table.notes.append(f"{noisy} of {len(records)} points are noisy: the 95% CI of their median stayed wider "
                           "than the target within the budget; their times are less certain (raise --budget-s, "
                           "or quiet the machine)")
    table.notes += raised + ran_note(records)
    if any(r.params.get("split_policy") for r in records):
        table.notes.append("split_policy points: best params and µs @N give the num_kv_splits the policy chose "
                           "(effective_params), not the one asked for")
    if any(r.timing_mode == "wall" for r in records):
        table.notes.append(CPU_RUN_NOTE)
    if measured:
        r0 = measured
        bw = r0.read_bandwidth_tbps if r0.floor_bandwidth == "read" else r0.copy_bandwidth_tbps
        fixed = [f"heads={r0.num_heads}" * ("heads" not in axes), f"page={r0.shape.get('page_size')}" * ("page" not in axes),
                 str(r0.shape.get("kv_dtype")) * ("kv dtype" not in axes)]
        fixed_text = " ".join(filter(None, fixed))
        table.notes.append(f"{fixed_text}{'; ' if fixed_text else ''}time: median µs per call ({r0.timing_mode or 'n/a'}); µs @N: at N splits; floor = "
                           f"bytes / measured {r0.floor_bandwidth} bandwidth {fmt(bw)} TB/s")
    table.notes += floor_notes(records)[1:]  # and where a point reads above that floor, why
    return table


def ran_values(record: Record) -> dict[str, str]:
    """The parameters ``record`` asked for as they ran, for telling variants apart: the value in
    ``effective_params`` where it holds the name; a name asked for that a non-empty
    ``effective_params`` does not hold did not run (gluon-splitkv's ``multi_token`` at one
    token before it recorded 0 there) and is left out; ``num_kv_splits`` is left out."""
    eff = record.effective_params
    return {n: str(eff.get(n, v)) for n, v in record.params.items()
            if n != "num_kv_splits" and (n in eff or not eff)}


def varied_params(records: Iterable[Record]) -> list[str]:
    """Names of the parameters whose :func:`ran_values` differ among the ok ``records`` (one
    backend's at one shape: ``multi_token``, ``rows_as_m``, ... of a variant sweep; not a
    default that differs between batch sizes, nor ``16 (asked auto)`` against ``16``), sorted."""
    ran = [ran_values(r) for r in records if r.status == "ok"]
    names = {n for p in ran for n in p}
    return sorted(n for n in names if len({p.get(n, "") for p in ran}) > 1)  # "": left out


def variant_names(cells: dict[tuple, dict[str, list[Record]]],
                  families: dict[str, str]) -> dict[str, list[str]]:
    """Per split-KV backend of ``cells`` (``{shape key: {backend: records}}``), the names
    :func:`varied_params` finds in any of its cells; backends with none are left out."""
    names: dict[str, set[str]] = {}
    for by_backend in cells.values():
        for b, recs in by_backend.items():
            if families.get(b) == "split-kv":
                names.setdefault(b, set()).update(varied_params(recs))
    return {b: sorted(n) for b, n in names.items() if n}


def _variant_cell(record: Record | None, names: dict[str, list[str]]) -> list[Any]:
    """The ``split-KV params`` cell of ``record``: its shown values of its backend's ``names``
    that ran (``defaults`` where none did; None for a backend without any, or no record); no
    cell when no backend has names."""
    if not names:
        return []
    mine = names.get(record.backend, []) if record else []
    if not mine:
        return [None]
    shown, ran = record.shown_params(), ran_values(record)
    return [" ".join(f"{n}={shown[n]}" for n in mine if n in ran) or "defaults"]


#: At a narrow terminal the compare table leaves out the persistent params, setup µs, the two %
#: floor columns, then the split-KV params (the speedup and both times stay).
COMPARE_STYLES = {"params": ColumnStyle(text=short_params, drop=5), "setup µs": ColumnStyle(drop=4),
                  "% floor": ColumnStyle(drop=3), "split-KV % floor": ColumnStyle(drop=3),
                  "split-KV params": ColumnStyle(text=short_params, drop=2)}


def compare_table(records: Sequence[Record], families: dict[str, str]) -> Table:
    """The 12-head question: each padded persistent backend against the best split count of each
    split-KV backend, per batch and context (and per heads, page size, ... where the records vary
    them: :data:`SHAPE_AXES`).

    ``families`` maps backend name -> family (``persistent`` / ``split-kv``).  ``speedup`` is
    split-KV µs / persistent µs: above 1 the padded persistent path is faster.  Where a
    split-KV backend's records at one shape vary other parameters (:func:`varied_params`: a
    variant sweep's ``multi_token``, ``rows_as_m``), a ``split-KV params`` column gives the best
    one's values.  Only ok records
    count; a configuration with no ok record shows as a dash.  A backend whose every record at a
    batch, context and qo_len is ``unsupported`` is left out there (its rows would be all dashes),
    with a note naming it and why.
    """
    records, raised = against_run_ceiling(records)
    qo = any(r.qo_len != 1 for r in records)  # several query tokens: a qo_len column
    axes = varying_axes(records)
    t = Table("Padded persistent vs best split-KV",
              ["batch", *axes, "context", *(["qo_len"] if qo else []), "persistent", "params", "µs", "% floor",
               "setup µs", "split-KV", "best splits", "split-KV µs", "split-KV % floor", "speedup"],
              styles=COMPARE_STYLES)
    cells: dict[tuple, dict[str, list[Record]]] = {}
    for r in records:
        cells.setdefault(compare_key(r), {}).setdefault(r.backend, []).append(r)
    dropped = _drop_unsupported(cells)
    variant = variant_names(cells, families)
    if variant:  # the best split-KV configuration's values of what varies within a cell
        t.columns.insert(t.columns.index("split-KV µs"), "split-KV params")
    persistent = sorted({b for b, f in families.items() if f == "persistent"})
    splitkv = sorted({b for b, f in families.items() if f == "split-kv"})
    for key, by_backend in sorted(cells.items(), key=lambda kv: sortable(kv[0])):
        r0 = next(iter(by_backend.values()))[0]
        batch, ctx = r0.batch, [*axis_values(r0, axes), r0.context_len]
        qo_cell = [r0.qo_label] if qo else []
        for p in [b for b in persistent if b in by_backend] or [None]:
            pb = best_ok(by_backend.get(p, [])) if p else None
            for s in [b for b in splitkv if b in by_backend] or [None]:
                sb = best_ok(by_backend.get(s, [])) if s else None
                speedup = sb.stats.median_us / pb.stats.median_us if pb and sb else None
                t.rows.append([
                    batch, *ctx, *qo_cell, p, params_label(pb.shown_params()) if pb else None,
                    pb.stats.median_us if pb else None, pb.pct_of_floor if pb else None,
                    sum(pb.setup_us.values()) if pb and pb.setup_us else None, s, sb.effective_params.get("num_kv_splits", sb.params.get("num_kv_splits")) if sb else None,
                    *_variant_cell(sb, variant), sb.stats.median_us if sb else None, sb.pct_of_floor if sb else None, speedup,
                ])
    t.notes.append("speedup = split-KV µs / persistent µs (> 1: padding to 16 heads and running the "
                   "persistent kernel wins); only configurations that passed the correctness check count")
    t.notes.append("setup µs: scheduling metadata / work list built once per decode step outside the "
                   "timed call (wall clock, as servers share it across layers)")
    t.notes += floor_notes(records) + [CPU_RUN_NOTE] * any(r.timing_mode == "wall" for r in records)
    t.notes += dropped + raised + ran_note(r for r in records if families.get(r.backend) == "persistent")
    return t


def compare_key(record: Record) -> tuple:
    """The point at which :func:`compare_table` pairs the two paths: ``(batch, shape axes...,
    context, qo_len, non-causal)`` (:data:`SHAPE_AXES`)."""
    return (record.batch, *axis_values(record, SHAPE_AXES), record.context_len, record.qo_len, not record.causal)


def _drop_unsupported(cells: dict[tuple, dict[str, list[Record]]]) -> list[str]:
    """Take out of ``cells`` (``{(batch, shape axes..., context, qo_len, non-causal): {backend: records}}``) each
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
