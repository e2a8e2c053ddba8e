"""``tune --export RUN --pages-rule B``: batch ``B``'s split counts chosen across lengths by pages per split.

A split-KV kernel that cuts a request of ``p`` pages into ``S`` splits gives each ``P = ceil(p / S)``
pages (gluon-splitkv: split ``s`` takes pages ``[s P, (s + 1) P)``), and ``ceil(p / P)`` of them own a
page.  Where that is fewer than ``S``, the other programs run empty and the launch is slower: at
7222 tokens (113 pages of 64), batch 1 on an H200, 57 splits (2 pages each, all owning pages) ran
9.81 µs and 58-96 (also 2 pages each, 57 owning) 9.0-12.5% slower (``results/h200/deploy/qo1-k3``'s
validation).  So the best count moves with every page or two of length, and one count per bucket
(the per-bucket choice of a tuning run) is off between the lengths it was tuned at: that run's
batch-1 table was 6.5% over the best count at held-out lengths (geometric mean, worst 12.9%).

The rule, for each page count ``p`` (``ceil(L / page_size)``) of the batch size:

- candidates: every ``P`` whose count ``S = ceil(p / P)`` is at most the run's wave cap (the study's
  ``max_splits``, else the SM count over the batch size and the programs a split launches: the top
  of the run's split ladder) and leaves no split without pages (``ceil(p / S) == P``);
- cost of ``P`` at a tuned length: the least regret (time / the fastest there - 1) among the counts
  measured there that cut it into ``P`` pages per split; lengths at most one page apart (a bucket's
  upper edge and the next one's lower edge + 1) make one point, the mean of their costs;
- cost of ``P`` at ``p``: interpolated linearly in log pages between the nearest tuned points at or
  below ``p`` and above it (one of them, where ``P`` was measured at only one, or ``p`` lies beyond
  the ends); the ``P`` of least cost wins (ties: more pages per split, fewer splits).

Each run of page counts with one ``P`` becomes one entry ``tokens_per_split = P x page_size`` (its
count ``ceil(L / t) = ceil(p / P)``; a run of one count is that count alone), which the loaded
policy expands to one row per count (a device table stores such a run as one rule row:
:func:`mlabench.policy.device_table.rule_rows`).  Fitted on that run's records, batch 1 scored 6.18% worst,
1.40% geometric mean, 21 of 27 held-out lengths within 3% on its validation (docs/tuning-device.md).
At batch 16, where the best count stays at one wave (8), pages per split do not carry from one
length to the next: 14.6% worst there, against the per-bucket choice's 2.69% (ties settled by the
neighbouring buckets, :mod:`mlabench.tune.neighbour_ties`; 4.85% before).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from mlabench.backends import get_backend
from mlabench.errors import ConfigError, ResultsError
from mlabench.policy.rules import MAX_KV_SPLITS
from mlabench.policy.tuned import BatchPolicy, Policy, PolicyEntry, merge_adjacent
from mlabench.records.record import Record
from mlabench.tune.seeded_trials import ladder_top
from mlabench.tune.space import TuneConfig, shape_dims, tune_shape
from mlabench.tune.studies import StudySpec


@dataclass(frozen=True)
class TunedPoint:
    """Tuned lengths at most a page apart: ``pages`` their page counts' geometric mean, ``cost`` the
    mean regret (a fraction over the fastest count there) of their best count per pages-per-split."""

    pages: float
    cost: dict[int, float]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def tuned_points(records: Iterable[Record], batch: int, params: dict[str, object], page_size: int) -> list[TunedPoint]:
    """The :class:`TunedPoint` of ``batch``'s records that launched ``params`` but for
    ``num_kv_splits`` (correct ones, of one length a request; of a launch recorded twice the latest),
    sorted by pages.  Raises :class:`ResultsError` when there is none."""
    others = {k: v for k, v in params.items() if k != "num_kv_splits"}
    latest: dict[str, Record] = {}
    for rec in records:
        lens = rec.shape.get("context_lens") or [rec.context_len]
        if (rec.batch == batch and len(set(lens)) == 1 and rec.status == "ok" and rec.median_us is not None
                and all(rec.params.get(k, v) == v for k, v in others.items())
                and (rec.key not in latest or rec.timestamp >= latest[rec.key].timestamp)):
            latest[rec.key] = rec
    times: dict[int, dict[int, float]] = defaultdict(dict)  # context_len -> {count: µs}
    for rec in latest.values():
        times[rec.context_len][int(rec.params["num_kv_splits"])] = rec.median_us
    if not times:
        raise ResultsError(f"--pages-rule {batch}: the run recorded no correct launch at batch {batch}")
    groups: list[list[tuple[int, dict[int, float]]]] = []
    for length in sorted(times):
        pages, fastest = ceil_div(length, page_size), min(times[length].values())
        cost: dict[int, float] = {}
        for count, us in times[length].items():
            per = ceil_div(pages, count)
            cost[per] = min(cost.get(per, math.inf), us / fastest - 1)
        if groups and pages - groups[-1][-1][0] <= 1:
            groups[-1].append((pages, cost))
        else:
            groups.append([(pages, cost)])
    return [TunedPoint(math.exp(sum(math.log(p) for p, _ in g) / len(g)), _mean_costs([c for _, c in g]))
            for g in groups]


def _mean_costs(costs: list[dict[int, float]]) -> dict[int, float]:
    keys = sorted({k for c in costs for k in c})
    return {k: sum(c[k] for c in costs if k in c) / sum(k in c for c in costs) for k in keys}


def pages_per_split(points: list[TunedPoint], pages: int, cap: int) -> int:
    """The pages per split of a ``pages``-page request by the rule of the module docstring, at most
    ``cap`` splits; where no candidate was measured near it, the fewest pages per split the cap
    allows (``ceil(pages / cap)``)."""
    below = [pt for pt in points if pt.pages <= pages]
    above = [pt for pt in points if pt.pages > pages]
    near = ([below[-1]] if below else []) + ([above[0]] if above else [])
    if len(near) == 2:
        f = math.log(pages / near[0].pages) / math.log(near[1].pages / near[0].pages)
        weights = [1 - f, f]
    else:
        weights = [1.0]
    best: tuple[float, int] | None = None
    for count in range(1, min(cap, pages) + 1):
        per = ceil_div(pages, count)
        if ceil_div(pages, per) != count:
            continue  # some of the count's splits would own no page
        num = den = 0.0
        for pt, w in zip(near, weights):
            if per in pt.cost:
                num, den = num + w * pt.cost[per], den + w
        if den > 0 and (best is None or num / den < best[0]):  # counts rise: a tie keeps more pages a split
            best = (num / den, per)
    return best[1] if best else ceil_div(pages, cap)


def rule_entries(points: list[TunedPoint], max_context_len: int, page_size: int, cap: int,
                 params: dict[str, object]) -> list[PolicyEntry]:
    """Entries up to ``max_context_len`` tokens, one per run of page counts with one pages per split
    ``P`` (:func:`pages_per_split`): ``params`` with ``tokens_per_split = P x page_size`` and
    ``num_kv_splits`` the run's largest count (so the clamp never binds), or with that count alone
    where the run has one; adjacent entries of one count merge."""
    runs: list[list[int]] = []  # [P, first page, last page]
    for pages in range(1, ceil_div(max_context_len, page_size) + 1):
        per = pages_per_split(points, pages, cap)
        if runs and runs[-1][0] == per:
            runs[-1][2] = pages
        else:
            runs.append([per, pages, pages])
    entries = []
    for i, (per, first, last) in enumerate(runs):
        count, varies = ceil_div(last, per), ceil_div(first, per) != ceil_div(last, per)
        entries.append(PolicyEntry(max_context_len=max_context_len if i == len(runs) - 1 else last * page_size,
                                   params={**params, "num_kv_splits": count},
                                   tokens_per_split=per * page_size if varies else None))
    return merge_adjacent(entries)


def pages_rule_policy(policy: Policy, records: list[Record], batches: list[int], page_size: int,
                      caps: dict[int, int], device_policy: bool = True) -> tuple[Policy, str]:
    """``policy`` (a run's per-bucket choice) with the entries of each batch size of ``batches``
    derived by :func:`rule_entries` from ``records`` (the run's) up to its last tuned length, and a
    note saying so.  ``caps``: each batch size's wave cap.  Raises :class:`ConfigError` for a run
    tuned without ``device_policy`` (its studies measured no split ladder up to one wave), a batch
    size the run did not tune, or a policy whose entries differ in more than the count."""
    if not device_policy:
        raise ConfigError("--pages-rule reads the split ladder a --device-policy run measures up to one wave, and "
                          "this run was tuned without --device-policy: export it without --pages-rule")
    tuned = {b.batch: b for b in policy.batches}
    if missing := [b for b in batches if b not in tuned]:
        raise ConfigError(f"--pages-rule {','.join(map(str, missing))}: the run tuned batch sizes "
                          f"{', '.join(map(str, sorted(tuned)))}")
    out, notes = [], []
    for b in policy.batches:
        others = {launch_key(e.params) for e in b.entries}
        if b.batch not in batches:
            out.append(b)
            continue
        if len(others) > 1 or any(e.tokens_per_split or e.tile_tokens for e in b.entries):
            raise ConfigError(f"--pages-rule {b.batch}: the run's choices at batch {b.batch} differ in more than a "
                              "fixed count; tune with --device-policy --tokens-per-split off")
        entries = rule_entries(tuned_points(records, b.batch, b.entries[0].params, page_size),
                               b.entries[-1].max_context_len, page_size, caps[b.batch], b.entries[0].params)
        out.append(BatchPolicy(batch=b.batch, entries=entries))
        notes.append(f"batch {b.batch}: counts by pages per split across the tuned lengths ({len(entries)} "
                     f"entries, at most {caps[b.batch]} splits), not the bucket choices above")
    source = {**policy.source, "pages_rule": sorted(set(batches))}
    return policy.model_copy(update={"batches": out, "source": source}), "; ".join(notes)


def launch_key(params: dict[str, object]) -> str:
    """``params`` but for ``num_kv_splits``, as one comparable string."""
    return repr(sorted((k, v) for k, v in params.items() if k != "num_kv_splits"))


def wave_caps(cfg: TuneConfig, specs: list[StudySpec], num_sms: int | None) -> dict[int, int]:
    """The most splits per batch size of a run: its studies' ``max_splits`` (the wave cap), else
    ``num_sms // (batch x programs a split launches)``, the top of the run's split ladder
    (:func:`mlabench.tune.seeded_trials.ladder_top`); :data:`MAX_KV_SPLITS` with neither."""
    backend, caps = get_backend(cfg.backend), {}
    for spec in specs:
        if spec.max_splits is None and not num_sms:
            cap = MAX_KV_SPLITS
        else:
            cap = ladder_top(backend, tune_shape(shape_dims(cfg), spec.batch, spec.length), num_sms or 0, spec.max_splits)
        caps[spec.batch] = max(caps.get(spec.batch, 1), min(cap, MAX_KV_SPLITS))
    return caps
