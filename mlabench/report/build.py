"""``mlabench report``: one document from recorded runs, ready for a pull request.

Markdown (figures as relative links to PNG files written beside it) or a single self-contained HTML
file (figures inline as base64 PNG). Sections: the runs, environment, correctness, latency and the
floor, best split count, padded persistent vs split-KV, serving TPOT, tuned policy and validation,
graph capture (graph-check), and the figures; a section the runs cannot fill says what is missing.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlabench.errors import ConfigError
from mlabench.files import check_writable, make_dir, read_text, user_path, write_bytes, write_text
from mlabench.report import sections as S
from mlabench.report.document import Block, FigureBlock, to_html_document, to_markdown_document
from mlabench.report.tuning_sections import graph_check_section, tuning_section

FORMATS = {"markdown": "report.md", "html": "report.html"}
FIGURE_DIR = "figures"
#: ``report --out`` file suffixes and the format each implies.
SUFFIX_FORMATS = {".md": "markdown", ".html": "html"}


@dataclass
class Report:
    """A built report: its title, blocks, and the figure kinds that could not be drawn."""

    title: str
    blocks: list[Block]
    skipped: list[Any]

    @property
    def figures(self) -> list[FigureBlock]:
        """The report's figures, in document order."""
        return [b for b in self.blocks if isinstance(b, FigureBlock)]


def build_report(runs: Any, families: dict[str, str] | None = None, figure_dir: str | None = FIGURE_DIR,
                 command: str | None = None) -> Report:
    """The report of ``runs`` (a :class:`mlabench.report.runs.Runs`); figures are planned, not yet drawn.

    ``command``, when given, is shown as the command that made the report.
    """
    from mlabench.report.figures.plan import plan
    from mlabench.backends import backend_families

    families = families if families is not None else backend_families()
    specs, skipped = plan(runs, families=families)
    title = S.report_title(runs)
    blocks = (S.header(runs, title, command) + S.environment(runs) + S.kernel_sections(runs, families, specs)
              + S.serving_section(runs, specs) + tuning_section(runs, specs) + graph_check_section(runs, specs)
              + S.figures_section(specs, skipped, figure_dir))
    return Report(title, blocks, skipped)


def report_target(out: Path | str, fmt: str | None) -> tuple[Path, str, Path]:
    """Where ``report --out OUT`` writes: ``(document path, format, figure folder)``.

    ``out`` is a folder (``report.md`` and ``figures/`` or ``report.html`` inside, in ``fmt``,
    default markdown), or a file named ``*.md`` or ``*.html``: the format then follows the suffix,
    and a markdown file's figures go to ``<stem>-figures/`` beside it, so two reports in one folder
    keep their own.  A trailing ``/`` (``new.md/``) always means a folder.  Raises
    :class:`ConfigError` for an unknown format, a file suffix that contradicts ``fmt``, a file name
    that is a folder already, a folder name (trailing ``/``) that is a file, or a document path where
    a file stands that is no report mlabench wrote (a user's file is never overwritten)."""
    if fmt is not None and fmt not in FORMATS:
        raise ConfigError(f"report format must be one of {', '.join(FORMATS)}, got {fmt!r} (report writes one "
                          "document; its --format is the document's file format, not a table's)")
    as_folder = str(out).endswith(("/", os.sep))
    out = Path(out)
    implied = None if as_folder else SUFFIX_FORMATS.get(out.suffix.lower())
    if implied is None:
        if as_folder and out.is_file():
            raise ConfigError(f"--out {out}/ ends in / (a folder) and {out} is a file: drop the / to write that "
                              "file, or name another folder")
        path = out / FORMATS[fmt or "markdown"]
        _refuse_users_file(path)
        return path, fmt or "markdown", out / FIGURE_DIR
    if out.is_dir():
        raise ConfigError(f"--out {out} names a {implied} file and is a folder (an older report's?): remove it, "
                          f"name another file, or give --out {out}/ to write inside it")
    if fmt is not None and fmt != implied:
        raise ConfigError(f"--out {out} names a {implied} file and --format says {fmt}: give a {fmt} file name "
                          f"or a folder")
    _refuse_users_file(out)
    return out, implied, figures_beside(out)


def default_out(source: Path, fmt: str | None) -> Path:
    """``report``'s ``--out`` when none is given, from the first ``--from`` ``source``: that folder
    (``report.md`` and ``figures/`` inside), or for a file (a graph-check JSON) ``<stem>.md``
    (``<stem>.html`` with ``--format html``) beside it, its figures in ``<stem>-figures/`` as ``plot``
    draws them.  Raises :class:`ConfigError` where that document stands already and is no report
    mlabench wrote (a user's file is never overwritten unasked)."""
    if not source.is_file():
        return source
    out = source.with_suffix(".html" if fmt == "html" else ".md")
    _refuse_users_file(out, f"the default report of {source} would be {out}, which is no mlabench report: "
                            "pass --out")
    return out


def default_figure_dir(source: Path) -> Path:
    """``plot``'s ``--out`` when none is given: ``<source>/figures`` for a folder, ``<stem>-figures/``
    beside a file (a graph-check JSON), where ``report`` of that file puts its figures too."""
    return figures_beside(source) if source.is_file() else source / FIGURE_DIR


def figures_beside(path: Path) -> Path:
    """The figure folder of a report file or graph-check JSON ``path``: ``<stem>-figures/`` beside it."""
    return path.with_name(f"{path.stem}-{FIGURE_DIR}")


def _refuse_users_file(path: Path, error: str | None = None) -> None:
    """Raise :class:`ConfigError` (``error``, else a line naming ``path``) where a file stands at
    ``path`` that is no report mlabench wrote; an earlier report there is regenerated in place."""
    if path.is_file() and not _is_report(path):
        raise ConfigError(error or f"{path} stands already and is no mlabench report: report does not overwrite "
                                   "it; move it, or give --out another file or folder")


def _is_report(path: Path) -> bool:
    """Whether ``path`` is a document ``report`` wrote (its title says ``mlabench report``)."""
    try:
        with path.open(encoding="utf-8") as f:
            head = f.read(4096)
    except (OSError, UnicodeError):
        return False
    return head.startswith("# mlabench report") or "<title>mlabench report" in head


def write_report(runs: Any, out: Path | str, fmt: str | None = "markdown", command: str | None = None) -> Path:
    """Write the report of ``runs`` where :func:`report_target` says (markdown with ``figures/*.png``,
    or one self-contained HTML file); return the document's path.

    The report and its figures are derived files: an earlier report there is replaced, and the
    figures it linked that the new one has not are removed (:func:`earlier_figures`); nothing else
    in the figure folder is touched.  Raises :class:`ConfigError` as :func:`report_target` does, and
    :class:`FileAccessError` before anything is written where the document could not be
    (:func:`~mlabench.files.check_writable`).
    """
    from mlabench.report.figures.plan import render

    path, fmt, figure_dir = report_target(out, fmt)
    check_writable(path, "report")  # before the figures: /proc/x.md named /proc/x-figures/ as the culprit
    make_dir(path.parent, "report folder")
    if fmt == "markdown":
        earlier = earlier_figures(path, figure_dir)
        report = build_report(runs, figure_dir=figure_dir.name, command=command)
        for fig in report.figures:
            write_bytes(figure_dir / f"{fig.stem}.png", render(fig, "png"), "figure")
        written = write_text(path, to_markdown_document(report.blocks, figure_dir.name), "report")
        for name in sorted(earlier - {f"{fig.stem}.png" for fig in report.figures}):
            with user_path(figure_dir / name, "earlier report's figure"):
                (figure_dir / name).unlink(missing_ok=True)
        return written
    report = build_report(runs, figure_dir=None, command=command)
    pngs = {fig.stem: render(fig, "png") for fig in report.figures}
    return write_text(path, to_html_document(report.blocks, report.title, pngs), "report")


#: A markdown image link, ``![alt](target)``.
_IMAGE_LINK = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def earlier_figures(path: Path, figure_dir: Path) -> set[str]:
    """The file names of the figures that the markdown report standing at ``path`` (if it is one
    mlabench wrote) links in ``figure_dir``: PNG files directly inside it, each a regular file (no
    folder, no symbolic link).  Those are the files that report wrote; anything else in the folder
    (``plot``'s other figures, a user's files) is not among them."""
    if not path.is_file() or not _is_report(path):
        return set()
    names = set()
    for link in _IMAGE_LINK.findall(read_text(path, "earlier report")):
        folder, _, name = link.partition("/")
        target = figure_dir / name
        if (folder == figure_dir.name and name.endswith(".png") and "/" not in name and "\\" not in name
                and not name.startswith(".") and target.is_file() and not target.is_symlink()):
            names.add(name)
    return names
