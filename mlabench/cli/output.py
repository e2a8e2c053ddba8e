"""Where output goes: tables to stdout in the chosen format, progress and notices to stderr."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import NoReturn

import typer
from rich.console import Console

from mlabench.errors import ExitCode
from mlabench.tables.render import min_width, render, to_rich
from mlabench.tables.table import Table

out = Console()
err = Console(stderr=True)


def print_wide(console: Console, rich_table: object) -> None:
    """Print ``rich_table`` on ``console`` at least :func:`~mlabench.tables.render.min_width` wide, so that a
    table that still does not fit runs past the edge rather than splitting its numbers and names.
    Rich's ``print(width=...)`` never exceeds the console's width, so a wider console writing to
    the same file, with the same colours, prints it."""
    need = min_width(rich_table)
    if need > console.width:
        console = Console(file=console.file, width=need, color_system=console.color_system,
                          force_terminal=console.is_terminal)
    console.print(rich_table)


def emit(tables: Sequence[Table], format: str) -> None:
    """Print ``tables`` to stdout: Rich tables for ``table``, else their JSON, markdown or CSV."""
    if format == "table":
        for t in tables:
            print_wide(out, to_rich(t, out.width))
    else:
        sys.stdout.write(render(tables, format))  # type: ignore[arg-type]


def notice(message: str, style: str = "yellow") -> None:
    """One line for people on stderr (taken literally: no Rich markup in ``message``), never
    broken by Rich, so that a path in it stays whole (the terminal wraps it, a log keeps it)."""
    err.print(message, style=style, markup=False, highlight=False, soft_wrap=True)


@contextmanager
def progress_bar(what: str) -> Iterator[Callable[[int, int, str], None]]:
    """A progress bar on stderr, yielded as ``update(done, total, description)``: it appears with
    the first update (after validation, so that an error stands alone) and stops on exit."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=err, transient=False)
    task = None

    def update(done: int, total: int, description: str) -> None:
        nonlocal task
        if task is None:
            bar.start()
            task = bar.add_task(what, total=total)
        bar.update(task, total=total, completed=done, description=description)

    try:
        yield update
    finally:
        if task is not None:
            bar.stop()


def fail(message: str) -> NoReturn:
    """Say why on stderr and exit with :attr:`ExitCode.FAILED` (a check failed, a result is missing)."""
    notice(message, style="red")
    raise typer.Exit(ExitCode.FAILED)
