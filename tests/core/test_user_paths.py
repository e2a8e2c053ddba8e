"""Every path a user gives, unreadable or unwritable: one ``error:`` line and exit 2 from every
command (issue 8 item 7), never a traceback."""

from pathlib import Path

import pytest

from mlabench.errors import FileAccessError
from tests.cli.test_cli import run

RUN = Path(__file__).parent.parent / "report" / "fixtures" / "h200-kimi-k3-tp8"


@pytest.fixture
def bad(tmp_path):
    """``binary`` (not UTF-8), ``folder`` (empty), ``missing``, ``under_file`` (a file as a parent
    folder), ``garbled_run`` (a run folder whose manifest and results are not text)."""
    (tmp_path / "binary").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "folder").mkdir()
    (tmp_path / "a_file").write_text("x")
    garbled = tmp_path / "garbled_run"
    garbled.mkdir()
    for name in ("manifest.json", "results.jsonl"):
        (garbled / name).write_bytes(bytes(range(256)))
    return {"binary": tmp_path / "binary", "folder": tmp_path / "folder", "missing": tmp_path / "missing",
            "under_file": tmp_path / "a_file" / "out", "garbled_run": garbled}


CASES = [
    (["check", "--model-config", "{binary}"], "model config is not a text file"),
    (["check", "--model-config", "{folder}"], "model config not found"),
    (["sweep", "--config", "{binary}"], "sweep config is not a text file"),
    (["sweep", "--config", "{folder}"], "sweep config is a folder"),
    (["sweep", "--model-config", "{binary}", "--results-dir", "{folder}"], "model config is not a text file"),
    (["sweep", "--resume", "{garbled_run}"], "run manifest is not a text file"),
    (["compare", "--from", "{garbled_run}"], "is not a text file"),
    (["compare", "--from", "{binary}"], "no run folder (results.jsonl, manifest.json)"),
    (["serve-bench", "{binary}"], "serve config is not a text file"),
    (["serve-bench", "{folder}"], "serve config is a folder"),
    (["serve-bench", "--from-run", "{garbled_run}"], "not a text file"),
    (["serve-bench", "--from-run", "{missing}"], "not found"),
    (["serve-check", "--base-url", "http://127.0.0.1:9", "--fixture", "{binary}"], "fixture is not a text file"),
    (["serve-check", "--base-url", "http://127.0.0.1:9", "--fixture", "{folder}"], "fixture is a folder"),
    (["plot", "--from", str(RUN), "--out", "{under_file}"], "figure folder is not a folder"),
    (["report", "--from", str(RUN), "--out", "{under_file}"], "a_file is a file"),
    (["report", "--from", "{garbled_run}"], "is not a text file"),
]


@pytest.mark.parametrize("args, message", CASES, ids=[" ".join(a[:2]) + f" {m[:20]}" for a, m in CASES])
def test_unreadable_or_unwritable_paths_are_one_line_exit_2(bad, monkeypatch, capsys, args, message):
    code, out, err = run([a.format(**bad) for a in args], monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err


def test_a_sweep_into_a_results_dir_that_is_a_file_writes_nothing(bad, monkeypatch, capsys):
    code, _, err = run(["sweep", "--heads", "12", "--backend", "torch-splitkv", "--context", "32", "--splits", "1",
                        "--page-size", "16", "--budget-s", "0.05", "--results-dir", str(bad["under_file"])],
                       monkeypatch, capsys)
    assert code == 2 and err.strip().startswith("error: run folder is not a folder"), err
    assert len(err.strip().splitlines()) == 1


def test_a_prompt_file_that_is_binary_is_one_line(bad, tmp_path):
    cfg = tmp_path / "serve.toml"
    cfg.write_text(f'baseline = "a"\n[check]\nprompt_file = "{bad["binary"]}"\n'
                   '[[variants]]\nname = "a"\nbase_url = "http://127.0.0.1:9"\n')
    from mlabench.serving.config import load_config, prompt_text

    with pytest.raises(FileAccessError, match="check.prompt_file is not a text file"):
        prompt_text(load_config(cfg).check)


def test_graph_check_and_tune_read_their_files_with_one_line(bad, monkeypatch, capsys):
    for args, message in ((["graph-check", "--policy", "{binary}"], "split policy is not a text file"),
                          (["tune", "--validate", "{binary}"], "policy is not a text file"),
                          (["tune", "--export", "{garbled_run}"], "run manifest is not a text file"),
                          (["diff", "{garbled_run}", "{garbled_run}"], "is not a text file")):
        code, _, err = run([a.format(**bad) for a in args], monkeypatch, capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, (args, err)


def test_a_file_in_the_way_of_a_folder_is_the_path_named(tmp_path, monkeypatch, capsys):
    """A fresh user's review: a report folder whose ``figures`` was a file said "figure exists
    already as a file: .../figures/latency-vs-context.png", naming the figure, not the file in the way."""
    (tmp_path / "rep").mkdir()
    (tmp_path / "rep" / "figures").write_text("x")
    code, _, err = run(["report", "--from", str(RUN), "--out", str(tmp_path / "rep")], monkeypatch, capsys)
    assert code == 2 and f"its folder {tmp_path / 'rep' / 'figures'} exists already as a file" in err, err


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc (no folder can be made in it)")
@pytest.mark.parametrize("args, message", [
    (["report", "--from", str(RUN), "--out", "/proc/mlabench-x"], "report /proc/mlabench-x/report.md: "),
    (["report", "--from", str(RUN), "--out", "/proc/mlabench-x.md"], "report /proc/mlabench-x.md: "),
    (["sweep", "--heads", "12", "--backend", "torch-splitkv", "--context", "32", "--splits", "1", "--page-size", "16",
      "--budget-s", "0.05", "--results-dir", "/proc/mlabench-x"], "its folder /proc/mlabench-x could not be created there"),
])
def test_a_folder_that_cannot_be_made_is_not_called_missing(monkeypatch, capsys, args, message):
    """A fresh user's review: ``--results-dir /proc/x`` said "its folder /proc/x not found" and
    ``report --out /proc/x`` "report folder not found", where both commands make missing folders;
    ``report --out /proc/x.md`` named its figure folder, /proc/x-figures (the next review).  The
    report is refused before anything is written: nothing can be created in /proc (permission
    denied where root may write there)."""
    code, _, err = run(args, monkeypatch, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    if args[0] == "report":
        assert err.strip().endswith(("nothing can be created in /proc", "permission denied")), err


def test_the_writability_probe_leaves_nothing_and_names_a_folder_without_permission(tmp_path):
    """check_writable makes a probe file where the output would go and removes it; a folder that
    refuses new files is refused in one line (graph-check's --save before any GPU work)."""
    import os

    from mlabench.files import check_writable

    check_writable(tmp_path / "new" / "out.json", "--save")
    assert list(tmp_path.iterdir()) == []  # no probe file, no folder made
    (tmp_path / "kept.json").write_text("x")
    check_writable(tmp_path / "kept.json", "--save")
    assert (tmp_path / "kept.json").read_text() == "x"  # opened for appending, nothing written
    if os.geteuid() != 0:  # root writes in a read-only-mode folder
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(FileAccessError, match=f"--save {locked}/x.json: permission denied"):
            check_writable(locked / "x.json", "--save")
