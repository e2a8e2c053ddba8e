"""What every study measures first: the public heuristics and the whole-tile candidates.

Both are enqueued as fixed trials before the sampler's own, so that a study can only match or
beat them, each with its name in the trial's ``enqueued_as`` user attribute:

- :func:`heuristic_trials`: each public split heuristic of :mod:`mlabench.policy.heuristics` (vLLM,
  SGLang, AITER Gluon, the ROCm buckets), named as there;
- :func:`whole_tile_trials`: the whole-tile rule (:func:`mlabench.policy.rules.whole_tile_splits`) at
  one wave of the backend's resident programs, half of it and a quarter, named
  ``whole-tiles-<cap>``, where the study searches that rule.  Why these caps: on an H200 at batch
  1 the fastest count below 32K was the one with the fewest 32-token tiles per split within about
  one program per SM (132 splits, half the 264-program wave), and at 1-3K tokens 48-96 splits of
  one tile (docs/tuning.md);
- :func:`ladder_trials`: for a device policy (``tune --device-policy``), the split ladder up to one
  wave, named ``ladder-<n>``;
- :func:`page_trials`: for a device policy, at each of the study's lengths the counts that cut it
  into whole splits of the fewest pages one wave allows and a few more, named ``pages-<n>``.
"""

from __future__ import annotations

from typing import Any

from mlabench.backends.base import Backend
from mlabench.shapes import MLADecodeShape
from mlabench.tune.space import RULE_PARAM, TILE_PARAM, Dimension, wave_cap
from mlabench.tune.validation import split_ladder

#: Fractions of one wave of resident programs enqueued as whole-tile caps.
WHOLE_TILE_WAVES = (1.0, 0.5, 0.25)


def default_point(backend: Backend, shape: MLADecodeShape, dims: list[Dimension]) -> dict[str, Any]:
    """Every searched backend parameter at the backend's default for ``shape`` (or the nearest
    allowed value); the rule dimensions (:data:`RULE_PARAM`, :data:`TILE_PARAM`) left out."""
    base: dict[str, Any] = {}
    for d in dims:
        if d.name in (RULE_PARAM, TILE_PARAM):
            continue
        default = next(p.default_for(shape) for p in backend.params if p.name == d.name)
        if d.choices:
            base[d.name] = default if default in d.choices else d.choices[0]
        else:
            base[d.name] = min(max(int(default), d.low), d.high)
    return base


def heuristic_trials(backend: Backend, shape: MLADecodeShape, dims: list[Dimension],
                     num_sms: int) -> list[tuple[str, dict[str, Any]]]:
    """``(heuristic name, searched params)`` for each public heuristic: its ``num_kv_splits`` at
    ``shape`` (clamped to the searched range) with every other searched parameter at the backend's
    default (or the nearest allowed value).  With :data:`RULE_PARAM` searched, a heuristic that is a
    tokens-per-split rule is tried as that rule over the bucket, and a fixed count as
    ``tokens_per_split`` 1 (left out when the rule's range starts above 1); with
    :data:`TILE_PARAM` searched, each has it 0.  Empty when ``num_kv_splits`` is not searched."""
    from mlabench.policy.heuristics import HEURISTICS

    by_name = {d.name: d for d in dims}
    splits, rule = by_name.get("num_kv_splits"), by_name.get(RULE_PARAM)
    if splits is None or splits.choices:
        return []
    base = {**default_point(backend, shape, dims), **({TILE_PARAM: 0} if TILE_PARAM in by_name else {})}
    out = []
    for h in HEURISTICS:
        if rule is not None and h.rule is not None:
            tokens, cap = h.rule(shape, num_sms)
            out.append((h.name, {**base, "num_kv_splits": min(max(cap, splits.low), splits.high),
                                 RULE_PARAM: min(max(tokens, rule.low), rule.high)}))
        elif rule is None or rule.low == 1:
            n = h.num_kv_splits(shape, num_sms, splits.low, splits.high)
            out.append((h.name, {**base, "num_kv_splits": n, **({RULE_PARAM: 1} if rule else {})}))
    return out


def whole_tile_trials(backend: Backend, shape: MLADecodeShape, dims: list[Dimension]) -> list[tuple[str, dict[str, Any]]]:
    """``(f"whole-tiles-{n}", searched params)``: the whole-tile rule capped at ``n`` splits for ``n``
    in one wave of the backend's resident programs for ``shape`` (:func:`mlabench.tune.space.wave_cap`:
    264 at batch 1 on an H200), half and a quarter of it (at least 1), each clamped to the
    searched ``num_kv_splits`` range, repeats dropped; the top of that range stands for the wave
    where the backend does not say its resident programs.  Other parameters at their defaults.
    Empty unless ``dims`` searches :data:`TILE_PARAM` (:func:`mlabench.tune.space.study_space`)."""
    by_name = {d.name: d for d in dims}
    splits, tiles = by_name.get("num_kv_splits"), by_name.get(TILE_PARAM)
    if tiles is None or splits is None or splits.choices:
        return []
    wave = wave_cap(backend, shape, 1.0) or splits.high
    caps = dict.fromkeys(min(max(int(wave * f), 1, splits.low), splits.high) for f in WHOLE_TILE_WAVES)
    base, tile = default_point(backend, shape, dims), max(tiles.choices)
    return [(f"whole-tiles-{n}", {**base, "num_kv_splits": n, TILE_PARAM: tile}) for n in caps]


def ladder_top(backend: Backend, shape: MLADecodeShape, num_sms: int, max_splits: int | None = None) -> int:
    """The most splits of the split ladder at ``shape``: ``max_splits`` (a study's wave cap) where
    given, else ``num_sms // (batch x programs a split launches)`` at the backend's defaults (one
    program per SM), at least 1."""
    return max_splits or max(1, num_sms // (shape.batch * backend.split_programs(shape, backend.resolve_params(shape))))


def ladder_trials(backend: Backend, shape: MLADecodeShape, dims: list[Dimension], num_sms: int,
                  max_splits: int | None = None) -> list[tuple[str, dict[str, Any]]]:
    """``(f"ladder-{n}", searched params)`` for each count ``n`` of the split ladder
    (:func:`mlabench.tune.validation.split_ladder`: powers of two, 1.5x powers of two, the SM count)
    up to one wave: ``max_splits`` (the study's wave cap) or, where the backend does not say its
    resident programs, ``num_sms // (batch x split programs)`` (one program per SM), within the
    searched range; other parameters at their defaults, a searched rule at a fixed count
    (``tokens_per_split`` 1, ``tile_tokens`` 0; none when the rule's range starts above 1).  Empty
    when ``num_kv_splits`` is not searched as a range.

    Why: the gluon-splitkv tune of ``results/h200/deploy/qo1/`` (20 trials over counts, a rule,
    ``pdl`` and ``num_stages``) never measured 8 splits at batch 16 from 16K to 64K and chose 16,
    3.0-7.5% slower than 8 at held-out lengths; its validation's best counts at 32 held-out points
    were all within one wave (12-132 at batch 1, 6-8 at batch 16) and 29 of them on this ladder."""
    by_name = {d.name: d for d in dims}
    splits, rule = by_name.get("num_kv_splits"), by_name.get(RULE_PARAM)
    if splits is None or splits.choices or (rule is not None and rule.low > 1):
        return []
    top = ladder_top(backend, shape, num_sms, max_splits)
    base = {**default_point(backend, shape, dims), **({RULE_PARAM: 1} if rule else {}),
            **({TILE_PARAM: 0} if TILE_PARAM in by_name else {})}
    return [(f"ladder-{n}", {**base, "num_kv_splits": n})
            for n in split_ladder(splits.low, min(splits.high, top), num_sms)]


def exact_page_counts(pages: int, top: int) -> list[int]:
    """The split counts that cut ``pages`` pages into ``P`` pages a split with no split left without
    a page (``ceil(pages / P)`` splits), for ``P`` from the fewest that ``top`` splits allow,
    ``P0 = ceil(pages / top)``, up to ``P0 + max(2, P0 // 2)``; largest count first, each once.
    Empty for no page."""
    if pages < 1:
        return []
    first = -(-pages // top)
    counts = [-(-pages // per) for per in range(first, first + max(2, first // 2) + 1)]
    return sorted(set(counts), reverse=True)


def page_trials(backend: Backend, shape: MLADecodeShape, dims: list[Dimension], lengths: tuple[int, ...],
                num_sms: int, max_splits: int | None = None) -> list[tuple[str, dict[str, Any]]]:
    """``(f"pages-{n}", searched params)`` for each count of :func:`exact_page_counts` at each of
    ``lengths`` (tokens; pages of ``shape.page_size``) up to the ladder's top (:func:`ladder_top`),
    within the searched range, not on the split ladder (:func:`ladder_trials` has those); other
    parameters as :func:`ladder_trials` sets them.  Empty when that is.

    Why: ``tune --export --pages-rule`` costs each pages-per-split ``P`` at a tuned length by the
    counts measured there that give ``P``, and the ladder's counts seldom give it with every split
    owning a page: at 20-33K tokens, batch 1 on an H200 (``results/h200/deploy/qo1-k3``), 5-6
    pages a split were best at held-out lengths (64-86 splits), the ladder measured 64, 96 and 128
    (8, 6 with 10 splits empty, 4), and the rule chose 7 pages, up to 6.2% slower."""
    ladder = ladder_trials(backend, shape, dims, num_sms, max_splits)
    if not ladder:
        return []
    splits = next(d for d in dims if d.name == "num_kv_splits")
    top = min(splits.high, ladder_top(backend, shape, num_sms, max_splits))
    on_ladder = {p["num_kv_splits"] for _, p in ladder}
    base = {k: v for k, v in ladder[0][1].items() if k != "num_kv_splits"}
    counts: list[int] = []
    for length in lengths:
        pages = -(-length // shape.page_size)
        counts += [n for n in exact_page_counts(pages, top)
                   if splits.low <= n and n not in on_ladder and n not in counts]
    return [(f"pages-{n}", {**base, "num_kv_splits": n}) for n in counts]
