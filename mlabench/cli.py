"""The ``mlabench`` command line: parse, call library functions, render with Rich.

Every :class:`~mlabench.errors.MlabenchError` becomes one ``error: ...`` line on stderr and exit
code 2; tables go to stdout, progress to stderr.
"""

from __future__ import annotations

import sys

import typer

from mlabench.errors import MlabenchError

app = typer.Typer(
    name="mlabench",
    help="Which MLA decode path, which split count, and what it buys end to end.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register_commands() -> None:
    from mlabench import cli_kernels, cli_serve

    cli_kernels.register(app)
    cli_serve.register(app)


_register_commands()


def main() -> None:
    """Console-script entry point."""
    try:
        # With standalone_mode=False click returns the code of a typer.Exit instead of raising it.
        code = app(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except MlabenchError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("aborted", err=True)
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:  # click usage errors arrive here in non-standalone mode
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise
