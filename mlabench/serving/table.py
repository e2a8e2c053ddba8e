"""The TPOT table: per concurrency (and input length, when a run has several) and variant, TPOT and
speedup against the baseline.

Repeats of one (variant, input length, concurrency) are combined by the mean of their per-run statistics (each
run has the same request count). Failures are never averaged away: completed/failed are summed
over repeats, a cell takes its worst repeat's status, and any cell that is not ``ok`` makes the
table not ok (the CLI then exits non-zero).

Speedup = baseline TPOT / variant TPOT (same statistic, same input length and concurrency): above 1
is faster.  A run of one input length has a row per concurrency as before (no input length
column), whether or not its results record their input length.

:class:`ServeTable` is the data; :func:`tpot_table` and :func:`tpot_markdown_table` lay it out as
:class:`mlabench.tables.table.Table` for the one set of renderers (:func:`view` picks the layout).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from statistics import fmean
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mlabench.files import write_text
from mlabench.run_files import TABLE_FILE, TABLE_JSON_FILE
from mlabench.serving.config import ServeConfig
from mlabench.serving.results import SEVERITY, BenchResult, Status
from mlabench.tables.render import render, to_json
from mlabench.tables.table import ColumnStyle, Table

Stat = Literal["mean", "median", "p99"]


class Cell(BaseModel):
    """One variant at one concurrency, combined over repeats."""

    model_config = ConfigDict(extra="forbid")
    variant: str = Field(..., description="Variant name.")
    status: Status = Field(..., description="Worst status over the repeats.")
    repeats: int = Field(..., description="Runs that were recorded (any status).")
    completed: int = Field(0, description="Completed requests, summed over repeats.")
    failed: int = Field(0, description="Failed requests, summed over repeats.")
    tpot_mean_ms: float | None = Field(None, description="Mean TPOT, ms (mean over repeats).")
    tpot_median_ms: float | None = Field(None, description="Median TPOT, ms.")
    tpot_p99_ms: float | None = Field(None, description="p99 TPOT, ms.")
    ttft_mean_ms: float | None = Field(None, description="Mean TTFT, ms.")
    itl_mean_ms: float | None = Field(None, description="Mean ITL, ms.")
    itl_median_ms: float | None = Field(None, description="Median ITL, ms: the typical decode step.")
    output_throughput_tok_s: float | None = Field(None, description="Output tokens/s.")
    speedup: float | None = Field(None, description="Baseline TPOT / this TPOT (chosen stat).")
    errors: list[str] = Field(default_factory=list, description="Errors of the repeats.")
    planned: bool = Field(True, description="False: the variant's config leaves this input length "
                                            "out (its own [variants.bench] list), so nothing was run.")


class Row(BaseModel):
    """One concurrency (of one input length, when the run has several)."""

    model_config = ConfigDict(extra="forbid")
    input_len: int | None = Field(None, description="--random-input-len, tokens; None: one length in the run.")
    concurrency: int = Field(..., description="--max-concurrency.")
    cells: list[Cell] = Field(..., description="One cell per variant, in config order.")


class ServeTable(BaseModel):
    """The whole table plus what it was computed with."""

    model_config = ConfigDict(extra="forbid")
    baseline: str = Field(..., description="Variant speedups are taken against.")
    stat: Stat = Field(..., description="TPOT statistic used for speedup.")
    variants: list[str] = Field(..., description="Variant names, column order.")
    rows: list[Row] = Field(..., description="One row per (input length, concurrency), or per concurrency.")
    input_len: int | None = Field(None, description="A run of one input length: the length its results "
                                                    "record (tokens), None when they record none.")

    @property
    def ok(self) -> bool:
        """True when every planned cell is ``ok`` (no failed request, no missing result)."""
        return all(c.status == "ok" for r in self.rows for c in r.cells if c.planned)

    @property
    def by_input_len(self) -> bool:
        """True when rows are keyed by input length too (the run has several)."""
        return any(r.input_len is not None for r in self.rows)


def row_label(row: Row) -> str:
    """``c=16``, or ``in=4096 c=16`` for a row of one of several input lengths."""
    return ("" if row.input_len is None else f"in={row.input_len} ") + f"c={row.concurrency}"


def _avg(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return fmean(got) if got else None


def combine(variant: str, runs: list[BenchResult]) -> Cell:
    """Combine the repeats of one (variant, input length, concurrency); no runs gives a ``missing`` cell."""
    if not runs:
        return Cell(variant=variant, status="missing", repeats=0, errors=["no run recorded"])
    status = max((r.status for r in runs), key=SEVERITY.__getitem__)
    return Cell(
        variant=variant, status=status, repeats=len(runs),
        completed=sum(r.completed for r in runs), failed=sum(r.failed for r in runs),
        tpot_mean_ms=_avg([r.tpot.mean_ms for r in runs]),
        tpot_median_ms=_avg([r.tpot.median_ms for r in runs]),
        tpot_p99_ms=_avg([r.tpot.p99_ms for r in runs]),
        ttft_mean_ms=_avg([r.ttft.mean_ms for r in runs]),
        itl_mean_ms=_avg([r.itl.mean_ms for r in runs]),
        itl_median_ms=_avg([r.itl.median_ms for r in runs]),
        output_throughput_tok_s=_avg([r.output_throughput_tok_s for r in runs]),
        errors=[f"r{r.repeat}: {r.error}" for r in runs if r.error],
    )


def tpot_of(cell: Cell, stat: Stat) -> float | None:
    """The TPOT statistic ``stat`` of a cell, ms."""
    return {"mean": cell.tpot_mean_ms, "median": cell.tpot_median_ms, "p99": cell.tpot_p99_ms}[stat]


def build_table(
    results: list[BenchResult], variants: list[str], concurrencies: list[int], baseline: str,
    stat: Stat = "mean", input_lens: list[int] | None = None,
    planned: dict[str, set[tuple[int | None, int]]] | None = None,
) -> ServeTable:
    """Build the table from every recorded result (any status); expected cells never vanish.

    With several ``input_lens`` (tokens) there is a row per (input length, concurrency), each
    holding the results of that ``input_len``; otherwise a row per concurrency holds every result
    of it (a run of one length, whose older records have no input length).  ``planned`` maps a
    variant to the (input length, concurrency) points its config runs, keyed as the rows are
    (input length None in a run of one length; default: every row): its cells elsewhere that
    recorded nothing are marked ``planned=False``, neither missing nor failed.
    """
    rows = []
    several = bool(input_lens and len(input_lens) > 1)
    keys = [(n, conc) for n in input_lens for conc in concurrencies] if several and input_lens \
        else [(None, conc) for conc in concurrencies]
    for n, conc in keys:
        cells = [combine(v, [r for r in results if r.variant == v and r.concurrency == conc
                             and (n is None or r.input_len == n)]) for v in variants]
        for c in cells:
            if (n, conc) not in (planned or {}).get(c.variant, {(n, conc)}) and not c.repeats:
                c.planned, c.errors = False, []
        base = next(c for c in cells if c.variant == baseline)
        base_t = tpot_of(base, stat)
        for c in cells:
            t = tpot_of(c, stat)
            if base_t and t and base_t > 0 and t > 0:  # a TPOT that measured nothing has no speedup
                c.speedup = base_t / t
        rows.append(Row(input_len=n, concurrency=conc, cells=cells))
    recorded = {r.input_len for r in results if r.input_len is not None}
    only = recorded.pop() if len(recorded) == 1 and not several else None
    return ServeTable(baseline=baseline, stat=stat, variants=variants, rows=rows, input_len=only)


def table_of(config: ServeConfig, results: list[BenchResult], stat: Stat = "mean") -> ServeTable:
    """The table of a serve config's variants (in config order), input lengths and concurrencies
    from ``results``; a variant's cells at a point its config does not run (its own input lengths
    and concurrencies) are "not run"."""
    several = len(config.input_lens()) > 1
    planned = {v.name: {(n if several else None, conc) for n in config.bench_for(v).input_lens()
                        for conc in config.concurrencies_for(v)} for v in config.variants}
    return build_table(results, [v.name for v in config.variants], config.concurrencies, config.baseline, stat,
                       config.input_lens(), planned)


def _f(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


#: A cell's text where a variant never ran (its config leaves the point out) and where a result is missing.
NOT_RUN, MISSING = "not run", "missing"


def _gap_text(cell: Cell) -> str | None:
    """:data:`NOT_RUN` for a cell its variant's config leaves out, :data:`MISSING` for one that should
    hold a result and measured nothing (no run recorded, no result file), else None."""
    if not cell.planned:
        return NOT_RUN
    if cell.status == "missing" and cell.tpot_mean_ms is None:
        return MISSING
    return None


def cell_texts(cell: Cell, stat: Stat, is_baseline: bool) -> list[str]:
    """Printed columns of one cell: TPOT, speedup, mean TTFT, median ITL, out tok/s, completed/failed.

    The median ITL, as the terminal and per-metric tables show it (the typical decode step): the
    mean ITL is the mean TPOT again where every request decodes as many tokens, skewed by the steps
    that waited on other requests' prefills; it stays in JSON and CSV (``itl_mean_ms``)."""
    gap = _gap_text(cell)
    if gap is not None:
        return [gap, "—", "—", "—", "—", "—" if gap == NOT_RUN else f"{cell.completed}/{cell.failed}"]
    speed = "1.00x (base)" if is_baseline and cell.speedup else (
        "—" if cell.speedup is None else f"{cell.speedup:.2f}x")
    done = f"{cell.completed}/{cell.failed}"
    if cell.status != "ok":
        done += f" {cell.status.upper()}"
    return [_f(tpot_of(cell, stat)), speed, _f(cell.ttft_mean_ms), _f(cell.itl_median_ms),
            _f(cell.output_throughput_tok_s, 1), done]


CELL_HEADERS = ("TPOT {stat} ms", "speedup", "TTFT mean ms", "ITL median ms", "out tok/s",
                "completed/failed")


def headers(table: ServeTable) -> list[str]:
    """Column headers: ['input len',] 'concurrency', then the cell columns prefixed by each variant name."""
    out = ["input len"] * table.by_input_len + ["concurrency"]
    for v in table.variants:
        out += [f"{v} {h.format(stat=table.stat)}" for h in CELL_HEADERS]
    return out


def body(table: ServeTable) -> list[list[str]]:
    """Printed rows (strings), matching :func:`headers`."""
    return [[str(r.input_len)] * table.by_input_len + [str(r.concurrency)] + [t for c in r.cells
                                    for t in cell_texts(c, table.stat, c.variant == table.baseline)]
            for r in table.rows]


def failures(table: ServeTable) -> list[str]:
    """One line per cell that is not ok: (input length and) concurrency, variant, status and the
    repeats' errors (:func:`failure_lines`); and
    one when no ok cell holds the ``--stat`` TPOT (p99 needs ``--metric-percentiles`` with 99)."""
    lines = failure_lines(table)
    ok = [c for r in table.rows for c in r.cells if c.status == "ok"]
    if ok and all(tpot_of(c, table.stat) is None for c in ok):
        others = " or ".join(s for s in ("mean", "median", "p99") if s != table.stat)
        pct = {"p99": "99", "median": "50"}.get(table.stat)
        why = f" (vllm bench serve wrote none: its --metric-percentiles lacked {pct})" if pct else ""
        lines.append(f"no {table.stat} TPOT in the recorded results{why}; --stat {others} reads what was recorded")
    return lines


def failure_lines(table: ServeTable) -> list[str]:
    """``c=16 b: missing; no run recorded``: one line per cell that is not ok (:func:`row_label`)."""
    return [f"{row_label(r)} {c.variant}: {c.status}; {'; '.join(c.errors)}"
            for r in table.rows for c in r.cells if c.status != "ok" and c.planned]


def _tpot_text(cell: Cell, table: ServeTable) -> str:
    """``6.34 (1.29x)``: the ``--stat`` TPOT with the speedup over the baseline (the baseline's alone)."""
    speed = "" if cell.speedup is None or cell.variant == table.baseline else f" ({cell.speedup:.2f}x)"
    return _f(tpot_of(cell, table.stat)) + speed


#: The markdown layout, a table per metric: its title (``{stat}``, ``{baseline}`` filled in) and cell text.
METRICS: list[tuple[str, Callable[[Cell, ServeTable], str]]] = [
    ("{stat} TPOT, ms (speedup vs {baseline})", _tpot_text),
    ("mean TTFT, ms", lambda c, _: _f(c.ttft_mean_ms)),
    ("median ITL, ms (the typical decode step)", lambda c, _: _f(c.itl_median_ms)),
    ("output tokens/s", lambda c, _: _f(c.output_throughput_tok_s, 1)),
    ("requests completed/failed", lambda c, _: f"{c.completed}/{c.failed}"),
]


def _metric_cell(cell: Cell, text: str) -> str:
    """``text``, or ``not run`` / ``missing`` where nothing ran, with the status after it when not ok."""
    gap = _gap_text(cell)
    if gap is not None:
        return gap
    return text + ("" if cell.status == "ok" else f" {cell.status.upper()}")


def metric_tables(table: ServeTable) -> list[Table]:
    """The markdown layout (``--markdown``, ``table.md``), what a pull request shows: a table per
    metric of :data:`METRICS` (the ``--stat`` TPOT with speedups, mean TTFT, median ITL, output
    throughput, requests completed/failed), a row per (input length and) concurrency and a column
    per variant; failures listed under the first.  JSON and CSV (:func:`tpot_table`) hold every number."""
    keys = ["input len"] * table.by_input_len + ["concurrency"]
    out = []
    for n, (title, text) in enumerate(METRICS):
        rows = [[str(r.input_len)] * table.by_input_len + [str(r.concurrency)]
                + [_metric_cell(c, text(c, table)) for c in r.cells] for r in table.rows]
        out.append(Table(title.format(stat=table.stat, baseline=table.baseline), keys + table.variants, rows,
                         failures(table) if n == 0 else []))
    return out


def tpot_markdown_table(table: ServeTable) -> Table:
    """The wide layout (``mlabench report``; the ``table.md`` of runs before :func:`metric_tables`): one
    row per (input length and) concurrency, per variant every printed cell text (:func:`cell_texts`);
    failures listed under it."""
    return Table("", headers(table), body(table), failures(table))


_DATA = ColumnStyle(show="machine")


def tpot_table(table: ServeTable) -> Table:
    """One row per (input length,) concurrency and variant (the terminal layout: fits 80 columns).

    People see the ``--stat`` TPOT, speedup, mean TTFT, median ITL (the typical decode step; the
    mean ITL is the mean TPOT again), output throughput and completed/failed requests; JSON and CSV carry every :class:`Cell` field (mean, median and p99 TPOT, request
    counts, status, errors) under its own name, beside ``concurrency`` and ``input_len`` (where the
    run has several input lengths, or its results record their one).
    """
    stat_col = f"tpot_{table.stat}_ms"
    tpot = {f"tpot_{s}_ms": ColumnStyle(text=_f, header=f"TPOT {s} ms", justify="right",
                                        show="all" if f"tpot_{s}_ms" == stat_col else "machine")
            for s in ("mean", "median", "p99")}
    # a run of one length has no input len column for people, but its JSON and CSV rows carry it
    lens = {"input_len": ColumnStyle(header="input len", justify="right",
                                     show="all" if table.by_input_len else "machine")} \
        if table.by_input_len or table.input_len is not None else {}
    styles = {
        **lens, "concurrency": ColumnStyle(header="conc", justify="right"), "variant": ColumnStyle(), **tpot,
        "speedup": ColumnStyle(text=lambda v: "—" if v is None else f"{v:.2f}x", justify="right", no_wrap=True),
        "ttft_mean_ms": ColumnStyle(text=_f, header="TTFT mean ms", justify="right"),
        "itl_mean_ms": ColumnStyle(text=_f, header="ITL mean ms", justify="right", show="machine"),
        "itl_median_ms": ColumnStyle(text=_f, header="ITL median ms", justify="right"),
        "output_throughput_tok_s": ColumnStyle(text=lambda v: _f(v, 1), header="out tok/s", justify="right"),
        "done_failed": ColumnStyle(header="done/failed", justify="right", no_wrap=True, show="human"),
        "status": _DATA, "repeats": _DATA, "completed": _DATA, "failed": _DATA, "errors": _DATA,
    }
    by = "input length and concurrency" if table.by_input_len else "concurrency"
    out = Table(f"TPOT by {by} (speedup vs {table.baseline}, {table.stat} TPOT)", list(styles),
                notes=failures(table), styles=styles, group_by="concurrency")
    for row in table.rows:
        for c in row.cells:
            if not c.planned:  # the variant's config leaves this length out
                continue
            done = f"{c.completed}/{c.failed}" + ("" if c.status == "ok" else f" {c.status.upper()}")
            values = {**c.model_dump(), "input_len": row.input_len or table.input_len, "concurrency": row.concurrency,
                      "done_failed": done}
            out.add_row([values[name] for name in out.columns], style=None if c.status == "ok" else "red")
    return out


def view(table: ServeTable, format: str) -> list[Table]:
    """The tables of an output format: markdown has a table per metric, variants side by side
    (:func:`metric_tables`); the terminal table, JSON and CSV have a row per (input length,)
    concurrency and variant (:func:`tpot_table`)."""
    return metric_tables(table) if format == "markdown" else [tpot_table(table)]


def write_table_files(table: ServeTable, run_dir: Path) -> None:
    """Save ``table.md`` (:func:`metric_tables`, as ``--markdown`` prints them) and ``table.json``
    (:func:`tpot_table`, as ``--json`` prints it) in the run folder."""
    write_text(run_dir / TABLE_FILE, render(metric_tables(table), "markdown"), "run table")
    write_text(run_dir / TABLE_JSON_FILE, to_json([tpot_table(table)]) + "\n", "run table")
