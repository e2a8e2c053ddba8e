"""Tables as data: the one table type every command prints (its renderers: :mod:`mlabench.tables.render`).

Builders (:mod:`mlabench.sweep.summary`, :mod:`mlabench.sweep.compare`, :mod:`mlabench.serving.table` and :mod:`mlabench.serving.greedy_check` for
serving) return a :class:`Table` whose rows hold raw values: numbers stay numbers until a renderer
formats them.  JSON and CSV carry the raw values of the columns meant for machines; the Rich table
and markdown show the text of the columns meant for people (:class:`ColumnStyle`).  Every ``--json``
prints the same structure: a list of ``{"title", "columns", "rows": [{column: value}], "notes"}``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

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
    when it is too narrow (0: never; higher first); ``keep``: never moved to the caption when it
    holds one value in every row (a table's headline numbers).
    """

    text: Callable[[Any], str] | None = None
    header: str | None = None
    justify: Literal["left", "right"] = "left"
    no_wrap: bool = False
    show: Literal["all", "human", "machine"] = "all"
    drop: int = 0
    keep: bool = False


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
