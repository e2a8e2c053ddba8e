"""``mlabench diff RUN_A RUN_B``: two recorded runs point by point (:mod:`mlabench.sweep.diff`); reads
only, needs no GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mlabench.cli.options import Format, Json, Markdown, output_format
from mlabench.cli.output import emit


def diff(
    run_a: Annotated[Path, typer.Argument(help="The baseline run folder (or a folder holding one run).")],
    run_b: Annotated[Path, typer.Argument(help="The run compared with it.")],
    all_points: Annotated[bool, typer.Option("--all", help="List every point, not only those that differ.")] = False,
    min_us: Annotated[float, typer.Option(metavar="US", help="Agreement (within 1%, worst) over points of at least this many "
                                               "µs in run A.")] = 20.0,
    machine: Annotated[bool | None, typer.Option(
        "--machine-factor/--no-machine-factor",
        help="Also compare against the machine factor (default: when the runs come from two machines).")] = None,
    format: Format = None, as_json: Json = False, markdown: Markdown = False,
) -> None:
    """Compare two runs point by point: medians, ratio B/A, significance from the samples and each
    run's repeat noise, a geometric mean per backend; notes where the runs' set-ups differ.  Runs
    from two machines also get the machine factor and the points that move beyond it."""
    from mlabench.sweep.diff import diff_runs, diff_tables
    from mlabench.sweep.machine import machine_factor, machine_tables

    fmt = output_format(format, as_json, markdown)
    d = diff_runs(run_a, run_b)
    summary, *rest = diff_tables(d, min_us, all_points)
    emit([summary, *machine_tables(machine_factor(d, machine)), *rest], fmt)  # the machine's part after the summary


#: The commands of this group, registered by :mod:`mlabench.cli.app`.
COMMANDS = {"diff": diff}
