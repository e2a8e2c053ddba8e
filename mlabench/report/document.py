"""A report as a list of blocks, and its two renderers: GitHub markdown and one self-contained HTML
file.

Blocks hold data (tables keep raw numbers until :func:`mlabench.tables.table.fmt` formats them), so the
markdown a reviewer pastes and the HTML page show the same numbers.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from mlabench.report.figures import style
from mlabench.tables.render import to_markdown
from mlabench.tables.table import Table, fmt


@dataclass
class Heading:
    """A section heading (level 1 is the title)."""

    text: str
    level: int = 2


@dataclass
class Para:
    """A paragraph of plain text (no markup: it is escaped in HTML)."""

    text: str


@dataclass
class Code:
    """A command or other literal text, shown as a code block."""

    text: str


@dataclass
class Bullets:
    """A list of plain-text items."""

    items: list[str]


@dataclass
class Missing:
    """A piece of the report the runs cannot give, and why (never an empty table or image)."""

    text: str


@dataclass
class TableBlock:
    """A :class:`mlabench.tables.table.Table`; its numbers are rounded by column when rendered."""

    table: Table


@dataclass
class FigureBlock:
    """A figure: its file stem (``figures/<stem>.png`` in markdown), caption and drawing callable."""

    stem: str
    caption: str
    draw: Callable[[], Any] = field(repr=False)


def _pct(value: float) -> str:
    return f"{value:.1f}" if abs(value) < 10 else f"{value:.0f}"


# Column name -> how people read its numbers (µs to 3 significant digits, speedups to 2 decimals).
_READABLE: tuple[tuple[str, Callable[[float], str]], ...] = (
    ("speedup", lambda v: f"{v:.2f}"), ("% floor", _pct), ("µs", style.sig3), ("TB/s", style.sig3),
    ("cosine", lambda v: f"{v:.6f}"), (" %", style.sig3),
)


def readable(table: Table) -> Table:
    """A copy of ``table`` whose numbers are rounded by what their column holds (by its name)."""
    rules = []
    for col in table.columns:
        rules.append(next((f for key, f in _READABLE if key in col), None))
    rows = [[rule(v) if rule and isinstance(v, (int, float)) and not isinstance(v, bool) else v
             for rule, v in zip(rules, row)] for row in table.rows]
    return Table(table.title, list(table.columns), rows, list(table.notes))


Block = Union[Heading, Para, Code, Bullets, Missing, TableBlock, FigureBlock]


def to_markdown_document(blocks: Sequence[Block], figure_dir: str = "figures") -> str:
    """GitHub markdown; figures as relative links ``<figure_dir>/<stem>.png``."""
    parts = []
    for b in blocks:
        if isinstance(b, Heading):
            parts.append(f"{'#' * b.level} {b.text}")
        elif isinstance(b, Para):
            parts.append(b.text)
        elif isinstance(b, Code):
            parts.append(f"```\n{b.text}\n```")
        elif isinstance(b, Bullets):
            parts.append("\n".join(f"- {item}" for item in b.items))
        elif isinstance(b, Missing):
            parts.append(f"> **Missing:** {b.text}")
        elif isinstance(b, TableBlock):
            parts.append(to_markdown(readable(b.table)).rstrip("\n"))
        elif isinstance(b, FigureBlock):
            parts.append(f"![{b.stem}]({figure_dir}/{b.stem}.png)\n\n*{b.caption}*")
    return "\n\n".join(parts) + "\n"


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1240px;
       padding: 0 1em; color: #1b1b1b; line-height: 1.45; }
h1 { font-size: 1.7em; border-bottom: 2px solid #ddd; padding-bottom: .2em; }
h2 { font-size: 1.3em; margin-top: 2em; border-bottom: 1px solid #eee; }
table { border-collapse: collapse; margin: .6em 0; font-size: .85em; }
caption { text-align: left; font-weight: 600; padding: .3em 0; }
th, td { border: 1px solid #d0d0d0; padding: .25em .55em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } tr:nth-child(even) td { background: #fafafa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f6f8fa; padding: .7em; overflow-x: auto; font-size: .85em; }
.missing { border-left: 4px solid #d9822b; background: #fff6ec; padding: .5em .8em; }
figure { margin: 1.2em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: .9em; color: #444; }
ul.notes { font-size: .85em; color: #444; }
.wide { overflow-x: auto; max-width: 100%; }
code { background: #f3f3f3; padding: 0 .2em; font-size: .9em; }
"""


def _inline(text: str) -> str:
    """``text`` escaped for HTML, its markdown code spans (`` `x` ``) as ``<code>x</code>``."""
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: no spans
        return html.escape(text)
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p) for i, p in enumerate(parts))


def _numeric(value: Any) -> bool:
    text = value if isinstance(value, str) else fmt(value)
    return not isinstance(value, bool) and text.replace(".", "", 1).replace("-", "", 1).replace("e", "", 1).isdigit()


def _html_table(t: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in t.columns)
    rows = []
    for row in t.rows:
        cells = "".join(f"<td class=\"num\">{html.escape(fmt(v))}</td>" if _numeric(v)
                        else f"<td>{html.escape(fmt(v))}</td>" for v in row)
        rows.append(f"<tr>{cells}</tr>")
    notes = "".join(f"<li>{_inline(n)}</li>" for n in t.notes)
    return (f"<div class=\"wide\"><table><caption>{html.escape(t.title)}</caption><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>" + (f"<ul class=\"notes\">{notes}</ul>" if notes else ""))


def to_html_document(blocks: Sequence[Block], title: str, figure_png: dict[str, bytes]) -> str:
    """One self-contained HTML page; each figure inline as a base64 PNG from ``figure_png[stem]``."""
    body = []
    for b in blocks:
        if isinstance(b, Heading):
            body.append(f"<h{b.level}>{html.escape(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            body.append(f"<p>{_inline(b.text)}</p>")
        elif isinstance(b, Code):
            body.append(f"<pre><code>{html.escape(b.text)}</code></pre>")
        elif isinstance(b, Bullets):
            body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Missing):
            body.append(f"<p class=\"missing\"><strong>Missing:</strong> {_inline(b.text)}</p>")
        elif isinstance(b, TableBlock):
            body.append(_html_table(readable(b.table)))
        elif isinstance(b, FigureBlock):
            data = base64.b64encode(figure_png[b.stem]).decode("ascii")
            body.append(f"<figure><img src=\"data:image/png;base64,{data}\" alt=\"{html.escape(b.caption.replace('`', ''))}\">"
                        f"<figcaption>{_inline(b.caption)}</figcaption></figure>")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")
