"""What :func:`~mlabench.report.figures.plan.plan` returns: a figure to draw (:class:`FigureSpec`)
and a kind the runs cannot give (:class:`Skipped`).

Apart from the planner so that the report's sections, which lay the figures out, import these two
types without the figures' data and drawing modules (and the tuner's search space they read).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class FigureSpec:
    """One figure to draw: its kind, file stem, a caption for reports, a drawing callable, and a
    note ``plot`` prints beside the file it writes ("" for none: e.g. why a serving figure has no
    predicted TPOT although sweep runs were given, which only its caption would say)."""

    kind: str
    stem: str
    caption: str
    draw: Callable[[], Any]
    note: str = ""


@dataclass
class Skipped:
    """A figure kind the runs cannot give, and why."""

    kind: str
    reason: str

    def line(self) -> str:
        """``skipped <kind>: <reason>``, the one line a command prints."""
        return f"skipped {self.kind}: {self.reason}"
