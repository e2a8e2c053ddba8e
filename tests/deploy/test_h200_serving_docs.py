"""The serving numbers of README.md and results/h200/serving/README.md are what the commands those
pages give print from the committed runs (`serve-bench --from-run`, `--predict-from`), to the digits
shown: a number the command does not print is a bug of the page."""

import json
import re
from pathlib import Path

import pytest

from tests.cli.test_cli import run

REPO = Path(__file__).resolve().parents[2]
SERVING = REPO / "results/h200/serving"
#: runs 1 and 4: every variant at every point, the qo1 and the qo1-k3 policy
RUN1 = SERVING / "serve-20261204T182027Z-h200-proxy"
RUN4 = SERVING / "serve-20261205T180702Z-h200-proxy"
SWEEPS1 = [SERVING / "sweep/kimi-k3-tp8-serving-20261204-211036-1205",
           SERVING / "sweep/kimi-k3-tp8-serving-host-20261204-211057-1293",
           SERVING / "sweep/kimi-k3-tp8-serving-20261204-213747-742"]
#: the order of the serving README's command: the qo1-k3 sweeps of gluon-splitkv first
SWEEPS4 = [SERVING / "sweep/kimi-k3-tp8-serving-20261205-150939-643",
           SERVING / "sweep/kimi-k3-tp8-serving-host-20261205-151010-724", SWEEPS1[0], SWEEPS1[2]]
CONFIG1 = REPO / "configs/serve/h200-kimi-k3-tp8-proxy.toml"
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


def _printed(monkeypatch, capsys, config, run_dir, sweeps, failed=""):
    """``(serve table rows, prediction rows)`` as `serve-bench [CONFIG] --from-run RUN --predict-from
    SWEEP... --json` prints them, each keyed by (input length, concurrency, variant); ``failed``: the
    line it ends with where a planned point has no result (exit 1)."""
    code, out, err = run([*(["serve-bench", str(config)] if config else ["serve-bench"]), "--from-run", str(run_dir),
                          *[a for s in sweeps for a in ("--predict-from", str(s))], "--json"], monkeypatch, capsys)
    assert (code, failed in err) == ((1, True) if failed else (0, True)), err
    serve, prediction = json.loads(out)
    return ({(r["input_len"], r["concurrency"], r["variant"]): r for r in serve["rows"]},
            {(r["input_len"], r["concurrency"], r["variant"]): r for r in prediction["rows"]})


@pytest.fixture
def printed(monkeypatch, capsys, tmp_path):
    """Run 1's rows, with the config of its policy's serving: the committed one with the host counts
    of the qo1 policy (108 and 16 splits) and mlabench's policy by a pattern, which is what the
    serving README's `git show` gives."""
    text = CONFIG1.read_text()
    line = "by_concurrency = { 1 = { num_kv_splits = 96 }, 16 = { num_kv_splits = 8 } }"
    assert line in text
    config = tmp_path / "qo1.toml"
    served = 'split_policy = "device:{env:MLABENCH_SPLIT_POLICY}"'  # run 1 recorded no launch env
    assert served in text
    config.write_text(text.replace(line, "by_concurrency = { 1 = { num_kv_splits = 108 }, 16 = { num_kv_splits = 16 } }")
                      .replace(served, 'split_policy = "device:*"'))
    monkeypatch.setenv("MLABENCH_PROXY_MODEL_DIR", str(tmp_path))
    monkeypatch.setenv("MLABENCH_SERVE_POLICY", str(tmp_path))
    return _printed(monkeypatch, capsys, config, RUN1, SWEEPS1)


@pytest.fixture
def printed4(monkeypatch, capsys):
    """Run 4's rows, its recorded [prediction] (the serving README's command): every planned point
    has a result, so it exits 0."""
    return _printed(monkeypatch, capsys, None, RUN4, SWEEPS4)


def _check_tpot_table(serve, header, rows, columns=None):
    for row in rows:
        for name, cell in zip(header[2:], row[2:]):
            key = (int(row[0]), int(row[1]), (columns or {}).get(name, name))
            want = "not run" if key not in serve else "missing" if serve[key]["tpot_mean_ms"] is None else \
                f"{serve[key]['tpot_mean_ms']:.2f}"
            assert cell == want, (row, name)


def test_the_readmes_tpot_table_is_run_4(printed4):
    text = (REPO / "README.md").read_text()
    header, *rows = _table_after(text, "## End to end")
    assert sorted((r[0], r[1]) for r in rows) == sorted((n, c) for n in ("4096", "32768", "100000") for c in ("1", "16"))
    _check_tpot_table(printed4[0], header, rows, README_COLUMNS)
    # README once said "11 of 12" (counting mlabench's own 4K row, 0 by construction); run 4's
    # prediction has 24 points besides mlabench's two 4K rows
    assert "within 10% of the server at all 24 points" in " ".join(text.split())


def test_the_serving_readmes_tpot_table_is_run_4(printed4):
    text = (SERVING / "README.md").read_text()
    header, *rows = _table_after(text, "## Every variant")
    assert len(rows) == 6
    _check_tpot_table(printed4[0], header, rows)


def test_the_serving_readmes_prediction_table_is_the_command(printed4):
    _, prediction = printed4
    text = (SERVING / "README.md").read_text()
    header, *rows = _table_after(text, "## Predicted from")
    assert header[:3] == ["input tokens", "conc", "variant"] and len(rows) == 24
    for n, conc, variant, us, predicted, measured, error, outside in rows:
        r = prediction[(int(n), int(conc), variant)]
        assert [us, predicted, measured] == [f"{r['attention_us']:.1f}", f"{r['predicted_ms']:.2f}",
                                             f"{r['measured_ms']:.2f}"], variant
        assert error == f"{r['error_pct']:+.1f}" and float(outside) == round(r["outside_step_pct"], 1), variant
    errors = [r["error_pct"] for r in prediction.values() if r["error_pct"] is not None]
    # the reference's own two 4K rows (0 by construction) are left out of the page
    assert len(errors) == 26 and all(abs(e) <= 10 for e in errors)
    assert "All 24 predictions are within 10% of the server" in " ".join(text.split())
    assert f"--from-run {RUN4.relative_to(REPO)}" in text


def test_run_1s_predictions_are_within_10_percent(printed):
    _, prediction = printed
    errors = [r["error_pct"] for r in prediction.values() if r["error_pct"] is not None]
    assert len(errors) == 26 and all(abs(e) <= 10 for e in errors)  # with mlabench's two 4K rows, 0 by construction
