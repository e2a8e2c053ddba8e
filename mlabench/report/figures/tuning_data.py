"""The data of the tuning figures (issue item f): pure functions from a tuning or validation run,
no matplotlib.

- :func:`study_choices`: per study (batch, context bucket), what the run measured, what the policy
  chose there, the fastest configuration and the best public heuristic;
- :func:`tuning_history`: each study's trials in the order measured, with the best time so far;
- :func:`policy_steps`: the policy's split count against the context length, beside every public
  heuristic's (:mod:`mlabench.policy.heuristics`) and the fastest split counts measured;
- :func:`validation_regret`: the regret of the policy and of each heuristic on the held-out grid.

A tuning run's trials are its records (:class:`mlabench.records.readers.TuneRun`), one per configuration
measured, in the order they were measured; a configuration a study suggested again is reused, not
measured again, so it has no record of its own.  The heuristics' choices are recomputed from each
study's shape, the run's GPU (SM count) and search range, as the tuner enqueued them.  Times are
median µs per decode call of records whose status is ``ok`` (correct on their own inputs).
"""

from __future__ import annotations

import json
import math
from typing import Any

from mlabench.records.record import Record
from mlabench.records.side_files import geomean_regret_pct
from mlabench.report.figures.tuning_types import (
    PolicySteps, RegretCurve, RegretPanel, SplitSteps, Study, StudyChoice, StudyHistory, Trial,
)

SPLITS = "num_kv_splits"


def studies_of(run: Any) -> list[Study]:
    """The studies of a :class:`mlabench.records.readers.TuneRun`, in the order of its manifest; a study
    measured at several lengths is shown at the one nearest its representative length (the
    bucket's geometric middle), whose records are one per configuration like a one-length study's."""
    out = []
    for s in run.studies:
        middle = int(s["length"])
        shown = min(s.get("lengths") or [middle], key=lambda n: (abs(math.log(int(n) / middle)), n))
        out.append(Study(int(s["batch"]), int(s["lo"]), int(s["hi"]), int(shown)))
    return out


def study_records(run: Any, study: Study) -> list[Record]:
    """The records (trials) of ``study``, in the order measured."""
    return [r for r in run.records if r.batch == study.batch and r.context_len == study.length]


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


def _clamped_heuristics(run: Any, shape: Any) -> dict[str, dict[str, Any]]:
    """``{heuristic: full params}`` the tuner enqueues for ``shape`` (an ``MLADecodeShape``): each
    public heuristic's split count clamped to the run's searched range, other parameters at their
    defaults.  Empty when the run does not search ``num_kv_splits``."""
    from mlabench.backends import get_backend
    from mlabench.tune.seeded_trials import heuristic_trials
    from mlabench.tune.space import TuneConfig, full_params, search_space

    cfg = TuneConfig.model_validate(run.config)
    backend = get_backend(cfg.backend)
    dims, fixed = search_space(backend, shape, cfg.space)
    num_sms = int(run.manifest.device.get("num_sms") or 1)
    return {name: full_params(backend, fixed, p) for name, p in heuristic_trials(backend, shape, dims, num_sms)}


def study_heuristics(run: Any, records: list[Record]) -> dict[str, dict[str, Any]]:
    """``{heuristic: params}`` of the study whose trials are ``records`` (its shape is theirs)."""
    from mlabench.shapes import MLADecodeShape

    if not records:
        return {}
    return _clamped_heuristics(run, MLADecodeShape.model_validate(records[0].shape))


def _fastest(records: list[Record]) -> Record | None:
    ok = [r for r in records if r.status == "ok" and r.median_us is not None]
    return min(ok, key=lambda r: r.median_us) if ok else None


def study_choices(run: Any) -> list[StudyChoice]:
    """One :class:`StudyChoice` per study: the policy's choice at the study's length (None when the
    run has no policy), the fastest correct trial, and the fastest heuristic among the trials."""
    out = []
    for study in studies_of(run):
        recs = study_records(run, study)
        ok = {_key(r.params): r for r in recs if r.status == "ok" and r.median_us is not None}
        chosen = run.policy.lookup(study.batch, study.length) if run.policy is not None else None
        fastest = _fastest(recs)
        choice = StudyChoice(study, len(recs), len(ok), chosen,
                             ok[_key(chosen)].median_us if chosen and _key(chosen) in ok else None,
                             fastest.params if fastest else None, fastest.median_us if fastest else None)
        timed = [(ok[_key(p)].median_us, name, p) for name, p in study_heuristics(run, recs).items()
                 if _key(p) in ok]
        if timed:
            choice.heuristic_us, choice.best_heuristic, choice.heuristic = min(timed, key=lambda t: t[0])
        out.append(choice)
    return out


def tuning_history(run: Any) -> dict[int, list[StudyHistory]]:
    """Per batch size, per study (in bucket order), its trials and the best time so far (µs)."""
    choices = {(c.study.batch, c.study.hi): c for c in study_choices(run)}
    out: dict[int, list[StudyHistory]] = {}
    for study in studies_of(run):
        recs = study_records(run, study)
        names: dict[str, list[str]] = {}
        for name, params in study_heuristics(run, recs).items():
            names.setdefault(_key(params), []).append(name)
        choice = choices[(study.batch, study.hi)]
        best, trials = None, []
        for i, r in enumerate(recs, 1):
            us = r.median_us if r.status == "ok" else None
            best = us if best is None or (us is not None and us < best) else best
            trials.append(Trial(i, r.params, us, r.status, best, names.get(_key(r.params), []),
                                choice.chosen is not None and _key(r.params) == _key(choice.chosen)))
        rule = run.policy.entry(study.batch, study.length) if run.policy is not None else None
        rule_text = rule.describe() if rule is not None and (rule.tokens_per_split or rule.tile_tokens) else None
        out.setdefault(study.batch, []).append(StudyHistory(study, trials, choice.chosen, choice.chosen_us,
                                                            rule_text))
    return {b: sorted(hs, key=lambda h: h.study.hi) for b, hs in sorted(out.items())}


def length_grid(low: int, high: int, extra: set[int], points: int = 240) -> list[int]:
    """``points`` log-spaced lengths in ``[low, high]`` with ``extra`` (in range) added, sorted."""
    grid = {round(low * (high / low) ** (i / (points - 1))) for i in range(points)}
    return sorted(grid | {x for x in extra if low <= x <= high})


def policy_steps(run: Any, validations: list[Any] = ()) -> list[PolicySteps]:
    """Per batch size of ``run``'s policy: its split count and every public heuristic's over the
    context lengths of the buckets (from a quarter of the first edge to the last edge), and the
    fastest split counts measured.  ``validations``: :class:`mlabench.records.readers.ValidationRun` s, those
    of this run's policy add their held-out points.  [] when the run has no policy."""
    from mlabench.shapes import MLADecodeShape

    policy = run.policy
    if policy is None:
        return []
    edges = [int(e) for e in run.config.get("buckets") or []] or sorted(
        {e.max_context_len for b in policy.batches for e in b.entries})
    held = [p for v in validations if v.policy_run_id == run.name for p in (v.points or [])]
    extra = {e + d for e in edges for d in (0, 1)} | {p.context_len for p in held}
    grid = length_grid(max(1, edges[0] // 4), max(edges[-1], max((p.context_len for p in held), default=0)), extra)
    keys = ("page_size", "q_dtype", "kv_dtype", "kv_lora_rank", "qk_rope_head_dim", "softmax_scale", "qo_len", "causal")
    dims = {k: policy.shape[k] for k in keys if k in policy.shape}
    fastest = {(c.study.batch, c.study.length): c.fastest for c in study_choices(run)}
    out = []
    for b in policy.batches:
        by_name: dict[str, list[int]] = {}
        for length in grid:
            shape = MLADecodeShape.uniform(b.batch, length, policy.shape["num_heads"], **dims)
            for name, params in _clamped_heuristics(run, shape).items():
                by_name.setdefault(name, []).append(int(params[SPLITS]))
        mine = SplitSteps("policy", grid, [int(policy.lookup(b.batch, n).get(SPLITS, 0)) for n in grid])
        out.append(PolicySteps(
            b.batch, mine, [SplitSteps(n, grid, s) for n, s in by_name.items()], edges,
            sorted((n, int(p[SPLITS])) for (bb, n), p in fastest.items() if bb == b.batch and p and SPLITS in p),
            [(p.context_len, int(p.best_params[SPLITS])) for p in held
             if p.batch == b.batch and SPLITS in p.best_params]))
    return out


def _curve(name: str, points: list[Any], us_of: Any, splits_of: Any) -> RegretCurve:
    regrets = [p.regret(us_of(p)) for p in points]
    pct = [None if r is None else 100 * r for r in regrets]
    worst = None if None in pct or not pct else max(pct)
    return RegretCurve(name, [p.context_len for p in points], pct, [splits_of(p) for p in points], worst,
                       geomean_regret_pct(regrets))


def validation_regret(run: Any) -> list[RegretPanel]:
    """Per batch size of a :class:`mlabench.records.readers.ValidationRun`: the regret of its policy and of
    every heuristic at each held-out length ([] without ``validation.json``).  The best time of a
    point is the fastest correct configuration measured there (split ladder, policy, heuristics)."""
    points = run.points or []
    source = run.manifest.config["validate"].get("policy_source") or {}
    edges = [int(e) for e in source.get("buckets") or []]
    names = sorted({h for p in points for h in p.heuristics})
    out = []
    for batch in sorted({p.batch for p in points}):
        mine = sorted((p for p in points if p.batch == batch), key=lambda p: p.context_len)
        policy = _curve("policy", mine, lambda p: p.policy_us, lambda p: p.policy_params.get(SPLITS))
        heur = [_curve(h, mine, lambda p, h=h: p.heuristics[h]["us"], lambda p, h=h: p.heuristics[h][SPLITS])
                for h in names]
        out.append(RegretPanel(batch, policy, heur, edges))
    return out
