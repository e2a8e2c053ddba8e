"""``mlabench tune``: what a run searches (:class:`TuneConfig`), its buckets, shapes and search space.

Each study (batch, context bucket) searches the backend's declared parameters
(:class:`~mlabench.backends.base.ParamSpec`) and, where ``num_kv_splits`` is searched, a split count
that grows with the length (``tokens_per_split``, or the whole-tile rule where the backend declares
its split tile), at several lengths of the bucket (log-spaced from its lower edge + 1 to its upper
edge).  Studies run in :mod:`mlabench.tune.trial_worker`, the public heuristics first
(:mod:`mlabench.tune.seeded_trials`); the choice is :mod:`mlabench.tune.choice`.  See ``docs/tuning.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mlabench.backends.base import Backend
from mlabench.bench.point import DEFAULT_CHECK_HEADS
from mlabench.checks.verdict import CheckConfig
from mlabench.errors import ConfigError
from mlabench.files import config_file, read_toml, validation_line
from mlabench.measure.timing import TimingConfig
from mlabench.policy.rules import rule_splits, whole_tile_splits
from mlabench.shapes import MLADecodeShape, resolve_heads

Sampler = Literal["auto", "tpe", "gp", "grid", "brute"]
#: The searched parameter of a split count that grows with the length (not a backend parameter).
RULE_PARAM = "tokens_per_split"
#: The searched choice of the whole-tile rule (0: not; g: tiles of g tokens), not a backend parameter.
TILE_PARAM = "tile_tokens"
#: What a run recorded before these fields existed meant by them (read back on resume and export).
LEGACY_FIELDS = {"lengths_per_bucket": 1, "tokens_per_split": None, "max_waves": 0.0, "whole_tiles": False}


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
    representative: Literal["geomean", "upper"] = Field("geomean", description="With one length per bucket, "
        "the length measured for (lo, hi]: sqrt(lo * hi) or hi; with several, where the heuristics' counts are taken.")
    lengths_per_bucket: int = Field(3, ge=1, le=16, description="Lengths measured per bucket (lo, hi], log-spaced "
                                    "from lo + 1 (hi / 2 for the first) to hi; 1: the representative length only.")
    combine: Literal["worst", "geomean"] = Field("worst", description="How a configuration's times at a bucket's "
        "lengths combine, each over the best measured there: the worst ratio (min-max) or their geometric mean.")
    tokens_per_split: SpaceRange | None = Field(
        default_factory=lambda: SpaceRange(low=1, high=4096),
        description="Range of the tokens-per-split rule searched beside num_kv_splits (1: a fixed count); "
        "None: fixed counts only.  Needs two lengths per bucket or more.")
    whole_tiles: bool = Field(True, description="Where the tokens-per-split rule is searched and the backend declares "
                              "its split tile (split_tile_tokens), also search the whole-tile rule (docs/tuning.md).")
    edges_per_octave: int | None = Field(None, ge=1, le=16, description="Cut buckets into sub-buckets of at "
                                         "most 2 ** (1 / K) in length (edges.fine_edges); None: the given edges.")
    device_policy: bool = Field(False, description="For split_policy=device: num_kv_splits only, the rest at defaults.")
    max_waves: float = Field(1.0, ge=0, description="Cap num_kv_splits at this many waves of the backend's "
                             "resident programs (wave_cap); 0: no cap.  No effect where the backend does not say.")
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
    noise: float = Field(0.01, ge=0, lt=1, description="Configurations within this fraction of the best are ties.")
    heuristics: bool = Field(True, description="Enqueue the public heuristics as the first trials.")
    atol: float | None = Field(None, gt=0, description="Elementwise absolute tolerance on top of the "
                               "relative verdict (optional; a sweep's [check] atol).")
    rtol: float | None = Field(None, ge=0, description="Elementwise relative tolerance with atol (optional).")
    timing: TimingConfig = Field(default_factory=tune_timing)
    storage: str | None = Field(None, description="Optuna storage URL; None: a journal file in the run folder.")

    @model_validator(mode="before")
    @classmethod
    def _default_heads(cls, data: Any) -> Any:
        """No model and no heads: 12 heads, as ``sweep`` and ``check`` take (Kimi K3 at TP8)."""
        if isinstance(data, dict) and not any(data.get(k) for k in ("model", "model_config", "model_config_path",
                                                                     "heads")):
            data = {**data, "heads": DEFAULT_CHECK_HEADS}
        return data

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

    @field_validator("tokens_per_split")
    @classmethod
    def _rule_range(cls, v: SpaceRange | None) -> SpaceRange | None:
        if v is not None and (v.choices is not None or v.low is None or v.high is None or not 1 <= v.low <= v.high):
            raise ValueError("must be a range LOW:HIGH with 1 <= LOW <= HIGH")
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
    except ValidationError as exc:  # a field a flag set is named by the flag
        field, line = str((exc.errors()[0].get("loc") or ("",))[0]), validation_line(exc)
        flag = FIELD_FLAGS.get(field, "--" + field.replace("_", "-")) if values.get(field) is not None else None
        raise ConfigError(f"{flag}: {line.split(': ', 1)[-1]}" if flag else f"tune: {line}") from None


#: TuneConfig fields set by a flag of another name (the others: ``--`` and the field, dashed).
FIELD_FLAGS = {"q_dtype": "--dtype", "kv_dtype": "--dtype", "timeout_s": "--timeout", "timing": "--budget-s"}


# ---- buckets and shapes --------------------------------------------------------------------------
@dataclass(frozen=True)
class Bucket:
    """Context lengths ``(lo, hi]`` (``lo`` 0 for the first), represented by ``length`` and
    measured at ``lengths`` (empty in runs recorded before several lengths: ``(length,)``)."""

    lo: int
    hi: int
    length: int
    lengths: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", tuple(self.lengths))  # a list when read from a manifest

    def measured(self) -> tuple[int, ...]:
        """The lengths this bucket is measured at, increasing."""
        return tuple(self.lengths) or (self.length,)


def buckets_of(edges: list[int], representative: str = "geomean", per_bucket: int = 1) -> list[Bucket]:
    """Buckets from increasing upper edges.  ``length``: ``round(sqrt(lo * hi))`` (``geomean``) or
    ``hi`` (``upper``), the first bucket's ``lo`` taken as ``hi / 2`` (lengths near 0 are not worth
    measuring).  ``lengths``: with ``per_bucket`` 1, ``(length,)``; else ``per_bucket`` lengths
    log-spaced from ``lo + 1`` (``hi / 2`` for the first bucket) to ``hi``, repeats dropped (three:
    the lower edge + 1, the geometric middle, the upper edge)."""
    out, lo = [], 0
    for hi in edges:
        base = lo if lo > 0 else hi / 2
        length = hi if representative == "upper" else max(lo + 1, min(hi, round(math.sqrt(base * hi))))
        if per_bucket == 1:
            lengths: tuple[int, ...] = (int(length),)
        else:
            spread = (round(base * (hi / base) ** (i / (per_bucket - 1))) for i in range(per_bucket))
            lengths = tuple(sorted({min(hi, max(lo + 1, int(n))) for n in spread}))
        out.append(Bucket(lo, hi, int(length), lengths))
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


def search_space(backend: Backend, shape: MLADecodeShape, narrow: dict[str, SpaceRange] | None = None,
                 counts_only: bool = False) -> tuple[list[Dimension], dict[str, Any]]:
    """The backend's declared parameters as ``(dimensions, fixed)``: a bounded integer or a string
    with choices is searched (unless declared ``searched=False``, or ``counts_only`` and not
    ``num_kv_splits``, and not named in ``narrow``); anything else stays at its default.  ``narrow``
    restricts ranges (a single value fixes the parameter).  Raises :class:`ConfigError` for a name
    the backend does not have, a range outside the declared one, or nothing left to search.
    """
    narrow = dict(narrow or {})
    unknown = sorted(set(narrow) - set(backend.param_names()))
    if unknown:
        raise ConfigError(f"{backend.name} has no parameter {unknown[0]!r} "
                          f"(known: {', '.join(backend.param_names()) or 'none'})")
    dims, fixed = [], {}
    for spec in backend.params:
        r = narrow.get(spec.name, SpaceRange())
        if (not spec.searched or counts_only and spec.name != "num_kv_splits") and spec.name not in narrow:
            if not spec.omit_default:  # (left out: what every earlier record ran, one policy
                fixed[spec.name] = spec.default_for(shape)  # parameter set for all batches)
        elif r.choices is not None:
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
        elif not spec.omit_default:  # one left at its default is not a part of the point's key
            fixed[spec.name] = spec.default_for(shape)
    if not dims:
        raise ConfigError(f"{backend.name}: nothing to tune (no bounded integer or string parameter left)")
    return dims, fixed


def capped(dim: Dimension, high: int) -> Dimension:
    """``dim`` with its top lowered to ``high`` (not below its bottom), its log scale re-decided."""
    high = max(dim.low, min(dim.high, high))
    return Dimension(dim.name, low=dim.low, high=high, log=dim.low >= 1 and high >= LOG_SCALE_RATIO * dim.low)


def full_params(backend: Backend, fixed: dict[str, Any], searched: dict[str, Any]) -> dict[str, Any]:
    """Every parameter of ``backend``, in its declared order: the searched ones over the fixed ones
    (one with ``omit_default`` that is neither stays out, as :meth:`Backend.resolve_params` leaves
    it)."""
    values = {**fixed, **searched}
    return {name: values[name] for name in backend.param_names() if name in values}


def wave_cap(backend: Backend, shape: MLADecodeShape, max_waves: float) -> int | None:
    """The most splits whose programs fit in ``max_waves`` waves: ``max(1, floor(max_waves x
    resident / (batch x programs per split)))``, from the backend's
    :meth:`~mlabench.backends.base.Backend.resident_programs` and ``split_programs`` at its default
    parameters; None when ``max_waves`` is 0 or the backend does not know its resident programs.

    Why: on an H200 ``triton-splitkv`` runs 264 programs at once (two per SM); at batch 16, 17
    splits launch 272 and pay a second wave where they do not save a tile per split, and a study
    that chose 17 lost 20-24% to 16 at held-out lengths (docs/tuning.md)."""
    if max_waves <= 0:
        return None
    params = backend.resolve_params(shape)
    resident = backend.resident_programs(shape, params)
    if resident is None:
        return None
    return max(1, math.floor(max_waves * resident / (shape.batch * backend.split_programs(shape, params))))


def study_space(backend: Backend, shape: MLADecodeShape, cfg: TuneConfig, lengths: tuple[int, ...],
                max_splits: int | None = None) -> tuple[list[Dimension], dict[str, Any]]:
    """:func:`search_space` plus, when ``cfg.tokens_per_split`` is set, ``num_kv_splits`` is a
    searched integer range and the study measures two lengths or more, the tokens-per-split rule
    (:data:`RULE_PARAM`, log scale): ``num_kv_splits`` is then the most splits, and the count at a
    length L is ``clamp(ceil(L / tokens_per_split), 1, num_kv_splits)`` (:func:`params_at`).  With
    ``cfg.whole_tiles`` and a backend that declares its split tile g
    (:meth:`~mlabench.backends.base.Backend.split_tile_tokens`), also the choice of the whole-tile
    rule, :data:`TILE_PARAM` in ``(0, g)``, before the rule: the sampler suggests
    ``tokens_per_split`` only when it is 0 (a conditional space; :func:`space_size`).

    ``max_splits`` (:func:`wave_cap`) lowers the top of a searched ``num_kv_splits`` range (never
    below its bottom), and so every rule's clamp.

    Raises :class:`ConfigError` as :func:`search_space` does, and when the rule is asked for but
    the ``num_kv_splits`` range does not start at 1 (the rule counts down to 1 split).
    """
    dims, fixed = search_space(backend, shape, cfg.space, cfg.device_policy)
    if max_splits is not None:
        dims = [capped(d, max_splits) if d.name == "num_kv_splits" and not d.choices else d for d in dims]
    rule = cfg.tokens_per_split
    splits = next((d for d in dims if d.name == "num_kv_splits" and not d.choices), None)
    if rule is None or splits is None or len(lengths) < 2:
        return dims, fixed
    if splits.low != 1:
        raise ConfigError(f"--tokens-per-split counts down to 1 split, but num_kv_splits starts at {splits.low}: "
                          "give --tokens-per-split off, or a range from 1")
    tile = backend.split_tile_tokens(shape, backend.resolve_params(shape, fixed)) if cfg.whole_tiles else None
    tiles = [Dimension(TILE_PARAM, choices=(0, int(tile)))] if tile else []
    return [*dims, *tiles, Dimension(RULE_PARAM, low=rule.low, high=rule.high,
                                     log=rule.high >= LOG_SCALE_RATIO * rule.low)], fixed


def params_at(backend: Backend, fixed: dict[str, Any], searched: dict[str, Any], length: int) -> dict[str, Any]:
    """The backend parameters a study's ``searched`` point launches at ``length`` tokens: with a
    non-zero :data:`TILE_PARAM` g, ``num_kv_splits`` = the whole-tile rule's count for at most
    ``num_kv_splits`` splits (:func:`mlabench.policy.rules.whole_tile_splits`); else with
    :data:`RULE_PARAM`, ``num_kv_splits = clamp(ceil(length / tokens_per_split), 1,
    num_kv_splits)`` (:func:`mlabench.policy.rules.rule_splits`): the policy's own rules."""
    values = {k: v for k, v in searched.items() if k not in (RULE_PARAM, TILE_PARAM)}
    if searched.get(TILE_PARAM):
        values["num_kv_splits"] = whole_tile_splits(length, searched[TILE_PARAM], searched["num_kv_splits"])
    elif RULE_PARAM in searched:
        values["num_kv_splits"] = rule_splits(length, searched[RULE_PARAM], searched["num_kv_splits"])
    return full_params(backend, fixed, values)


def launched(backend: Backend, fixed: dict[str, Any], searched: dict[str, Any],
             lengths: tuple[int, ...]) -> list[list[Any]]:
    """What ``searched`` launches at each of ``lengths``: ``[[length, params], ...]`` (JSON-able;
    two points of a study with equal launches are one configuration, measured once)."""
    return [[n, params_at(backend, fixed, searched, n)] for n in sorted(lengths)]


def space_size(dims: list[Dimension]) -> int:
    """Number of points of the search space: the product of every dimension's values, where
    :data:`RULE_PARAM` is searched only when :data:`TILE_PARAM` is 0."""
    by_name = {d.name: len(d.values()) for d in dims}
    if TILE_PARAM in by_name:
        by_name[RULE_PARAM] = by_name.pop(RULE_PARAM) + by_name.pop(TILE_PARAM) - 1
    return math.prod(by_name.values())


def resolve_sampler(cfg: TuneConfig, dims: list[Dimension]) -> str:
    """The sampler to use: ``auto`` is brute force when the space has at most ``trials`` points."""
    if cfg.sampler != "auto":
        return cfg.sampler
    return "brute" if space_size(dims) <= cfg.trials else "tpe"
