"""``mlabench report``: one document from recorded runs, ready for a pull request.

Markdown (figures as relative links to PNG files written beside it) or a single self-contained HTML
file (figures inline as base64 PNG). Sections: the runs, environment, correctness, latency and the
floor, best split count, padded persistent vs split-KV, serving TPOT, tuned policy and validation,
graph capture (graph-check), and the figures; a section the runs cannot fill says what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlabench.errors import ConfigError
from mlabench.files import make_dir, write_bytes, write_text
from mlabench.report import sections as S
from mlabench.report.document import Block, FigureBlock, to_html_document, to_markdown_document
from mlabench.report.tuning_sections import graph_check_section, tuning_section

FORMATS = {"markdown": "report.md", "html": "report.html"}
FIGURE_DIR = "figures"


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


def write_report(runs: Any, out_dir: Path, fmt: str = "markdown", command: str | None = None) -> Path:
    """Write ``report.md`` (and ``figures/*.png``) or ``report.html`` into ``out_dir``; return its path.

    The report and its figures are derived files: an earlier report in ``out_dir`` is replaced.
    Raises :class:`ConfigError` for an unknown format.
    """
    from mlabench.report.figures.plan import render

    if fmt not in FORMATS:
        raise ConfigError(f"report format must be one of {', '.join(FORMATS)}, got {fmt!r} (report writes one "
                          "document; its --format is the document's file format, not a table's)")
    make_dir(out_dir, "report folder")
    path = out_dir / FORMATS[fmt]
    if fmt == "markdown":
        report = build_report(runs, command=command)
        for fig in report.figures:
            write_bytes(out_dir / FIGURE_DIR / f"{fig.stem}.png", render(fig, "png"), "figure")
        return write_text(path, to_markdown_document(report.blocks, FIGURE_DIR), "report")
    report = build_report(runs, figure_dir=None, command=command)
    pngs = {fig.stem: render(fig, "png") for fig in report.figures}
    return write_text(path, to_html_document(report.blocks, report.title, pngs), "report")
