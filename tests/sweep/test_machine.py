"""The machine factor of ``mlabench diff`` for runs from two machines (issue 27 item 5), on copies of
the committed H200 run: machine B 2% slower everywhere, one point 10% slower on top."""

import dataclasses
import json
from pathlib import Path

import pytest

from mlabench.measure.stats import summarize
from mlabench.records.store import ResultStore
from mlabench.sweep.diff import diff_runs, diff_tables, point_params
from mlabench.sweep.machine import machine_factor, machine_tables, two_machines
from mlabench.sweep.sentinel import append_sentinel
from tests.cli.test_cli import run as mlabench
from tests.sweep.test_diff import H200_RUN, copy_run

#: The point that changed beyond the machine: triton-splitkv's first record.
CHANGED = next(r.key for r in ResultStore(H200_RUN).records() if r.backend == "triton-splitkv")


def two_machine_runs(tmp_path, host_b="other-host", copy_b=None):
    """A (the committed run, host ``vm``, with its sentinel 3 times at its time) and B on ``host_b``:
    every sample 2% slower, the :data:`CHANGED` point 10% more, its sentinel 2% slower."""
    a = copy_run(H200_RUN, tmp_path / "a")
    m = ResultStore(H200_RUN).manifest()
    b = copy_run(H200_RUN, tmp_path / "b", scale=1.02, host=host_b,
                 copy_bandwidth_tbps=copy_b or m.copy_bandwidth_tbps)  # the run's floor (recorded before read)
    store = ResultStore(b)
    recs = store.records()
    lines = []
    for r in recs:
        if r.key == CHANGED:
            r = r.model_copy(update={"stats": summarize([1.1 * x for x in r.stats.samples_us])})
        lines.append(r.model_dump_json())
    (b / "results.jsonl").write_text("\n".join(lines) + "\n")
    sentinel = ResultStore(a).records()[0]
    for i in range(3):
        append_sentinel(a, 20 * i, sentinel)
        append_sentinel(b, 20 * i, sentinel.model_copy(update={"stats": summarize(
            [1.02 * x for x in sentinel.stats.samples_us])}))
    return a, b


def test_runs_from_two_hosts_get_the_machine_factor_and_the_one_point_beyond_it(tmp_path):
    a, b = two_machine_runs(tmp_path, copy_b=0.98 * ResultStore(H200_RUN).manifest().copy_bandwidth_tbps)
    d = diff_runs(a, b)
    assert sum(p.significant for p in d.points) > 200  # the plain comparison: B slower nearly everywhere
    mf = machine_factor(d)
    assert mf.reason == "hosts vm vs other-host" and mf.points == len(d.points)
    assert mf.factor == pytest.approx(1.02, abs=1e-6) and mf.sentinel == pytest.approx(1.02)
    assert mf.floors == pytest.approx(1 / 0.98)
    (p, rel, z), = mf.beyond
    assert p.a.key == CHANGED and rel == pytest.approx(1.1, rel=1e-6) and z > 3
    (table,) = machine_tables(mf)
    assert [row[0] for row in table.rows] == ["triton-splitkv"]
    # the params as the other diff tables show them: points of several query tokens say how many
    assert table.rows[0][3] == point_params(p.a) and "qo=" not in table.rows[0][3]
    four = dataclasses.replace(p, a=p.a.model_copy(update={"qo_len": 4}))
    (many,) = machine_tables(dataclasses.replace(mf, beyond=[(four, rel, z)]))
    assert many.rows[0][3].startswith("qo=4 ")
    assert table.notes[0].startswith("two machines (hosts vm vs other-host): machine factor +2.00% (B/A, the "
                                     f"median over the {len(d.points)} points compared); the sentinel says +2.00%, "
                                     "the floors' bandwidths +2.04%")
    assert table.notes[1].startswith(f"1 of {len(d.points)} points move beyond it (1 slower, 0 faster)")
    assert d.manifest_notes == ["different hosts: vm vs other-host (two machines: see the machine factor)"]


def test_one_machine_has_no_factor_unless_asked(tmp_path):
    a, b = two_machine_runs(tmp_path, host_b="vm")
    d = diff_runs(a, b)
    assert two_machines(d.a.manifest, d.b.manifest) is None and machine_factor(d) is None
    assert machine_tables(None) == []
    assert machine_factor(d, force=True).reason == "as asked (--machine-factor)"
    other = ResultStore(H200_RUN).manifest()
    assert two_machines(other, other.model_copy(update={"device": {**other.device, "name": "NVIDIA H100"}})) \
        == "NVIDIA H200 vs NVIDIA H100"
    uuids = [other.model_copy(update={"device": {**other.device, "uuid": u}}) for u in ("GPU-a", "GPU-b")]
    assert two_machines(*uuids) == "GPUs GPU-a vs GPU-b"
    assert machine_factor(diff_runs(a, b), force=False) is None


def test_diff_command_prints_the_machine_table_after_the_summary(tmp_path, monkeypatch, capsys):
    a, b = two_machine_runs(tmp_path)
    code, out, _ = mlabench(["diff", str(a), str(b), "--json"], monkeypatch, capsys)
    tables = json.loads(out)
    assert code == 0 and [t["title"] for t in tables][:3] == [
        "diff: b against a", "points that move beyond the machine factor", "points that differ significantly"]
    assert len(tables[1]["rows"]) == 1
    code, out, _ = mlabench(["diff", str(a), str(b), "--json", "--no-machine-factor"], monkeypatch, capsys)
    assert code == 0 and "points that move beyond the machine factor" not in out
    assert len(diff_tables(diff_runs(a, b))) + 1 == len(tables)


def test_the_floors_estimate_compares_one_kind_of_bandwidth():
    """The committed pair-3 run (read ceiling 4.51, copy 4.19 TB/s) against the older Kimi K3 sweep
    (copy 4.18 only): the floors' estimate set A's read ceiling over B's copy bandwidth, +7.98%,
    where the copy bandwidths agree within 0.3%."""
    results = Path(__file__).resolve().parents[2] / "results/h200"
    d = diff_runs(results / "repeatability/history-attempt/pair-3/runs/kimi-k3-tp8-20261201-025639-435",
                  results / "kimi-k3-tp8/kimi-k3-tp8-20261130-105953-511")
    a, b = d.a.manifest, d.b.manifest
    assert b.read_bandwidth_tbps is None and a.read_bandwidth_tbps / b.copy_bandwidth_tbps > 1.07
    assert machine_factor(d, force=True).floors == pytest.approx(a.copy_bandwidth_tbps / b.copy_bandwidth_tbps)
