"""A run or graph-check result reached by two spellings (``val`` and ``/tmp/x/val`` from ``/tmp/x``,
as ``report --from val --from .`` gives them) is read once: the report listed it twice."""

import shutil
from pathlib import Path

from mlabench.report.runs import load_runs

REPO = Path(__file__).resolve().parents[2]
QO1_K3 = REPO / "results/h200/deploy/qo1-k3"


def test_a_run_and_a_graph_check_named_by_two_spellings_are_read_once(tmp_path, monkeypatch):
    shutil.copytree(next(QO1_K3.glob("validate-*")), tmp_path / "val")
    shutil.copy(QO1_K3 / "graph_check_device.json", tmp_path)
    monkeypatch.chdir(tmp_path)
    runs = load_runs([Path("val"), Path("graph_check_device.json"), tmp_path])
    assert [r.path for r in runs.validation_runs] == [Path("val")]
    assert [g.path for g in runs.graph_checks] == [Path("graph_check_device.json")]
