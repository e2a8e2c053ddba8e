"""The sweep's summary table: per backend, batch and context, the best correct configuration beside
its time at each split count swept (``mlabench sweep`` prints it; ``compare`` and the report read it)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from mlabench.tables.table import PARAMS, ColumnStyle, Table, fmt, params_label

if TYPE_CHECKING:  # records are only read here; importing results would load torch for the CLI
    from mlabench.records.record import Record


def best_ok(records: Iterable[Record]) -> Record | None:
    """Fastest record whose status is ok (a fast wrong answer never wins)."""
    ok = [r for r in records if r.status == "ok" and r.stats is not None]
    return min(ok, key=lambda r: r.stats.median_us) if ok else None


def sweep_summary(records: Sequence[Record], splits: Sequence[int] | None = None) -> Table:
    """Per (backend, batch, context): best configuration and its µs / TB/s / % of floor, beside the
    µs at each split count swept (or at ``splits``, those of them swept), and how many points
    were not ok or noisy.  At a narrow terminal the TB/s, then the split columns (from the right),
    then ``noisy`` are left out (:class:`ColumnStyle` ``drop``)."""
    swept = sorted({r.params.get("num_kv_splits") for r in records} - {None})
    swept = [s for s in swept if splits is None or s in splits]
    at = {f"µs @{s} splits": ColumnStyle(header=f"µs @{s}", drop=2) for s in swept}
    styles = {"best params": PARAMS, "TB/s": ColumnStyle(drop=3), **at, "noisy": ColumnStyle(drop=1)}
    qo = any(r.qo_len != 1 for r in records)  # several query tokens: a qo_len column
    cols = ["backend", "batch", "context", *(["qo_len"] if qo else []), "best params", "µs", "TB/s", "% floor",
            *at, "not ok", "noisy"]
    table = Table("Sweep: best configuration per backend, batch and context", cols, styles=styles)
    groups: dict[tuple, list[Record]] = {}
    for r in records:
        groups.setdefault((r.backend, r.batch, r.num_heads, r.context_len, r.qo_len, not r.causal), []).append(r)
    for (backend, batch, _h, ctx, *_qo), recs in sorted(groups.items()):
        best = best_ok(recs)
        row: list[Any] = [backend, batch, ctx, *([recs[0].qo_label] if qo else [])]
        row += [params_label(best.params), best.stats.median_us, best.achieved_tbps, best.pct_of_floor] \
            if best else ["(none ok)", None, None, None]
        for s in swept:
            hit = best_ok(r for r in recs if r.params.get("num_kv_splits") == s)
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
    if records:
        r0 = records[0]
        bw = r0.read_bandwidth_tbps if r0.floor_bandwidth == "read" else r0.copy_bandwidth_tbps
        table.notes.append(f"heads={r0.num_heads} page={r0.shape.get('page_size')} {r0.shape.get('kv_dtype')}; "
                           f"time: median µs per call ({r0.timing_mode or 'n/a'}); µs @N: at N splits; floor = "
                           f"bytes / measured {r0.floor_bandwidth} bandwidth {fmt(bw)} TB/s")
    return table
