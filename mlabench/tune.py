"""``mlabench tune``: one Optuna study per (batch, context bucket), a noise-aware choice, a policy.

For a backend and a decode shape, each study searches the backend's declared parameters
(:class:`~mlabench.backends.base.ParamSpec`: integers by ``low``/``high``, strings by ``choices``)
on the bucket's representative length; the objective is the measurement engine's median (graph
replay and cold cache on a GPU) and every trial is also a result record in the run folder.  A
configuration that fails the correctness check or errors is pruned and never chosen.  The public
heuristics (:mod:`mlabench.heuristics`) are enqueued as the first trials.  Among the configurations
within the measured noise of the best, the one with the fewest splits wins; adjacent buckets with
the same choice merge into one policy entry (:mod:`mlabench.policy`).  See ``docs/tuning.md``.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mlabench.backends import get_backend
from mlabench.backends.base import Backend
from mlabench.configfile import config_file, read_toml, validation_line
from mlabench.errors import ConfigError, ResultsError
from mlabench.policy import BatchPolicy, Policy, PolicyEntry, merge_adjacent
from mlabench.shapes import MLADecodeShape, resolve_heads
from mlabench.timing import TimingConfig
from mlabench.verdict import CheckConfig

Sampler = Literal["auto", "tpe", "gp", "grid", "brute"]


def tune_timing() -> TimingConfig:
    """Tuning's measurement defaults: graph replay only (no eager pass), 0.5 s per configuration."""
    return TimingConfig(budget_s=0.5, eager=False)


class SpaceRange(BaseModel):
    """A narrower range for one parameter: ``low``/``high`` for integers, ``choices`` for strings."""

    model_config = ConfigDict(extra="forbid")
    low: int | None = None
    high: int | None = None
    choices: list[Any] | None = None


class TuneConfig(BaseModel):
    """What a tuning run searches, and how (flags, or a sweep TOML's shape and buckets)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field("tune", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                      description="Run-id prefix: letters, digits, '.', '_' or '-' (it names the run folder).")
    backend: str = Field(description="Backend to tune.")
    model: str | None = Field(None, description="Model preset under configs/models/.")
    model_config_path: str | None = Field(None, alias="model_config", description="A model's HF config.json.")
    tp: int = Field(1, description="Tensor-parallel size dividing the model's heads.")
    heads: int | None = Field(None, description="Local heads (without a model).")
    batch: list[int] = Field([1], description="Batch sizes; one study per batch and bucket.")
    buckets: list[int] = Field(description="Context bucket upper edges, tokens, increasing.")
    representative: Literal["geomean", "upper"] = Field(
        "geomean", description="Length measured for a bucket (lo, hi]: sqrt(lo * hi) or hi.")
    page_size: int = Field(64, description="KV-cache page size.")
    q_dtype: str = Field("bfloat16", description="Query/output dtype.")
    kv_dtype: str = Field("bfloat16", description="Latent cache dtype.")
    qo_len: int = Field(1, ge=1, description="Query tokens per request (1-8; speculative verify, MTP).")
    causal: bool = Field(True, description="Query token t sees the prefix and block tokens 0..t.")
    seed: int = Field(0, description="Seed of the inputs and the samplers.")
    sampler: Sampler = Field("auto", description="auto: brute force when the space has <= trials points, else TPE.")
    trials: int = Field(64, ge=1, description="Finished trials per study (enqueued heuristics count).")
    timeout_s: float | None = Field(None, gt=0, description="Per study and worker, seconds.")
    space: dict[str, SpaceRange] = Field(default_factory=dict, description="Narrower ranges than the backend declares.")
    noise: float = Field(0.01, ge=0, description="Configurations within this fraction of the best are ties.")
    heuristics: bool = Field(True, description="Enqueue the public heuristics as the first trials.")
    atol: float | None = Field(None, gt=0, description="Elementwise absolute tolerance on top of the "
                               "relative verdict (optional; a sweep's [check] atol).")
    rtol: float | None = Field(None, ge=0, description="Elementwise relative tolerance with atol (optional).")
    timing: TimingConfig = Field(default_factory=tune_timing)
    storage: str | None = Field(None, description="Optuna storage URL; None: a journal file in the run folder.")

    @field_validator("batch")
    @classmethod
    def _batch(cls, v: list[int]) -> list[int]:
        if not v or any(b <= 0 for b in v):
            raise ValueError("must be a non-empty list of values > 0")
        return sorted(set(v))

    @field_validator("buckets")
    @classmethod
    def _buckets(cls, v: list[int]) -> list[int]:
        if not v or any(x <= 0 for x in v) or v != sorted(set(v)):
            raise ValueError(f"must be increasing context lengths > 0, got {v}")
        return v

    @property
    def check(self) -> CheckConfig:
        """How trial outputs are judged: every input set, the dtypes' relative limits, and the
        elementwise bound when ``atol`` is set."""
        return CheckConfig(atol=self.atol, rtol=self.rtol)



def load_tune_config(sweep: str | None, values: dict[str, Any]) -> TuneConfig:
    """A :class:`TuneConfig` from flag ``values`` (None values ignored), on top of a sweep TOML's
    model, heads, batch sizes, page size, dtypes and context lengths (the bucket edges).

    ``sweep`` is a path or a name under ``configs/sweeps/``.  Raises :class:`ConfigError`.
    """
    data: dict[str, Any] = {}
    if sweep is not None:
        path = config_file(sweep, "sweeps", "sweep config")
        toml = read_toml(path, "sweep config")
        data = {k: toml[k] for k in ("model", "model_config", "tp", "batch", "page_size", "q_dtype",
                                     "kv_dtype", "causal", "seed") if k in toml}
        if "name" in toml:
            data["name"] = f"tune-{toml['name']}"
        if "context_lens" in toml:
            data["buckets"] = sorted(set(toml["context_lens"]))
        for key in ("heads", "qo_len"):
            value = toml.get(key)
            if isinstance(value, list) and len(value) > 1:
                raise ConfigError(f"{path}: tuning takes one {key} value, the sweep has {value}")
            if value:
                data[key] = value[0] if isinstance(value, list) else value
        for key in ("atol", "rtol"):
            if key in toml.get("check", {}):
                data[key] = toml["check"][key]
    data.update({k: v for k, v in values.items() if v is not None})
    try:
        return TuneConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"tune: {validation_line(exc)}") from None


# ---- buckets and shapes --------------------------------------------------------------------------
@dataclass(frozen=True)
class Bucket:
    """Context lengths ``(lo, hi]`` (``lo`` 0 for the first) measured at ``length``."""

    lo: int
    hi: int
    length: int


def buckets_of(edges: list[int], representative: str = "geomean") -> list[Bucket]:
    """Buckets from increasing upper edges.  ``geomean``: ``round(sqrt(lo * hi))`` with the first
    bucket's ``lo`` taken as ``hi / 2`` (lengths near 0 are not worth measuring); ``upper``: ``hi``."""
    out, lo = [], 0
    for hi in edges:
        base = lo if lo > 0 else hi / 2
        length = hi if representative == "upper" else max(lo + 1, min(hi, round(math.sqrt(base * hi))))
        out.append(Bucket(lo, hi, int(length)))
        lo = hi
    return out


def shape_dims(cfg: TuneConfig) -> dict[str, Any]:
    """``MLADecodeShape`` keyword arguments shared by every point of the run (heads, widths, scale,
    and for a multi-token run its qo_len and mask; a one-token run names neither, as before)."""
    heads, scale, spec = resolve_heads(model=cfg.model, model_config=cfg.model_config_path, tp=cfg.tp,
                                       heads=cfg.heads)
    dims: dict[str, Any] = {"num_heads": heads, "page_size": cfg.page_size, "q_dtype": cfg.q_dtype,
                            "kv_dtype": cfg.kv_dtype, "softmax_scale": scale}
    if spec is not None:
        dims.update(kv_lora_rank=spec.kv_lora_rank, qk_rope_head_dim=spec.qk_rope_head_dim)
    if cfg.qo_len != 1:
        dims.update(qo_len=cfg.qo_len, causal=cfg.causal)
    return dims


def tune_shape(dims: dict[str, Any], batch: int, length: int) -> MLADecodeShape:
    """``batch`` requests of ``length`` tokens with the run's ``dims``."""
    return MLADecodeShape.uniform(batch, length, **dims)


# ---- the search space ----------------------------------------------------------------------------
#: An integer range at least this wide (high / low) is sampled on a log scale by TPE and GP.
LOG_SCALE_RATIO = 64


@dataclass(frozen=True)
class Dimension:
    """One searched parameter: integers ``low..high`` or a list of ``choices``.

    ``log``: sample the integers on a log scale (split counts from 1 to 512: the time changes as
    much from 2 to 4 splits as from 128 to 256); exhaustive samplers enumerate every value anyway.
    """

    name: str
    low: int | None = None
    high: int | None = None
    choices: tuple[Any, ...] = ()
    log: bool = False

    def values(self) -> list[Any]:
        """Every value of the dimension, in order."""
        return list(self.choices) if self.choices else list(range(self.low, self.high + 1))


def search_space(backend: Backend, shape: MLADecodeShape,
                 narrow: dict[str, SpaceRange] | None = None) -> tuple[list[Dimension], dict[str, Any]]:
    """The backend's declared parameters as ``(dimensions, fixed)``: a bounded integer or a string
    with choices is searched; anything else stays at its default.  ``narrow`` restricts ranges
    (a single value fixes the parameter).  Raises :class:`ConfigError` for a name the backend does
    not have, a range outside the declared one, or nothing left to search.
    """
    narrow = dict(narrow or {})
    unknown = sorted(set(narrow) - set(backend.param_names()))
    if unknown:
        raise ConfigError(f"{backend.name} has no parameter {unknown[0]!r} "
                          f"(known: {', '.join(backend.param_names()) or 'none'})")
    dims, fixed = [], {}
    for spec in backend.params:
        r = narrow.get(spec.name, SpaceRange())
        if r.choices is not None:
            choices = tuple(dict.fromkeys(spec.validate(c) for c in r.choices))
            if len(choices) == 1:
                fixed[spec.name] = choices[0]
            else:
                dims.append(Dimension(spec.name, choices=choices))
        elif spec.kind is int and spec.low is not None and spec.high is not None:
            low = spec.validate(r.low if r.low is not None else spec.low)
            high = spec.validate(r.high if r.high is not None else spec.high)
            if low > high:
                raise ConfigError(f"{spec.name}: empty range {low}:{high}")
            if low == high:
                fixed[spec.name] = low
            else:
                wide = low >= 1 and high >= LOG_SCALE_RATIO * low
                dims.append(Dimension(spec.name, low=low, high=high, log=wide))
        elif spec.choices:
            dims.append(Dimension(spec.name, choices=tuple(spec.choices)))
        else:
            fixed[spec.name] = spec.default_for(shape)
    if not dims:
        raise ConfigError(f"{backend.name}: nothing to tune (no bounded integer or string parameter left)")
    return dims, fixed


def full_params(backend: Backend, fixed: dict[str, Any], searched: dict[str, Any]) -> dict[str, Any]:
    """Every parameter of ``backend``, in its declared order: the searched ones over the fixed ones."""
    values = {**fixed, **searched}
    return {name: values[name] for name in backend.param_names()}


def space_size(dims: list[Dimension]) -> int:
    """Number of points of the search space (the product of every dimension's values)."""
    return math.prod(len(d.values()) for d in dims)


def resolve_sampler(cfg: TuneConfig, dims: list[Dimension]) -> str:
    """The sampler to use: ``auto`` is brute force when the space has at most ``trials`` points."""
    if cfg.sampler != "auto":
        return cfg.sampler
    return "brute" if space_size(dims) <= cfg.trials else "tpe"


# ---- choice and policy ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Measured:
    """One configuration's outcome in a study (trials with the same params pooled)."""

    params: dict[str, Any]
    median_us: float
    rel_ci: float
    trials: int


def measured_configs(trials: list[Any]) -> list[Measured]:
    """Correct, finished configurations of a study's trials (Optuna ``FrozenTrial``\\ s): only
    COMPLETE trials whose recorded status is ``ok``; repeats of one configuration are pooled by
    the median of their medians."""
    groups: dict[str, list[Any]] = {}
    for t in trials:
        if t.state.name == "COMPLETE" and t.user_attrs.get("status") == "ok" and t.value is not None:
            groups.setdefault(json.dumps(t.params, sort_keys=True), []).append(t)
    return [Measured(params=ts[0].params, median_us=statistics.median(t.value for t in ts),
                     rel_ci=max(float(t.user_attrs.get("median_rel_ci") or 0.0) for t in ts), trials=len(ts))
            for ts in groups.values()]


def choose(configs: list[Measured], noise: float) -> tuple[Measured, Measured]:
    """``(chosen, fastest)``: among configurations within ``max(noise, the fastest one's measured
    CI half-width)`` of the fastest median, the one with the fewest ``num_kv_splits`` (less
    workspace, fewer partials to merge), then the faster.  Raises :class:`ResultsError` when no
    configuration passed the correctness check."""
    if not configs:
        raise ResultsError("no configuration passed the correctness check")
    fastest = min(configs, key=lambda m: m.median_us)
    tolerance = max(noise, fastest.rel_ci)
    near = [m for m in configs if m.median_us <= fastest.median_us * (1 + tolerance)]
    chosen = min(near, key=lambda m: (m.params.get("num_kv_splits", 0), m.median_us))
    return chosen, fastest


def build_policy(cfg: TuneConfig, choices: dict[tuple[int, int], dict[str, Any]], device: str,
                 versions: dict[str, Any], source: dict[str, Any]) -> Policy:
    """The policy from ``{(batch, bucket hi): full params}``; adjacent equal choices merge."""
    backend = get_backend(cfg.backend)
    dims = shape_dims(cfg)
    batches = []
    for batch in cfg.batch:
        entries = [PolicyEntry(max_context_len=hi, params=choices[(batch, hi)]) for hi in cfg.buckets]
        batches.append(BatchPolicy(batch=batch, entries=merge_adjacent(entries)))
    shape = {k: v for k, v in dims.items()}
    shape.setdefault("kv_lora_rank", 512)
    shape.setdefault("qk_rope_head_dim", 64)
    return Policy(backend=cfg.backend, shape=shape, device=device, versions=versions,
                  param_names=list(backend.param_names()), batches=batches, source=source)


def heuristic_trials(backend: Backend, shape: MLADecodeShape, dims: list[Dimension],
                     num_sms: int) -> list[tuple[str, dict[str, Any]]]:
    """``(heuristic name, searched params)`` for each public heuristic: its ``num_kv_splits``
    (clamped to the searched range) with every other searched parameter at the backend's default
    (or the nearest allowed value).  Empty when ``num_kv_splits`` is not searched."""
    from mlabench.heuristics import heuristic_splits

    by_name = {d.name: d for d in dims}
    splits = by_name.get("num_kv_splits")
    if splits is None or splits.choices:
        return []
    base: dict[str, Any] = {}
    for d in dims:
        default = next(p.default_for(shape) for p in backend.params if p.name == d.name)
        if d.choices:
            base[d.name] = default if default in d.choices else d.choices[0]
        else:
            base[d.name] = min(max(int(default), d.low), d.high)
    return [(name, {**base, "num_kv_splits": n})
            for name, n in heuristic_splits(shape, num_sms, splits.low, splits.high).items()]
