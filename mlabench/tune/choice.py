"""The choice of one study, and the policy the choices make.

A configuration of a study (a point of its search space; with ``tokens_per_split``, a rule whose
split count grows with the length) is measured at each of its bucket's lengths.  Its score is the
worst (``combine="worst"``, a min-max choice) or the geometric mean (``"geomean"``) of its time at
each length over the best correct time measured at that length by any trial of the study.  Among
configurations whose score is within the noise of the best score (:func:`tie_window`), the one with
the fewest splits (averaged over the lengths) wins: less workspace, fewer partials to merge.  With
one length this is the plain noise-aware choice on medians.  See ``docs/tuning.md``.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from mlabench.backends import get_backend
from mlabench.backends.base import Backend
from mlabench.errors import ResultsError
from mlabench.measure.stats import geomean
from mlabench.policy.heuristics import HEURISTICS
from mlabench.policy.rules import rule_splits
from mlabench.policy.tuned import BatchPolicy, Policy, PolicyEntry, merge_adjacent
from mlabench.tune.edges import fine_edges
from mlabench.tune.space import RULE_PARAM, TILE_PARAM, Bucket, TuneConfig, full_params, params_at, shape_dims
from mlabench.tune.studies import FINISHED_STATES, distinct_finished, launch_key

Combine = Literal["worst", "geomean"]

#: The most the best configuration's measured spread widens the tie window (a fraction of its
#: score).  Beyond it a spread says the machine was too busy to measure, not that a configuration
#: 1.87x slower by its medians is as fast (issue 35: ±657% on a busy CPU made it a tie).
TIE_SPREAD_CAP = 0.05


def tie_window(noise: float, best: Measured) -> float:
    """The relative window of :func:`choose`'s ties: ``noise`` (``--noise``, as the user set it),
    widened to the best configuration's widest CI half-width ``best.rel_ci`` up to
    :data:`TIE_SPREAD_CAP`."""
    return max(noise, min(best.rel_ci, TIE_SPREAD_CAP))


@dataclass(frozen=True)
class Measured:
    """One configuration's outcome in a study (trials with the same params pooled).

    ``params``: the searched parameters; ``median_us``: the geometric mean over its lengths of its
    median times (µs; with one length, its median); ``rel_ci``: the widest relative CI half-width of
    those medians; ``times_us`` and ``splits``: per length (tokens), the median (µs) and the split
    count launched (empty for a configuration known by one median only); ``launch``: what it
    launches (:func:`mlabench.tune.studies.launch_key`; empty when built by hand).
    """

    params: dict[str, Any]
    median_us: float
    rel_ci: float
    trials: int
    times_us: dict[int, float] = field(default_factory=dict)
    splits: dict[int, int] = field(default_factory=dict)
    launch: str = ""

    def times(self) -> dict[int, float]:
        """``times_us``, or ``{0: median_us}`` when it is empty."""
        return self.times_us or {0: self.median_us}

    def mean_splits(self) -> float:
        """The split count averaged over the lengths (``num_kv_splits`` when not known per length)."""
        return statistics.fmean(self.splits.values()) if self.splits else float(self.params.get("num_kv_splits", 0))


def trial_points(trial: Any, length: int) -> dict[int, dict[str, Any]]:
    """``{length: attributes}`` of each length a trial measured (``status``, ``median_us``,
    ``median_rel_ci``, ``num_kv_splits``...).  A trial recorded before several lengths per bucket
    (its attributes those of one record) counts as measured at ``length``."""
    attrs = trial.user_attrs
    if "points" in attrs:
        return {int(p["length"]): p for p in attrs["points"]}
    if "status" not in attrs:
        return {}
    return {length: {**attrs, "length": length, "num_kv_splits": trial.params.get("num_kv_splits")}}


def best_times(trials: list[Any], length: int = 0) -> dict[int, float]:
    """The fastest correct median (µs) measured at each length by any finished trial (a pruned
    trial's lengths that passed count too: each measurement carries its own verdict)."""
    best: dict[int, float] = {}
    for t in trials:
        if t.state.name not in ("COMPLETE", "PRUNED"):
            continue
        for n, p in trial_points(t, length).items():
            if p.get("status") == "ok" and p.get("median_us") is not None:
                best[n] = min(best.get(n, math.inf), float(p["median_us"]))
    return best


def measured_configs(trials: list[Any], length: int = 0) -> list[Measured]:
    """Correct, finished configurations of a study's trials (Optuna ``FrozenTrial``\\ s): only
    COMPLETE trials whose recorded status is ``ok`` (at every length); repeats of one
    configuration (trials launching the same at every length, :func:`mlabench.tune.studies.launch_key`)
    are pooled by the median of their medians, length by length, under the first one's params."""
    groups: dict[str, list[Any]] = {}
    for t in sorted(trials, key=lambda t: t.number):
        if t.state.name == "COMPLETE" and t.user_attrs.get("status") == "ok" and t.value is not None:
            groups.setdefault(launch_key(t), []).append(t)
    out = []
    for ts in groups.values():
        points = [trial_points(t, length) for t in ts]
        times = {n: statistics.median(float(p[n]["median_us"]) for p in points) for n in points[0]}
        splits = {n: int(p["num_kv_splits"]) for n, p in points[0].items() if p.get("num_kv_splits") is not None}
        rel_ci = max(float(p[n].get("median_rel_ci") or 0.0) for p in points for n in p)
        out.append(Measured(params=ts[0].params, median_us=geomean(list(times.values())), rel_ci=rel_ci,
                            trials=len(ts), times_us=times, splits=splits, launch=launch_key(ts[0])))
    return out


def score(m: Measured, best_us: dict[int, float], combine: Combine = "worst") -> float:
    """``m``'s time over the best time at each of its lengths, combined: the worst ratio or their
    geometric mean (1.0: the best at every length)."""
    ratios = [us / best_us[n] for n, us in m.times().items()]
    return max(ratios) if combine == "worst" else geomean(ratios)


def choose(configs: list[Measured], noise: float, combine: Combine = "worst",
           best_us: dict[int, float] | None = None) -> tuple[Measured, Measured]:
    """``(chosen, best)``: ``best`` has the lowest :func:`score`; ``chosen`` is, among the
    configurations scoring within :func:`tie_window` of it, the one with the fewest splits
    averaged over the lengths, then the better score.  ``best_us``: the best time
    per length (default: the fastest of ``configs`` at each).  Raises :class:`ResultsError` when no
    configuration passed the correctness check."""
    if not configs:
        raise ResultsError("no configuration passed the correctness check")
    if best_us is None:
        best_us = {n: min(m.times()[n] for m in configs if n in m.times()) for c in configs for n in c.times()}
    near, best = tied_configs(configs, noise, combine, best_us)
    return near[0], best


def tied_configs(configs: list[Measured], noise: float, combine: Combine,
                 best_us: dict[int, float]) -> tuple[list[Measured], Measured]:
    """``(near, best)``: the configurations scoring within :func:`tie_window` of the best one, in the
    order of :func:`choose`'s tie rule (the fewest splits averaged over the lengths, then the better
    score), and the best-scoring one.  ``configs`` must not be empty."""
    scored = {id(m): score(m, best_us, combine) for m in configs}
    best = min(configs, key=lambda m: scored[id(m)])
    near = [m for m in configs if scored[id(m)] <= scored[id(best)] * (1 + tie_window(noise, best))]
    near.sort(key=lambda m: (m.mean_splits(), scored[id(m)], json.dumps(m.params, sort_keys=True)))
    return near, best


def tie_note(configs: list[Measured], chosen: Measured, best: Measured, noise: float, combine: Combine = "worst",
             best_us: dict[int, float] | None = None) -> str | None:
    """What the tie rule of :func:`choose` did when it chose other than the best-scoring
    configuration (None when it chose that one): how many tied within which tolerance, whether that
    tolerance was the best's confidence interval (measurements too noisy to tell them apart; when
    wider than :data:`TIE_SPREAD_CAP`, the cap) or ``noise``, and the chosen time over the best's."""
    if chosen is best:
        return None
    if best_us is None:
        best_us = {n: min(m.times()[n] for m in configs if n in m.times()) for c in configs for n in c.times()}
    tolerance = tie_window(noise, best)
    tied = sum(score(m, best_us, combine) <= score(best, best_us, combine) * (1 + tolerance) for m in configs)
    capped = (f", ±{100 * best.rel_ci:.3g}%, capped at ±{100 * TIE_SPREAD_CAP:.3g}%"
              if best.rel_ci > TIE_SPREAD_CAP >= noise else "")
    why = (f"its confidence interval{capped}: too noisy to tell them apart; a longer --budget-s or a quieter "
           "machine narrows it") if best.rel_ci > noise else "--noise"
    return (f"{tied} configurations tied within ±{100 * tolerance:.3g}% of the fastest ({why}); the tie rule took "
            f"the fewest splits, {chosen.median_us / best.median_us:.3f}x the fastest's µs")


def policy_choice(backend: Backend, fixed: dict[str, Any], searched: dict[str, Any],
                  bucket: Bucket) -> tuple[dict[str, Any], int | None, int | None]:
    """``(params, tokens_per_split, tile_tokens)`` of a policy entry for ``bucket`` from a study's
    ``searched`` point, giving at every measured length the count that was measured there: a rule
    whose count is the same at every measured length becomes that fixed count; a tokens-per-split
    rule's cap is lowered to its count at the bucket's upper edge (the most it reaches inside the
    bucket); a whole-tile rule keeps its cap (its tiles per split follow from it)."""
    lengths = bucket.measured()
    if RULE_PARAM not in searched and not searched.get(TILE_PARAM):
        return full_params(backend, fixed, searched), None, None
    counts = {params_at(backend, fixed, searched, n)["num_kv_splits"] for n in lengths}
    if len(counts) == 1:
        return params_at(backend, fixed, searched, lengths[0]), None, None
    values = {k: v for k, v in searched.items() if k not in (RULE_PARAM, TILE_PARAM)}
    if searched.get(TILE_PARAM):
        return full_params(backend, fixed, values), None, int(searched[TILE_PARAM])
    tokens, cap = int(searched[RULE_PARAM]), int(searched["num_kv_splits"])
    return full_params(backend, fixed, {**values, "num_kv_splits": rule_splits(bucket.hi, tokens, cap)}), tokens, None


def policy_entry(backend: Backend, fixed: dict[str, Any], searched: dict[str, Any], bucket: Bucket) -> PolicyEntry:
    """The policy entry for ``bucket`` (up to ``bucket.hi`` tokens) from a study's ``searched``
    point: :func:`policy_choice`'s params and rule."""
    params, tokens, tiles = policy_choice(backend, fixed, searched, bucket)
    return PolicyEntry(max_context_len=bucket.hi, params=params, tokens_per_split=tokens, tile_tokens=tiles)


@dataclass
class BucketChoice:
    """What one study chose (``chosen``, ``tokens_per_split`` and ``tile_tokens``: the policy entry), and how it,
    the best-scoring configuration and the best public heuristic measured.

    ``finished`` and ``pruned``: distinct configurations by what they launch (repeats not
    counted, as for ``--trials``); ``*_us``: geometric mean over the bucket's lengths of the
    medians (µs); ``*_worst``: the worst ratio minus 1 over those lengths against the best time
    measured at each (in-sample regret, a fraction).
    """

    batch: int
    bucket: str
    max_context_len: int
    lengths: list[int]
    finished: int
    pruned: int
    configs: int
    chosen: dict[str, Any]
    tokens_per_split: int | None
    chosen_us: float
    chosen_worst: float
    best_us: float
    best_heuristic: str | None
    best_heuristic_us: float | None
    best_heuristic_worst: float | None
    max_splits: int | None = None  #: the study's wave cap on num_kv_splits (None: none)
    tile_tokens: int | None = None  #: the chosen entry's whole-tile rule (None: not one)
    tie: str | None = None  #: what the tie rule did when it chose other than the best (:func:`tie_note`)
    #: The configurations tied with the best (:func:`tied_configs`), as policy entries, the tie rule's
    #: choice first (a neighbour's may be chosen instead: :mod:`mlabench.tune.neighbour_ties`).
    tied: tuple[TiedEntry, ...] = ()
    tie_tolerance: float = 0.0  #: the relative window of those ties (:func:`tie_window`)

    def entry(self) -> PolicyEntry:
        """The policy entry of the choice, for the bucket up to ``max_context_len``."""
        return PolicyEntry(max_context_len=self.max_context_len, params=self.chosen,
                           tokens_per_split=self.tokens_per_split, tile_tokens=self.tile_tokens)


@dataclass(frozen=True)
class TiedEntry:
    """A configuration within the tie window of a study's best, as the policy ``entry`` it makes
    (:func:`policy_choice`), with its ``us`` (the geometric mean over the bucket's lengths of its
    medians, µs) and ``worst`` (its worst ratio minus 1 over those lengths against the best time
    measured at each)."""

    entry: PolicyEntry
    us: float
    worst: float


def study_choice(trials: list[Any], bucket: Bucket, batch: int, backend: Backend, fixed: dict[str, Any],
                 noise: float, combine: Combine) -> BucketChoice:
    """:func:`choose` on a study's trials, and the policy entry it makes (:func:`policy_choice`).

    Raises :class:`ResultsError` naming the bucket when no configuration passed the correctness check.
    """
    configs, best_us = measured_configs(trials, bucket.length), best_times(trials, bucket.length)
    if not configs:
        where = f"batch {batch}, context {bucket.lo + 1}-{bucket.hi}"
        if not any(t.state.name in FINISHED_STATES for t in trials):  # nothing measured, nothing failed
            states = Counter(t.state.name.lower() for t in trials)
            raise ResultsError(f"{where}: none of its {len(trials)} trials finished ("
                               + ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
                               + "): nothing to choose from; `mlabench tune --resume` on the run folder measures them")
        raise ResultsError(f"{where}: no configuration passed the correctness check ({len(trials)} trials)")
    near, best = tied_configs(configs, noise, combine, best_us)
    chosen = near[0]
    tied = tuple(TiedEntry(policy_entry(backend, fixed, m.params, bucket), m.median_us,
                           score(m, best_us, "worst") - 1) for m in near)
    public = {h.name for h in HEURISTICS}  # not the tuner's own enqueued candidates (whole tiles)
    heuristics: dict[str, str] = {}  # launch -> the first public heuristic launching it
    for t in sorted(trials, key=lambda t: t.number):
        if t.user_attrs.get("enqueued_as") in public:
            heuristics.setdefault(launch_key(t), t.user_attrs["enqueued_as"])
    measured_h = [m for m in configs if m.launch in heuristics]
    best_h = min(measured_h, key=lambda m: score(m, best_us, combine)) if measured_h else None
    entry = tied[0].entry  # the chosen configuration's
    return BucketChoice(
        batch, f"{bucket.lo + 1}-{bucket.hi}", bucket.hi, list(bucket.measured()), distinct_finished(trials),
        distinct_finished([t for t in trials if t.state.name == "PRUNED"]),
        len(configs), dict(entry.params), entry.tokens_per_split, chosen.median_us, score(chosen, best_us, "worst") - 1, best.median_us,
        heuristics[best_h.launch] if best_h else None,
        best_h.median_us if best_h else None, score(best_h, best_us, "worst") - 1 if best_h else None,
        tile_tokens=entry.tile_tokens, tie=tie_note(configs, chosen, best, noise, combine, best_us), tied=tied,
        tie_tolerance=tie_window(noise, best))


def build_policy(cfg: TuneConfig, choices: list[BucketChoice], device: str, versions: dict[str, Any],
                 source: dict[str, Any]) -> Policy:
    """The policy of a run's choices (one per batch size and bucket of ``cfg``); adjacent equal
    choices merge."""
    backend = get_backend(cfg.backend)
    by_key = {(c.batch, c.max_context_len): c for c in choices}
    batches = []
    for batch in cfg.batch:
        entries = [by_key[(batch, hi)].entry() for hi in fine_edges(cfg.buckets, cfg.edges_per_octave)]
        batches.append(BatchPolicy(batch=batch, entries=merge_adjacent(entries)))
    shape = dict(shape_dims(cfg))
    shape.setdefault("kv_lora_rank", 512)
    shape.setdefault("qk_rope_head_dim", 64)
    tuned = set(choices[0].chosen) if choices else set(backend.param_names())
    names = [n for n in backend.param_names() if n in tuned]  # a default left out stays out
    return Policy(backend=cfg.backend, shape=shape, device=device, versions=versions,
                  param_names=names, batches=batches, source=source)


