"""``mlabench tune --validate POLICY``: a policy's regret on held-out context lengths.

Held-out lengths are drawn afresh by every validation from a seed it records (one log-uniform draw
per stratum of the range, none within one tile of a bucket edge or a tuned length), at every batch
size of the policy.  Each point measures the policy's choice, every public heuristic's choice and
the reference counts (:func:`reference_counts`): every split count up to the wave cap where that is
at most :data:`EVERY_COUNT_CAP` counts, else the ladder plus every count within a factor
:data:`WINDOW_FACTOR` of the policy's and of the best ladder count.  Regret is ``time / best
time - 1``, the best being the fastest correct of the counts measured (issue 27 item 2: a best
from a ladder alone missed counts 5, 7, 9 and 10 at batch 16).  Every measurement is a record in a
``validate-*`` run folder (readable by ``compare``), with ``validation.json`` and ``validation.md``
beside it.
"""

from __future__ import annotations

import json
import math
import random
import secrets
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlabench.backends import get_backend
from mlabench.bench.shape_bench import ShapeBench
from mlabench.device import current_device
from mlabench.errors import BackendUnavailableError, ConfigError, FileAccessError, Interrupted, ResultsError
from mlabench.measure.timing import TimingConfig
from mlabench.policy.heuristics import heuristic_splits
from mlabench.policy.tuned import Policy
from mlabench.records.record import point_key
from mlabench.records.store import ResultStore
from mlabench.run_files import VALIDATION_FILE, VALIDATION_KIND, VALIDATION_TABLE_FILE
from mlabench.shapes import MLADecodeShape
from mlabench.tables.table import ColumnStyle, Table

Progress = Callable[[int, int, str], None]


#: The largest wave cap at which a held-out point measures every split count up to it.
EVERY_COUNT_CAP = 64
#: Elsewhere a point measures the ladder and every count within this factor of the policy's count
#: and of the best ladder count.
WINDOW_FACTOR = 1.5


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
    return f"held-out lengths {low}-{high} reach outside the lengths the policy was tuned at ({lo}-{hi}){above}"


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
class PointResult:
    """One validated point: the best measured configuration and each rule's time (µs; None failed)."""

    batch: int
    context_len: int
    best_us: float | None
    best_params: dict[str, Any]
    policy_params: dict[str, Any]
    policy_us: float | None
    heuristics: dict[str, dict[str, Any]] = field(default_factory=dict)
    counts_measured: int = 0  # distinct split counts measured at the point (the best is of these)

    def regret(self, us: float | None) -> float | None:
        """``us / best_us - 1`` (None when either failed)."""
        return us / self.best_us - 1 if us is not None and self.best_us else None


@dataclass
class Validation:
    """A validation run: its folder, every point, and the heuristics compared."""

    store: ResultStore
    points: list[PointResult]
    heuristic_names: list[str]
    seed: int | None = None  # the held-out lengths' draw


def _shape(policy: Policy, batch: int, length: int) -> MLADecodeShape:
    keys = ("num_heads", "page_size", "q_dtype", "kv_dtype", "kv_lora_rank", "qk_rope_head_dim", "softmax_scale",
            "qo_len", "causal")
    return MLADecodeShape.uniform(batch, length, **{k: policy.shape[k] for k in keys if k in policy.shape})


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


def validate_policy(policy: Policy, count: int | None = 48, low: int | None = None, high: int | None = None,
                    ladder: list[int] | None = None, timing: TimingConfig | None = None,
                    results_root: Path = Path("results"), progress: Progress | None = None,
                    seed: int | None = None, resume: Path | None = None, policy_path: Path | None = None) -> Validation:
    """Measure ``policy`` on ``count`` held-out lengths in ``[low, high]`` (default
    :func:`policy_span`; ``count`` None: 48, fewer where the span has fewer free lengths) at each of
    its batch sizes, drawn with ``seed`` (:func:`draw_lengths`; None: a fresh random seed), which is
    recorded in the run's configuration, in ``Validation.seed`` and in the tables' notes, and also
    seeds the inputs.  ``ladder``: the ladder of :func:`reference_counts` (default :func:`split_ladder`).

    ``resume``: a validation folder of this policy to continue, with its recorded lengths, seed,
    ladder and timing; what it recorded is reused, not measured again.  Ctrl-C saves the CSV and
    raises :class:`Interrupted` naming the command that continues (``policy_path``: the policy's file).
    Raises :class:`BackendUnavailableError` when the policy's backend cannot run here and
    :class:`ConfigError` for a bad grid or a backend that takes no ``num_kv_splits`` (it would
    run every count alike, and the policy's regret would read 0%).
    """
    backend = get_backend(policy.backend)
    if _splits_spec(backend) is None:
        raise ConfigError(f"backend {backend.name} takes no num_kv_splits: there are no split counts to validate "
                          f"(tune --backend {backend.name} has nothing to tune either)")
    ok, why = backend.available()
    if not ok:
        raise BackendUnavailableError(f"backend {backend.name} is not available here: {why}")
    if resume is not None:
        store, cfg = _reopen(policy, resume)
        lengths, seed, ladder, timing = cfg["lengths"], cfg["seed"], cfg["ladder"], TimingConfig(**cfg["timing"])
    else:
        store, lengths, seed, timing = _new_run(policy, backend, count, low, high, ladder, timing, results_root,
                                                seed, policy_path)
    run_id, copy_bw = store.manifest().run_id, store.manifest().copy_bandwidth_tbps
    prior = {r.key: r for r in store.records()}
    points, total = [], len(lengths) * len(policy.batches)
    if progress:
        progress(0, total, "validate")
    try:
        for b in policy.batches:
            for length in lengths:
                shape = _shape(policy, b.batch, length)
                points.append(_measure_point(backend, shape, policy, ladder, timing, seed, store, run_id, copy_bw,
                                             prior))
                if progress:
                    progress(len(points), total, shape.label())
        return _finish(store, points, seed)
    except KeyboardInterrupt:
        from mlabench.tune.run import validation_resume_command

        store.write_csv()
        raise Interrupted(f"interrupted: {len(points)} of {total} points recorded in {store.run_dir} (kept); "
                          f"continue with: {validation_resume_command(policy_path, store.run_dir)}") from None
    except FileAccessError as exc:  # e.g. the disk filled up: what was recorded stays, and how to go on
        from mlabench.tune.run import validation_resume_command

        raise FileAccessError(f"{exc}; {len(points)} of {total} points are recorded in {store.run_dir} (kept); "
                              f"once it can be written, continue with: "
                              f"{validation_resume_command(policy_path, store.run_dir)}") from None



def _finish(store: ResultStore, points: list[PointResult], seed: int) -> Validation:
    """The :class:`Validation` of ``points``, with ``validation.json``, ``validation.md`` and the CSV written."""
    from mlabench.tables.render import to_markdown

    names = sorted({k for p in points for k in p.heuristics})
    result = Validation(store, points, names, seed)
    (store.run_dir / VALIDATION_FILE).write_text(json.dumps([asdict(p) for p in points], indent=1) + "\n")
    (store.run_dir / VALIDATION_TABLE_FILE).write_text("\n".join(to_markdown(t) for t in validation_tables(result)))
    store.write_csv()
    return result


def _new_run(policy: Policy, backend: Any, count: int | None, low: int | None, high: int | None,
             ladder: list[int] | None, timing: TimingConfig | None, results_root: Path, seed: int | None,
             policy_path: Path | None) -> tuple[ResultStore, list[int], int, TimingConfig]:
    """A new validation folder: its held-out lengths drawn, its configuration recorded."""
    from mlabench.measure.bandwidth import measure_copy_bandwidth_tbps
    from mlabench.tune.run import fresh_run_id, run_manifest
    from mlabench.tune.space import tune_timing

    seed = secrets.randbelow(2**31) if seed is None else seed
    span = policy_span(policy)
    low, high = span[0] if low is None else low, span[1] if high is None else high
    avoid = set(policy.source.get("buckets", [])) | {e.max_context_len for b in policy.batches for e in b.entries}
    avoid |= set(policy.source.get("lengths", []))
    tile = _tile_tokens(backend, policy)
    if count is None:  # the default: 48, or as many as the range holds
        count = max(1, min(48, len(free_lengths(low, high, avoid, tile))))
    lengths = draw_lengths(count, low, high, avoid, tile, seed)
    timing = timing or tune_timing()
    copy_bw = measure_copy_bandwidth_tbps()
    run_id = fresh_run_id(results_root, "validate")
    config = {"validate": {"policy_source": policy.source, "backend": policy.backend, "lengths": lengths,
                           "seed": seed, "ladder": ladder, "timing": timing.model_dump(),
                           "policy": str(policy_path) if policy_path else None}}
    store = ResultStore.create(results_root / run_id, run_manifest(run_id, copy_bw, config, kind=VALIDATION_KIND))
    return store, lengths, seed, timing


def _reopen(policy: Policy, resume: Path) -> tuple[ResultStore, dict[str, Any]]:
    """The validation folder ``resume`` of ``policy`` and its recorded configuration; refuses another
    kind of run, another policy, device, driver, library versions or git revision."""
    from mlabench.tune.run import run_manifest

    store = ResultStore.open_existing(resume, identity=run_manifest("resume", 0.0, {}).identity())
    cfg = store.manifest().config.get("validate")
    if cfg is None:
        raise ResultsError(f"{resume} is not a validation run (its manifest has no validate configuration)")
    if cfg["policy_source"] != policy.source or cfg["backend"] != policy.backend:
        raise ConfigError(f"{resume} validated another policy; give that policy's file, or start a new validation")
    return store, cfg


def _tile_tokens(backend: Any, policy: Policy) -> int:
    """One tile, in tokens, for keeping held-out lengths off the tuned ones: the largest tile of
    the policy's whole-tile rows, else the backend's split tile at batch 1, else the page size."""
    tiles = [e.tile_tokens for b in policy.batches for e in b.entries if getattr(e, "tile_tokens", None)]
    if tiles:
        return max(tiles)
    shape = _shape(policy, 1, max(e.max_context_len for b in policy.batches for e in b.entries))
    return backend.split_tile_tokens(shape, backend.resolve_params(shape)) or shape.page_size


def _measure_point(backend, shape, policy, ladder, timing, seed, store, run_id, copy_bw, prior) -> PointResult:
    """Measure one held-out point: the policy, the heuristics and :func:`reference_counts`, the
    window around the best ladder count once the ladder is measured; each distinct launch once,
    a launch recorded before (``prior``: ``{key: record}`` of a resumed run) not again."""
    from mlabench.tune.space import wave_cap

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
    spec = _splits_spec(backend)
    if spec is not None:
        lo, hi = spec.low or 1, spec.high or 512
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


def geomean_regret_pct(values: list[float | None]) -> float | None:
    """``100 * (geometric mean of (1 + regret) - 1)``, percent; None when ``values`` is empty or holds
    a None (a configuration that failed)."""
    vals = [v for v in values if v is not None]
    if not vals or len(vals) < len(values):
        return None
    return 100 * (math.exp(sum(math.log1p(v) for v in vals) / len(vals)) - 1)


def validation_tables(v: Validation) -> list[Table]:
    """A summary per batch (worst and geometric-mean regret of the policy and every heuristic,
    and how many split counts each point measured) and a table of every point; regrets in percent
    against the best of the counts measured at the point, None where a configuration failed."""
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
    summary.notes.append("regret = time / best time - 1; best = the fastest correct of the split counts measured "
                         f"at that point ({how}); — = a configuration failed")
    if v.seed is not None:
        summary.notes.append(f"held-out lengths drawn with seed {v.seed} (tune --validate ... --seed {v.seed} "
                             "draws them again)")
    point_cols = ["batch", "context", *(["counts"] if counted else []), "best µs", "best splits", "policy splits",
                  "policy %"] + [f"{h} (splits) %" for h in v.heuristic_names]
    # at 80 columns the heuristics' columns go first, then the counts; the policy's stay
    droppable = {f"{h} (splits) %": 1 for h in v.heuristic_names} | ({"counts": 2} if counted else {})
    detail = Table("Held-out points", point_cols, styles={c: ColumnStyle(drop=d) for c, d in droppable.items()})
    for p in v.points:
        regret = p.regret(p.policy_us)
        detail.rows.append([p.batch, p.context_len, *([p.counts_measured] if counted else []), p.best_us,
                            p.best_params.get("num_kv_splits"),
                            p.policy_params.get("num_kv_splits"), None if regret is None else 100 * regret]
                           + [_heuristic_cell(p, h) for h in v.heuristic_names])
    return [summary, detail]


def _span(values: Any) -> str:
    """``"12"`` or ``"12-40"``: the range of some counts."""
    vals = sorted(values)
    return "" if not vals else str(vals[0]) if vals[0] == vals[-1] else f"{vals[0]}-{vals[-1]}"


def _heuristic_cell(p: PointResult, name: str) -> str:
    h = p.heuristics[name]
    regret = p.regret(h["us"])
    return f"{'—' if regret is None else f'{100 * regret:.1f}'} ({h['num_kv_splits']})"
