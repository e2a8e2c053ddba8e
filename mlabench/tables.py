"""Tables as data: pure functions from records to (columns, rows), and their renderers.

Numbers stay numbers until a renderer formats them, so the same table becomes a Rich table, a
markdown table or JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlabench.results import Record


@dataclass
class Table:
    """A titled table: ``columns`` names, ``rows`` of raw values (None prints as an em dash)."""

    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, r)) for r in self.rows]


def fmt(value: Any) -> str:
    """Human formatting: floats to 3-4 significant digits, None to an em dash."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:.1f}"
        if abs(value) >= 1e-3:
            return f"{value:.3g}" if abs(value) < 10 else f"{value:.2f}"
        return f"{value:.2e}"
    return str(value)


def to_markdown(table: Table) -> str:
    """GitHub-flavoured markdown (title as a bold line, notes below)."""
    lines = [f"**{table.title}**", "", "| " + " | ".join(table.columns) + " |",
             "|" + "|".join("---" for _ in table.columns) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in table.rows]
    lines += [""] + [f"- {n}" for n in table.notes] if table.notes else []
    return "\n".join(lines) + "\n"


def to_rich(table: Table) -> Any:
    """A ``rich.table.Table``."""
    from rich.table import Table as RichTable

    t = RichTable(title=table.title, caption="\n".join(table.notes) or None, caption_justify="left")
    for c in table.columns:
        t.add_column(c, overflow="fold")
    for row in table.rows:
        t.add_row(*(fmt(v) for v in row))
    return t


def to_json(tables: Sequence[Table]) -> str:
    return json.dumps([{"title": t.title, "columns": t.columns, "rows": t.as_dicts(), "notes": t.notes}
                       for t in tables], indent=2, default=str)


# ---- sweep summary ----------------------------------------------------------------------------
def params_label(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(params.items())) or "—"


def best_ok(records: Iterable[Record]) -> Record | None:
    """Fastest record whose status is ok (a fast wrong answer never wins)."""
    ok = [r for r in records if r.status == "ok" and r.stats is not None]
    return min(ok, key=lambda r: r.stats.median_us) if ok else None


def sweep_summary(records: Sequence[Record], fixed_splits: Sequence[int] = (1, 16, 64, 128)) -> Table:
    """Per (backend, batch, context): best configuration and its µs / TB/s / % of floor, beside a few
    fixed split counts (µs), and how many points were not ok."""
    present = sorted({r.params.get("num_kv_splits") for r in records} - {None})
    fixed = [s for s in fixed_splits if s in present]
    cols = ["backend", "batch", "context", "best params", "µs", "TB/s", "% floor"]
    cols += [f"µs @{s} splits" for s in fixed] + ["not ok", "noisy"]
    table = Table("Sweep: best configuration per backend, batch and context", cols)
    groups: dict[tuple, list[Record]] = {}
    for r in records:
        groups.setdefault((r.backend, r.batch, r.num_heads, r.context_len), []).append(r)
    for (backend, batch, _h, ctx), recs in sorted(groups.items()):
        best = best_ok(recs)
        row: list[Any] = [backend, batch, ctx]
        row += [params_label(best.params), best.stats.median_us, best.achieved_tbps, best.pct_of_floor] \
            if best else ["(none ok)", None, None, None]
        for s in fixed:
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
        table.notes.append(f"heads={r0.num_heads} page={r0.shape.get('page_size')} {r0.shape.get('kv_dtype')}; "
                           f"time: median per call ({r0.timing_mode or 'n/a'}); floor = bytes / measured copy "
                           f"bandwidth {fmt(r0.copy_bandwidth_tbps)} TB/s")
    return table


def check_table(records: Sequence[Record]) -> Table:
    """``backend | params | shape | max abs err | RMSE | cosine | finite | verdict``."""
    t = Table("Correctness against the fp32 reference",
              ["backend", "params", "shape", "max abs err", "RMSE", "cosine", "finite", "verdict"])
    for r in records:
        v = r.verdict
        shape = f"B={r.batch} H={r.num_heads} L={_ctx(r)} p{r.shape.get('page_size')}"
        if v:
            shape += f" → [{','.join(map(str, v.output_shape))}]"
        verdict = {"ok": "pass", "incorrect": "FAIL"}.get(r.status, r.status)
        if r.status not in ("ok", "incorrect") and r.message:
            verdict += f": {r.message}"
        t.rows.append([r.backend, params_label(r.params), shape, v.max_abs_err if v else None,
                       v.rmse if v else None, v.cosine if v else None, v.all_finite if v else None, verdict])
    if records and records[0].verdict:
        t.notes.append(f"atol={records[0].verdict.atol:g} rtol={records[0].verdict.rtol:g}; "
                       "outputs poisoned with NaN before every run")
    return t


def _ctx(r: Record) -> str:
    lens = r.shape.get("context_lens", [r.context_len])
    return str(lens[0]) if len(set(lens)) == 1 else ",".join(map(str, lens))


def compare_table(records: Sequence[Record], families: dict[str, str]) -> Table:
    """The 12-head question: each padded persistent backend against the best split count of each
    split-KV backend, per batch and context.

    ``families`` maps backend name -> family (``persistent`` / ``split-kv``).  ``speedup`` is
    split-KV µs / persistent µs: above 1 the padded persistent path is faster.  Only ok records
    count; a configuration with no ok record shows as a dash.
    """
    t = Table("Padded persistent vs best split-KV",
              ["batch", "context", "persistent", "params", "µs", "% floor", "setup µs", "split-KV",
               "best splits", "split-KV µs", "split-KV % floor", "speedup"])
    cells: dict[tuple[int, int], dict[str, list[Record]]] = {}
    for r in records:
        cells.setdefault((r.batch, r.context_len), {}).setdefault(r.backend, []).append(r)
    persistent = sorted({b for b, f in families.items() if f == "persistent"})
    splitkv = sorted({b for b, f in families.items() if f == "split-kv"})
    for (batch, ctx), by_backend in sorted(cells.items()):
        for p in [b for b in persistent if b in by_backend] or [None]:
            pb = best_ok(by_backend.get(p, [])) if p else None
            for s in [b for b in splitkv if b in by_backend] or [None]:
                sb = best_ok(by_backend.get(s, [])) if s else None
                speedup = sb.stats.median_us / pb.stats.median_us if pb and sb else None
                t.rows.append([
                    batch, ctx, p, params_label(pb.params) if pb else None,
                    pb.stats.median_us if pb else None, pb.pct_of_floor if pb else None,
                    sum(pb.setup_us.values()) if pb and pb.setup_us else None, s, sb.effective_params.get("num_kv_splits", sb.params.get("num_kv_splits")) if sb else None,
                    sb.stats.median_us if sb else None, sb.pct_of_floor if sb else None, speedup,
                ])
    t.notes.append("speedup = split-KV µs / persistent µs (> 1: padding to 16 heads and running the "
                   "persistent kernel wins); only configurations that passed the correctness check count")
    t.notes.append("setup µs: scheduling metadata / work list built once per decode step outside the "
                   "timed call (wall clock, as servers share it across layers)")
    t.notes.append("% floor is against the measured device-to-device copy bandwidth (read + write); a "
                   "read-mostly kernel can exceed it by a few percent")
    return t
