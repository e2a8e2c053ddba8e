"""``mlabench tune --validate POLICY``: measure a policy on held-out context lengths.

:func:`validate_policy` draws the lengths (:mod:`.validation`), measures at each point the policy's
choice, every public heuristic's and the reference counts with
:class:`~mlabench.bench.shape_bench.ShapeBench`, and writes every measurement as a record in a
``validate-*`` run folder (readable by ``compare``), with ``validation.json`` and ``validation.md``
beside it.  A folder cut short is continued with ``--resume``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mlabench.backends import get_backend
from mlabench.bench.shape_bench import ShapeBench
from mlabench.device import current_device
from mlabench.errors import BackendUnavailableError, ConfigError, FileAccessError, Interrupted, ResultsError
from mlabench.inputs import check_fits
from mlabench.measure.timing import TimingConfig
from mlabench.policy.heuristics import heuristic_splits
from mlabench.policy.tuned import Policy
from mlabench.records.kinds import refuse_search_run_folder, validation_resume_command
from mlabench.records.record import point_key
from mlabench.records.store import ResultStore
from mlabench.run_files import VALIDATION_FILE, VALIDATION_KIND, VALIDATION_TABLE_FILE
from mlabench.shapes import MLADecodeShape
from mlabench.tune.manifest import fresh_run_id, run_manifest
from mlabench.tune.space import tune_timing, wave_cap
from mlabench.tune.validation import (TARGET_TOLERANCE, PointResult, Validation, draw_lengths, free_lengths,
                                      policy_shape, policy_span, reference_counts, split_ladder,
                                      validation_tables)

Progress = Callable[[int, int, str], None]


def _configs(policy: Policy, shape: MLADecodeShape, counts: list[int]) -> dict[str, dict[str, Any]]:
    """``{label: params}`` to measure at one point: the policy, each heuristic, and each of
    ``counts`` (with the backend's other parameters at their defaults, and at the policy's)."""
    backend = get_backend(policy.backend)
    chosen = policy.lookup(shape.batch, shape.max_context_len)
    out = {"policy": dict(chosen)}
    spec = _splits_spec(backend)
    if spec is None:
        return out
    for name, n in heuristic_splits(shape, current_device().num_sms, spec.low or 1, spec.high).items():
        out[f"heuristic:{name}"] = backend.resolve_params(shape, {"num_kv_splits": n})
    for n in counts:
        out[f"count:{n}"] = backend.resolve_params(shape, {"num_kv_splits": n})
        out[f"count-policy:{n}"] = {**chosen, "num_kv_splits": n}
    return out


def _splits_spec(backend: Any) -> Any:
    return next((p for p in backend.params if p.name == "num_kv_splits"), None)


def _splits_range(backend: Any) -> tuple[int, int] | None:
    """The split counts ``backend`` takes, ``(low, high)`` (1 and 512 where its spec leaves one
    open); None when it takes no ``num_kv_splits``."""
    spec = _splits_spec(backend)
    return None if spec is None else (spec.low or 1, spec.high or 512)


def validate_policy(policy: Policy, count: int | None = 48, low: int | None = None, high: int | None = None,
                    ladder: list[int] | None = None, timing: TimingConfig | None = None,
                    results_root: Path = Path("results"), progress: Progress | None = None,
                    seed: int | None = None, resume: Path | None = None, policy_path: Path | None = None,
                    tolerance: float = TARGET_TOLERANCE, extra_lengths: Sequence[int] = ()) -> Validation:
    """Measure ``policy`` on ``count`` held-out lengths in ``[low, high]`` (default
    :func:`policy_span`; ``count`` None: 48, fewer where the span has fewer free lengths; 0: none) at each of
    its batch sizes, drawn with ``seed`` (:func:`draw_lengths`; None: a fresh random seed), which is
    recorded in the run's configuration, in ``Validation.seed`` and in the tables' notes, and also
    seeds the inputs.  ``ladder``: the ladder of :func:`reference_counts` (default :func:`split_ladder`).
    ``extra_lengths``: lengths measured too, wherever they fall (tuned lengths and bucket edges
    included), such as the contexts a server decodes at: a benchmark's prompt of 4096 tokens
    decodes at 4097 and on, beside a bucket edge that the drawn lengths keep a tile away from.

    ``resume``: a validation folder of this policy to continue, with its recorded lengths, seed,
    ladder and timing; what it recorded is reused, not measured again.  ``tolerance``: the target
    the tables judge each point by (:func:`~mlabench.tune.validation.target_verdict`).  Ctrl-C saves the CSV and
    raises :class:`Interrupted` naming the command that continues (``policy_path``: the policy's file).
    Raises :class:`BackendUnavailableError` when the policy's backend cannot run here and
    :class:`ConfigError` for a bad grid or a backend that takes no ``num_kv_splits`` (it would
    run every count alike, and the policy's regret would read 0%).
    """
    backend = _backend_here(policy, resume)
    if resume is not None:
        store, cfg = _reopen(policy, resume)
        lengths, seed, ladder, timing = cfg["lengths"], cfg["seed"], cfg["ladder"], TimingConfig(**cfg["timing"])
        given = tuple(cfg.get("context") or ())  # recorded since --context
    else:
        given = tuple(sorted({int(n) for n in extra_lengths}))
        store, lengths, seed, timing = _new_run(policy, backend, (count, given), low, high, ladder, timing,
                                                results_root, seed, policy_path)
    run_id, copy_bw = store.manifest().run_id, store.manifest().copy_bandwidth_tbps
    prior = {r.key: r for r in store.records()}
    points, total = [], len(lengths) * len(policy.batches)
    if progress:
        progress(0, total, "validate")
    try:
        for b in policy.batches:
            for length in lengths:
                shape = policy_shape(policy, b.batch, length)
                points.append(_measure_point(backend, shape, policy, ladder, timing, seed, store, run_id, copy_bw,
                                             prior))
                if progress:
                    progress(len(points), total, shape.label())
        return _finish(store, points, seed, tolerance, given, policy.device)
    except KeyboardInterrupt:
        store.write_csv()
        raise Interrupted(f"interrupted: {len(points)} of {total} points recorded in {store.run_dir} (kept); "
                          f"continue with: {validation_resume_command(policy_path, store.run_dir)}") from None
    except FileAccessError as exc:  # e.g. the disk filled up: what was recorded stays, and how to go on
        raise type(exc)(f"{exc}; {len(points)} of {total} points are recorded in {store.run_dir} (kept); "
                        f"once it can be written, continue with: "
                        f"{validation_resume_command(policy_path, store.run_dir)}") from None


def _backend_here(policy: Policy, resume: Path | None) -> Any:
    """The backend of ``policy``, once it is known to take ``num_kv_splits`` (:class:`ConfigError`)
    and, where ``resume`` is another kind of run, that run is named as such before this machine's
    backends are asked (a fresh user's review), to run here (:class:`BackendUnavailableError`)."""
    backend = get_backend(policy.backend)
    if _splits_spec(backend) is None:
        raise ConfigError(f"backend {backend.name} takes no num_kv_splits: there are no split counts to validate "
                          f"(tune --backend {backend.name} has nothing to tune either)")
    if resume is not None:
        refuse_search_run_folder(Path(resume), reader=VALIDATION_KIND)
    ok, why = backend.available()
    if not ok:
        raise BackendUnavailableError(f"backend {backend.name} is not available here: {why}")
    return backend


def _finish(store: ResultStore, points: list[PointResult], seed: int, tolerance: float,
            given: tuple[int, ...], policy_device: str | None) -> Validation:
    """The :class:`Validation` of ``points`` (``given``: the lengths of ``--context``;
    ``policy_device``: the GPU the policy was tuned on), with ``validation.json``,
    ``validation.md`` and the CSV written."""
    from mlabench.tables.render import to_markdown

    names = sorted({k for p in points for k in p.heuristics})
    result = Validation(store, points, names, seed, tolerance, given, policy_device=policy_device)
    (store.run_dir / VALIDATION_FILE).write_text(json.dumps([asdict(p) for p in points], indent=1) + "\n")
    (store.run_dir / VALIDATION_TABLE_FILE).write_text("\n".join(to_markdown(t) for t in validation_tables(result)))
    store.write_csv()
    return result


def _new_run(policy: Policy, backend: Any, counts: tuple[int | None, Sequence[int]], low: int | None,
             high: int | None, ladder: list[int] | None, timing: TimingConfig | None, results_root: Path,
             seed: int | None, policy_path: Path | None) -> tuple[ResultStore, list[int], int, TimingConfig]:
    """A new validation folder: its held-out lengths drawn (``counts``: how many, and the extra
    lengths measured too, sorted and distinct), its configuration recorded."""
    from mlabench.measure.bandwidth import measure_copy_bandwidth_tbps

    count, extra = counts
    lo, hi = _splits_range(backend)  # validate_policy refused a backend without num_kv_splits
    if stray := sorted(n for n in ladder or () if not lo <= n <= hi):  # it would be left out unmeasured
        raise ConfigError(f"--ladder {stray[0]}: {backend.name} takes num_kv_splits {lo}-{hi}")
    for b in policy.batches:  # a bad --context length fails before a run folder exists
        for length in extra:
            policy_shape(policy, b.batch, length)
    seed = secrets.randbelow(2**31) if seed is None else seed
    span = policy_span(policy)
    low, high = span[0] if low is None else low, span[1] if high is None else high
    avoid = set(policy.source.get("buckets", [])) | {e.max_context_len for b in policy.batches for e in b.entries}
    avoid |= set(policy.source.get("lengths", []))
    tile = _tile_tokens(backend, policy)
    if count is None:  # the default: 48, or as many as the range holds
        count = max(1, min(48, len(free_lengths(low, high, avoid, tile))))
    drawn = draw_lengths(count, low, high, avoid, tile, seed) if count else []
    lengths = sorted(set(drawn) | set(extra))
    for b in policy.batches if lengths else ():  # each batch's longest point fits, before a run folder exists
        check_fits(policy_shape(policy, b.batch, lengths[-1]))
    timing = timing or tune_timing()
    copy_bw = measure_copy_bandwidth_tbps()
    run_id = fresh_run_id(results_root, "validate")
    config = {"validate": {"policy_source": policy.source, "backend": policy.backend, "lengths": lengths,
                           "context": list(extra), "seed": seed, "ladder": ladder,
                           "timing": timing.model_dump(),
                           "policy": str(policy_path) if policy_path else None, "choices": _choices(policy)}}
    store = ResultStore.create(results_root / run_id, run_manifest(run_id, copy_bw, config, kind=VALIDATION_KIND))
    return store, lengths, seed, timing


def _choices(policy: Policy) -> list[dict[str, Any]]:
    """What a policy chooses (its batches' entries, as JSON), recorded so that a resume with a policy
    of the same tuning run but other counts is refused: it rewrote the run's scores (a fresh
    user's review)."""
    return policy.model_dump(mode="json")["batches"]


def _not_a_validation_run(resume: Path) -> ResultsError:
    return ResultsError(f"{resume} is not a validation run (its manifest has no validate configuration)")


def _reopen(policy: Policy, resume: Path) -> tuple[ResultStore, dict[str, Any]]:
    """The validation folder ``resume`` of ``policy`` and its recorded configuration; refuses another
    kind of run, another policy, device, driver, library versions or git revision."""
    store = ResultStore.open_existing(resume, identity=run_manifest("resume", 0.0, {}).identity(),
                                      repair=False)
    cfg = store.manifest().config.get("validate")
    if cfg is None:
        raise _not_a_validation_run(resume)
    if (cfg["policy_source"] != policy.source or cfg["backend"] != policy.backend
            or cfg.get("choices", _choices(policy)) != _choices(policy)):  # recorded since a fresh user's review
        raise ConfigError(f"{resume} validated another policy; give that policy's file, or start a new validation "
                          f"(tune --validate POLICY --from-run {resume} scores this one on its records)")
    store.drop_torn_line()
    return store, cfg


def _tile_tokens(backend: Any, policy: Policy) -> int:
    """One tile, in tokens, for keeping held-out lengths off the tuned ones: the largest tile of
    the policy's whole-tile rows, else the backend's split tile at batch 1, else the page size."""
    tiles = [e.tile_tokens for b in policy.batches for e in b.entries if getattr(e, "tile_tokens", None)]
    if tiles:
        return max(tiles)
    shape = policy_shape(policy, 1, max(e.max_context_len for b in policy.batches for e in b.entries))
    return backend.split_tile_tokens(shape, backend.resolve_params(shape)) or shape.page_size


def _measure_point(backend, shape, policy, ladder, timing, seed, store, run_id, copy_bw, prior) -> PointResult:
    """Measure one held-out point: the policy, the heuristics and :func:`reference_counts`, the
    window around the best ladder count once the ladder is measured; each distinct launch once,
    a launch recorded before (``prior``: ``{key: record}`` of a resumed run) not again."""
    bench: list[ShapeBench] = []  # made at the first launch not recorded before: its inputs take memory
    times: dict[str, float | None] = {}

    def measure(configs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for key, params in {json.dumps(p, sort_keys=True): p for p in configs.values()}.items():
            if key not in times:
                rec = prior.get(point_key(backend.name, params, shape.key()))
                if rec is None:
                    if not bench:
                        bench.append(ShapeBench(shape, timing, seed=seed))
                    rec = bench[0].run(backend, params, copy_bw_tbps=copy_bw, run_id=run_id)
                    store.append(rec)
                times[key] = rec.median_us if rec.status == "ok" else None
        return configs

    configs = measure(_configs(policy, shape, []))
    counts = _splits_range(backend)
    if counts is not None:
        lo, hi = counts
        steps = ladder if ladder is not None else split_ladder(lo, hi, current_device().num_sms)
        cap, mine = wave_cap(backend, shape, 1.0), configs["policy"].get("num_kv_splits")
        configs = measure(_configs(policy, shape, reference_counts(lo, hi, cap, steps, [mine] if mine else [])))
        on_ladder = {n: times[json.dumps(configs[f"count:{n}"], sort_keys=True)] for n in steps if f"count:{n}" in configs}
        ok_ladder = {n: us for n, us in on_ladder.items() if us is not None}
        if ok_ladder:
            around = [n for n in (mine, min(ok_ladder, key=ok_ladder.__getitem__)) if n]
            configs = measure(_configs(policy, shape, reference_counts(lo, hi, cap, steps, around)))
    return _point_result(shape, configs, times)


def _point_result(shape: MLADecodeShape, configs: dict[str, dict[str, Any]],
                  times: dict[str, float | None]) -> PointResult:
    """The :class:`PointResult` of one point from its ``configs`` and the median µs of each launch."""
    ok = {k: v for k, v in times.items() if v is not None}
    best_key = min(ok, key=ok.__getitem__) if ok else None
    us = {label: times[json.dumps(p, sort_keys=True)] for label, p in configs.items()}
    heur = {label.split(":", 1)[1]: {"num_kv_splits": configs[label].get("num_kv_splits"), "us": us[label]}
            for label in configs if label.startswith("heuristic:")}
    counts = len({json.loads(k).get("num_kv_splits") for k in times})
    return PointResult(shape.batch, shape.max_context_len, ok.get(best_key) if best_key else None,
                       json.loads(best_key) if best_key else {}, configs["policy"], us["policy"], heur,
                       counts_measured=counts)
