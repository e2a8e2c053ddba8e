"""The machine factor of two runs from different machines (``mlabench diff``, issue 27 item 5).

Two separately started H200 machines agreed within 1% at only 87-94% of points where one machine
agreed with itself at 96.7-100% (results/h200/repeatability/), and a before/after comparison
usually spans days and machines: part of every difference is the machine.  For runs from two
machines (other hosts, other physical GPUs by UUID, or other GPU models) the diff estimates that
part as one factor on every time, B over A:

- **points**: the median of B/A over every point compared (the factor used: a machine moves most
  points alike, while a change to the code moves some);
- **sentinel**: B's sentinel median over A's, when both runs measured the same sentinel point;
- **floors**: A's floor bandwidth over B's (the read ceilings, or the copy bandwidths where a run
  was recorded before the read ceiling): the time ratio of a purely bandwidth-bound call.

A point *moves beyond the machine factor* when ``ln(B/A / factor)`` exceeds the diff's rule
(:data:`mlabench.sweep.diff.Z_CRITICAL` combined standard errors, :func:`~mlabench.sweep.diff.combined_se`);
the factor's own uncertainty, over hundreds of points, is left out.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from mlabench.records.record import Manifest
from mlabench.records.side_files import read_sentinels
from mlabench.sweep.diff import (
    Z_CRITICAL, PointDiff, RunDiff, combined_se, comparable_key, point_params, z_score,
)
from mlabench.tables.table import PARAMS, ColumnStyle, Table


@dataclass
class MachineFactor:
    """What the machine explains of a diff: the factor (B/A, the median over ``points``), the
    sentinel's and the floors' estimates of it (None where not measured), and the points beyond it
    with their ratio over the factor and its z score."""

    reason: str
    factor: float
    points: int
    sentinel: float | None
    floors: float | None
    beyond: list[tuple[PointDiff, float, float]] = field(default_factory=list)


def two_machines(a: Manifest, b: Manifest) -> str | None:
    """Why two runs come from two machines (``"hosts h1 vs h2"``, ``"GPUs <uuid> vs <uuid>"``,
    ``"NVIDIA H200 vs NVIDIA H100"``), or None when nothing recorded says so."""
    if a.device.get("name") != b.device.get("name"):
        return f"{a.device.get('name')} vs {b.device.get('name')}"
    if a.device.get("uuid") and b.device.get("uuid") and a.device["uuid"] != b.device["uuid"]:
        return f"GPUs {a.device['uuid']} vs {b.device['uuid']}"
    if a.host != b.host:
        return f"hosts {a.host} vs {b.host}"
    return None


def machine_factor(d: RunDiff, force: bool | None = None, z_critical: float = Z_CRITICAL) -> MachineFactor | None:
    """The :class:`MachineFactor` of ``d``: for runs from two machines (:func:`two_machines`), or for
    any two with ``force`` True; None for one machine (or ``force`` False) or no point compared."""
    reason = two_machines(d.a.manifest, d.b.manifest)
    if force is not None:
        reason = (reason or "as asked (--machine-factor)") if force else None
    if reason is None or not d.points:
        return None
    factor = statistics.median(p.ratio for p in d.points)
    mf = MachineFactor(reason, factor, len(d.points), _sentinel_ratio(d), _floors_ratio(d.a.manifest, d.b.manifest))
    for p in d.points:
        z = z_score(p.ratio / factor, combined_se(p.a, p.b, d.a.repeat_noise, d.b.repeat_noise))
        if z > z_critical:
            mf.beyond.append((p, p.ratio / factor, z))
    return mf


def _floors_ratio(a: Manifest, b: Manifest) -> float | None:
    """A's bandwidth over B's, of one kind: the read ceilings where both runs measured one, else
    the copy bandwidths (a run recorded before the read ceiling has only that); None where neither
    kind is in both.  A read ceiling over a copy bandwidth is no machine factor: on one H200 they
    differ by about 8% (4.51 against 4.19 TB/s)."""
    for kind in ("read_bandwidth_tbps", "copy_bandwidth_tbps"):
        ra, rb = getattr(a, kind), getattr(b, kind)
        if ra and rb:
            return ra / rb
    return None


def _sentinel_ratio(d: RunDiff) -> float | None:
    """B's sentinel median over A's when both runs measured the same sentinel point (the median of
    each run's timed sentinel measurements), else None."""
    medians = []
    for run in (d.a, d.b):
        timed = [s.record for s in read_sentinels(run.path) if s.record.status == "ok" and s.record.stats]
        if not timed:
            return None
        medians.append((comparable_key(timed[0]), statistics.median(r.stats.median_us for r in timed)))
    (key_a, us_a), (key_b, us_b) = medians
    return us_b / us_a if key_a == key_b else None


def machine_tables(mf: MachineFactor | None) -> list[Table]:
    """The points that move beyond the machine factor, with notes giving the factor and its three
    estimates; [] for one machine."""
    if mf is None:
        return []
    fmt = lambda v: "—" if v is None else f"{100 * (v - 1):+.2f}%"  # noqa: E731
    t = Table("points that move beyond the machine factor",
              ["backend", "batch", "context", "params", "a_us", "b_us", "ratio", "vs_machine", "z"],
              styles={"params": PARAMS, "a_us": ColumnStyle(header="A µs", justify="right"),
                      "b_us": ColumnStyle(header="B µs", justify="right"),
                      "ratio": ColumnStyle(text=fmt, header="change", justify="right"),
                      "vs_machine": ColumnStyle(text=fmt, header="beyond machine", justify="right"),
                      "z": ColumnStyle(justify="right", drop=1)})
    for p, rel, z in mf.beyond:
        t.add_row([p.a.backend, p.a.batch, p.a.context_len, point_params(p.a), p.a.stats.median_us,
                   p.b.stats.median_us, p.ratio, rel, z], style="red")
    slower = sum(rel > 1 for _, rel, _ in mf.beyond)
    t.notes += [
        f"two machines ({mf.reason}): machine factor {fmt(mf.factor)} (B/A, the median over the {mf.points} points "
        f"compared); the sentinel says {fmt(mf.sentinel)}, the floors' bandwidths {fmt(mf.floors)}",
        f"{len(mf.beyond)} of {mf.points} points move beyond it ({slower} slower, {len(mf.beyond) - slower} "
        f"faster): |ln(B/A / factor)| over {Z_CRITICAL:g} combined standard errors; beyond machine: B/A / factor - 1"]
    if mf.sentinel is not None and abs(math.log(mf.sentinel / mf.factor)) > 0.01:
        t.notes.append("the sentinel and the points disagree on the factor by more than 1%: the machines may "
                       "differ unevenly (by kernel or size), so read the plain comparison too")
    return [t]
