"""Report commands: ``plot`` (figures) and ``report`` (one markdown or HTML document), from recorded
runs; neither measures anything nor needs a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mlabench.cli.options import name_list
from mlabench.cli.output import notice
from mlabench.errors import ConfigError, MissingResultError
from mlabench.report.figures.plan import KINDS

FromRuns = Annotated[list[Path], typer.Option(
    "--from", metavar="RUN",
    help="A run folder (sweep, tune, tune --validate, serve-bench), a graph-check JSON (graph-check --save), "
         "or a folder holding them at any depth (never searched inside a run folder); repeatable.")]


def plot(
    from_run: FromRuns,
    config_path: Annotated[Path | None, typer.Argument(
        metavar="CONFIG", show_default=False,
        help="A serve config whose [prediction] the serving figure's predicted TPOT follows instead of the "
             "one each serve-bench run recorded (as serve-bench CONFIG --from-run); needs sweep runs.")] = None,
    out: Annotated[Path | None, typer.Option(
        metavar="DIR", help="Folder for the figures (default: <first --from>/figures, or <stem>-figures/ "
                            "beside a --from file).")] = None,
    kind: Annotated[list[str] | None, typer.Option(
        metavar="KIND[,KIND...]", help="Only these figure kinds (default: all): " + ", ".join(KINDS) + ".")] = None,
    fmt: Annotated[str, typer.Option("--format", metavar="png|svg|png,svg", help="Figure format(s).")] = "png",
) -> None:
    """Draw the figures of recorded runs (PNG/SVG); a figure without data is skipped with the reason."""
    from mlabench.report.build import default_figure_dir
    from mlabench.report.figures.plan import write_figures
    from mlabench.report.runs import load_runs

    kinds = name_list(kind)
    if kind is not None and not kinds:
        raise ConfigError(f"--kind is empty (kinds: {', '.join(KINDS)})")
    runs = load_runs(from_run)
    if config_path is not None:
        runs.prediction = _config_prediction(runs, config_path)
    formats = list(dict.fromkeys(f.strip() for f in fmt.split(",") if f.strip()))  # svg,svg: once
    written, skipped = write_figures(runs, out or default_figure_dir(from_run[0]), kinds, formats)
    if not written:
        raise MissingResultError("no figure to draw from these runs (" + "; ".join(s.line() for s in skipped) + ")")
    for s in skipped:
        notice(s.line(), style="")
    for spec, paths in written:
        if spec.note:
            notice(spec.note, style="")
        for path in paths:
            typer.echo(str(path))


def _config_prediction(runs, config_path: Path) -> tuple[dict, str]:
    """``plot CONFIG``: CONFIG's ``[prediction]`` and its words for the serving figure, checked as
    ``serve-bench CONFIG --from-run`` checks it (:func:`~mlabench.cli.serve_commands.config_prediction`,
    then against each serve run's variants); a line for each run whose recorded one it replaces."""
    from mlabench.cli.serve_commands import config_prediction, replaced_prediction
    from mlabench.backends import backend_params
    from mlabench.deploy.prediction import PredictionSpec

    if not runs.serve_runs:
        raise ConfigError(f"plot {config_path}: a CONFIG gives the [prediction] of serve-bench runs, and --from "
                          "gives none")
    table = config_prediction(config_path, bool(runs.records), "plot", "--from")
    for run in runs.serve_runs:
        PredictionSpec.of(table, [v.name for v in run.config.variants], run.launch_env, run.config.input_lens(),
                          run.config.concurrencies, backend_params())
        if table != run.config.prediction:
            notice(f"{run.name}: " + replaced_prediction(table, run.config.prediction), style="")
    return table, f"the [prediction] of {config_path}"


def report(
    from_run: FromRuns,
    out: Annotated[str | None, typer.Option(metavar="DIR|FILE", show_default=False, help=(
        "Folder for the report (default: the first --from, or <stem>.md beside a --from file), or a file "
        "named *.md (figures in <stem>-figures/ beside it) or *.html; a trailing / means a folder."))] = None,
    fmt: Annotated[str | None, typer.Option(
        "--format", metavar="markdown|html",
        help="markdown (report.md + figures/) or html; default: markdown, or the --out file's.")] = None,
) -> None:
    """Write one report from recorded runs: environment, correctness, best split, compare, serving, tuned
    policy and validation, graph-check, figures."""
    from mlabench.records.provenance import command_line
    from mlabench.report.build import default_out, write_report
    from mlabench.report.runs import load_runs

    runs = load_runs(from_run)
    target = out if out is not None else default_out(from_run[0], fmt)
    path = write_report(runs, target, fmt, command=" ".join(command_line()))
    typer.echo(str(path))


#: The commands of this group, registered by :mod:`mlabench.cli.app`.
COMMANDS = {"plot": plot, "report": report}
