"""Golden outputs: what the reading commands print over committed runs stays the same.

Each case runs one command in this process (as ``mlabench ...``) over runs committed under
``results/h200/`` and compares its output with the file of the same name in this folder, after
:func:`normalise` (the repository and the temporary folder spelled as ``<repo>`` and ``<tmp>``, and an
archived ``.jsonl.gz``/``.journal.gz`` read as its plain name), so that moving the code, or gzipping
the runs' raw records, changes nothing here.  Nothing is measured: these run on any machine.

To write the files again after a change of output that is meant (and reviewed in the diff)::

    MLABENCH_GOLDEN_UPDATE=1 python3 -m pytest tests/golden
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from mlabench.files import read_text
from mlabench.records.store import stored_file
from tests.golden.cli import run_mlabench

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
H200 = REPO / "results" / "h200"
KIMI = H200 / "kimi-k3-tp8" / "kimi-k3-tp8-20261130-105953-511"
QO_LEN = H200 / "qo-len" / "kimi-k3-tp8-mtp-20261130-181848-687"
PAIR = H200 / "repeatability" / "history-attempt" / "pair-3" / "runs"
DIFF_A, DIFF_B = PAIR / "kimi-k3-tp8-20261201-025639-435", PAIR / "kimi-k3-tp8-20261201-025947-594"
TUNE = (H200 / "tune-kimi-k3-tp8" / "whole-tiles-attempt" / "workers-dealt" / "one-worker"
        / "tune-kimi-k3-tp8-20261201-002140-921")
GRAPH_CHECK = H200 / "graph-check"
UPDATE = bool(os.environ.get("MLABENCH_GOLDEN_UPDATE"))


def normalise(text: str, tmp: Path) -> str:
    """``text`` with this checkout's and ``tmp``'s paths replaced by ``<repo>`` and ``<tmp>``, and
    archived file names (``results.jsonl.gz``, ``study.journal.gz``) by their plain names."""
    text = text.replace(str(REPO), "<repo>").replace(str(tmp), "<tmp>")
    return re.sub(r"\.(jsonl|journal)\.gz\b", r".\1", text)


def check_golden(name: str, text: str) -> None:
    """``text`` equals ``tests/golden/NAME`` (or, with MLABENCH_GOLDEN_UPDATE set, is written there)."""
    path = HERE / name
    if UPDATE:
        path.write_text(text)
    assert path.exists(), f"{path} is missing: run with MLABENCH_GOLDEN_UPDATE=1 to write it"
    assert text == path.read_text(), f"{name} differs from the golden output"


def copy_tuning_run(tmp: Path) -> Path:
    """A copy of the committed tuning run whose Optuna journal is plain text (``tune --export``
    rebuilds the policy files inside the run folder and reads the journal uncompressed)."""
    run = tmp / TUNE.name
    shutil.copytree(TUNE, run)
    journal = run / "study.journal"
    if not journal.exists():  # committed gzipped: study.journal.gz
        journal.write_text(read_text(stored_file(journal), "tuning journal"))
    return run


@pytest.mark.parametrize("name, args", [
    ("compare-kimi-k3-tp8.json", ["compare", "--from", str(KIMI), "--json"]),
    ("compare-qo-len.json", ["compare", "--from", str(QO_LEN), "--json"]),
    ("diff-pair-3.json", ["diff", str(DIFF_A), str(DIFF_B), "--json"]),
], ids=lambda v: v if isinstance(v, str) else "")
def test_reading_command_output_is_unchanged(name, args, tmp_path, monkeypatch, capsys):
    check_golden(name, normalise(run_mlabench(args, monkeypatch, capsys), tmp_path))


def test_tune_export_tables_and_policy_files_are_unchanged(tmp_path, monkeypatch, capsys):
    run = copy_tuning_run(tmp_path)
    out = run_mlabench(["tune", "--export", str(run), "--json"], monkeypatch, capsys)
    check_golden("tune-export.json", normalise(out, tmp_path))
    for name in ("policy.h", "policy.py"):
        check_golden(f"tune-export-{name}", (run / name).read_text())
    created = re.compile(r'"created": "[^"]*"')  # the time of the export itself
    check_golden("tune-export-policy.json", created.sub('"created": "<now>"', (run / "policy.json").read_text()))


def test_report_sections_and_graph_check_tables_are_unchanged(tmp_path, monkeypatch, capsys):
    """One report over a sweep, a multi-token sweep, a tuning run and graph-check's saved tables:
    every section's text and tables, and the figures it lists (the PNGs themselves are not compared)."""
    run = copy_tuning_run(tmp_path)
    out = tmp_path / "report"
    args = ["report", "--from", str(KIMI), "--from", str(QO_LEN), "--from", str(run),
            "--from", str(GRAPH_CHECK), "--out", str(out)]
    run_mlabench(args, monkeypatch, capsys)
    check_golden("report.md", normalise((out / "report.md").read_text(), tmp_path))
