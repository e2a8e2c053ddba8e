"""Where ``report`` and ``plot`` write: the default beside a graph-check JSON given first, ``--out DIR/``
with its trailing slash, and figures an earlier report wrote that the new one no longer has."""

import shutil
import sys

import pytest

from mlabench import cli
from tests.report.conftest import GRAPH_CHECK

CHECK = GRAPH_CHECK / "graph_check_splitkv.json"


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """``mlabench ARGS`` in this process: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["mlabench", *args])
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_report_and_plot_of_a_graph_check_file_write_beside_it(tmp_path, monkeypatch, capsys):
    """A graph-check JSON given first: the default was a folder named as the JSON file ("report folder
    exists already as a file"); now ``<stem>.md`` and ``plot``'s ``<stem>-figures/`` beside it."""
    check = shutil.copy(CHECK, tmp_path)
    code, out, err = run_cli(monkeypatch, capsys, "report", "--from", str(check))
    assert (code, err) == (0, "") and out.strip() == str(tmp_path / "graph_check_splitkv.md")
    text = (tmp_path / "graph_check_splitkv.md").read_text()
    assert "](graph_check_splitkv-figures/graph-check" in text
    code, out, err = run_cli(monkeypatch, capsys, "report", "--from", str(check), "--format", "html")
    assert (code, err) == (0, "") and out.strip() == str(tmp_path / "graph_check_splitkv.html")
    (tmp_path / "graph_check_splitkv-figures").rename(tmp_path / "by-report")
    code, out, err = run_cli(monkeypatch, capsys, "plot", "--from", str(check))
    assert code == 0 and out.split() == [str(p) for p in sorted((tmp_path / "graph_check_splitkv-figures").iterdir())]
    assert (tmp_path / "graph_check_splitkv.json").read_bytes() == CHECK.read_bytes()


def test_the_default_report_of_a_file_leaves_a_users_document_alone(tmp_path, monkeypatch, capsys):
    """Where ``<stem>.md`` stands and is no report mlabench wrote, one error line asks for ``--out``."""
    check = shutil.copy(CHECK, tmp_path)
    (tmp_path / "graph_check_splitkv.md").write_text("# my notes on the graph check\n")
    code, out, err = run_cli(monkeypatch, capsys, "report", "--from", str(check))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "pass --out" in err
    assert (tmp_path / "graph_check_splitkv.md").read_text() == "# my notes on the graph check\n"
