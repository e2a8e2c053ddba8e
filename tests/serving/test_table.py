"""TPOT table math: repeats, speedup, failures kept visible."""

import json

import pytest

from mlabench.serving.results import BenchResult, MetricStats
from mlabench.serving.table import build_table, tpot_markdown_table, tpot_table
from mlabench.tables.render import to_json, to_markdown as _to_markdown


def to_markdown(t):
    """The markdown layout: variants side by side."""
    return _to_markdown(tpot_markdown_table(t))


def res(variant, conc, rep, tpot, status="ok", completed=3, failed=0, ttft=100.0):
    return BenchResult(variant=variant, concurrency=conc, repeat=rep, status=status,
                       completed=completed, failed=failed, output_throughput_tok_s=1000 / tpot,
                       tpot=MetricStats(mean_ms=tpot, median_ms=tpot - 1, p99_ms=tpot * 2),
                       ttft=MetricStats(mean_ms=ttft), itl=MetricStats(mean_ms=tpot))


def test_speedup_against_baseline_per_concurrency():
    results = [res("asm", 1, 0, 87.29), res("gluon", 1, 0, 23.58),
               res("asm", 16, 0, 149.17), res("gluon", 16, 0, 89.70)]
    t = build_table(results, ["asm", "gluon"], [1, 16], "asm")
    assert t.ok
    c1, c16 = t.rows
    assert c1.cells[1].speedup == pytest.approx(87.29 / 23.58)  # 3.70x, the seed PR's table
    assert c16.cells[1].speedup == pytest.approx(149.17 / 89.70)  # 1.66x
    assert c1.cells[0].speedup == pytest.approx(1.0)
    md = to_markdown(t)
    assert "| 1 | 87.29 | 1.00x (base) |" in md and "3.70x" in md and "1.66x" in md


def test_repeats_are_averaged_and_counts_summed():
    results = [res("a", 1, 0, 10.0), res("a", 1, 1, 12.0), res("b", 1, 0, 5.0), res("b", 1, 1, 7.0)]
    t = build_table(results, ["a", "b"], [1], "a")
    a, b = t.rows[0].cells
    assert a.tpot_mean_ms == pytest.approx(11.0) and a.completed == 6 and a.repeats == 2
    assert b.speedup == pytest.approx(11.0 / 6.0)


def test_median_and_p99_speedups():
    results = [res("a", 1, 0, 11.0), res("b", 1, 0, 6.0)]
    assert build_table(results, ["a", "b"], [1], "a", "median").rows[0].cells[1].speedup == \
        pytest.approx(10.0 / 5.0)
    assert build_table(results, ["a", "b"], [1], "a", "p99").rows[0].cells[1].speedup == \
        pytest.approx(22.0 / 12.0)


def test_failed_requests_are_not_averaged_away():
    results = [res("a", 1, 0, 10.0), res("a", 1, 1, 10.0, "failed_requests", 2, 1),
               res("b", 1, 0, 5.0)]
    t = build_table(results, ["a", "b"], [1], "a")
    a = t.rows[0].cells[0]
    assert a.status == "failed_requests" and a.failed == 1 and a.completed == 5
    assert not t.ok
    assert "5/1 FAILED_REQUESTS" in to_markdown(t)
    rows = json.loads(to_json([tpot_table(t)]))[0]["rows"]
    assert [(r["variant"], r["status"], r["failed"]) for r in rows] == [("a", "failed_requests", 1), ("b", "ok", 0)]


def test_missing_result_is_a_row_not_a_gap():
    results = [res("a", 1, 0, 10.0), res("a", 16, 0, 20.0), res("b", 1, 0, 5.0),
               BenchResult(variant="b", concurrency=16, repeat=0, status="missing",
                           error="no result file b-c16-r0.json")]
    t = build_table(results, ["a", "b"], [1, 16], "a")
    assert [r.concurrency for r in t.rows] == [1, 16]
    b16 = t.rows[1].cells[1]
    assert b16.status == "missing" and b16.speedup is None
    md = to_markdown(t)
    assert "| missing |" in md and "no result file b-c16-r0.json" in md and "MISSING" not in md
    from mlabench.serving.table import body
    assert body(t)[1][-6:] == ["missing", "—", "—", "—", "—", "0/0"]  # the report's serving table
    assert not t.ok


def test_never_recorded_cell_is_missing():
    t = build_table([res("a", 1, 0, 10.0)], ["a", "b"], [1], "a")
    assert t.rows[0].cells[1].status == "missing" and not t.ok


def test_baseline_missing_gives_no_speedups():
    t = build_table([res("b", 1, 0, 5.0)], ["a", "b"], [1], "a")
    assert t.rows[0].cells[1].speedup is None


def test_a_tpot_that_measured_nothing_gives_no_speedup():
    zero = res("a", 1, 0, 10.0).model_copy(update={"tpot": MetricStats(mean_ms=0.0)})
    t = build_table([zero, res("b", 1, 0, 5.0)], ["a", "b"], [1], "a")
    assert [c.speedup for c in t.rows[0].cells] == [None, None]  # not 0.00x
    t = build_table([res("a", 1, 0, 10.0), zero.model_copy(update={"variant": "b"})], ["a", "b"], [1], "a")
    assert t.rows[0].cells[1].speedup is None


def test_a_stat_the_results_do_not_hold_is_said_in_a_note():
    """Issue 25 item 10: ``--stat p99`` on a run recorded without p99 printed every cell "—" and no note."""
    results = [r.model_copy(update={"tpot": MetricStats(mean_ms=r.tpot.mean_ms)})
               for r in (res("a", 1, 0, 11.0), res("b", 1, 0, 6.0))]
    said = ("no p99 TPOT in the recorded results (vllm bench serve wrote none: its --metric-percentiles "
            "lacked 99); --stat mean or median reads what was recorded")
    for table in (tpot_table(build_table(results, ["a", "b"], [1], "a", "p99")),
                  tpot_markdown_table(build_table(results, ["a", "b"], [1], "a", "p99"))):
        assert said in table.notes
    assert not tpot_table(build_table(results, ["a", "b"], [1], "a", "mean")).notes


def at(n, result):
    return result.model_copy(update={"input_len": n})


def test_rows_per_input_length_and_concurrency():
    """Several input lengths: a row per (input len, concurrency); speedup within that row only."""
    results = [at(4096, res("asm", 1, 0, 20.0)), at(4096, res("gluon", 1, 0, 10.0)),
               at(100000, res("asm", 1, 0, 87.29)), at(100000, res("gluon", 1, 0, 23.58))]
    t = build_table(results, ["asm", "gluon"], [1], "asm", input_lens=[4096, 100000])
    assert [(r.input_len, r.concurrency) for r in t.rows] == [(4096, 1), (100000, 1)] and t.by_input_len
    assert t.rows[0].cells[1].speedup == pytest.approx(2.0)
    assert t.rows[1].cells[1].speedup == pytest.approx(87.29 / 23.58)
    md = to_markdown(t)
    assert md.splitlines()[0].startswith("| input len | concurrency | asm TPOT mean ms |")
    assert "| 100000 | 1 | 87.29 | 1.00x (base) |" in md
    (tbl,) = json.loads(to_json([tpot_table(t)]))
    assert tbl["title"] == "TPOT by input length and concurrency (speedup vs asm, mean TPOT)"
    assert [(r["input_len"], r["variant"]) for r in tbl["rows"]] == [
        (4096, "asm"), (4096, "gluon"), (100000, "asm"), (100000, "gluon")]


def test_a_missing_length_is_named_in_the_notes():
    t = build_table([at(64, res("a", 1, 0, 10.0))], ["a"], [1], "a", input_lens=[64, 128])
    assert tpot_table(t).notes == ["in=128 c=1 a: missing; no run recorded"] and not t.ok


def test_one_input_length_prints_as_before():
    """A run of one length prints the same whether its results record the length or not; its JSON
    and CSV rows carry the length its results record (a new user found `input len` gone from the
    JSON of the H200 4K repeats)."""
    from mlabench.tables.render import to_csv, to_markdown as one_markdown

    plain = [res("a", 1, 0, 10.0), res("b", 1, 0, 5.0)]
    old = build_table(plain, ["a", "b"], [1], "a")
    new = build_table([at(64, r) for r in plain], ["a", "b"], [1], "a", input_lens=[64])
    assert to_markdown(new) == to_markdown(old) and not new.by_input_len and "input" not in to_markdown(new)
    assert one_markdown(tpot_table(new)) == one_markdown(tpot_table(old))  # what people see of it
    assert [r["input_len"] for r in json.loads(to_json([tpot_table(new)]))[0]["rows"]] == [64, 64]
    assert to_csv(tpot_table(new)).startswith("input_len,concurrency,variant,")
    assert "input_len" not in json.loads(to_json([tpot_table(old)]))[0]["columns"]  # nothing recorded


def test_a_length_a_variant_leaves_out_is_not_run_rather_than_missing():
    results = [at(4096, res("a", 1, 0, 10.0)), at(4096, res("b", 1, 0, 8.0)), at(32768, res("a", 1, 0, 12.0))]
    t = build_table(results, ["a", "b"], [1], "a", input_lens=[4096, 32768],
                    planned={"a": {(4096, 1), (32768, 1)}, "b": {(4096, 1)}})
    assert t.ok
    unplanned = t.rows[1].cells[1]
    assert not unplanned.planned and unplanned.status == "missing"
    md = to_markdown(t)
    assert "not run" in md and "missing" not in md.lower()
    assert [r["variant"] for r in json.loads(to_json([tpot_table(t)]))[0]["rows"]] == ["a", "b", "a"]
    # without the plan (or once the variant ran there) the same gap is missing
    assert not build_table(results, ["a", "b"], [1], "a", input_lens=[4096, 32768]).ok


def test_a_concurrency_a_variant_leaves_out_is_not_run_rather_than_missing():
    from mlabench.serving.config import ServeConfig, Variant
    from mlabench.serving.table import table_of

    conf = ServeConfig(baseline="a", variants=[Variant(name="a", base_url="http://x"),
                                               Variant(name="b", base_url="http://y", concurrencies=[16])])
    t = table_of(conf, [res("a", 1, 0, 10.0), res("a", 16, 0, 20.0), res("b", 16, 0, 18.0)])
    assert t.ok and [c.planned for c in t.rows[0].cells] == [True, False]
    assert tpot_table(t).notes == [] and "not run" in to_markdown(t)
    # once b records a run at c=1 it counts; with no plan the gap is missing
    assert build_table([res("a", 1, 0, 10.0), res("a", 16, 0, 20.0), res("b", 16, 0, 18.0)],
                       ["a", "b"], [1, 16], "a").ok is False


def test_the_markdown_tables_mark_what_failed_or_did_not_run():
    """The table per metric (issue 33) keeps failures visible: a failed cell carries its status in
    every table, a missing one says "missing" (it said MISSING, where the docs say "missing"), one never
    planned "not run", and the reasons are listed under the first table."""
    from mlabench.serving.table import metric_tables

    results = [res("a", 1, 0, 10.0), res("a", 1, 1, 10.0, "failed_requests", 2, 1), res("b", 1, 0, 5.0),
               res("a", 16, 0, 20.0)]
    t = build_table(results, ["a", "b", "c"], [1, 16], "a", planned={"c": {(None, 16)}})
    tpot, ttft, *_, done = metric_tables(t)
    assert tpot.title == "mean TPOT, ms (speedup vs a)" and tpot.columns == ["concurrency", "a", "b", "c"]
    assert tpot.rows == [["1", "10.00 FAILED_REQUESTS", "5.00 (2.00x)", "not run"],
                         ["16", "20.00", "missing", "missing"]]
    assert done.rows[0][1] == "5/1 FAILED_REQUESTS" and ttft.rows[0][2] == "100.00"
    assert "c=16 b: missing; no run recorded" in tpot.notes and not ttft.notes


def test_json_csv_and_the_terminal_carry_the_median_itl():
    """The median ITL (the typical decode step) is in JSON and CSV and is the ITL people see; the mean
    ITL, which is the mean TPOT again, stays in JSON and CSV only."""
    from mlabench.tables.render import to_csv

    r = res("a", 16, 0, 10.0).model_copy(update={"itl": MetricStats(mean_ms=10.0, median_ms=8.0)})
    table = tpot_table(build_table([r], ["a"], [16], "a"))
    (row,) = json.loads(to_json([table]))[0]["rows"]
    assert row["itl_median_ms"] == 8.0 and row["itl_mean_ms"] == 10.0
    assert "itl_median_ms" in to_csv(table).splitlines()[0]
    shown = [table.style(table.columns[i]).header for i in table.shown(human=True)]
    assert "ITL median ms" in shown and "ITL mean ms" not in shown


def test_the_wide_layout_shows_the_median_itl():
    """`mlabench report`'s serving table showed the mean ITL, the mean TPOT again, where serve-bench's
    terminal and per-metric tables show the median ITL, the typical decode step that
    results/h200/serving/README.md reasons with."""
    results = [r.model_copy(update={"itl": MetricStats(mean_ms=r.tpot.mean_ms, median_ms=median)})
               for r, median in ((res("a", 16, 0, 11.25), 8.01), (res("b", 16, 0, 11.81), 9.19))]
    md = to_markdown(build_table(results, ["a", "b"], [16], "b"))
    assert "| concurrency | a TPOT mean ms | a speedup | a TTFT mean ms | a ITL median ms | a out tok/s |" in md
    assert "| 16 | 11.25 | 1.05x | 100.00 | 8.01 | 88.9 | 3/0 | 11.81 | 1.00x (base) | 100.00 | 9.19 |" in md
