"""Golden tests on the committed H200 run (results/h200/kimi-k3-tp8/): the tables and the CSV that
mlabench makes from its records must be the ones committed beside them.

The records were measured on an H200 and are read, not re-measured, so these run anywhere.
"""

import csv
import json
import sys
from pathlib import Path

import pytest

from mlabench import cli
from mlabench.files import read_text
from mlabench.records.store import ResultStore, records_of, stored_file
from mlabench.sweep.summary import sweep_summary
from mlabench.tables.render import to_markdown
from tests.golden.cli import run_mlabench


REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "results" / "h200" / "kimi-k3-tp8"
RUN = H200 / "kimi-k3-tp8-20261130-105953-511"


def raw_records() -> str:
    """The committed run's raw records (kept as ``results.jsonl.gz``, as the results/ rule asks)."""
    return read_text(stored_file(RUN / "results.jsonl"), "run records")


def markdown_rows(text: str) -> list[list[str]]:
    """The cells of every table line (``| a | b |``) of a markdown text, separator line included."""
    return [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("|")]


def test_compare_reproduces_the_committed_table_byte_for_byte(monkeypatch, capsys):
    out = run_mlabench(["compare", "--from", str(H200), "--markdown"], monkeypatch, capsys)
    assert out == (H200 / "compare.md").read_text()


def test_compare_speedup_is_split_kv_time_over_persistent_time(monkeypatch, capsys):
    (table,) = json.loads(run_mlabench(["compare", "--from", str(H200), "--json"], monkeypatch, capsys))
    rows = [r for r in table["rows"] if r["speedup"] is not None]
    assert len(rows) == len(table["rows"]) == 32  # 16 (batch, context) cells x 2 persistent backends
    for r in rows:
        assert r["speedup"] == pytest.approx(r["split-KV µs"] / r["µs"], rel=1e-12)
    # batch 16, 131072 tokens: FlashMLA 562.5 µs against split-KV 763.3 µs, so the persistent wins
    (big,) = [r for r in rows if (r["batch"], r["context"], r["persistent"]) == (16, 131072, "flashmla")]
    assert big["speedup"] > 1.3


def test_sweep_summary_reproduces_the_committed_table_byte_for_byte():
    """sweep.md is the summary of the committed records as mlabench renders it: a column for every
    split count swept (1 to 256), the best correct configuration, the notes."""
    table = sweep_summary(records_of([H200]))
    assert to_markdown(table) == (H200 / "sweep.md").read_text()
    header = markdown_rows(to_markdown(table))[0]
    assert header[7:19] == [f"µs @{n}" for n in (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)]


def test_results_csv_values_are_rewritten_from_the_records(tmp_path):
    """Every value of the committed CSV, not only its header (columns added later may follow)."""
    with open(RUN / "results.csv", newline="") as fh:
        committed = list(csv.DictReader(fh))
    path = ResultStore(RUN).write_csv(tmp_path / "results.csv")
    with open(path, newline="") as fh:
        now = list(csv.DictReader(fh))
    assert len(now) == len(committed) == len(ResultStore(RUN).records())
    for old, new in zip(committed, now):
        assert {k: new[k] for k in old} == old
    first = json.loads(raw_records().splitlines()[0])
    assert float(now[0]["median_us"]) == first["stats"]["median_us"]
    assert float(now[0]["floor_us"]) == first["floor_us"] and now[0]["noisy"] == "False"


def test_runs_of_two_devices_are_refused_naming_each_run(tmp_path):
    from mlabench.errors import ResultsError

    other = tmp_path / RUN.name
    other.mkdir()
    (other / "results.jsonl").write_text(raw_records())
    manifest = json.loads((RUN / "manifest.json").read_text())
    manifest["device"]["name"] = "AMD Instinct MI355X"
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ResultsError) as info:
        records_of([RUN, other])
    assert str(info.value) == (f"runs from different devices do not compare: NVIDIA H200 ({RUN}); "
                               f"AMD Instinct MI355X ({other})")


@pytest.mark.parametrize("flag, value", [("--batch", "3"), ("--qo-len", "2")])
def test_compare_filter_matching_nothing_is_one_error_line_and_exit_1(flag, value, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["mlabench", "compare", "--from", str(RUN), flag, value])
    with pytest.raises(SystemExit) as info:
        cli.main()
    out, err = capsys.readouterr()
    assert info.value.code == 1 and not out
    assert err == (f"error: no recorded point matches {flag} {value}: the runs hold backends flashmla, "
                   "triton-persistent, triton-splitkv; batch 1, 16; qo_len 1; context 1024-131072 (8 lengths)\n")


def test_from_a_folder_reads_the_runs_below_it_as_report_does(tmp_path, monkeypatch, capsys):
    """`compare --from results/h200/serving` read its serve-bench runs as kernel runs and stopped
    ("unreadable manifest"), while `report --from` it reads the sweeps of `sweep/`: compare reads
    them too (the runs at any depth, serve-bench runs passed over).  A script's output, no run, is
    still named as one."""
    serving = H200.parent / "serving"
    out = run_mlabench(["compare", "--from", str(serving), "--json"], monkeypatch, capsys)
    assert out == run_mlabench(["compare", "--from", str(serving / "sweep"), "--json"], monkeypatch, capsys)
    assert "kimi-k3-tp8-serving-host-20261204-211057-1293" in out  # its runs differ: a run column
    script_out = tmp_path / "hopper-kernel"  # a script's output from before it also wrote run/
    script_out.mkdir()
    (script_out / "records.jsonl").write_text(raw_records())
    monkeypatch.setattr(sys, "argv", ["mlabench", "compare", "--from", str(script_out)])
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert "its records.jsonl is a script's output, not a run" in capsys.readouterr().err
