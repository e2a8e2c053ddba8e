"""One Table type, one set of renderers: what people see, what machines get."""

import csv
import io
import json
from pathlib import Path

import pytest

from mlabench.cli.options import OutputFormat, output_format
from mlabench.errors import ConfigError
from mlabench.tables.render import render, to_csv, to_json, to_markdown, to_rich
from mlabench.tables.table import ColumnStyle, Table


def sample():
    styles = {"ms": ColumnStyle(text=lambda v: f"{v:.2f}", header="time ms", justify="right"),
              "text": ColumnStyle(show="human"), "raw": ColumnStyle(show="machine")}
    t = Table("T", ["group", "ms", "text", "raw"], notes=["a note"], styles=styles, group_by="group")
    t.add_row([1, 1.234, "one", [1, 2]])
    t.add_row([1, 20.0, "two", None], style="red")
    t.add_row([2, 3.0, "three", {"k": 1}])
    return t


def test_people_see_texts_and_headers_machines_see_raw_values():
    t = sample()
    md = to_markdown(t)
    assert md.startswith("**T**\n\n| group | time ms | text |\n|---|---|---|\n| 1 | 1.23 | one |")
    assert "raw" not in md and md.endswith("\n- a note\n")
    (doc,) = json.loads(to_json([t]))
    assert doc["columns"] == ["group", "ms", "raw"] and doc["notes"] == ["a note"]
    assert doc["rows"][0] == {"group": 1, "ms": 1.234, "raw": [1, 2]}
    rows = list(csv.reader(io.StringIO(to_csv(t))))
    assert rows == [["group", "ms", "raw"], ["1", "1.234", "[1, 2]"], ["1", "20.0", ""], ["2", "3.0", '{"k": 1}']]


def test_rich_groups_rows_and_styles_them():
    from rich.console import Console

    console = Console(width=80, record=True, color_system=None)
    console.print(to_rich(sample()))
    text = console.export_text()
    lines = [line for line in text.splitlines() if "one" in line or "two" in line or "three" in line]
    assert lines[0].split()[0] == "1" and lines[1].split()[0] != "1"  # the group value shown once
    assert "time ms" in text and "raw" not in text and "a note" in text
    assert sample().row_styles == [None, "red", None]


def test_rich_prints_titles_notes_and_cells_literally_and_keeps_row_styles():
    from rich.console import Console

    t = Table("a [params] b", ["path", "n"], notes=["cfg[/x]/config.json", "[bold]x\\"])
    t.add_row(["/tmp/exp[red]1", 1], style="red")
    t.add_row(["/tmp/exp[red]1", 2])
    t.notes.append("[/]")
    narrow = to_rich(t, 20)  # the constant path column moves to the caption
    assert str(narrow.caption).endswith("path: /tmp/exp[red]1 (every row)")
    console = Console(width=80, record=True, color_system="truecolor")
    console.print(to_rich(t))
    text = console.export_text(clear=False)
    for literal in ("a [params] b", "/tmp/exp[red]1", "cfg[/x]/config.json", "[bold]x\\", "[/]"):
        assert literal in text
    assert "\x1b[31m" in console.export_text(styles=True)  # the red row stays red


def test_an_empty_title_prints_no_title_line_and_render_joins_tables():
    t = Table("", ["a"], [[1]])
    assert to_markdown(t) == "| a |\n|---|\n| 1 |\n"
    assert render([t, t], "markdown") == to_markdown(t) + "\n" + to_markdown(t)
    assert json.loads(render([t], "json")) == [{"title": "", "columns": ["a"], "rows": [{"a": 1}], "notes": []}]
    with pytest.raises(ValueError):
        render([t], "table")


def test_format_option_and_its_aliases():
    assert output_format(None) == "table"
    assert output_format(None, as_json=True) == "json" and output_format(None, markdown=True) == "markdown"
    assert output_format(OutputFormat.csv) == "csv" and output_format(OutputFormat.json, as_json=True) == "json"
    with pytest.raises(ConfigError, match="choose one of --json and --markdown"):
        output_format(None, True, True)
    with pytest.raises(ConfigError, match="--format csv contradicts --json"):
        output_format(OutputFormat.csv, as_json=True)


H200 = Path(__file__).parents[2] / "results" / "h200" / "kimi-k3-tp8"


def rendered(table, width):
    """What ``--format table`` prints for ``table`` in a terminal ``width`` columns wide."""
    from unittest.mock import patch

    from rich.console import Console

    from mlabench.cli.output import print_wide

    console = Console(width=width, color_system=None, file=io.StringIO())
    print_wide(console, to_rich(table, width))
    return console.file.getvalue()


    from mlabench.cli import output

    buf = io.StringIO()
    with patch.object(output, "out", Console(width=width, color_system=None, file=buf)):
        output.emit([table], "table")
    return buf.getvalue()


def number_texts(table):
    """Every number as people read it in ``table`` (the texts of its numeric columns)."""
    headers, rows = table.texts()
    shown = [table.columns[i] for i in table.shown(human=True)]
    return {row[n] for row in rows for n, c in enumerate(shown) if table.numeric(c) and row[n] != "—"}


def checked_records():
    """Records of a real check on the CPU (the committed H200 run predates the relative verdict)."""
    from mlabench.sweep.check import check_shapes, run_check

    shapes = check_shapes(heads=[2, 4, 6, 8, 10, 12, 14, 16], context_lens=[40, 100], page_size=16)
    return run_check(shapes, ["torch-splitkv"], [3], seed=1)[0]


@pytest.mark.parametrize("which", ["compare", "sweep", "check"])
def test_at_80_columns_numbers_never_wrap(which):
    """Issue 8 item 10: in an 80-column log every number is whole on one line; columns are left
    out (and said so) instead."""
    from mlabench.sweep.check import check_table
    from mlabench.backends import backend_families
    from mlabench.sweep.compare import recorded_records
    from mlabench.sweep.summary import compare_table, sweep_summary

    records = recorded_records([H200])
    table = {"compare": lambda: compare_table(records, backend_families()),
             "sweep": lambda: sweep_summary(records),
             "check": lambda: check_table(checked_records())}[which]()
    text = rendered(table, 80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    words = {w for line in lines for w in line.split()}
    kept = [c for c in table.columns if (table.style(c).header or c).split()[-1] in text]
    shown = number_texts(table) & words
    assert len(shown) > 10 and kept
    if "left out at 80 columns" in text:
        wide = rendered(table, 400)
        assert "left out" not in wide and number_texts(table) <= {w for w in wide.split()}
    else:
        assert number_texts(table) <= words


def test_the_summary_shows_the_splits_that_were_swept():
    from mlabench.sweep.compare import recorded_records
    from mlabench.sweep.summary import sweep_summary

    records = recorded_records([H200])
    swept = sorted({r.params["num_kv_splits"] for r in records if "num_kv_splits" in r.params})
    assert [c for c in sweep_summary(records).columns if c.startswith("µs @")] == [f"µs @{s} splits" for s in swept]
    four = [r for r in records if r.params.get("num_kv_splits") in (1, 4)]
    assert [c for c in sweep_summary(four).columns if c.startswith("µs @")] == ["µs @1 splits", "µs @4 splits"]
    assert [c for c in sweep_summary(records, splits=(4, 7)).columns if c.startswith("µs @")] == ["µs @4 splits"]


@pytest.mark.parametrize("values, texts", [
    ([7.42e-4, 0.0014, 0.5], ["7.42e-04", "1.40e-03", "5.00e-01"]),
    ([14.66, 309.7, 7361.4, None], ["14.7", "309.7", "7361.4", "—"]),
    ([0.0958, 2.0, 4.31], ["0.096", "2.000", "4.310"]),
    ([1.5, 2_000_000.0], ["1.50e+00", "2.00e+06"]),
    ([3, 0.0, "n/a"], ["3", "0", "n/a"]),
    ([1.5, 3, "n/a", None], ["1.50", "3", "n/a", "—"]),  # what is no float keeps its own text
    ([0.001, 0.5], ["0.001", "0.500"]),  # the smallest at exactly 0.001: still fixed point
    ([1e6, 2.5], ["1.00e+06", "2.50e+00"]),  # the largest at exactly 1e6: scientific
])
def test_one_number_format_per_column(values, texts):
    from mlabench.tables.table import column_texts

    assert column_texts(values) == texts


def test_a_column_with_one_value_moves_to_the_caption_when_room_is_short():
    t = Table("", ["name", "n"], [["same-everywhere" * 3, float(i)] for i in range(3)])
    assert "same-everywhere" in rendered(t, 200).splitlines()[3]
    narrow = rendered(t, 30)
    assert "name:same-everywhere" in "".join(narrow.split()) and max(map(len, narrow.splitlines())) <= 30
    assert "0.00" in narrow.split() and "2.00" in narrow.split()


def fitting_table(rows=2):
    """A constant human column, a number column with a three-word header, three droppable ones."""
    styles = {"backend": ColumnStyle(show="human"), "ms": ColumnStyle(header="milliseconds per token"),
              "x": ColumnStyle(drop=1), "y": ColumnStyle(drop=2), "z": ColumnStyle(drop=1),
              "raw": ColumnStyle(show="machine")}
    t = Table("", ["backend", "ms", "x", "y", "z", "raw"], styles=styles)
    for n in range(rows):
        t.add_row(["triton", 1.5 + n, 10 + n, 20 + n, 30 + n, n])
    return t


def fitted(width, rows=2):
    """What ``to_rich`` keeps at ``width``: [(header, fixed width)], its caption, its min width."""
    from mlabench.tables.render import min_width

    rich_table = to_rich(fitting_table(rows), width)
    caption = rich_table.caption and rich_table.caption.plain  # a Text: taken literally
    return [(c.header.plain, c.width) for c in rich_table.columns], caption, min_width(rich_table)


def test_a_narrow_terminal_wraps_headers_then_moves_constant_columns_then_drops_highest_rightmost():
    full = fitted(None)[2]
    whole = [("backend", 7), ("milliseconds per token", 22), ("x", 2), ("y", 2), ("z", 2)]
    assert fitted(full) == (whole, None, full)  # it fits: nothing changes
    cols, caption, wrapped = fitted(full - 1)  # headers wrap to their longest word first
    assert cols == [("backend", 7), ("milliseconds per token", 12), ("x", 2), ("y", 2), ("z", 2)]
    assert caption is None and wrapped < full
    cols, caption, moved = fitted(wrapped - 1)  # then the column of one value moves to the caption
    assert [h for h, _ in cols] == ["milliseconds per token", "x", "y", "z"]
    assert caption == "backend: triton (every row)" and moved < wrapped
    left_out = "left out at {} columns: {} (a wider terminal, or --format markdown / json / csv, shows them)"
    cols, caption, one = fitted(moved - 1)  # then drop 2 before drop 1
    assert [h for h, _ in cols] == ["milliseconds per token", "x", "z"]
    assert caption == "backend: triton (every row)\n" + left_out.format(moved - 1, "y")
    cols, caption, _ = fitted(one - 1)  # of equal drops, the rightmost first
    assert [h for h, _ in cols] == ["milliseconds per token", "x"]
    assert caption.endswith(left_out.format(one - 1, "y, z"))
    cols, caption, _ = fitted(1)  # a column of drop 0 is never left out
    assert [h for h, _ in cols] == ["milliseconds per token"] and caption.endswith(left_out.format(1, "y, z, x"))


def test_a_single_row_moves_no_column_to_the_caption():
    cols, caption, _ = fitted(1, rows=1)  # every column holds one value: none is "constant"
    assert [h for h, _ in cols] == ["backend", "milliseconds per token"]
    assert "every row" not in caption


def test_min_width_of_a_table_wider_than_any_terminal():
    from mlabench.tables.render import min_width

    assert min_width(to_rich(Table("", ["a"], [["x" * 300]]))) >= 300


def test_the_terminal_table_at_20_columns_line_by_line():
    """Title, box, number columns right-aligned and whole, notes then what was moved or left out
    in the left-justified caption: the whole rendering, to the character (trailing blanks cut)."""
    styles = {"tag": ColumnStyle(text=lambda v: ""), "note": ColumnStyle(header="long header words", drop=1),
              "ms": ColumnStyle(header="time ms", justify="right")}
    t = Table("Title", ["name", "tag", "ms", "note"], notes=["first note", "second note"], styles=styles)
    t.add_row(["a", None, 1.25, "x"])
    t.add_row(["bb", None, 10.5, "y"])
    lines = [line.rstrip() for line in rendered(t, 20).splitlines()]
    assert lines == [
        "     Title", "", "          time", "  name      ms", " " + "─" * 14, "  a       1.25",
        "  bb     10.50", "", "first note", "second note", "tag: none (every", "row)",
        "left out at 20", "columns: long", "header words (a", "wider terminal,", "or --format",
        "markdown / json", "/ csv, shows", "them)",
    ]


def test_short_params_abbreviates_names_and_shows_no_params_as_a_dash():
    from mlabench.tables.table import short_params

    assert short_params("head_padding=16 num_kv_splits=4 programs_per_sm=2 x=1") == "pad=16 splits=4 prog/SM=2 x=1"
    assert short_params(None) == "—" and short_params("") == "—"


def test_a_table_that_cannot_fit_runs_past_the_edge_whole():
    """Nothing left to drop (the tuning choice table at 80 columns): the table is printed as wide as
    it needs, every name and number whole on its line, not squeezed to 80 columns with headers one
    letter a line (Rich's print never exceeds its console's width by itself)."""
    table = Table("", ["bucket", "chosen", "chosen µs", "best heuristic", "heuristic µs"],
                  [["129-512", "num_kv_splits=min(ceil(L/330),2)" + "x" * 40, 350.0, "rocm-buckets", 497.0],
                   ["1-128", "num_kv_splits=1", 218.0, "vllm-triton", 218.0]])
    text = rendered(table, 80)
    assert "num_kv_splits=min(ceil(L/330),2)" + "x" * 40 in text
    assert max(len(line) for line in text.splitlines()) > 80
    assert " rocm-buckets " in text and " 497 " in text and " 218 " in text


def grouped_table():
    """A group column, a number column, one of several words, a no-wrap one, a right-justified one."""
    t = Table("", ["group", "n", "words", "flag", "tag"], group_by="group",
              styles={"flag": ColumnStyle(no_wrap=True), "tag": ColumnStyle(justify="right")})
    t.add_row(["a", 1.5, "two wordy-words", "no wrap here", "x"])
    t.add_row(["a", 10.25, "w", "y", "long"], style="red")
    t.add_row(["b", 3.0, "w", "z", "x"])
    return t


def test_a_grouped_table_line_by_line_at_its_narrowest():
    """At its narrowest only the column of several words (longer than a short label) wraps; the group value shows once, a line
    follows each group; numbers stand right-aligned, a right-justified text column too; each row
    keeps its style (a failed one red)."""
    lines = [line.rstrip() for line in rendered(grouped_table(), 1).splitlines()]
    assert lines == [
        "", "  group       n   words         flag            tag", " " + "─" * 51,
        "  a        1.50   two           no wrap here      x", "                  wordy-words",
        "          10.25   w             y              long", "",
        "  b        3.00   w             z                 x", "",
    ]
    assert [line.rstrip() for line in rendered(grouped_table(), 200).splitlines()][3] == \
        "  a        1.50   two wordy-words   no wrap here      x"
    assert [row.style for row in to_rich(grouped_table()).rows] == [None, "red", None]


def test_a_table_wider_than_the_terminal_runs_past_its_edge_with_every_number_whole():
    """Nothing can be left out: the table is printed as wide as it needs (the terminal wraps the
    lines, a log keeps them), never squeezed into the terminal with numbers cut short."""
    t = Table("", ["name", "ms"], [["a-name-too-long-for-the-terminal", 1.5], ["b", 10.25]])
    lines = [line.rstrip() for line in rendered(t, 20).splitlines()]
    assert lines[3:5] == ["  a-name-too-long-for-the-terminal    1.50", "  b                                  10.25"]


def test_json_is_indented_for_people_and_params_leave_unset_options_out():
    from mlabench.tables.table import params_label

    t = Table("T", ["a", "note"], [[1, "x"]], styles={"note": ColumnStyle(show="human")})
    assert to_json([t]) == ('[\n  {\n    "title": "T",\n    "columns": [\n      "a"\n    ],\n    "rows": [\n'
                            '      {\n        "a": 1\n      }\n    ],\n    "notes": []\n  }\n]')
    assert params_label({"split_policy": "", "num_kv_splits": 4}) == "num_kv_splits=4"
    assert params_label({"split_policy": ""}) == "—"


def test_a_header_word_is_never_split_however_narrow_the_column():
    """Issue 35 item 17: a heuristic's column (cells of two words) was narrowed below its header's
    name, which then folded as "aiter-gluon-0.1.2" / "0" in tune --validate's held-out table."""
    from rich.console import Console

    from mlabench.tables.render import min_width

    names = ["aiter-gluon-0.1.20", "vllm-triton", "sglang", "flashinfer"]
    table = Table("Held-out points", ["batch", "context", "policy %", *(f"{h} (splits) %" for h in names)])
    table.rows = [[1, 1000 + i, 0.5, *(f"{13.1 * i:.1f} ({i + 8})" for _ in names)] for i in range(3)]
    for width in (80, 120):
        rich_table = to_rich(table, width=width)
        console = Console(width=max(width, min_width(rich_table)), file=io.StringIO())
        console.print(rich_table)
        assert "aiter-gluon-0.1.20" in console.file.getvalue(), console.file.getvalue()


def test_a_short_label_is_never_split_and_headers_wrap_one_at_a_time():
    """Issue 33: the prediction table's "step from" column ("TPOT", "p50 ITL") was squeezed to
    "p50" / "ITL" on two lines (its header too) a few columns short of the table's width; now a
    short label stays whole, and headers wrap one at a time, the one that saves most first."""
    t = Table("", ["variant", "step_from", "ms", "pct"], [["fa3", "TPOT", 1.5, 2.0], ["fa3", "p50 ITL", 2.5, 3.0]],
              styles={"step_from": ColumnStyle(header="step from"), "ms": ColumnStyle(header="measured step ms"),
                      "pct": ColumnStyle(header="TPOT outside step %")})
    from mlabench.tables.render import min_width

    full = min_width(to_rich(t))
    assert "TPOT outside step %" in rendered(t, full)
    text = rendered(t, full - 1)  # one header wraps, the one that saves most; the others stay whole
    assert "measured step ms" in text and "TPOT outside step %" not in text and "  step %" in text
    for width in (full - 1, 30, 20):
        assert "p50 ITL" in rendered(t, width), rendered(t, width)
