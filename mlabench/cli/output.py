"""Where output goes: tables to stdout in the chosen format, progress and notices to stderr."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import NoReturn

import typer
from rich.console import Console

from mlabench.errors import ExitCode
from mlabench.tables import Table, render, to_rich

out = Console()
err = Console(stderr=True)


def emit(tables: Sequence[Table], format: str) -> None:
    """Print ``tables`` to stdout: Rich tables for ``table``, else their JSON, markdown or CSV."""
    if format == "table":
        for t in tables:
            out.print(to_rich(t))
    else:
        sys.stdout.write(render(tables, format))  # type: ignore[arg-type]


def notice(message: str, style: str = "yellow") -> None:
    """One line for people on stderr (taken literally: no Rich markup in ``message``)."""
    err.print(message, style=style, markup=False, highlight=False)


def fail(message: str) -> NoReturn:
    """Say why on stderr and exit with :attr:`ExitCode.FAILED` (a check failed, a result is missing)."""
    notice(message, style="red")
    raise typer.Exit(ExitCode.FAILED)
