"""``mlabench tune --validate POLICY --from-run RUN``: a policy scored on measurements already recorded.

A validation run records, at each of its points, the split ladder and a window of counts around
the best (:mod:`.validation_run`); a tuning run records every trial at its studies' lengths; a
sweep records its grid.  :func:`recorded_points` reads such records as they lie and scores another
policy on them, with no GPU: at each recorded ``(batch, context)`` point of the policy's backend
and shape, the policy's launch (:meth:`~mlabench.policy.tuned.Policy.lookup`, its other parameters
at the backend's defaults) is looked up by its record key, and its time is set against the
fastest correct launch recorded there -- the regret a validation would report if it had measured
only those counts.  A point where the policy's launch was not recorded is left out and counted.

Why: a policy edited by hand, or exported again with another ``--combine``, can be checked against
the committed H200 measurements before a GPU is at hand.  The scores are only as fair as the
records: lengths that shaped the policy are not held out for it (a validation run's lengths are
held out for the policy it validated, not for a policy derived from them).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from mlabench.backends import get_backend
from mlabench.errors import ResultsError
from mlabench.policy.tuned import Policy
from mlabench.records.record import Record, point_key
from mlabench.records.side_files import PointResult
from mlabench.records.store import ResultStore, describe_records, records_of, runs_of_kinds
from mlabench.run_files import SWEEP_KIND, TUNE_KIND, VALIDATION_KIND
from mlabench.tune.validation import Validation, policy_shape


@dataclass(frozen=True)
class RecordedScore:
    """The points a policy could be scored at (:class:`PointResult`, best of what was recorded),
    and the ``(batch, context)`` points recorded for its backend and shape where its own launch
    was not (``unscored``), both sorted by batch then context."""

    points: list[PointResult]
    unscored: list[tuple[int, int]]


def recorded_points(policy: Policy, records: Iterable[Record]) -> RecordedScore:
    """Score ``policy`` on ``records`` (any runs' records; those of another backend, of another
    head count, page size, dtype, query length or causality than the policy's, those of ragged
    batches and those launched under a ``split_policy`` (``device:``/``host:``, whose
    ``num_kv_splits`` is ignored: a sweep's 256 that ran 16) are skipped).  At each remaining
    ``(batch, context)`` point: ``best_us`` the fastest ``ok`` record (its ``params``),
    ``policy_us`` the time of the record whose key is the policy's launch there (its params as
    the policy names them, or completed with the backend's defaults; None when that launch did
    not run correctly), ``counts_measured`` the distinct ``num_kv_splits`` recorded; a point where
    no launch ran correctly is kept with ``best_us`` None (a miss, as a live validation keeps it).
    Of the records of one launch (a rerun, or several runs), the latest by its timestamp counts."""
    backend = get_backend(policy.backend)
    groups: dict[str, dict[str, Record]] = defaultdict(dict)
    for rec in records:
        lens = rec.shape.get("context_lens") or []
        if rec.backend == policy.backend and lens and len(set(lens)) == 1 and not rec.params.get("split_policy"):
            same = groups[json.dumps(rec.shape, sort_keys=True)]
            if rec.key not in same or rec.timestamp >= same[rec.key].timestamp:
                same[rec.key] = rec
    points, unscored = [], []
    for recorded_shape, by_key in groups.items():
        first = next(iter(by_key.values()))
        shape = policy_shape(policy, first.batch, first.context_len)
        if json.dumps(shape.key(), sort_keys=True) != recorded_shape:
            continue
        chosen = policy.lookup(shape.batch, shape.max_context_len)
        keys = [point_key(backend.name, p, shape.key()) for p in (chosen, backend.resolve_params(shape, chosen))]
        mine = next((by_key[k] for k in keys if k in by_key), None)
        if mine is None:
            unscored.append((shape.batch, shape.max_context_len))
            continue
        ok = [r for r in by_key.values() if r.status == "ok" and r.median_us is not None]
        best = min(ok, key=lambda r: r.median_us) if ok else None  # none correct: a miss, as validate keeps it
        points.append(PointResult(shape.batch, shape.max_context_len, best.median_us if best else None,
                                  dict(best.params) if best else {}, dict(chosen),
                                  mine.median_us if mine.status == "ok" else None,
                                  counts_measured=len({r.params.get("num_kv_splits") for r in by_key.values()})))
    points.sort(key=lambda p: (p.batch, p.context_len))
    return RecordedScore(points, sorted(unscored))


def recorded_validation(policy: Policy, runs: list[Path], tolerance: float) -> tuple[Validation, list[str]]:
    """``tune --validate POLICY --from-run RUN``: :func:`recorded_points` over the records of the
    sweep, tuning and validation runs at any depth under ``runs`` (one device; serve-bench runs
    beside them are passed over, :func:`~mlabench.records.store.runs_of_kinds`), as a
    :class:`Validation` (``recorded``; no folder, nothing written) and the notes that say what was
    read and what was left out.  Raises
    :class:`ResultsError` when no run is found, the runs come from different devices, or no point
    recorded the policy's launch (naming what the records cover)."""
    folders = runs_of_kinds(runs, (SWEEP_KIND, TUNE_KIND, VALIDATION_KIND), "tune --validate --from-run")
    records = records_of(folders)
    score = recorded_points(policy, records)
    if not score.points:
        mine = policy_shape(policy, 1, 1)
        heads = sorted({r.num_heads for r in records})
        pages = sorted({r.shape.get("page_size") for r in records if r.shape.get("page_size") is not None})
        at = (f"at the policy's shape ({mine.num_heads} heads, page {mine.page_size}, qo_len {mine.qo_len}, "
              f"{mine.q_dtype})")
        cover = (f"the records cover {describe_records(records)}; heads {', '.join(map(str, heads))}; "
                 f"page {', '.join(map(str, pages))}")
        n = len(score.unscored)
        why = (f"no recorded point of {policy.backend} {at} holds its own launch ({n} point{'s' * (n > 1)} at "
               f"that shape without it; {cover})" if n else f"no point of {policy.backend} is recorded {at}; {cover}")
        if under := sum(r.backend == policy.backend and bool(r.params.get("split_policy")) for r in records):
            why += (f"; {under} of its records ran under a split_policy, whose num_kv_splits is not the count "
                    "that ran: they are not scored")
        raise ResultsError(f"{', '.join(map(str, runs))}: {why}")
    revisions = {ResultStore(f).manifest().git_revision for f in folders}
    notes = [f"records of {len(revisions)} mlabench revisions pooled: the best at a point may be another "
             "kernel version's (name one run to score against it alone)"] if len(revisions) > 1 else []
    notes += [f"scored on the records of {len(folders)} run(s) under {', '.join(map(str, runs))}: nothing measured "
             "now; lengths that shaped a policy are not held out for it"]
    if score.unscored:
        where = "; ".join(f"batch {b}: " + ", ".join(str(n) for bb, n in score.unscored if bb == b)
                          for b in sorted({b for b, _ in score.unscored}))
        notes.append(f"{len(score.unscored)} recorded points left out, the policy's launch not among their "
                     f"records ({where})")
    return Validation(None, score.points, [], None, tolerance, recorded=True, left_out=len(score.unscored)), notes
