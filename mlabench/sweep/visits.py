"""A sweep point measured in several visits spread over the run, and their samples pooled.

Why: on an H200 the same point, measured twice a few hundred milliseconds apart with the same inputs
and graph, differs by up to 1-2% (batch 16, 8K-100K tokens), while its own ten samples, taken
within about 20 ms, agree within 0.1-0.5%; blocks of samples from one captured graph drift the same
way, so it is the GPU's state over time, not placement or capture (``scripts/gpu_noise_sources.py`` of 0849486,
docs/h200.md).  A point measured once catches whichever state the GPU is in, and two runs of one
sweep disagree by more than 1% at about one point in twelve.  Measuring every point in ``visits``
passes over the sweep, the even passes in reverse order, spreads its samples over the whole run
(every point's mean position in time is the run's middle), and the pooled samples' median and
confidence interval then describe the run rather than one moment of it.

A point whose visits disagree is visited again: after its planned visits, further passes over the
points not yet settled (:func:`settled`) measure one more visit each, until the standard error of
the mean of a point's visit medians is at most ``visit_rel_se`` (0.3%) of that mean or it has
``max_visits`` visits (default 3x the planned visits).  Why: the points that disagreed by more than 2%
between two runs on an H200 (batch 16, 64K-128K) were the ones whose own visits disagreed by 2-5%
(128K, 128 splits: 815, 844, 816, 841 µs), with no clock, power or thermal event reported over
them (``scripts/h200_throttle_probe.sh`` of 0849486); more visits are the only remedy where the cause is not
visible, and two runs whose points each have a standard error of 0.3% differ by more than 2% at
fewer than one point in 100 000 (4.7 standard deviations of the difference).

The first visit checks correctness and times (graph and eager); later visits time the graph only.
Each visit is appended to ``visits.jsonl`` in the run folder as it is measured; once a point has
all its visits, its pooled record goes to ``results.jsonl`` (:func:`pooled_record`).  A resumed run
reads ``visits.jsonl`` and measures only the visits still missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

from mlabench.bench.point import speed_fields
from mlabench.files import append_text
from mlabench.measure.observers import pooled_clocks
from mlabench.measure.stats import mean_rel_se, summarize
from mlabench.records.record import Record, utc_now
from mlabench.records.store import read_jsonl
from mlabench.run_files import VISITS_FILE

#: Visits per point on a GPU when the sweep does not say (``SweepConfig.visits``); 1 on the CPU.
DEFAULT_GPU_VISITS = 4
#: Most visits per point when the sweep does not say (``SweepConfig.max_visits``): this many times
#: its planned visits.
MAX_VISITS_FACTOR = 3
#: A point is visited again while the standard error of the mean of its visits' medians is above this
#: fraction of that mean (``SweepConfig.visit_rel_se``).
DEFAULT_VISIT_REL_SE = 0.003

P = TypeVar("P")


def visit_order(points: Sequence[P], visit: int) -> list[P]:
    """``points`` in the order of visit ``visit`` (1-based): as given on odd visits, reversed on
    even ones, so a drift over the run falls on every point alike."""
    return list(points) if visit % 2 else list(points)[::-1]


class VisitMeasurement(BaseModel):
    """One visit of a point (one line of ``visits.jsonl``)."""

    model_config = ConfigDict(extra="forbid")

    visit: int = Field(description="Which visit of its point (1-based).")
    record: Record = Field(description="The point as measured at this visit.")


def append_visit(run_dir: Path, visit: int, rec: Record) -> None:
    """Append ``rec``, the ``visit``-th measurement of its point, to ``run_dir/visits.jsonl``
    (flushed and fsync'ed, as results are)."""
    line = VisitMeasurement(visit=visit, record=rec).model_dump_json() + "\n"
    append_text(Path(run_dir) / VISITS_FILE, line, "run visits", sync=True)


def _visit_lines(run_dir: Path) -> list[VisitMeasurement]:
    """Every line of ``run_dir/visits.jsonl`` in file order (:func:`mlabench.records.store.read_jsonl`:
    a last line cut short by a kill is skipped, a bad line elsewhere raises); [] when there is no file."""
    return read_jsonl(Path(run_dir) / VISITS_FILE, VisitMeasurement, "visit")


def read_visits(run_dir: Path) -> dict[str, list[Record]]:
    """Every point's visits recorded in ``run_dir/visits.jsonl``, by point key, in visit order
    (a line cut short by a kill is skipped); empty when there is no file."""
    out: dict[str, list[tuple[int, Record]]] = {}
    for line in _visit_lines(run_dir):
        out.setdefault(line.record.key, []).append((line.visit, line.record))
    return {k: [r for _, r in sorted(v, key=lambda t: t[0])] for k, v in out.items()}


def measured_in_order(run_dir: Path) -> list[Record]:
    """Every visit in ``run_dir/visits.jsonl`` in the order measured: the sequence a visit run's
    sentinel windows index (:mod:`mlabench.sweep.sentinel`)."""
    return [line.record for line in _visit_lines(run_dir)]


def wants_more(visits: Sequence[Record]) -> bool:
    """Whether a point with these visits so far is timed again: only when its first visit was
    timed (``ok`` or ``incorrect`` with samples); a failed or unsupported point is recorded once."""
    return bool(visits) and visits[0].stats is not None and all(v.stats is not None for v in visits)


def visits_rel_se(visits: Sequence[Record]) -> float | None:
    """The standard error of the mean of the timed visits' medians over that mean (sample standard
    deviation / sqrt(n) / mean); None with fewer than two timed visits."""
    return mean_rel_se([v.stats.median_us for v in visits if v.stats is not None])


def settled(visits: Sequence[Record], planned: int, most: int, rel_se: float) -> bool:
    """Whether a point with these visits so far needs no more: it failed or went untimed at its
    first visit (:func:`wants_more`), or it has ``most`` visits, or it has its ``planned`` visits
    and their :func:`visits_rel_se` is at most ``rel_se``.  False for no visits."""
    if not visits:
        return False
    if not wants_more(visits) or len(visits) >= max(most, 1):
        return True
    if len(visits) < planned:
        return False
    se = visits_rel_se(visits)
    return se is None or se <= rel_se


def pooled_record(visits: Sequence[Record], target_rel_ci: float = 0.01) -> Record:
    """One record from a point's visits: the first visit's verdict, status, eager time and
    metadata; the graph time (``stats``) from every visit's samples pooled (median, spread and
    confidence interval of all of them, ``noisy`` against ``target_rel_ci``; ``calls_per_sample``
    and ``graph_captures`` of the first, ``capture_medians_us`` of every visit in turn); the speed fields from
    the pooled median; ``visit_medians_us`` each visit's own median; the GPU state after the last
    visit; the clocks while timing pooled over the visits
    (:func:`~mlabench.measure.observers.pooled_clocks`); ``clock_below_steady`` when any visit was.  One visit, or an untimed first visit, is
    returned as it is.  Raises ValueError for no visits."""
    if not visits:
        raise ValueError("no visits")
    first = visits[0]
    timed = [v for v in visits if v.stats is not None]
    if len(visits) == 1 or first.stats is None:
        return first
    samples = [x for v in timed for x in v.stats.samples_us]
    captures = [us for v in timed for us in (v.stats.capture_medians_us or [])]
    stats = summarize(samples, target_rel_ci).model_copy(
        update={"calls_per_sample": first.stats.calls_per_sample, "graph_captures": first.stats.graph_captures,
                "capture_medians_us": captures or None})
    flags = [v.clock_below_steady for v in timed if v.clock_below_steady is not None]
    return first.model_copy(update={
        "stats": stats, **speed_fields(first.bytes_moved, first.floor_us, stats.median_us),
        "visit_medians_us": [v.stats.median_us for v in timed], "gpu_state": timed[-1].gpu_state,
        "gpu_state_during": pooled_clocks([v.gpu_state_during for v in timed]),
        "clock_below_steady": any(flags) if flags else None, "timestamp": utc_now()})
