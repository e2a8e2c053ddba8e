"""A validation's arithmetic: held-out lengths, the split counts a point measures, regret and the
tables, without measuring anything (``mlabench tune --validate`` measures in :mod:`.validation_run`).

Held-out lengths are drawn afresh by every validation from a seed it records (one log-uniform draw
per stratum of the range, none within one tile of a bucket edge or a tuned length), at every batch
size of the policy.  Each point measures the policy's choice, every public heuristic's choice and
the reference counts (:func:`reference_counts`): every split count up to the wave cap where that is
at most :data:`EVERY_COUNT_CAP` counts, else the ladder plus every count within a factor
:data:`WINDOW_FACTOR` of the policy's and of the best ladder count.  Regret is ``time / best
time - 1``, the best being the fastest correct of the counts measured (issue 27 item 2: a best
from a ladder alone missed counts 5, 7, 9 and 10 at batch 16).

It imports the records, the policy type and the tables, never the tuner's studies or worker
processes: a figure or a report of a validation reads it without them.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from mlabench.errors import ConfigError
from mlabench.policy.tuned import Policy
from mlabench.records.record import CPU_RUN_NOTE
from mlabench.records.side_files import PointResult, geomean_regret_pct  # noqa: F401  (the tables' types)
from mlabench.records.store import ResultStore
from mlabench.shapes import MLADecodeShape
from mlabench.tables.table import ColumnStyle, Table

#: The largest wave cap at which a held-out point measures every split count up to it.
EVERY_COUNT_CAP = 64
#: Elsewhere a point measures the ladder and every count within this factor of the policy's count
#: and of the best ladder count.
WINDOW_FACTOR = 1.5
#: The target of ``tune --validate`` (``--tolerance``): at every held-out point the policy's choice
#: within this fraction of the best count measured there (issue 34: a device policy within 3% of the
#: count tuned for each length, batch 1 and 16, 1K-128K).
TARGET_TOLERANCE = 0.03


def draw_lengths(count: int, low: int, high: int, avoid: set[int], tile: int, seed: int) -> list[int]:
    """``count`` distinct, sorted lengths in ``[low, high]`` drawn with ``seed``: the range is cut
    into ``count`` strata of equal width in log length and one length is drawn uniformly from each
    (from anywhere free in the range where a stratum has none), never within ``tile`` tokens of a
    length in ``avoid`` (bucket edges, tuned lengths).  Raises :class:`ConfigError` for a bad range
    or one with fewer than ``count`` free lengths."""
    if count < 1 or low < 1 or high <= low:
        raise ConfigError(f"validation grid needs count >= 1 and 1 <= low < high, got {count}, {low}, {high}")
    free = free_lengths(low, high, avoid, tile)
    if len(free) < count:
        raise ConfigError(f"validation grid: fewer than {count} lengths in [{low}, {high}] more than {tile} "
                          "tokens from the bucket edges and tuned lengths")
    rng, taken = random.Random(seed), set()
    edges = [low * (high / low) ** (i / count) for i in range(count + 1)]
    for lo, hi in zip(edges, edges[1:]):
        stratum = [n for n in free if lo <= n < hi or (hi == edges[-1] and n == high)]
        pool = [n for n in stratum if n not in taken] or [n for n in free if n not in taken]
        taken.add(rng.choice(pool))
    return sorted(taken)


def free_lengths(low: int, high: int, avoid: set[int], tile: int) -> list[int]:
    """The lengths in ``[low, high]`` more than ``tile`` tokens from every length in ``avoid``."""
    near = {n for a in avoid for n in range(a - tile, a + tile + 1)}
    return [n for n in range(low, high + 1) if n not in near]


def policy_shape(policy: Policy, batch: int, length: int) -> MLADecodeShape:
    """The uniform shape of ``batch`` requests of ``length`` tokens in ``policy``'s recorded shape
    (heads, page size, dtypes, MLA widths, softmax scale, query length, causality)."""
    keys = ("num_heads", "page_size", "q_dtype", "kv_dtype", "kv_lora_rank", "qk_rope_head_dim", "softmax_scale",
            "qo_len", "causal")
    return MLADecodeShape.uniform(batch, length, **{k: policy.shape[k] for k in keys if k in policy.shape})


def policy_span(policy: Policy) -> tuple[int, int]:
    """The context lengths ``policy`` was tuned for: from its shortest tuned length (else half its
    first bucket edge) to its last bucket edge; the default range of its held-out lengths."""
    edges = sorted(policy.source.get("buckets") or {e.max_context_len for b in policy.batches for e in b.entries})
    tuned = policy.source.get("lengths") or []
    return (min(tuned) if tuned else max(1, edges[0] // 2)), edges[-1]


def span_note(policy: Policy, low: int, high: int) -> str | None:
    """A note when ``[low, high]`` reaches outside :func:`policy_span` (None when inside it)."""
    lo, hi = policy_span(policy)
    if lo <= low and high <= hi:
        return None
    above = f"; above its last bucket ({hi}) each batch size uses that bucket's choice" if high > hi else ""
    return f"lengths {low}-{high} reach outside the lengths the policy was tuned at ({lo}-{hi}){above}"


def reference_counts(low: int, high: int, cap: int | None, ladder: list[int], around: list[int]) -> list[int]:
    """The split counts a held-out point measures, within ``[low, high]``: every count up to ``cap``
    (the wave cap) where that is at most :data:`EVERY_COUNT_CAP` counts; else ``ladder`` plus every
    count within a factor :data:`WINDOW_FACTOR` of each count in ``around`` (the policy's, and once
    measured the best ladder count)."""
    if cap is not None and cap - low + 1 <= EVERY_COUNT_CAP:
        return list(range(low, min(cap, high) + 1))
    near = {n for c in around for n in range(math.ceil(c / WINDOW_FACTOR), math.floor(c * WINDOW_FACTOR) + 1)}
    return sorted(n for n in set(ladder) | near if low <= n <= high)


def split_ladder(low: int, high: int, num_sms: int) -> list[int]:
    """Split counts the exhaustive reference measures: powers of two and 1.5x powers of two, and
    multiples of the SM count up to 4, within ``[low, high]``."""
    values = {1 << k for k in range(12)} | {3 << k for k in range(11)} | {m * num_sms for m in range(1, 5)}
    return sorted(v for v in values if low <= v <= high)


@dataclass
class Validation:
    """A validation run: its folder, every point, and the heuristics compared."""

    store: ResultStore
    points: list[PointResult]
    heuristic_names: list[str]
    seed: int | None = None  # the held-out lengths' draw
    tolerance: float = TARGET_TOLERANCE  # the target: every point's policy regret at most this fraction
    given: tuple[int, ...] = ()  # lengths given with --context, not drawn: held out only by chance
    recorded: bool = False  # scored on recorded measurements (--from-run), none drawn or measured
    left_out: int = 0  # recorded points without the policy's launch (--from-run), not scored
    policy_device: str | None = None  # the GPU the policy was tuned on (Policy.device)


def target_misses(points: list[PointResult], tolerance: float) -> list[PointResult]:
    """The points where the policy misses the target: its time more than ``tolerance`` (a fraction)
    over the best count measured there, or it failed (no time, or no correct configuration)."""
    return [p for p in points if (r := p.regret(p.policy_us)) is None or r > tolerance]


def lengths_noun(points: list[PointResult], given: tuple[int, ...] = (), recorded: bool = False) -> str:
    """What the validated lengths are, for the verdict and the table title: ``"held-out length"``
    (all drawn), ``"given length"`` (all given with ``--context``: a length a server decodes at
    may sit next to a tuned one, so it is not called held out), ``"length (held out or
    given)"``, or ``"recorded length"`` (``recorded``: scored on a run's records, ``--from-run``)."""
    if recorded:
        return "recorded length"
    drawn = any(p.context_len not in given for p in points)
    if not given or not any(p.context_len in given for p in points):
        return "held-out length"
    return "length (held out or given)" if drawn else "given length"


def target_verdict(points: list[PointResult], tolerance: float, given: tuple[int, ...] = (),
                   recorded: bool = False, left_out: int = 0) -> str:
    """One line: whether every point is within ``tolerance`` of its best, else how many are not
    and which (``batch B: L1, L2, ...`` per batch size); ``given`` and ``recorded`` name the points
    (:func:`lengths_noun`); ``left_out`` recorded points were not scored (the policy's launch not
    among their records), so the line claims only the lengths where its launch was recorded."""
    misses = target_misses(points, tolerance)
    where = " where the policy's launch was recorded" if left_out else ""
    target = (f"every {lengths_noun(points, given, recorded)}{where} within {100 * tolerance:g}% of the best count "
              "measured there")
    if not misses:
        return f"target met: {target} ({len(points)} points{f'; {left_out} left out' if left_out else ''})"
    where = "; ".join(f"batch {b}: " + ", ".join(str(p.context_len) for p in misses if p.batch == b)
                      for b in sorted({p.batch for p in misses}))
    return f"target not met: {target}: {len(misses)} of {len(points)} points miss it ({where})"


def validation_tables(v: Validation) -> list[Table]:
    """A summary per batch (worst and geometric-mean regret of the policy and every heuristic,
    and how many split counts each point measured) and a table of every point; regrets in percent
    against the best of the counts measured at the point, None where a configuration failed.  The
    seed's note is left out where every length was given (``v.given``, ``--context``), which a note
    names."""
    counted = any(p.counts_measured for p in v.points)  # validations recorded before did not count them
    cols = ["batch", "points", *(["counts"] if counted else []), "policy worst %", "policy geomean %"] + [
        f"{h} geomean %" for h in v.heuristic_names]
    keep = ColumnStyle(keep=True)  # the policy's numbers stay in the table, also when every row has them
    summary = Table("Regret against the best of the split counts measured at each point", cols,
                    styles={"policy worst %": keep, "policy geomean %": keep})
    for batch in sorted({p.batch for p in v.points}) + [None]:
        pts = [p for p in v.points if batch is None or p.batch == batch]
        policy = [p.regret(p.policy_us) for p in pts]
        worst = None if None in policy else 100 * max(policy)
        summary.rows.append(["all" if batch is None else batch, len(pts),
                             *([_span(p.counts_measured for p in pts)] if counted else []),
                             worst, geomean_regret_pct(policy)]
                            + [geomean_regret_pct([p.regret(p.heuristics[h]["us"]) for p in pts])
                               for h in v.heuristic_names])
    how = (f"counts: how many; every count up to the wave cap where that is <= {EVERY_COUNT_CAP}, else the ladder "
           f"and every count within {WINDOW_FACTOR:g}x of the policy's and of the best ladder count; with the "
           "policy's and the heuristics'" if counted else "a validation recorded by an older mlabench: the split "
           "ladder, the policy's and the heuristics' counts")
    if v.recorded:
        how = "counts: how many the runs recorded there, every launch of any parameters; none measured now"
    summary.notes.append("regret = time / best time - 1; best = the fastest correct of the split counts measured "
                         f"at that point ({how}); — = a configuration failed")
    summary.notes.append(target_verdict(v.points, v.tolerance, v.given, v.recorded, v.left_out))
    manifest = v.store.manifest() if v.store is not None else None
    if manifest is not None and manifest.on_cpu():
        summary.notes.append(CPU_RUN_NOTE)
    here = manifest.device.get("name") if manifest is not None and not v.recorded else None
    if here and v.policy_device and here != v.policy_device:
        summary.notes.append(f"the policy was tuned on {v.policy_device} and is measured here on {here}: the best "
                             "count of each point is this device's, its choices the other's (docs/tuning.md)")
    if v.seed is not None and any(p.context_len not in v.given for p in v.points):
        summary.notes.append(f"held-out lengths drawn with seed {v.seed} (tune --validate ... --seed {v.seed} "
                             "draws them again)")
    if v.given:
        summary.notes.append("given with --context, not drawn (held out only where no tuned length or bucket edge "
                             f"is near): {', '.join(map(str, v.given))}")
    point_cols = ["batch", "context", *(["counts"] if counted else []), "best µs", "best splits", "policy splits",
                  "policy %", "target"] + [f"{h} (splits) %" for h in v.heuristic_names]
    # at 80 columns the heuristics' columns go first, then the counts; the policy's stay
    droppable = {f"{h} (splits) %": 1 for h in v.heuristic_names} | ({"counts": 2} if counted else {})
    missed = {id(p) for p in target_misses(v.points, v.tolerance)}
    noun = lengths_noun(v.points, v.given, v.recorded).replace("length", "points")
    detail = Table(f"{noun[0].upper()}{noun[1:]} (policy %: its slowdown over the best count; target: within "
                   f"{100 * v.tolerance:g}%)", point_cols, styles={c: ColumnStyle(drop=d) for c, d in droppable.items()})
    for p in v.points:
        regret = p.regret(p.policy_us)
        detail.rows.append([p.batch, p.context_len, *([p.counts_measured] if counted else []), p.best_us,
                            _best_cell(p),
                            p.policy_params.get("num_kv_splits"), None if regret is None else 100 * regret,
                            "miss" if id(p) in missed else "ok"]
                           + [_heuristic_cell(p, h) for h in v.heuristic_names])
    return [summary, detail]


def _best_cell(p: PointResult) -> int | str | None:
    """The best launch's split count, with its other parameters where they differ from the
    policy's (``"128 (pdl=0)"``): the same count can be the best and the policy's slower one."""
    count = p.best_params.get("num_kv_splits")
    other = {k: v for k, v in p.best_params.items() if k != "num_kv_splits" and p.policy_params.get(k, v) != v}
    return f"{count} ({' '.join(f'{k}={v}' for k, v in sorted(other.items()))})" if other else count


def _span(values: Any) -> str:
    """``"12"`` or ``"12-40"``: the range of some counts."""
    vals = sorted(values)
    return "" if not vals else str(vals[0]) if vals[0] == vals[-1] else f"{vals[0]}-{vals[-1]}"


def _heuristic_cell(p: PointResult, name: str) -> str:
    h = p.heuristics[name]
    regret = p.regret(h["us"])
    return f"{'—' if regret is None else f'{100 * regret:.1f}'} ({h['num_kv_splits']})"
