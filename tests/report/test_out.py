"""Where ``report`` and ``plot`` write: the default beside a graph-check JSON given first, ``--out DIR/``
with its trailing slash, and figures an earlier report wrote that the new one no longer has."""

import shutil
from pathlib import Path

from tests.cli.test_cli import run
from tests.report.conftest import GRAPH_CHECK, H200

CHECK = GRAPH_CHECK / "graph_check_splitkv.json"


def test_report_and_plot_of_a_graph_check_file_write_beside_it(tmp_path, monkeypatch, capsys):
    """A graph-check JSON given first: the default was a folder named as the JSON file ("report folder
    exists already as a file"); now ``<stem>.md`` and ``plot``'s ``<stem>-figures/`` beside it."""
    check = shutil.copy(CHECK, tmp_path)
    code, out, err = run(["report", "--from", str(check)], monkeypatch, capsys)
    assert (code, err) == (0, "") and out.strip() == str(tmp_path / "graph_check_splitkv.md")
    text = (tmp_path / "graph_check_splitkv.md").read_text()
    assert "](graph_check_splitkv-figures/graph-check" in text
    code, out, err = run(["report", "--from", str(check), "--format", "html"], monkeypatch, capsys)
    assert (code, err) == (0, "") and out.strip() == str(tmp_path / "graph_check_splitkv.html")
    (tmp_path / "graph_check_splitkv-figures").rename(tmp_path / "by-report")
    code, out, err = run(["plot", "--from", str(check)], monkeypatch, capsys)
    assert code == 0 and out.split() == [str(p) for p in sorted((tmp_path / "graph_check_splitkv-figures").iterdir())]
    assert (tmp_path / "graph_check_splitkv.json").read_bytes() == CHECK.read_bytes()


def test_the_default_report_of_a_file_leaves_a_users_document_alone(tmp_path, monkeypatch, capsys):
    """Where ``<stem>.md`` stands and is no report mlabench wrote, one error line asks for ``--out``."""
    check = shutil.copy(CHECK, tmp_path)
    (tmp_path / "graph_check_splitkv.md").write_text("# my notes on the graph check\n")
    code, out, err = run(["report", "--from", str(check)], monkeypatch, capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "pass --out" in err
    assert (tmp_path / "graph_check_splitkv.md").read_text() == "# my notes on the graph check\n"


def test_out_with_a_trailing_slash_is_a_folder(tmp_path, monkeypatch, capsys):
    """``--out new.md/`` wrote the file ``new.md``; the slash says folder: ``new.md/report.md`` and
    ``new.md/figures/``, an existing folder ``old.html/`` gets ``report.html`` inside, and a file
    standing at a name given with ``/`` is one error line."""
    check = str(GRAPH_CHECK / "graph_check_splitkv.json")
    code, out, err = run(["report", "--from", check, "--out", f"{tmp_path / 'new.md'}/"], monkeypatch, capsys)
    assert (code, err) == (0, "") and out.strip() == str(tmp_path / "new.md" / "report.md")
    assert (tmp_path / "new.md" / "report.md").is_file() and any((tmp_path / "new.md" / "figures").glob("*.png"))
    (tmp_path / "old.html").mkdir()
    code, out, err = run(["report", "--from", check, "--out", f"{tmp_path / 'old.html'}/", "--format", "html"],
                         monkeypatch, capsys)
    assert (code, err) == (0, "") and out.strip() == str(tmp_path / "old.html" / "report.html")
    (tmp_path / "pr.md").write_text("a file\n")
    code, out, err = run(["report", "--from", check, "--out", f"{tmp_path / 'pr.md'}/"], monkeypatch, capsys)
    pr = tmp_path / "pr.md"
    assert code == 2 and out == "" and err.strip() == (f"error: --out {pr}/ ends in / (a folder) and {pr} is a "
                                                       "file: drop the / to write that file, or name another folder")
    assert (tmp_path / "pr.md").read_text() == "a file\n"


def test_a_report_rewritten_removes_only_the_figures_its_earlier_self_wrote(tmp_path, monkeypatch, capsys):
    """``report --out X`` again with fewer runs left the earlier report's figures beside the new ones;
    now those it linked and the new one has not go, and nothing else in the figure folder: ``plot``'s
    SVGs, a user's PNG and notes stay; a user's own document standing as ``report.md`` is refused, and
    the figure it links stays."""
    for out, figures in ((tmp_path / "a", tmp_path / "a" / "figures"), (tmp_path / "pr.md", tmp_path / "pr-figures")):
        both = ["--from", str(H200), "--from", str(CHECK)]
        assert run(["report", *both, "--out", str(out)], monkeypatch, capsys)[0] == 0
        earlier = {p.name for p in figures.glob("*.png")}
        assert len(earlier) > 2 and "graph-check.png" in earlier
        assert run(["plot", "--from", str(H200), "--out", str(figures), "--format", "svg"], monkeypatch, capsys)[0] == 0
        kept = {p.name for p in figures.iterdir() if p.suffix == ".svg"} | {"mine.png", "notes.txt"}
        (figures / "mine.png").write_bytes(b"a user's figure")
        (figures / "notes.txt").write_text("notes\n")
        assert run(["report", "--from", str(CHECK), "--out", str(out)], monkeypatch, capsys)[0] == 0
        assert {p.name for p in figures.iterdir()} == kept | {"graph-check.png"}
    document = tmp_path / "a" / "report.md"
    document.write_text("# my page\n\n![mine](figures/mine.png)\n")
    assert run(["report", "--from", str(CHECK), "--out", str(tmp_path / "a")], monkeypatch, capsys)[0] == 2
    assert document.read_text() == "# my page\n\n![mine](figures/mine.png)\n"
    assert (tmp_path / "a" / "figures" / "mine.png").read_bytes() == b"a user's figure"


def test_out_never_overwrites_a_users_file(tmp_path, monkeypatch, capsys):
    """``--out notes.md`` (or a folder whose ``report.md``, an ``.html``) where a user's own file stands
    replaced it; now one error line and exit 2, the file as it was and no figures written.  A report
    mlabench wrote there earlier is regenerated in place, as before."""
    check = str(CHECK)
    notes = tmp_path / "notes.md"
    (tmp_path / "page").mkdir()
    for target, document in ((notes, notes), (tmp_path / "page", tmp_path / "page" / "report.md"),
                             (tmp_path / "notes.html", tmp_path / "notes.html")):
        document.write_text("# my notes\n")
        code, out, err = run(["report", "--from", check, "--out", str(target)], monkeypatch, capsys)
        assert code == 2 and out == "" and err.strip() == (f"error: {document} stands already and is no mlabench "
                                                           "report: report does not overwrite it; move it, or give "
                                                           "--out another file or folder")
        assert document.read_text() == "# my notes\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.html", "notes.md", "page"]
    assert [p.name for p in (tmp_path / "page").iterdir()] == ["report.md"]
    for target in (tmp_path / "pr.md", tmp_path / "pr.html", tmp_path / "folder"):
        for _ in range(2):
            code, out, err = run(["report", "--from", check, "--out", str(target)], monkeypatch, capsys)
            assert (code, err) == (0, "") and "mlabench report" in Path(out.strip()).read_text()


def test_a_full_disk_leaves_no_empty_report_nor_figure(tmp_path, monkeypatch, capsys):
    """A fresh user's review: ``report`` and ``plot`` on a full disk left 0-byte ``x.html`` and
    figures, and the retry was refused (``x.html stands already and is no mlabench report``).  Each
    file is written through a temporary one renamed over it: nothing is left, and the retry writes."""
    import errno
    import os

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    check = str(GRAPH_CHECK / "graph_check_splitkv.json")
    for i, (command, out) in enumerate((("report", "x.html"), ("report", "rep"), ("plot", "figs"))):
        args, where = [command, "--from", check, "--out", str(tmp_path / str(i) / out)], tmp_path / str(i)
        with monkeypatch.context() as m:
            m.setattr("mlabench.files.os.write", full)
            code, _, err = run(args, monkeypatch, capsys)
        assert code == 3 and "the disk is full" in err, err  # a full disk: this machine cannot go on
        assert [p for p in where.rglob("*") if p.is_file()] == [], args
        code, out, err = run(args, monkeypatch, capsys)
        assert code == 0 and "error" not in err, err
