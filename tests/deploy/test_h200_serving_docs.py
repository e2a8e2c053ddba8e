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
RUN = SERVING / "serve-20261204T182027Z-h200-proxy"
SWEEPS = [SERVING / "sweep/kimi-k3-tp8-serving-20261204-181954-1205",
          SERVING / "sweep/kimi-k3-tp8-serving-host-20261204-182017-1293"]
#: the [prediction] the committed table was computed with (flashmla from the flashmla backend; the
#: serve config now predicts it from vllm-flashmla, which these sweeps did not time)
CONFIG = SERVING / "prediction-20261204.toml"
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


@pytest.fixture
def printed(monkeypatch, capsys):
    """``(serve table rows, prediction rows)`` as `serve-bench CONFIG --from-run --predict-from --json`
    prints them, each keyed by (input length, concurrency, variant)."""
    code, out, err = run(["serve-bench", str(CONFIG), "--from-run", str(RUN),
                          *[a for s in SWEEPS for a in ("--predict-from", str(s))], "--json"], monkeypatch, capsys)
    assert code == 0, err
    serve, prediction = json.loads(out)
    return ({(r["input_len"], r["concurrency"], r["variant"]): r for r in serve["rows"]},
            {(r["input_len"], r["concurrency"], r["variant"]): r for r in prediction["rows"]})


def test_the_readmes_tpot_table_is_the_runs(printed):
    serve, _ = printed
    header, *rows = _table_after((REPO / "README.md").read_text(), "## End to end")
    for row in rows:
        for name, cell in zip(header[2:], row[2:]):
            assert cell == f"{serve[(int(row[0]), int(row[1]), README_COLUMNS[name])]['tpot_mean_ms']:.2f}", (row, name)


def test_the_serving_readmes_tpot_table_is_the_runs(printed):
    serve, _ = printed
    header, *rows = _table_after((SERVING / "README.md").read_text(), "## Mean TPOT")
    variants = [h for h in header[2:] if h in {v for _, _, v in serve}]
    for row in rows:
        for name, cell in zip(variants, row[2:]):
            key = (int(row[0]), int(row[1]), name)
            assert cell == (f"{serve[key]['tpot_mean_ms']:.2f}" if key in serve else "not run"), (row, name)


def test_the_serving_readmes_prediction_table_is_the_commands(printed):
    _, prediction = printed
    header, *rows = _table_after((SERVING / "README.md").read_text(), "## Predicted from")
    assert header[:3] == ["input tokens", "conc", "variant"] and len(rows) == 18
    for n, conc, variant, us, predicted, measured, error, outside in rows:
        r = prediction[(int(n), int(conc), variant)]
        assert [us, predicted, measured] == [f"{r['attention_us']:.2f}", f"{r['predicted_ms']:.2f}",
                                             f"{r['measured_ms']:.2f}"], variant
        assert error == f"{r['error_pct']:+.1f}" and float(outside) == round(r["outside_step_pct"], 1), variant
    assert re.search(r"16 of 18 predictions are within 10%", (SERVING / "README.md").read_text())
    assert f"mlabench serve-bench {CONFIG.relative_to(REPO)} \\\n      --from-run {RUN.relative_to(REPO)}" in (
        SERVING / "README.md").read_text()   # the command the page gives is the one checked
    assert sum(abs(prediction[(int(r[0]), int(r[1]), r[2])]["error_pct"]) <= 10 for r in rows) == 16
