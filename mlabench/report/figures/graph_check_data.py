"""The data of the graph-check figure (issue item g): pure, no matplotlib.

A graph-check result (:class:`mlabench.report.runs.GraphCheckRun`, the table ``mlabench graph-check --save``
writes) holds, per subject (a backend and its parameters), batch size and context length, the
captured graph's µs per call after the per-step refresh, the µs of the same backend prepared
knowing that length (the count tuned for it, timed the same way), their ratio as ``slowdown_pct``,
and whether the replay was correct.  What the table says about its shape and device is in its
notes; this module reads them back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from mlabench.report.figures import style


@dataclass
class SlowdownCurve:
    """One subject at one batch size: ``slowdown_pct[i]`` = 100 * (graph µs / tuned µs - 1) at
    ``contexts[i]`` tokens (None when either was not measured); ``correct[i]`` None when not checked."""

    subject: str
    backend: str
    contexts: list[int]
    slowdown_pct: list[float | None]
    graph_us: list[float | None]
    tuned_us: list[float | None]
    correct: list[bool | None]
    flagged: list[bool]

    def at(self, context_len: int) -> float | None:
        """The slowdown (%) at ``context_len`` tokens; KeyError when that context was not checked."""
        return self.slowdown_pct[self.contexts.index(context_len)]


@dataclass
class GraphCheckData:
    """Figure (g): per batch size, a curve per subject; the flag threshold (%) and where it ran."""

    curves: dict[int, list[SlowdownCurve]]
    tolerance_pct: float | None
    where: str
    capture: str
    sources: list[str] = field(default_factory=list)


_TOLERANCE = re.compile(r"> ?([0-9.]+)% slower than tuned")
_SHAPE = re.compile(r"heads=(\d+) page=(\d+) (\w+)")
_DEVICE = re.compile(r"^device: (.+)$")
_CAPTURE = re.compile(r"captured with (\d+) token\(s\) per request([^,]*)")


def where_text(notes: list[str]) -> str:
    """``NVIDIA H200 · 12 heads · page 64 · bf16`` from a graph-check table's notes (the device only
    where the table recorded it)."""
    device = next((m.group(1) for n in notes if (m := _DEVICE.match(n))), None)
    shape = next((m for n in notes if (m := _SHAPE.search(n))), None)
    parts = [device or "device not recorded in the file"]
    if shape:
        heads, page, dtype = shape.groups()
        parts += [f"{heads} heads", f"page {page}", style.DTYPE_SHORT.get(dtype, dtype)]
    return " · ".join(parts)


def graph_check_slowdown(checks: list[Any]) -> list[GraphCheckData]:
    """The slowdown curves of graph-check results (:class:`mlabench.report.runs.GraphCheckRun`), one
    :class:`GraphCheckData` per shape and device (results with the same notes on those share one)."""
    groups: dict[tuple[str, str], GraphCheckData] = {}
    for check in checks:
        capture = _CAPTURE.search(check.title)
        cap = (f"captured at {capture.group(1)} token{'s' if capture.group(1) != '1' else ''} per request"
               f"{capture.group(2)}" if capture else "captured at small lengths")
        tol = next((float(m.group(1)) for n in check.notes if (m := _TOLERANCE.search(n))), None)
        data = groups.setdefault((where_text(check.notes), cap),
                                 GraphCheckData({}, tol, where_text(check.notes), cap))
        data.sources.append(str(check.path))
        for subject in dict.fromkeys(r["subject"] for r in check.rows):
            for batch in sorted({int(r["batch"]) for r in check.rows if r["subject"] == subject}):
                rows = sorted((r for r in check.rows if r["subject"] == subject and int(r["batch"]) == batch),
                              key=lambda r: int(r["context"]))
                data.curves.setdefault(batch, []).append(SlowdownCurve(
                    subject, subject.split()[0], [int(r["context"]) for r in rows],
                    [r.get("slowdown_pct") for r in rows], [r.get("graph_us") for r in rows],
                    [r.get("tuned_us") for r in rows], [r.get("correct") for r in rows],
                    [bool(r.get("flagged")) for r in rows]))
    return [groups[k] for k in groups if any(c.contexts for cs in groups[k].curves.values() for c in cs)]
