"""The ``mlabench`` command line (console script ``mlabench = "mlabench.cli:main"``).

- :mod:`~mlabench.cli.app`: the Typer app, where command groups are registered, and :func:`main`,
  the one place that maps errors to exit codes (:class:`mlabench.errors.ExitCode`).
- :mod:`~mlabench.cli.options`: options shared by commands, declared once as ``Annotated`` aliases.
- :mod:`~mlabench.cli.output`: ``--format table|json|markdown|csv`` and where output goes.
- one module per command group (:mod:`~mlabench.cli.kernel_commands`, :mod:`~mlabench.cli.diff_command`,
  :mod:`~mlabench.cli.serve_commands`, :mod:`~mlabench.cli.report_commands`; tune joins them), each command a
  top-level function: parse, call the library, render.
"""

from mlabench.cli.app import app, main

__all__ = ["app", "main"]
