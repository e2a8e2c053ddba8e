"""The ``mlabench`` command line: parse, call library functions, render with Rich.

Every :class:`~mlabench.errors.MlabenchError` becomes one ``error: ...`` line on stderr and exit
code 2 (or the error's own ``exit_code``); a usage mistake prints click's usage message and exits
2; tables go to stdout, progress to stderr.
"""

from __future__ import annotations

import sys

import typer

from mlabench import __version__
from mlabench.errors import MlabenchError

app = typer.Typer(
    name="mlabench",
    help="Which MLA decode path, which split count, and what it buys end to end.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mlabench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Which MLA decode path, which split count, and what it buys end to end."""


def _register_commands() -> None:
    from mlabench import cli_kernels, cli_serve, cli_tune

    cli_kernels.register(app)
    cli_serve.register(app)
    cli_tune.register(app)


_register_commands()


def _is_usage_error(exc: BaseException) -> bool:
    """Click-style exceptions (``show()`` and ``exit_code``), whichever click typer bundles."""
    return callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None), int)


def main() -> None:
    """Console-script entry point."""
    try:
        # With standalone_mode=False click returns the code of a typer.Exit instead of raising it.
        code = app(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except MlabenchError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(getattr(exc, "exit_code", 2))
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("aborted", err=True)
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:
        if _is_usage_error(exc):
            exc.show()
            sys.exit(exc.exit_code or 2)
        raise
