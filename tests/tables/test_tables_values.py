"""What the renderers write, to the character: the human number format, the machine formats'
handling of strings, paths and several tables; run ids; the wall clock's unit."""

import csv
import datetime as dt
import io
import json
import os
import re
import time
from pathlib import Path

import pytest

from mlabench.device import DeviceInfo
from mlabench.measure.timing import TimingConfig, time_calls
from mlabench.records.record import new_run_id
from mlabench.tables.render import render, to_csv, to_json
from mlabench.tables.table import Table, fmt


@pytest.mark.parametrize("value, text", [
    (None, "—"), (True, "yes"), (False, "no"), (float("nan"), "nan"), (0.0, "0"), (1.0, "1"),
    (123.456, "123.5"), (100.0, "100.0"), (-250.0, "-250.0"), (99.99, "99.99"), (10.0, "10.00"),
    (9.999, "10"), (1.234, "1.23"), (0.001, "0.001"), (0.0123, "0.0123"), (0.000999, "9.99e-04"),
    (-0.5, "-0.5"), (7, "7"), ("text", "text"),
])
def test_fmt_to_the_character(value, text):
    assert fmt(value) == text


def test_machine_formats_keep_strings_raw_and_write_paths_as_text():
    t = Table("T", ["name", "path", "n"])
    t.add_row(["a,b", Path("/x/y"), 3])
    t.add_row(["plain", None, None])
    rows = list(csv.reader(io.StringIO(to_csv(t))))
    assert rows == [["name", "path", "n"], ["a,b", "/x/y", "3"], ["plain", "", ""]]
    assert json.loads(to_json([t]))[0]["rows"][0] == {"name": "a,b", "path": "/x/y", "n": 3}


def test_render_puts_tables_one_after_the_other():
    a, b = Table("", ["a"], [[1]]), Table("", ["b"], [[2]])
    assert render([a, b], "markdown").count("|") == 12
    assert render([a, b], "csv") == "table,a,b\n1,1,\n2,,2\n"                # one stream, one header
    assert render([Table("TPOT", ["a"], [[1]]), Table("TTFT", ["a", "b"], [[2, 3]])], "csv") == (
        "table,a,b\nTPOT,1,\nTTFT,2,3\n")
    assert render([a], "csv") == "a\n1\n"
    with pytest.raises(ValueError, match="no text form for format 'table'"):
        render([a], "table")


def test_run_id_is_prefix_utc_second_and_process(monkeypatch):
    monkeypatch.setenv("TZ", "Asia/Tokyo")  # 9 h off UTC: a local-time stamp would show it
    time.tzset()
    try:
        before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
        run_id = new_run_id("kimi")
        after = dt.datetime.now(dt.timezone.utc)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    m = re.fullmatch(rf"kimi-(\d{{8}}-\d{{6}})-{os.getpid()}", run_id)
    assert m, run_id
    stamp = dt.datetime.strptime(m.group(1), "%Y%m%d-%H%M%S").replace(tzinfo=dt.timezone.utc)
    assert before <= stamp <= after
    assert new_run_id().startswith("run-")


def test_wall_clock_samples_are_microseconds_per_call(monkeypatch):
    """A fake nanosecond clock that advances 3 ms per read: each pass of two calls reads it twice."""
    ticks = iter(range(0, 10**12, 3_000_000))
    monkeypatch.setattr("mlabench.measure.timing.time.perf_counter_ns", lambda: next(ticks))
    cpu = DeviceInfo("cpu", "cpu", "cpu", 2, 0, "cpu", 0)
    cfg = TimingConfig(warmup_iters=0, min_samples=3, max_samples=3)
    stats = time_calls([lambda: None, lambda: None], cfg, use_graph=False, device=cpu)
    assert stats.samples_us == [1500.0, 1500.0, 1500.0]  # 3000 µs per pass / 2 calls
