"""Running the command line inside a test: ``mlabench ARGS`` in this process, its standard output."""

import sys

from mlabench import cli


def run_mlabench(args: list[str], monkeypatch, capsys) -> str:
    """The standard output of ``mlabench ARGS`` run here; fails with its standard error on an error."""
    monkeypatch.setattr(sys, "argv", ["mlabench", *args])
    try:
        cli.main()
    except SystemExit as exc:
        assert not exc.code, capsys.readouterr().err
    return capsys.readouterr().out
