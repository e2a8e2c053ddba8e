"""The one set of renderers of a :class:`~mlabench.tables.table.Table`: Rich (a terminal, columns
left out at a narrow one by their :class:`~mlabench.tables.table.ColumnStyle`), markdown, JSON and CSV."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any

from mlabench.tables.table import Format, Table


def to_markdown(table: Table) -> str:
    """GitHub-flavoured markdown (title as a bold line, notes as a list below)."""
    headers, rows = table.texts()
    lines = [f"**{table.title}**", ""] if table.title else []
    lines += ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += [""] + [f"- {n}" for n in table.notes] if table.notes else []
    return "\n".join(lines) + "\n"


#: Cells of at most this many characters are labels, kept whole on the terminal however narrow the room.
SHORT_CELL = 10


def to_rich(table: Table, width: int | None = None) -> Any:
    """A ``rich.table.Table`` (notes as its caption); numbers, names and short labels never wrap.

    With ``width`` (the console's, e.g. 80 in a log) and a table wider than that, headers wrap to
    their longest word one at a time (the one that saves most first), then a column that
    holds one value in every row moves to the caption (``split-KV: triton-splitkv``), then
    columns whose style may be dropped (:attr:`ColumnStyle.drop`, highest first, rightmost first)
    are left out, until the table fits; the caption names them.  Print it at least
    :func:`min_width` wide, so that what still does not fit runs past the edge rather than
    splitting a number.
    """
    headers, texts = table.texts()
    shown = [table.columns[i] for i in table.shown(human=True)]
    constant = [c for n, c in enumerate(shown) if len(texts) > 1 and len({row[n] for row in texts}) == 1
                and c != table.group_by and not table.style(c).keep]
    left_out: list[str] = []
    moved: list[str] = []
    narrow: list[str] = []  # columns whose headers wrap to their longest word
    saving = {c: _header_saving(headers[n], texts, n) for n, c in enumerate(shown)} if width is not None else {}
    wraps = sorted((c for c in saving if saving[c] > 0), key=lambda c: -saving[c])
    while width is not None and min_width(_rich_table(table, left_out + moved, narrow)) > width:
        droppable = [c for c in shown if c not in left_out + moved and table.style(c).drop > 0]
        if len(narrow) < len(wraps):  # one header at a time, the one that saves most first
            narrow.append(wraps[len(narrow)])
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
        t.caption = _literal("\n".join(table.notes + extra), "table.caption")
    return t


def _header_saving(header: str, texts: list[list[str]], n: int) -> int:
    """Columns saved by wrapping column ``n``'s ``header`` to its longest word (its cells kept whole)."""
    from rich.cells import cell_len

    return cell_len(header) - max([cell_len(row[n]) for row in texts] + [cell_len(w) for w in header.split()])


def min_width(rich_table: Any) -> int:
    """The fewest columns ``rich_table`` needs without splitting a word (or a number)."""
    from rich.console import Console
    from rich.measure import Measurement

    console = Console(width=100_000, file=io.StringIO())
    return Measurement.get(console, console.options, rich_table).minimum


def _rich_table(table: Table, left_out: Sequence[str] = (), narrow: Sequence[str] = ()) -> Any:
    from rich import box
    from rich.cells import cell_len
    from rich.table import Table as RichTable
    from rich.text import Text

    headers, rows = table.texts()
    shown = table.shown(human=True)
    keep = [n for n, i in enumerate(shown) if table.columns[i] not in left_out]
    headers, rows = [headers[n] for n in keep], [[row[n] for n in keep] for row in rows]
    keep = [shown[n] for n in keep]
    # Titles, notes and cells are taken literally (a path with "[x]" in it is no Rich markup).
    t = RichTable(title=_literal(table.title, "table.title"),
                  caption=_literal("\n".join(table.notes), "table.caption"), caption_justify="left",
                  box=box.SIMPLE_HEAD)
    for n, (header, i) in enumerate(zip(headers, keep)):
        s, name = table.style(table.columns[i]), table.columns[i]
        numbers = table.numeric(name)
        # numbers, names and short labels ("p50 ITL"): never split, so that a row stays one line
        whole = numbers or s.no_wrap or all(" " not in row[n] or cell_len(row[n]) <= SHORT_CELL for row in rows)
        # Such a column is as wide as its widest cell or header (a ``narrow`` one: the header's longest
        # word, the header wraps), so that Rich, short of room, narrows only columns of several words.
        width = max([cell_len(row[n]) for row in rows]
                    + [cell_len(w) for w in (header.split() if name in narrow else [header])]) if whole else None
        # A column of several words still keeps its header's longest word whole: a name such as
        # aiter-gluon-0.1.20 was folded as "aiter-gluon-0.1.2" / "0".
        t.add_column(Text(header, no_wrap=False, overflow="fold"), justify="right" if numbers else s.justify,
                     no_wrap=whole, width=width, overflow="ellipsis" if whole else "fold",
                     min_width=max((cell_len(w) for w in header.split()), default=0))
    g = table.columns.index(table.group_by) if table.group_by else None
    for n, (raw, row) in enumerate(zip(table.rows, rows)):
        ends = g is not None and (n + 1 == len(rows) or table.rows[n + 1][g] != raw[g])
        if g is not None and g in keep and n and table.rows[n - 1][g] == raw[g]:
            row[keep.index(g)] = ""
        t.add_row(*(Text(cell) for cell in row), end_section=ends,
                  style=table.row_styles[n] if n < len(table.row_styles) else None)
    return t


def _literal(text: str, style: str) -> Any:
    """``text`` as a Rich ``Text`` in ``style`` (a table's title or caption style): printed as
    written, brackets and all, not read as markup; None when empty."""
    from rich.text import Text

    return Text(text, style=style) if text else None


def to_json(tables: Sequence[Table]) -> str:
    """``[{"title", "columns", "rows": [{column: raw value}], "notes"}]`` over the machine columns."""
    return json.dumps([{"title": t.title, "columns": [t.columns[i] for i in t.shown(human=False)],
                        "rows": t.as_dicts(), "notes": t.notes} for t in tables], indent=2, default=str)


def to_csv(table: Table) -> str:
    """The machine columns as CSV: a header row, raw values (None empty, lists and dicts as JSON)."""
    return _csv([table.columns[i] for i in table.shown(human=False)], table.as_dicts())


def tables_to_csv(tables: Sequence[Table]) -> str:
    """Several tables as one CSV stream with one header, so a CSV reader takes it whole: a first
    column ``table`` (each row's table title, or its 1-based position where untitled), then every
    machine column of any table in order of first appearance, empty where a table lacks it.  One
    table is :func:`to_csv`."""
    if len(tables) == 1:
        return to_csv(tables[0])
    columns = list(dict.fromkeys(t.columns[i] for t in tables for i in t.shown(human=False)))
    rows = [{"table": t.title or str(n), **row} for n, t in enumerate(tables, start=1) for row in t.as_dicts()]
    return _csv(["table", *columns], [{c: row.get(c) for c in ["table", *columns]} for row in rows])


def _csv(header: list[str], rows: list[dict[str, Any]]) -> str:
    """``header`` then ``rows`` (dicts in header order) as CSV text (None empty, lists and dicts as JSON)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        writer.writerow(["" if v is None else json.dumps(v) if isinstance(v, (list, dict)) else v
                         for v in row.values()])
    return buf.getvalue()


def render(tables: Sequence[Table], format: Format) -> str:
    """The text of ``tables`` in ``format`` (json, markdown: several tables one after the other;
    csv: one stream, :func:`tables_to_csv`).  The ``table`` format is Rich's: print :func:`to_rich`
    to a console instead."""
    if format == "json":
        return to_json(tables) + "\n"
    if format == "markdown":
        return "\n".join(to_markdown(t) for t in tables)
    if format == "csv":
        return tables_to_csv(tables)
    raise ValueError(f"render: no text form for format {format!r}")
