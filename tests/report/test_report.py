"""The report: every section in markdown, what is missing said, and the HTML page opened in a real
headless Chromium (non-blank screenshot, every figure loaded)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlabench import cli
from mlabench.report.build import build_report, write_report
from mlabench.report.document import to_markdown_document
from tests.report.conftest import GRAPH_CHECK, H200, REPO, SERVE

SECTIONS = ["# mlabench report: NVIDIA H200 · kimi-k3 TP8", "## Environment", "## Correctness",
            "## Latency and the memory-bandwidth floor", "## Best split count",
            "## Padded persistent vs best split-KV", "## Serving: TPOT by concurrency",
            "## Tuned policy and validation", "## Graph capture: frozen choices (graph-check)", "## Figures"]


def test_markdown_report_has_every_section_and_its_figures(both_runs, tmp_path):
    path = write_report(both_runs, tmp_path, "markdown", command="mlabench report --from x")
    text = path.read_text()
    positions = [text.find(s + "\n") for s in SECTIONS]
    assert -1 not in positions and positions == sorted(positions), dict(zip(SECTIONS, positions))
    links = re.findall(r"!\[[^\]]*\]\((figures/[^)]+\.png)\)", text)
    assert len(links) == 6 and all((tmp_path / link).stat().st_size > 10_000 for link in links)
    assert "NVIDIA H200 (sm_90, 132 SMs, 140 GiB)" in text and "580.159.04" in text
    assert "SM 1980 MHz, memory 3201 MHz" in text and "4.18 TB/s" in text and "mlabench report --from x" in text
    assert "| triton-splitkv | 12 | 72 | 72 | 0 |" in text  # correctness: 12 configurations, 72 points
    # best split at batch 1, 128K: 256 splits, 71.7 µs (3 significant digits), 50% of the floor
    assert "| triton-splitkv | 1 | 131072 | num_kv_splits=256 | 71.7 | 2.11 | 50 | 9630 |" in text
    assert "| 16 | 131072 | flashmla | — | 562 |" in text and "| 1.36 |" in text  # compare, speedup to 2 decimals
    assert "| 16 | 19.63 | 1.00x (base) |" in text and "1.34x" in text  # the serve-bench table's own cells
    assert "| running TTFT mean ms | running ITL median ms |" in text
    assert "| 16 | 19.63 | 1.00x (base) | 304.49 | 12.80 |" in text  # the median ITL, not the mean (19.63 again)
    assert "> **Missing:** no tuning run among the folders given" in text


def test_a_report_says_what_is_missing(serve_runs, h200_runs):
    serve_only = to_markdown_document(build_report(serve_runs).blocks)
    assert "> **Missing:** no kernel run (`mlabench sweep`)" in serve_only
    assert "> **Missing:** no kernel sweep records among the folders given" in serve_only
    assert "- skipped latency: no kernel sweep records among the runs given" in serve_only
    assert "![serving-tpot](figures/serving-tpot.png)" in serve_only
    sweep_only = to_markdown_document(build_report(h200_runs).blocks)
    assert "> **Missing:** no serve-bench run among the folders given" in sweep_only
    assert "- skipped serving-tpot: no serve-bench run with a TPOT result" in sweep_only


def chromium():
    """A Chromium executable, or skip saying why (scripts/test.sh installs Debian's chromium)."""
    for name in (os.environ.get("MLABENCH_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    pytest.skip("no chromium here: scripts/test.sh installs it (apt-get install chromium) and could not")


def headless(browser, profile, *args):
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", *args]
    return subprocess.run([browser, *flags], capture_output=True, text=True, timeout=120)


PROBE = ("<script>window.addEventListener('load', () => { const imgs = [...document.images]; "
         "document.body.setAttribute('data-figures', imgs.length + ':' + "
         "imgs.filter(i => i.complete && i.naturalWidth > 0).length); });</script>")


def figures_loaded(browser, page, profile):
    """``(figures, loaded)`` as the browser saw them once the page's load event fired."""
    probe = page.with_name("probe-" + page.name)
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    done = headless(browser, profile, "--virtual-time-budget=10000", "--dump-dom", probe.as_uri())
    found = re.search(r'data-figures="(\d+):(\d+)"', done.stdout)
    assert found, done.stderr[-2000:]
    return int(found[1]), int(found[2])


def test_html_report_opens_in_a_real_browser(all_runs, tmp_path):
    from matplotlib.image import imread

    browser = chromium()
    page = write_report(all_runs, tmp_path / "out", "html")
    html = page.read_text()
    assert sorted(os.listdir(tmp_path / "out")) == ["report.html"]  # one self-contained file
    assert not re.search(r'(src|href)="(?!data:)', html)
    assert figures_loaded(browser, page, tmp_path / "profile") == (11, 11)  # every kind of figure
    shot = tmp_path / "shot.png"
    done = headless(browser, tmp_path / "profile2", "--hide-scrollbars", "--window-size=1280,2400",
                    f"--screenshot={shot}", page.as_uri())
    assert shot.exists(), done.stderr[-2000:]
    pixels = imread(shot)[..., :3]
    assert pixels.shape[:2] == (2400, 1280)
    assert (pixels.min(axis=-1) < 0.8).mean() > 0.03 and pixels.std() > 0.05  # text, tables and figures drawn


def test_the_browser_probe_sees_a_broken_figure(both_runs, tmp_path):
    browser = chromium()
    page = write_report(both_runs, tmp_path, "html")
    text = page.read_text()
    page.write_text(text.replace("data:image/png;base64,", "data:image/png;base64,AAAA", 1))
    assert figures_loaded(browser, page, tmp_path / "profile") == (6, 5)


def test_report_command(tmp_path, monkeypatch, capsys):
    for fmt, name in (("markdown", "report.md"), ("html", "report.html")):
        monkeypatch.setattr(sys, "argv", ["mlabench", "report", "--from", str(H200), "--from", str(SERVE),
                                          "--out", str(tmp_path), "--format", fmt])
        cli.main()
        assert capsys.readouterr().out.strip() == str(tmp_path / name)
    assert f"mlabench report --from {H200} --from {SERVE}" in (tmp_path / "report.md").read_text()
    assert len(list((tmp_path / "figures").glob("*.png"))) == 6
    monkeypatch.setattr(sys, "argv", ["mlabench", "report", "--from", str(H200), "--format", "pdf"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 2 and "report format must be one of markdown, html, got 'pdf' (report writes one document; its --format is the document's file format, not a table's)" in capsys.readouterr().err


def test_report_out_names_a_file(tmp_path, monkeypatch, capsys):
    """``--out pr.html`` writes that file (it made a folder ``pr.html/`` holding ``report.html``);
    ``--out pr.md`` keeps its figures in ``pr-figures/`` beside it, linked from the page."""
    for out, fmt in (("pr.html", []), ("pr.md", []), ("page.html", ["--format", "html"])):
        monkeypatch.setattr(sys, "argv", ["mlabench", "report", "--from", str(H200), "--out", str(tmp_path / out), *fmt])
        cli.main()
        assert capsys.readouterr().out.strip() == str(tmp_path / out) and (tmp_path / out).is_file()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", (tmp_path / "pr.md").read_text())
    assert links and all(link.startswith("pr-figures/") and (tmp_path / link).is_file() for link in links)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.html", "pr-figures", "pr.html", "pr.md"]
    monkeypatch.setattr(sys, "argv", ["mlabench", "report", "--from", str(H200), "--out", str(tmp_path / "x.md"),
                                      "--format", "html"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 2 and f"--out {tmp_path / 'x.md'} names a markdown file and --format says html" in capsys.readouterr().err


def test_report_out_file_names_its_figure_folder_and_refuses_a_folder(tmp_path, monkeypatch, capsys):
    """``--out pr.md``'s figures paragraph names ``pr-figures/``, where they are; ``--out old.html`` where a
    folder ``old.html/`` stands (the old ``--out``'s) is one error line, not a ``report.md`` written inside."""
    monkeypatch.setattr(sys, "argv", ["mlabench", "report", "--from", str(H200), "--out", str(tmp_path / "pr.md")])
    cli.main()
    text = (tmp_path / "pr.md").read_text()
    assert "figures (under pr-figures/):" in text and "(under figures/)" not in text
    (tmp_path / "old.html").mkdir()
    monkeypatch.setattr(sys, "argv", ["mlabench", "report", "--from", str(H200), "--out", str(tmp_path / "old.html")])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 2 and f"--out {tmp_path / 'old.html'} names a html file and is a folder" in capsys.readouterr().err
    assert list((tmp_path / "old.html").iterdir()) == []


def test_report_of_a_tuning_run_and_of_a_validation_run(tmp_path):
    """Tuning runs keep their timing under ``tune``, validation runs under ``validate``: both render."""
    from mlabench.report.build import write_report
    from mlabench.report.runs import load_runs

    base = Path(__file__).resolve().parent / "fixtures" / "h200-tune-first-attempt"
    tune_run = next(base.glob("tune-*"))
    text = write_report(load_runs([tune_run]), tmp_path / "t", "markdown").read_text()
    assert "cold cache (4-64 input copies)" in text and "0.5 s budget per point" in text
    text = write_report(load_runs([next(base.glob("validate-*"))]), tmp_path / "v", "markdown").read_text()
    assert "cold cache (4-64 input copies)" in text and "0.3 s budget per point" in text


def test_html_shows_code_spans_as_code_and_scrolls_a_wide_table():
    """Issue 25 item 14: the HTML report showed literal backticks in its "Missing:" boxes, and a
    21-column table ran past the page."""
    from mlabench.report.document import Missing, Para, TableBlock, to_html_document
    from mlabench.tables.table import Table

    wide = Table("wide", [f"c{i}" for i in range(21)], [list(range(21))])
    page = to_html_document([Missing("run `mlabench sweep`, then pass <its folder> to --from"),
                             Para("a `b` c"), TableBlock(wide)], "t", {})
    assert "`" not in page
    assert "run <code>mlabench sweep</code>, then pass &lt;its folder&gt; to --from" in page
    assert '<div class="wide"><table>' in page and ".wide { overflow-x: auto;" in page


def test_the_clock_row_says_what_its_reading_is():
    """Issue 35 item 7: run-72fb349's records read 345 MHz and 78 W after every point, an idle
    GPU (its points reached 4.3 TB/s): an mlabench that read NVML's first GPU of the host, the
    run on GPU 1.  Such a row says so; records with the clock read while timing show that."""
    from mlabench.records.store import records_of
    from mlabench.report.sections import OLD_OBSERVER_NOTE, clock_row

    old = records_of([REPO / "results/h200/hopper-kernel/run-72fb349/run"])
    assert clock_row(old) == ["SM clock after each point", f"345 MHz ({OLD_OBSERVER_NOTE})"]
    after = {"sm_clock_mhz": 1980, "at_s": 1.0}
    assert clock_row([old[0].model_copy(update={"gpu_state": after})]) == ["SM clock after each point", "1980 MHz"]
    during = [old[i].model_copy(update={"gpu_state": after, "gpu_state_during": {"sm_clock_mhz": mhz}})
              for i, mhz in ((0, 1965), (1, 1980))]
    assert clock_row(during) == ["SM clock while timing", "1965-1980 MHz"]


def test_a_report_of_a_serve_run_and_its_sweeps_has_the_prediction_table(tmp_path):
    """A new user gave `report` the H200 serve run and its sweeps: the figure had dashes but the
    report no table of the numbers under them, `serve-bench --predict-from`'s."""
    from mlabench.report.runs import load_runs
    from tests.report.serve_runs import PREDICTION, PREDICTION_SWEEP, write_serve_run

    run = write_serve_run(tmp_path, prediction=PREDICTION)
    text = to_markdown_document(build_report(load_runs([run, PREDICTION_SWEEP])).blocks)
    assert "**decode step measured and predicted (61 layers x attention µs + the non-attention time of flashmla" in text
    assert "| input len | concurrency | variant | measured step ms | step from | predicted step ms | error % |" in text
    plain = to_markdown_document(build_report(load_runs([write_serve_run(tmp_path / "plain"), PREDICTION_SWEEP])).blocks)
    assert "decode step measured and predicted" not in plain  # no [prediction]: the caption says why
    assert "decode step measured and predicted" not in to_markdown_document(build_report(load_runs([run])).blocks)


def test_report_from_a_results_folder_reads_the_runs_at_any_depth(tmp_path, monkeypatch, capsys):
    """`report --from results/h200/serving` read its serve-bench runs one level down but not the
    sweep runs of `sweep/<run>`, two levels down: no sweep sections, no prediction table.  Runs are
    found at any depth, never inside a run folder (a run's own subfolders are its own)."""
    from tests.report.serve_runs import PREDICTION, PREDICTION_SWEEP, write_serve_run

    serving = tmp_path / "serving"
    write_serve_run(serving, prediction=PREDICTION)
    sweep = shutil.copytree(PREDICTION_SWEEP, serving / "sweep" / PREDICTION_SWEEP.name)
    write_serve_run(sweep / "kept", name="serve-inside-a-run")  # inside a run folder: not a run of its own
    (serving / "check" / "graphs").mkdir(parents=True)
    shutil.copy(GRAPH_CHECK / "graph_check_splitkv.json", serving / "check" / "graphs")
    monkeypatch.setattr(sys, "argv", ["mlabench", "report", "--from", str(serving), "--out", str(tmp_path / "out")])
    cli.main()
    text = (tmp_path / "out" / "report.md").read_text()
    assert f"- {sweep} (kernel run, " in text and "(serve-bench run)" in text
    assert "serve-inside-a-run" not in text
    assert "## Best split count\n\n**" in text  # the sweep's own section, not "Missing"
    assert "**decode step measured and predicted (61 layers x attention µs" in text
    assert "## Graph capture: frozen choices (graph-check)\n\n**" in text  # a saved table three levels down
