"""The Typer app, the registration of every command group, and the one mapping of errors to exit
codes.

Exit codes (:class:`~mlabench.errors.ExitCode`): 0 done; 1 a check failed or a result is missing
(a command raises ``typer.Exit(ExitCode.FAILED)``, or a
:class:`~mlabench.errors.MissingResultError` gives one ``error:`` line and 1); 2 a usage mistake (click's message
as one ``error:`` line: :func:`usage_line`) or
a :class:`~mlabench.errors.MlabenchError` (one ``error: ...`` line on stderr, or the error's own
``exit_code``); 3 cannot run here (no GPU, a backend or package missing, a full disk: the error's own
``exit_code``);
130 Ctrl-C or SIGTERM (:func:`stop_on_sigterm`).  Tables go to stdout, progress and notices to stderr.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

import typer

from mlabench import __version__
from mlabench.cli import (
    diff_command as diff, graph_check_command as graphs, kernel_commands as kernels, report_commands as report,
    serve_commands as serve, tune_command as tune,
)
from mlabench.errors import ConfigError, ExitCode, MlabenchError

app = typer.Typer(
    name="mlabench",
    help="Which MLA decode path, which split count, and what it buys end to end.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,  # plain help: flags without a "<bool>", wrapped to the terminal
)

#: Command groups: modules whose ``COMMANDS`` maps command names to top-level functions, in the
#: order ``mlabench --help`` lists them.  A new group is one more entry here.
GROUPS = (kernels, graphs, diff, serve, tune, report)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mlabench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Which MLA decode path, which split count, and what it buys end to end."""


for _group in GROUPS:
    for _name, _command in _group.COMMANDS.items():
        app.command(_name)(_command)


def _is_usage_error(exc: BaseException) -> bool:
    """Click-style exceptions (``show()`` and ``exit_code``), whichever click typer bundles."""
    return callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None), int)


def help_wins(args: list[str]) -> list[str]:
    """``args`` with ``--help`` anywhere reduced to the command names before the first option and
    ``--help``, so that help wins even where ``--help`` would be read as an option's value
    (``tune --validate --help``)."""
    if "--help" not in args:
        return args
    first_option = next((i for i, a in enumerate(args) if a.startswith("-")), len(args))
    return [*args[:first_option], "--help"]


def repeated_option(command: Any, args: list[str]) -> str:
    """One line naming an option of the command ``args`` run (``command``: the app's click command)
    that is given twice although it takes one value (click keeps the last: ``tune --backend a
    --backend b`` tuned b without a word), or "".  Options that take several (``check --backend``)
    and flags may repeat; ``--`` ends the scan."""
    rest = list(args)
    while hasattr(command, "list_commands") and rest and not rest[0].startswith("-"):  # a group
        command, rest = command.commands.get(rest[0]), rest[1:]
    if command is None:
        return ""
    rest = rest[:rest.index("--")] if "--" in rest else rest
    for param in command.params:
        if param.param_type_name != "option" or param.multiple or param.is_flag or param.nargs != 1:
            continue
        values = []
        for i, arg in enumerate(rest):
            name, eq, value = arg.partition("=")
            if arg in param.opts:  # --opt VALUE
                values.append((rest[i + 1:i + 2] or [""])[0])
            elif eq and name in param.opts:  # --opt=VALUE
                values.append(value)
        if len(values) > 1:
            return (f"{param.opts[0]} given {len(values)} times ({', '.join(values)}); it takes one value "
                    "(the last would win)")
    return ""


def stop_on_sigterm() -> None:
    """Make SIGTERM (``kill``, ``timeout``, a job scheduler's stop) end a command as Ctrl-C does:
    Python's default for it ends the process at once, so an interrupted sweep or tune would not
    print the ``--resume`` line and serve-bench would not stop its server in order.  Only from the
    main thread (Python delivers signals there)."""
    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupt)


def main() -> None:
    """Console-script entry point: run the app and turn what it raised into an exit code."""
    stop_on_sigterm()
    try:
        # With standalone_mode=False click returns the code of a typer.Exit instead of raising it,
        # and typer turns Ctrl-C inside a command into code 130.
        command = typer.main.get_command(app)  # built once: the check below and the run share it
        if (why := repeated_option(command, sys.argv[1:])) and "--help" not in sys.argv:
            raise ConfigError(why)
        code = command(args=help_wins(sys.argv[1:]), standalone_mode=False)
        if code == ExitCode.INTERRUPTED:
            typer.echo("aborted", err=True)
        if isinstance(code, int) and code:
            sys.exit(code)
    except MlabenchError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):  # Ctrl-C outside a command
        typer.echo("aborted", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # no command: the help, as --help prints it
            typer.echo(app_help(), err=True)
            sys.exit(ExitCode.ERROR)
        if _is_usage_error(exc):
            typer.echo(f"error: {usage_line(exc, sys.argv[1:])}", err=True)
            sys.exit(exc.exit_code or ExitCode.ERROR)
        raise


def app_help() -> str:
    """``mlabench --help``'s text (usage, commands, options), with the program named mlabench."""
    import click

    command = typer.main.get_command(app)
    with click.Context(command, info_name="mlabench") as ctx:
        return command.get_help(ctx)


def usage_line(exc: BaseException, args: list[str] | None = None) -> str:
    """Click's usage error as one line: its message, without pydantic's ``Value error,`` prefix and
    with a lower-case start, then the command whose ``--help`` lists the options, e.g.
    ``invalid value for '--order': 'bogus' is not one of ... (mlabench sweep --help)``.  Where
    click names no context (an option missing its value), the command is the first of ``args``
    (the command line after the program) if it is one."""
    format_message = getattr(exc, "format_message", None)
    text = format_message() if callable(format_message) else str(exc)
    text = " ".join(text.replace("Value error, ", "").split())
    names, ctx = [], getattr(exc, "ctx", None)
    while ctx is not None and ctx.parent is not None:  # the root's name is the program's, however run
        names.insert(0, ctx.info_name)
        ctx = ctx.parent
    commands = {name for group in GROUPS for name in group.COMMANDS}
    if ctx is None and args and args[0] in commands:
        names = [args[0]]
    path = " ".join(["mlabench", *names])
    return f"{text[:1].lower()}{text[1:]} ({path} --help)"
