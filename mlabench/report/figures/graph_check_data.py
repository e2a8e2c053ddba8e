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
    #: What tells this figure from the others, as file-name words: ``device``, ``heads``, ``page``,
    #: ``dtype`` and ``qo`` (the tokens per request captured), e.g. ``{"qo": "qo4", "heads": "h12"}``.
    facets: dict[str, str] = field(default_factory=dict)


def figure_stems(groups: list[GraphCheckData]) -> list[str]:
    """File stems of the figures of ``groups``: ``graph-check`` for one, else ``graph-check-`` and
    the facets that differ between them (``graph-check-qo1``, ``graph-check-qo4``), so that a reader
    knows from the names what differs; a number only where the facets do not tell them apart."""
    if len(groups) == 1:
        return ["graph-check"]
    keys = [k for k in dict.fromkeys(k for g in groups for k in g.facets)
            if len({g.facets.get(k, "") for g in groups}) > 1]
    stems = ["-".join(["graph-check", *(g.facets[k] for k in keys if g.facets.get(k))]) for g in groups]
    if len(set(stems)) < len(stems):
        return [f"{stem}-{i + 1}" for i, stem in enumerate(stems)]
    return stems


_TOLERANCE = re.compile(r"> ?([0-9.]+)% slower than tuned")
_SHAPE = re.compile(r"heads=(\d+) page=(\d+) (\w+)")
_DEVICE = re.compile(r"^device: (.+)$")
_CAPTURE = re.compile(r"captured with (\d+) token\(s\) per request([^,]*)")


#: Flagged points of one curve closer than this ratio of lengths (64K, 100K, 128K on a log axis)
#: take turns above and below: their labels, all above, printed over each other.
CLOSE_CONTEXT_RATIO = 1.6


def label_below(curves: list[SlowdownCurve]) -> set[tuple[str, int]]:
    """``(subject, context)`` of the flagged points whose label goes below the point, not above: along
    a curve, every other one of a run of points closer than :data:`CLOSE_CONTEXT_RATIO`; and at a
    context where several curves are flagged, every one but the highest (+38% was printed over
    +287%)."""
    at: dict[int, list[tuple[float, str]]] = {}
    below: set[tuple[str, int]] = set()
    for c in curves:
        prev: tuple[int, bool] | None = None  # the last labelled context and whether it went below
        for x, y, flagged in zip(c.contexts, c.slowdown_pct, c.flagged):
            if not flagged or y is None:
                continue
            at.setdefault(x, []).append((y, c.subject))
            down = prev is not None and x < prev[0] * CLOSE_CONTEXT_RATIO and not prev[1]
            if down:
                below.add((c.subject, x))
            prev = (x, down)
    return below | {(subject, x) for x, pts in at.items() for _y, subject in sorted(pts)[:-1]}


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


def _facets(notes: list[str], tokens: str | None) -> dict[str, str]:
    """File-name words for a graph-check table's device, shape and captured tokens per request."""
    device = next((m.group(1) for n in notes if (m := _DEVICE.match(n))), None)
    shape = next((m for n in notes if (m := _SHAPE.search(n))), None)
    out = {"device": re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")} if device else {}
    if shape:
        heads, page, dtype = shape.groups()
        out.update(heads=f"h{heads}", page=f"page{page}", dtype=style.DTYPE_SHORT.get(dtype, dtype))
    if tokens:
        out["qo"] = f"qo{tokens}"
    return out


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
                                 GraphCheckData({}, tol, where_text(check.notes), cap,
                                                facets=_facets(check.notes, capture.group(1) if capture else None)))
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
