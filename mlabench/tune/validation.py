"""``mlabench tune --validate POLICY``: a policy's regret on held-out context lengths.

On a dense grid of lengths (log-spaced, none on a bucket edge or a tuned length) at every batch
size of the policy, each point measures a ladder of split counts (the exhaustive reference), the
policy's choice and every public heuristic's choice; regret is ``time / best time - 1``.  Every
measurement is a record in a ``validate-*`` run folder (readable by ``compare``), with
``validation.json`` and ``validation.md`` beside it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlabench.backends import get_backend
from mlabench.device import current_device
from mlabench.errors import BackendUnavailableError, ConfigError
from mlabench.measure.timing import TimingConfig
from mlabench.policy.heuristics import heuristic_splits
from mlabench.policy.tuned import Policy
from mlabench.records.store import ResultStore
from mlabench.shapes import MLADecodeShape
from mlabench.sweep.point import ShapeBench
from mlabench.tables.table import Table

Progress = Callable[[int, int, str], None]


def validation_lengths(count: int, low: int, high: int, avoid: set[int]) -> list[int]:
    """``count`` distinct, sorted, roughly log-spaced lengths in ``[low, high]``, none in ``avoid``
    (bucket edges, tuned lengths): each log-spaced target moves to the nearest free length inside
    the range (down before up, so the top one stays at or below ``high``).  Raises
    :class:`ConfigError` for a bad range or one with fewer than ``count`` free lengths."""
    if count < 1 or low < 1 or high <= low:
        raise ConfigError(f"validation grid needs count >= 1 and 1 <= low < high, got {count}, {low}, {high}")
    taken = {n for n in avoid if low <= n <= high}
    if high - low + 1 - len(taken) < count:
        raise ConfigError(f"validation grid: fewer than {count} lengths in [{low}, {high}] off the bucket edges "
                          "and tuned lengths")
    out: list[int] = []
    for i in range(count):
        target = round(low * (high / low) ** (i / max(1, count - 1))) if count > 1 else low
        for step in range(high - low + 1):
            free = [n for n in (target - step, target + step) if low <= n <= high and n not in taken]
            if free:
                break
        out.append(free[0])
        taken.add(free[0])
    return sorted(out)


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

    def regret(self, us: float | None) -> float | None:
        """``us / best_us - 1`` (None when either failed)."""
        return us / self.best_us - 1 if us is not None and self.best_us else None


@dataclass
class Validation:
    """A validation run: its folder, every point, and the heuristics compared."""

    store: ResultStore
    points: list[PointResult]
    heuristic_names: list[str]


def _shape(policy: Policy, batch: int, length: int) -> MLADecodeShape:
    keys = ("num_heads", "page_size", "q_dtype", "kv_dtype", "kv_lora_rank", "qk_rope_head_dim", "softmax_scale",
            "qo_len", "causal")
    return MLADecodeShape.uniform(batch, length, **{k: policy.shape[k] for k in keys if k in policy.shape})


def _configs(policy: Policy, shape: MLADecodeShape, ladder: list[int] | None) -> dict[str, dict[str, Any]]:
    """``{label: params}`` to measure at one point: the policy, each heuristic, the ladder."""
    backend = get_backend(policy.backend)
    chosen = policy.lookup(shape.batch, shape.max_context_len)
    out = {"policy": dict(chosen)}
    spec = next((p for p in backend.params if p.name == "num_kv_splits"), None)
    if spec is None:
        return out
    num_sms = current_device().num_sms
    for name, n in heuristic_splits(shape, num_sms, spec.low or 1, spec.high).items():
        out[f"heuristic:{name}"] = backend.resolve_params(shape, {"num_kv_splits": n})
    for n in ladder if ladder is not None else split_ladder(spec.low or 1, spec.high or 512, num_sms):
        out[f"ladder:{n}"] = backend.resolve_params(shape, {"num_kv_splits": n})
        out[f"ladder-policy:{n}"] = {**chosen, "num_kv_splits": n}
    return out


def validate_policy(policy: Policy, count: int = 48, low: int = 1024, high: int = 131072,
                    ladder: list[int] | None = None, timing: TimingConfig | None = None,
                    results_root: Path = Path("results"), progress: Progress | None = None,
                    seed: int = 0) -> Validation:
    """Measure ``policy`` on ``count`` held-out lengths in ``[low, high]`` at each of its batch sizes.

    Raises :class:`BackendUnavailableError` when the policy's backend cannot run here and
    :class:`ConfigError` for a bad grid.
    """
    from mlabench.measure.bandwidth import measure_copy_bandwidth_tbps
    from mlabench.tune.run import fresh_run_id, run_manifest
    from mlabench.tune.space import tune_timing

    backend = get_backend(policy.backend)
    ok, why = backend.available()
    if not ok:
        raise BackendUnavailableError(f"backend {backend.name} is not available here: {why}")
    avoid = set(policy.source.get("buckets", [])) | {e.max_context_len for b in policy.batches for e in b.entries}
    lengths = validation_lengths(count, low, high, avoid | set(policy.source.get("lengths", [])))
    timing = timing or tune_timing()
    copy_bw = measure_copy_bandwidth_tbps()
    run_id = fresh_run_id(results_root, "validate")
    config = {"validate": {"policy_source": policy.source, "backend": policy.backend, "lengths": lengths,
                           "ladder": ladder, "timing": timing.model_dump()}}
    store = ResultStore.create(results_root / run_id, run_manifest(run_id, copy_bw, config))
    points, total = [], len(lengths) * len(policy.batches)
    for b in policy.batches:
        for length in lengths:
            shape = _shape(policy, b.batch, length)
            points.append(_measure_point(backend, shape, policy, ladder, timing, seed, store, run_id, copy_bw))
            if progress:
                progress(len(points), total, shape.label())
    names = sorted({k for p in points for k in p.heuristics})
    result = Validation(store, points, names)
    (store.run_dir / "validation.json").write_text(json.dumps([asdict(p) for p in points], indent=1) + "\n")
    from mlabench.tables.render import to_markdown

    (store.run_dir / "validation.md").write_text("\n".join(to_markdown(t) for t in validation_tables(result)))
    store.write_csv()
    return result


def _measure_point(backend, shape, policy, ladder, timing, seed, store, run_id, copy_bw) -> PointResult:
    bench = ShapeBench(shape, timing, seed=seed)
    times: dict[str, float | None] = {}
    configs = _configs(policy, shape, ladder)
    for params in {json.dumps(p, sort_keys=True): p for p in configs.values()}.values():
        rec = bench.run(backend, params, copy_bw_tbps=copy_bw, run_id=run_id)
        store.append(rec)
        times[json.dumps(params, sort_keys=True)] = rec.median_us if rec.status == "ok" else None
    ok = {k: v for k, v in times.items() if v is not None}
    best_key = min(ok, key=ok.__getitem__) if ok else None
    us = {label: times[json.dumps(p, sort_keys=True)] for label, p in configs.items()}
    heur = {label.split(":", 1)[1]: {"num_kv_splits": configs[label].get("num_kv_splits"), "us": us[label]}
            for label in configs if label.startswith("heuristic:")}
    return PointResult(shape.batch, shape.max_context_len, ok.get(best_key) if best_key else None,
                       json.loads(best_key) if best_key else {}, configs["policy"], us["policy"], heur)


def geomean_regret_pct(values: list[float | None]) -> float | None:
    """``100 * (geometric mean of (1 + regret) - 1)``, percent; None when ``values`` is empty or holds
    a None (a configuration that failed)."""
    vals = [v for v in values if v is not None]
    if not vals or len(vals) < len(values):
        return None
    return 100 * (math.exp(sum(math.log1p(v) for v in vals) / len(vals)) - 1)


def validation_tables(v: Validation) -> list[Table]:
    """A summary per batch (worst and geometric-mean regret of the policy and every heuristic)
    and a table of every point; regrets in percent, None where a configuration failed."""
    cols = ["batch", "points", "policy worst %", "policy geomean %"] + [f"{h} geomean %" for h in v.heuristic_names]
    summary = Table("Regret against the per-point best of the split ladder", cols)
    for batch in sorted({p.batch for p in v.points}) + [None]:
        pts = [p for p in v.points if batch is None or p.batch == batch]
        policy = [p.regret(p.policy_us) for p in pts]
        worst = None if None in policy else 100 * max(policy)
        summary.rows.append(["all" if batch is None else batch, len(pts), worst, geomean_regret_pct(policy)]
                            + [geomean_regret_pct([p.regret(p.heuristics[h]["us"]) for p in pts])
                               for h in v.heuristic_names])
    summary.notes.append("regret = time / best time - 1; best = fastest correct configuration measured at "
                         "that point (split ladder, policy, heuristics); — = a configuration failed")
    point_cols = ["batch", "context", "best µs", "best splits", "policy splits", "policy %"] + [
        f"{h} (splits) %" for h in v.heuristic_names]
    detail = Table("Held-out points", point_cols)
    for p in v.points:
        regret = p.regret(p.policy_us)
        detail.rows.append([p.batch, p.context_len, p.best_us, p.best_params.get("num_kv_splits"),
                            p.policy_params.get("num_kv_splits"), None if regret is None else 100 * regret]
                           + [_heuristic_cell(p, h) for h in v.heuristic_names])
    return [summary, detail]


def _heuristic_cell(p: PointResult, name: str) -> str:
    h = p.heuristics[name]
    regret = p.regret(h["us"])
    return f"{'—' if regret is None else f'{100 * regret:.1f}'} ({h['num_kv_splits']})"
