"""The sentinel: one point re-measured through a sweep, the drift it shows, and the run's health notes.

A sweep measures its sentinel point before its first point, again after every ``sentinel_every``
points and once more at the end, each time on freshly made inputs, and appends each measurement
to ``sentinel.jsonl`` in the run folder (with how many points were recorded when it was taken; in a
run with several visits per point, how many visits were measured: :mod:`mlabench.sweep.visits`).
The drift of a measurement is its median over the reference, minus 1: the median of the first
:data:`REFERENCE_READINGS` measurements, taken once the warm-up has settled (on an H200 every later
reading was 1.2-3.2% faster than the first, coldest one, so a drift against the first measured its
slowness; issue 27 item 4).  A run whose sentinel drifts by more than the target at a measurement
that ends a window of points is flagged, and the points measured in a drifting window (between the
sentinel before and the drifting one) are named.  The spread between successive sentinel
measurements is the run's *repeat noise*: how far one point's median moves when it is measured
again, beyond what its own samples show (:func:`mlabench.measure.stats.repeat_noise`); :mod:`mlabench.sweep.diff`
uses it.  The measurements are read back by :func:`mlabench.records.side_files.read_sentinels`.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mlabench.measure.stats import mean_rel_se, repeat_noise
from mlabench.records.record import Manifest, Record
from mlabench.records.side_files import SentinelMeasurement
from mlabench.run_files import RESULTS_FILE, SENTINEL_FILE, VISITS_FILE
from mlabench.tables.table import fmt, params_label

#: The sentinel's reference is the median of this many of its first measurements (of all but the
#: last where a run has fewer: at least one reading is always compared with a reference it is not in).
REFERENCE_READINGS = 3


class DriftWindow(BaseModel):
    """Points measured between a sentinel measurement and the next, drifting one."""

    model_config = ConfigDict(extra="forbid")

    from_point: int = Field(description=f"Index (0-based, in {RESULTS_FILE}; with several visits per point, "
                                        f"in {VISITS_FILE}) of the first point in the window.")
    to_point: int = Field(description="Index after the last point in the window.")
    drift: float = Field(description="Drift of the sentinel measured at the window's end.")
    points: list[str] = Field(description="The points measured in the window, as labels.")


class Drift(BaseModel):
    """What the sentinel measurements of one run show (the manifest's ``drift``)."""

    model_config = ConfigDict(extra="forbid")

    sentinel: str = Field(description="The sentinel point, as a label.")
    key: str = Field(description="Its point key.")
    target: float = Field(description="Largest drift that does not flag the run.")
    after_points: list[int] = Field(description="Points recorded at each measurement.")
    medians_us: list[float] = Field(description="Median of each measurement, µs.")
    reference_us: float | None = Field(None, description="The reference: median of the first measurements "
                                                         "(None: runs recorded before, against the first).")
    reference_readings: int = Field(1, description="How many first measurements the reference is the median of.")
    drift: list[float] = Field(description="Each median over the reference, minus 1.")
    max_abs_drift: float = Field(description="Largest absolute drift of a measurement that ends a window of "
                                             "points (the first, taken before any point, is left out).")
    repeat_noise: float | None = Field(description="Relative spread of successive measurements (None: fewer than 3).")
    drifting: bool = Field(description="True when max_abs_drift exceeds the target.")
    windows: list[DriftWindow] = Field(default_factory=list, description="Windows that end in a drifting measurement.")


def point_label(r: Record) -> str:
    """``backend params B=.. L=..`` of a record, for notes."""
    return f"{r.backend} {params_label(r.shown_params())} B={r.batch} L={r.context_len}"


def append_sentinel(run_dir: Path, after_points: int, record: Record) -> None:
    """Append one sentinel measurement to ``run_dir/sentinel.jsonl``."""
    line = SentinelMeasurement(after_points=after_points, record=record).model_dump_json() + "\n"
    with open(Path(run_dir) / SENTINEL_FILE, "a", encoding="utf-8") as fh:
        fh.write(line)


def drift_of(sentinels: Sequence[SentinelMeasurement], records: Sequence[Record], target: float) -> Drift | None:
    """The drift the ``sentinels`` of a run show; ``records`` in the order measured (a visit run's
    visits) name the points of drifting windows.  None when fewer than two sentinel measurements were timed."""
    timed = [s for s in sentinels if s.record.status == "ok" and s.record.stats is not None]
    if len(timed) < 2:
        return None
    medians = [s.record.stats.median_us for s in timed]
    first = medians[:min(REFERENCE_READINGS, len(medians) - 1)]
    reference = statistics.median(first)
    drift = [m / reference - 1 for m in medians]
    windows = [DriftWindow(from_point=prev.after_points, to_point=cur.after_points, drift=d,
                           points=[point_label(r) for r in records[prev.after_points:cur.after_points]])
               for prev, cur, d in zip(timed, timed[1:], drift[1:]) if abs(d) > target]
    worst = max(abs(d) for d in drift[1:])
    return Drift(sentinel=point_label(timed[0].record), key=timed[0].record.key, target=target,
                 after_points=[s.after_points for s in timed], medians_us=medians, reference_us=reference,
                 reference_readings=len(first), drift=drift, max_abs_drift=worst,
                 repeat_noise=repeat_noise(medians), drifting=worst > target, windows=windows)


def health_notes(manifest: Manifest, records: Sequence[Record], verbose: bool = False) -> list[str]:
    """Notes for a sweep's summary, one line per kind: an interrupted run (fewer points recorded
    than ``manifest.planned_points``), the GPU's warm-up, the sentinel's drift
    against its reference, the drifting windows, points measured below the steady clock, and points
    whose visits still disagreed when they reached the most visits (:func:`unsettled`).  A line
    names at most 3 points or windows and counts the rest, which the manifest (``drift.windows``) and
    the records (``clock_below_steady``, ``visit_medians_us``) hold; with ``verbose`` each drifting
    window has its own line naming up to 8 of its points, and the other lines name up to 8 points
    (issue 25 item 13: 40 lines of windows under one H200 sweep's table)."""
    most = 8 if verbose else 3
    recorded, planned = len({r.key for r in records}), manifest.planned_points
    notes = [f"interrupted: {recorded} of the {planned} points planned are recorded (a best configuration is "
             "the best of those measured: — marks a split count not measured); `mlabench sweep --resume` "
             "on this run folder measures the rest"] if planned is not None and recorded < planned else []
    warmups: Counter[str] = Counter()  # a resumed run warms up again: the same text once, with a count
    for w in manifest.warmups:
        clock = f" at {w['sm_clock_mhz']:.0f} MHz" if w.get("sm_clock_mhz") else ""
        power = f", {w['power_w']:.0f} W" if w.get("power_w") else ""
        warmups[f"{w.get('reason')}{clock}{power}"] += 1
    notes += ["GPU warm-up" + (f" (x{len(manifest.warmups)}: the run was resumed)" if len(manifest.warmups) > 1 else "")
              + ": " + "; ".join(warmups)] if warmups else []
    if manifest.drift:
        notes += _drift_notes(Drift.model_validate(manifest.drift), manifest, verbose)
    for flagged, what in ((
            [r for r in records if r.clock_below_steady], "measured with the SM clock below its steady value"), (
            unsettled(manifest, records), _unsettled_text(manifest))):
        if flagged:
            notes.append(f"{len(flagged)} point(s) {what}: " + "; ".join(point_label(r) for r in flagged[:most])
                         + (f"; and {len(flagged) - most} more" if len(flagged) > most else ""))
    return notes


def _unsettled_text(manifest: Manifest) -> str:
    settings = manifest.visit_settings()
    return (f"whose visits still disagreed at {settings['max_visits']} visits (standard error of the mean of "
            f"their medians over {100 * (settings['visit_rel_se'] or 0):g}%)")


def _drift_notes(d: Drift, manifest: Manifest, verbose: bool) -> list[str]:
    """The sentinel's line and its drifting windows': one line for all windows, or with ``verbose``
    one per window naming up to 8 of its points."""
    against = (f"against the median of its first {d.reference_readings} readings"
               if d.reference_us is not None and d.reference_readings > 1 else "against its first reading")
    head = (f"sentinel {d.sentinel} measured {len(d.medians_us)} times: drift {100 * min(d.drift):+.2f}% to "
            f"{100 * max(d.drift):+.2f}% {against} (target ±{100 * d.target:g}%)")
    if d.repeat_noise is not None:
        head += f", repeat noise {100 * d.repeat_noise:.2f}%"
    notes = [("DRIFTING: " if d.drifting else "") + head]
    unit = "visits" if manifest.visit_settings()["visits"] > 1 else "points"  # what the windows index
    spans = [f"{unit} {w.from_point + 1}-{w.to_point}, sentinel {100 * w.drift:+.2f}%" for w in d.windows]
    if verbose:
        for w, span in zip(d.windows, spans):
            more = f" and {len(w.points) - 8} more" if len(w.points) > 8 else ""
            notes.append(f"drifting window ({span}): " + "; ".join(w.points[:8]) + more)
    elif d.windows:
        more = f"; and {len(spans) - 3} more" if len(spans) > 3 else ""
        notes.append(f"{len(d.windows)} drifting window(s), {sum(len(w.points) for w in d.windows)} {unit} measured "
                     f"in them ({'; '.join(spans[:3])}{more}): their points in the manifest's drift.windows, "
                     "or with sweep --verbose")
    return notes


def unsettled(manifest: Manifest, records: Sequence[Record]) -> list[Record]:
    """The records of a run with further visits (``max_visits`` above ``visits``) whose visits
    reached ``max_visits`` with the standard error of the mean of their medians still above
    ``visit_rel_se`` (:func:`mlabench.measure.stats.mean_rel_se`): their pooled time is the least settled."""
    settings = manifest.visit_settings()
    most, target = settings["max_visits"], settings["visit_rel_se"]
    if not target or most <= settings["visits"]:
        return []
    out = []
    for r in records:
        medians = r.visit_medians_us or []
        if len(medians) >= most and (se := mean_rel_se(medians)) is not None and se > target:
            out.append(r)
    return out


def ceilings_note(manifest: Manifest) -> str:
    """One line: the read, copy and datasheet bandwidths of a run; how the read one was found
    (its readings, :class:`mlabench.measure.bandwidth.ReadCeiling`) and, when a point read faster,
    that the run's ceiling was raised to it and by which point."""
    sheet, found = manifest.datasheet_bandwidth_tbps, manifest.read_ceiling or {}
    how = ""
    if found.get("readings_tbps"):
        readings = ", ".join(f"{k} {fmt(v)}" for k, v in found["readings_tbps"].items())
        how = f": best of {readings} TB/s over {found.get('copies')} buffers"
    raised = found.get("raised") or []
    if raised:
        last = raised[-1]
        how += (f"; RAISED to {fmt(last['tbps'])} TB/s by {last['point']}, which read faster than the measured "
                f"{fmt(found.get('tbps'))}: every % floor is against {fmt(last['tbps'])}")
    return (f"memory bandwidth: read {fmt(manifest.read_bandwidth_tbps)} TB/s (the floor{how}), copy "
            f"{fmt(manifest.copy_bandwidth_tbps)} TB/s (read + write), "
            + (f"datasheet {fmt(sheet)} TB/s" if sheet is not None else "no datasheet figure for this device"))


def drift_dict(drift: Drift | None) -> dict[str, Any] | None:
    """The manifest's form of a :class:`Drift`."""
    return drift.model_dump(mode="json") if drift else None
