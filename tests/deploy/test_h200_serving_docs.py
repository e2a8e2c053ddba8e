"""The serving numbers of README.md and results/h200/serving/README.md are what the commands those
pages give print from the committed run (`serve-bench --from-run`, `--predict-from` with the H200
config), to the digits shown: a number the command does not print is a bug of the page."""

import json
import re
from pathlib import Path

import pytest

from tests.cli.test_cli import run

REPO = Path(__file__).resolve().parents[2]
SERVING = REPO / "results/h200/serving"
#: run 1: every variant at every point; run 2: concurrency 16 again after the short-extend change
RUN1 = SERVING / "serve-20261204T182027Z-h200-proxy"
RUN2 = SERVING / "serve-20261204T211104Z-h200-proxy"
SWEEPS = [SERVING / "sweep/kimi-k3-tp8-serving-20261204-211036-1205",
          SERVING / "sweep/kimi-k3-tp8-serving-host-20261204-211057-1293",
          SERVING / "sweep/kimi-k3-tp8-serving-20261204-213747-742"]
CONFIG1 = REPO / "configs/serve/h200-kimi-k3-tp8-proxy.toml"
CONFIG2 = REPO / "configs/serve/h200-kimi-k3-tp8-proxy-c16.toml"
#: README.md names the variants by the vLLM backend they run
README_COLUMNS = {"mlabench plugin": "mlabench", "FLASHMLA": "flashmla", "FLASH_ATTN_MLA": "fa3",
                  "TRITON_MLA": "triton"}


def _table_after(text: str, heading: str) -> list[list[str]]:
    """The cells of the first markdown table after ``heading``, header row first, bold removed."""
    lines = text[text.index(heading):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        if not line.startswith("|---"):
            rows.append([c.strip().strip("*") for c in line.strip("|").split("|")])
    return rows


def _printed(monkeypatch, capsys, config, run_dir):
    """``(serve table rows, prediction rows)`` as `serve-bench CONFIG --from-run RUN --predict-from
    SWEEP... --json` prints them, each keyed by (input length, concurrency, variant)."""
    code, out, err = run(["serve-bench", str(config), "--from-run", str(run_dir),
                          *[a for s in SWEEPS for a in ("--predict-from", str(s))], "--json"], monkeypatch, capsys)
    assert code == 0, err
    serve, prediction = json.loads(out)
    return ({(r["input_len"], r["concurrency"], r["variant"]): r for r in serve["rows"]},
            {(r["input_len"], r["concurrency"], r["variant"]): r for r in prediction["rows"]})


@pytest.fixture
def printed(monkeypatch, capsys):
    """Run 1's rows (its config's [prediction] as committed now)."""
    return _printed(monkeypatch, capsys, CONFIG1, RUN1)


@pytest.fixture
def printed2(monkeypatch, capsys):
    """Run 2's rows."""
    return _printed(monkeypatch, capsys, CONFIG2, RUN2)


def _check_tpot_table(serve, header, rows, columns=None):
    for row in rows:
        for name, cell in zip(header[2:], row[2:]):
            key = (int(row[0]), int(row[1]), (columns or {}).get(name, name))
            assert cell == (f"{serve[key]['tpot_mean_ms']:.2f}" if key in serve else "not run"), (row, name)


def test_the_readmes_tpot_tables_are_the_runs(printed, printed2):
    text = (REPO / "README.md").read_text()
    header, *rows = _table_after(text, "## End to end")
    assert {r[1] for r in rows} == {"1"}
    _check_tpot_table(printed[0], header, rows, README_COLUMNS)
    header, *rows = _table_after(text, "At concurrency 16,")
    assert {r[1] for r in rows} == {"16"} and len(rows) == 3
    _check_tpot_table(printed2[0], header, rows, README_COLUMNS)


def test_the_serving_readmes_tpot_tables_are_the_runs(printed, printed2):
    text = (SERVING / "README.md").read_text()
    _check_tpot_table(printed2[0], *(lambda t: (t[0], t[1:]))(_table_after(text, "## Concurrency 16")))
    _check_tpot_table(printed[0], *(lambda t: (t[0], t[1:]))(_table_after(text, "## Every variant")))


def test_the_serving_readmes_prediction_table_is_the_commands(printed):
    _, prediction = printed
    text = (SERVING / "README.md").read_text()
    header, *rows = _table_after(text, "## Predicted from")
    assert header[:3] == ["input tokens", "conc", "variant"] and len(rows) == 24
    for n, conc, variant, us, predicted, measured, error, outside in rows:
        r = prediction[(int(n), int(conc), variant)]
        assert [us, predicted, measured] == [f"{r['attention_us']:.2f}", f"{r['predicted_ms']:.2f}",
                                             f"{r['measured_ms']:.2f}"], variant
        assert error == f"{r['error_pct']:+.1f}" and float(outside) == round(r["outside_step_pct"], 1), variant
    assert all(abs(r["error_pct"]) <= 10 for r in prediction.values()) and "All 24 predictions are within 10%" in text
    assert f"mlabench serve-bench {CONFIG1.relative_to(REPO)} \\\n      --from-run {RUN1.relative_to(REPO)}" in text


def test_run_2s_predictions_from_the_same_sweeps_are_within_10_percent(printed2):
    _, prediction = printed2
    assert prediction and all(abs(r["error_pct"]) <= 10 for r in prediction.values() if r["error_pct"] is not None)
