"""Tables as data, and their one set of renderers: Rich, markdown, JSON and CSV.

Builders (here for records; :mod:`mlabench.serving.table` and :mod:`mlabench.serving.check` for
serving) return a :class:`Table` whose rows hold raw values: numbers stay numbers until a renderer
formats them.  JSON and CSV carry the raw values of the columns meant for machines; the Rich table
and markdown show the text of the columns meant for people (:class:`ColumnStyle`).  Every ``--json``
prints the same structure: a list of ``{"title", "columns", "rows": [{column: value}], "notes"}``.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # records are only read here; importing results would load torch for the CLI
    from mlabench.records.record import Record

#: The output formats of every command (``--format``).
FORMATS = ("table", "json", "markdown", "csv")
Format = Literal["table", "json", "markdown", "csv"]


def fmt(value: Any) -> str:
    """Human formatting: floats to 3-4 significant digits, None to an em dash, booleans yes/no."""
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


@dataclass(frozen=True)
class ColumnStyle:
    """How one column renders.

    ``text`` turns a raw value into what people read (default: :func:`column_texts`, one number
    format for the whole column); ``header`` is the heading people read (default: the column's
    name, which JSON and CSV use); ``show`` is ``all``, ``human`` (Rich and markdown only) or
    ``machine`` (JSON and CSV only); ``drop`` orders the columns the terminal table may leave out
    when it is too narrow (0: never; higher first).
    """

    text: Callable[[Any], str] | None = None
    header: str | None = None
    justify: Literal["left", "right"] = "left"
    no_wrap: bool = False
    show: Literal["all", "human", "machine"] = "all"
    drop: int = 0


PLAIN = ColumnStyle()


@dataclass
class Table:
    """A titled table: ``columns`` names, ``rows`` of raw values (None prints as an em dash).

    ``styles`` maps a column name to its :class:`ColumnStyle` (default :data:`PLAIN`);
    ``row_styles`` holds an optional Rich style per row (e.g. ``"red"`` for a failed one);
    ``group_by`` names a column that the Rich table shows once per run of equal values, with a
    line after each run.  An empty title is not printed.
    """

    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    styles: dict[str, ColumnStyle] = field(default_factory=dict)
    row_styles: list[str | None] = field(default_factory=list)
    group_by: str | None = None

    def add_row(self, values: list[Any], style: str | None = None) -> None:
        """Append a row (as many values as columns) with an optional Rich style."""
        self.row_styles += [None] * (len(self.rows) - len(self.row_styles)) + [style]
        self.rows.append(values)

    def style(self, column: str) -> ColumnStyle:
        return self.styles.get(column, PLAIN)

    def shown(self, human: bool) -> list[int]:
        """Indices of the columns people (``human``) or machines see."""
        hidden = "machine" if human else "human"
        return [i for i, c in enumerate(self.columns) if self.style(c).show != hidden]

    def as_dicts(self) -> list[dict[str, Any]]:
        """The rows as ``{column: raw value}`` over the machine columns."""
        keep = self.shown(human=False)
        return [{self.columns[i]: row[i] for i in keep} for row in self.rows]

    def texts(self) -> tuple[list[str], list[list[str]]]:
        """Headers and row texts of the human columns."""
        keep = self.shown(human=True)
        styles = [self.style(self.columns[i]) for i in keep]
        headers = [s.header or self.columns[i] for s, i in zip(styles, keep)]
        columns = [[s.text(row[i]) for row in self.rows] if s.text else column_texts([row[i] for row in self.rows])
                   for s, i in zip(styles, keep)]
        return headers, [list(cells) for cells in zip(*columns)] if columns else [[] for _ in self.rows]

    def numeric(self, column: str) -> bool:
        """True when every value of ``column`` is a number or None (and one is a number)."""
        i = self.columns.index(column)
        values = [row[i] for row in self.rows if row[i] is not None]
        return bool(values) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def column_texts(values: Sequence[Any]) -> list[str]:
    """The texts of one column's values with one number format for all its floats: fixed point
    with enough decimals for 3 significant digits of the smallest magnitude (at most 3), or
    scientific (``7.42e-04``) for all of them when the smallest is below 0.001 or the largest
    1e6 or more.  Everything else as :func:`fmt`."""
    floats = [abs(v) for v in values if isinstance(v, float) and math.isfinite(v) and v != 0]
    if not floats:
        return [fmt(v) for v in values]
    low, high = min(floats), max(floats)
    decimals = min(3, max(0, 2 - math.floor(math.log10(low))))
    spec = ".2e" if low < 1e-3 or high >= 1e6 else f".{decimals}f"
    return [format(v, spec) if isinstance(v, float) and math.isfinite(v) else fmt(v) for v in values]


def to_markdown(table: Table) -> str:
    """GitHub-flavoured markdown (title as a bold line, notes as a list below)."""
    headers, rows = table.texts()
    lines = [f"**{table.title}**", ""] if table.title else []
    lines += ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += [""] + [f"- {n}" for n in table.notes] if table.notes else []
    return "\n".join(lines) + "\n"


def to_rich(table: Table, width: int | None = None) -> Any:
    """A ``rich.table.Table`` (notes as its caption); number columns never wrap.

    With ``width`` (the console's, e.g. 80 in a log) and a table wider than that, a column that
    holds one value in every row moves to the caption (``split-KV: triton-splitkv``), then
    columns whose style may be dropped (:attr:`ColumnStyle.drop`, highest first, rightmost first)
    are left out, until the table fits; the caption names them.  Print it at least
    :func:`min_width` wide, so that what still does not fit runs past the edge rather than
    splitting a number.
    """
    headers, texts = table.texts()
    shown = [table.columns[i] for i in table.shown(human=True)]
    constant = [c for n, c in enumerate(shown) if len(texts) > 1 and len({row[n] for row in texts}) == 1
                and c != table.group_by]
    left_out: list[str] = []
    moved: list[str] = []
    narrow = False  # headers wrapped to their longest word
    while width is not None and min_width(_rich_table(table, left_out + moved, narrow)) > width:
        droppable = [c for c in shown if c not in left_out + moved and table.style(c).drop > 0]
        if not narrow:
            narrow = True
        elif constant:
            moved.append(constant.pop(0))
        elif droppable:
            left_out.append(max(reversed(droppable), key=lambda c: table.style(c).drop))
        else:
            break
    t = _rich_table(table, left_out + moved, narrow)
    extra = [f"{headers[shown.index(c)]}: {texts[0][shown.index(c)] or 'none'} (every row)" for c in moved]
    if left_out:
        extra.append(f"left out at {width} columns: {', '.join(headers[shown.index(c)] for c in left_out)} "
                     "(a wider terminal, or --format markdown / json / csv, shows them)")
    if extra:
        t.caption = "\n".join(([t.caption] if t.caption else []) + extra)
    return t


def min_width(rich_table: Any) -> int:
    """The fewest columns ``rich_table`` needs without splitting a word (or a number)."""
    from rich.console import Console
    from rich.measure import Measurement

    console = Console(width=100_000, file=io.StringIO())
    return Measurement.get(console, console.options, rich_table).minimum


def _rich_table(table: Table, left_out: Sequence[str] = (), narrow: bool = False) -> Any:
    from rich import box
    from rich.cells import cell_len
    from rich.table import Table as RichTable
    from rich.text import Text

    headers, rows = table.texts()
    shown = table.shown(human=True)
    keep = [n for n, i in enumerate(shown) if table.columns[i] not in left_out]
    headers, rows = [headers[n] for n in keep], [[row[n] for n in keep] for row in rows]
    keep = [shown[n] for n in keep]
    t = RichTable(title=table.title or None, caption="\n".join(table.notes) or None, caption_justify="left",
                  box=box.SIMPLE_HEAD)
    for n, (header, i) in enumerate(zip(headers, keep)):
        s, name = table.style(table.columns[i]), table.columns[i]
        numbers = table.numeric(name)
        whole = numbers or s.no_wrap or all(" " not in row[n] for row in rows)  # numbers and names: never split
        # Such a column is as wide as its widest cell or header (``narrow``: the header's longest
        # word, the header wraps), so that Rich, short of room, narrows only columns of several words.
        width = max([cell_len(row[n]) for row in rows]
                    + [cell_len(w) for w in (header.split() if narrow else [header])]) if whole else None
        t.add_column(Text(header, no_wrap=False, overflow="fold"), justify="right" if numbers else s.justify,
                     no_wrap=whole, width=width, overflow="ellipsis" if whole else "fold")
    g = table.columns.index(table.group_by) if table.group_by else None
    for n, (raw, row) in enumerate(zip(table.rows, rows)):
        ends = g is not None and (n + 1 == len(rows) or table.rows[n + 1][g] != raw[g])
        if g is not None and g in keep and n and table.rows[n - 1][g] == raw[g]:
            row[keep.index(g)] = ""
        t.add_row(*row, style=table.row_styles[n] if n < len(table.row_styles) else None, end_section=ends)
    return t


def to_json(tables: Sequence[Table]) -> str:
    """``[{"title", "columns", "rows": [{column: raw value}], "notes"}]`` over the machine columns."""
    return json.dumps([{"title": t.title, "columns": [t.columns[i] for i in t.shown(human=False)],
                        "rows": t.as_dicts(), "notes": t.notes} for t in tables], indent=2, default=str)


def to_csv(table: Table) -> str:
    """The machine columns as CSV: a header row, raw values (None empty, lists and dicts as JSON)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([table.columns[i] for i in table.shown(human=False)])
    for row in table.as_dicts():
        writer.writerow(["" if v is None else json.dumps(v) if isinstance(v, (list, dict)) else v
                         for v in row.values()])
    return buf.getvalue()


def render(tables: Sequence[Table], format: Format) -> str:
    """The text of ``tables`` in ``format`` (json, markdown or csv; several tables one after the
    other).  The ``table`` format is Rich's: print :func:`to_rich` to a console instead."""
    if format == "json":
        return to_json(tables) + "\n"
    if format == "markdown":
        return "\n".join(to_markdown(t) for t in tables)
    if format == "csv":
        return "\n".join(to_csv(t) for t in tables)
    raise ValueError(f"render: no text form for format {format!r}")


# ---- sweep summary ----------------------------------------------------------------------------
def params_label(params: dict[str, Any]) -> str:
    """``k=v`` pairs sorted by name; empty-string values (an unset option such as
    ``split_policy``) are left out."""
    return " ".join(f"{k}={v}" for k, v in sorted(params.items()) if v != "") or "—"


#: Parameter names as the terminal table abbreviates them (JSON, CSV keep the full label).
SHORT_PARAMS = {"num_kv_splits": "splits", "head_padding": "pad", "programs_per_sm": "prog/SM"}


def short_params(label: str | None) -> str:
    """A :func:`params_label` with the names of :data:`SHORT_PARAMS` abbreviated."""
    if not label:
        return "—"
    return " ".join(SHORT_PARAMS.get(k, k) + sep + v for k, sep, v in (p.partition("=") for p in label.split()))


#: The params column of the record tables: people read it abbreviated.
PARAMS = ColumnStyle(text=short_params)


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


def check_table(records: Sequence[Record], unavailable: dict[str, str] | None = None) -> Table:
    """``backend | params | shape | rel RMSE | rel max err | max abs err | finite | verdict`` (errors
    of each point's worst input set; a failure says why and which needle went missing), with a note
    per backend of ``unavailable`` (``{name: why}``) saying why it is not available here."""
    t = Table("Correctness against the fp32 reference",
              ["backend", "params", "shape", "rel RMSE", "rel max err", "max abs err", "finite", "verdict"],
              styles=CHECK_STYLES)
    for r in records:
        v = r.verdict
        qo = "" if r.qo_len == 1 else f" T={r.qo_label}"
        shape = f"B={r.batch} H={r.num_heads} L={_ctx(r)}{qo} p{r.shape.get('page_size')}"
        if v:
            shape += f" → [{','.join(map(str, v.output_shape))}]"
        verdict = {"ok": "pass", "incorrect": "FAIL"}.get(r.status, r.status)
        if r.status != "ok" and r.message:
            verdict += f": {r.message}"
        t.rows.append([r.backend, params_label(r.params), shape, v.rel_rmse if v else None,
                       v.rel_max_err if v else None, v.max_abs_err if v else None,
                       v.all_finite if v else None, verdict])
    v0 = next((r.verdict for r in records if r.verdict and r.verdict.rel_rmse_limit), None)
    if v0:
        sets = ", ".join(v0.by_input_set) or v0.input_set or "random"
        t.notes.append(f"rel RMSE = RMSE / RMS of the reference (limit {v0.rel_rmse_limit:.3g}), rel max err = "
                       f"max |error| / RMS of the reference (limit {v0.rel_max_err_limit:.3g}), on the worst of "
                       f"the input sets {sets}; unread cache slots and outputs poisoned with NaN")
    t.notes += [f"not available here: {n} ({why})" for n, why in (unavailable or {}).items()]
    return t


#: At a narrow terminal the check table leaves out the max abs error, then finite (the verdict
#: says what failed); the relative errors, which the verdict is on, stay, to 3 significant digits
#: (their limits are 2^-n: 0.00781, 0.0625).
_SIG3 = ColumnStyle(text=lambda v: fmt(v) if v is None else f"{v:.3g}")
CHECK_STYLES = {"params": PARAMS, "rel RMSE": _SIG3, "rel max err": _SIG3, "max abs err": ColumnStyle(drop=2),
                "finite": ColumnStyle(drop=1)}


def _ctx(r: Record) -> str:
    lens = r.shape.get("context_lens", [r.context_len])
    return str(lens[0]) if len(set(lens)) == 1 else ",".join(map(str, lens))


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
