"""One Table type, one set of renderers: what people see, what machines get."""

import csv
import io
import json

import pytest

from mlabench.cli.options import OutputFormat, output_format
from mlabench.errors import ConfigError
from mlabench.tables import ColumnStyle, Table, render, to_csv, to_json, to_markdown, to_rich


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
    assert lines[0].split()[1] == "1" and lines[1].split()[1] != "1"  # the group value shown once
    assert "time ms" in text and "raw" not in text and "a note" in text
    assert sample().row_styles == [None, "red", None]


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
