"""Sweep configuration and grid expansion: what a sweep measures, as points.

A sweep is backends x batch x context lengths x heads x query tokens per request (``qo_len``),
and per backend the product of its parameter axes (``num_kv_splits``, ``head_padding``, ...).  Everything is validated before a run
folder is created, so bad input leaves nothing half-written.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mlabench.backends import backend_names, get_backend
from mlabench.backends.base import Backend, param_grid
from mlabench.bench.point import Point
from mlabench.checks.verdict import CheckConfig
from mlabench.device import DeviceInfo, current_device
from mlabench.errors import ConfigError, ResultsError
from mlabench.files import config_file, read_toml, validation_line
from mlabench.inputs import check_fits
from mlabench.measure.timing import TimingConfig
from mlabench.records.kinds import recording_script, refuse_search_run_folder, refuse_search_runs
from mlabench.records.store import ResultStore
from mlabench.shapes import MLADecodeShape, PageSize, resolve_heads
from mlabench.sweep.order import DEFAULT_ORDER, Order
from mlabench.sweep.visits import DEFAULT_VISIT_REL_SE

#: The two ways to name a model; one given by a flag replaces either in a file.
MODEL_SOURCES = ("model", "model_config")


class SweepConfig(BaseModel):
    """A sweep, as read from ``configs/sweeps/*.toml`` and/or flags."""

    name: str = Field("sweep", description="Run-id prefix.")
    model: str | None = Field(None, description="Model preset under configs/models/.")
    model_config_path: str | None = Field(None, alias="model_config", description="A model's HF config.json.")
    tp: int = Field(1, ge=1, description="Tensor-parallel size dividing the model's heads.")
    heads: list[int] | None = Field(None, description="Local heads axis (instead of, or equal to, the model's).")
    backends: list[str] | None = Field(None, description="Backends to run; default: every available non-reference one.")
    batch: list[int] = Field([1], description="Batch sizes.")
    context_lens: list[int] = Field([4096], description="Context lengths, tokens (one per point, all requests equal).")
    qo_len: list[int] = Field([1], description="Query tokens per request (1-8; speculative verify, MTP), an axis.")
    causal: bool = Field(True, description="Query token t sees the prefix and block tokens 0..t (False: a draft "
                                           "block that sees only the cache).")
    page_size: PageSize = Field(64, description="KV-cache page size.")
    q_dtype: str = Field("bfloat16", description="Query/output dtype.")
    kv_dtype: str = Field("bfloat16", description="Latent cache dtype.")
    seed: int = Field(0, description="Seed of the random inputs.")
    params: dict[str, list[Any]] = Field(default_factory=dict, description="Parameter axes, e.g. num_kv_splits = [1, 16].")
    check: CheckConfig = Field(default_factory=CheckConfig)
    timing: TimingConfig = Field(default_factory=TimingConfig)
    order: Order = Field(DEFAULT_ORDER, description="Measuring order: grid, shuffled or interleaved (mlabench.sweep.order).")
    order_seed: int | None = Field(None, description="Seed of the order; drawn and recorded when not given.")
    sentinel_every: int = Field(20, ge=0, description="Re-measure the sentinel point after every N measurements "
                                                      "(points, or visits with several per point; 0: only at the "
                                                      "start and end).")
    visits: int | None = Field(None, ge=1, le=16, description="Visits per point, spread over the run and their "
                               "samples pooled (mlabench.sweep.visits); default: 4 on a GPU, 1 on the CPU.")
    max_visits: int | None = Field(None, ge=1, le=48, description=(
        "Most visits of a point whose visits disagree (mlabench.sweep.visits.settled); default: 3 x visits."))
    visit_rel_se: float = Field(DEFAULT_VISIT_REL_SE, gt=0, lt=1, description=(
        "A point is visited again, up to max_visits, while the standard error of the mean of its "
        "visits' medians is above this fraction of that mean."))
    drift_target: float = Field(0.01, gt=0, description="Sentinel drift (relative) beyond which the run is flagged.")

    # strict: a file's "16", true or 16.0 is refused where a number is asked (lax, they would run 16, 1, 16)
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)

    @field_validator("batch", "context_lens", "qo_len", "heads", mode="before")
    @classmethod
    def _one_value_axis(cls, v: Any) -> Any:
        """A single value is an axis of one value: ``batch = 16`` reads as ``batch = [16]`` (and
        ``batch = "16"`` is refused as ``batch.0``, no integer, not as no list)."""
        return [v] if isinstance(v, (int, float, str, bool)) else v

    @field_validator("batch", "context_lens", "qo_len")
    @classmethod
    def _positive(cls, v: list[int], info: Any) -> list[int]:
        if not v:
            raise ValueError("must not be empty")
        for x in v:
            if x <= 0:
                raise ValueError(f"must be > 0, got {x}")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", v):
            raise ValueError(f"must be letters, digits, '.', '_' or '-' (it names the run folder), got {v!r}")
        return v

    @field_validator("backends")
    @classmethod
    def _backends(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and not v:
            raise ValueError("must not be empty (leave the key out for every backend available here)")
        return v

    @field_validator("heads")
    @classmethod
    def _heads(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or any(h <= 0 for h in v)):
            raise ValueError("must be a non-empty list of values > 0")
        return v

    @field_validator("params", mode="before")
    @classmethod
    def _one_value_params(cls, v: Any) -> Any:
        """A parameter given one value (``num_kv_splits = 4``) is an axis of that value."""
        if isinstance(v, dict):
            return {name: values if isinstance(values, list) else [values] for name, values in v.items()}
        return v

    @field_validator("params")
    @classmethod
    def _axes(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        integers = integer_params()
        for name, values in v.items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"{name} must be a non-empty list")
            stray = [x for x in values if name in integers and (isinstance(x, bool) or not isinstance(x, int))]
            if stray:  # as strict as the file's other numbers: "4" is not read as 4
                raise ValueError(f"{name} takes integers, got {stray[0]!r}")
        return v


def integer_params() -> set[str]:
    """Names of the backend parameters that take integers (``num_kv_splits``, ``pdl``, ...)."""
    return {spec.name for b in map(get_backend, backend_names()) for spec in b.params if spec.kind is int}


def param_takers() -> dict[str, list[str]]:
    """Every backend parameter's name -> the names of the backends that take it."""
    takers: dict[str, list[str]] = {}
    for b in map(get_backend, backend_names()):
        for spec in b.params:
            takers.setdefault(spec.name, []).append(b.name)
    return takers


def params_taken(params: dict[str, Any], backends: list[str]) -> dict[str, Any]:
    """``params`` less the axes that only other backends than ``backends`` take: a config narrowed
    to some of its backends by ``--backend`` keeps their axes, where keeping another backend's
    would be refused as taken by none of the run's.  A name no backend has stays, for
    :func:`expand` to refuse."""
    takers = param_takers()
    return {name: values for name, values in params.items()
            if name not in takers or set(takers[name]) & set(backends)}


def load_sweep_config(path: str | Path | None, overrides: dict[str, Any] | None = None,
                      base: dict[str, Any] | None = None) -> SweepConfig:
    """Read a sweep TOML (``configs/sweeps/<name>.toml`` may be given by name), or start from
    ``base``, and apply ``overrides`` (None values are ignored).  A flag replaces what the file
    says: ``model`` or ``model_config`` given as a flag drops the file's other one.

    ``backends`` given as a flag narrows the file's: its ``[params]`` axes that none of those
    backends takes are dropped.  A single value where an axis is a list (``batch = 16``, ``num_kv_splits = 4`` under
    ``[params]``) is an axis of that one value.  Raises :class:`ConfigError` with one line for a
    missing file, bad TOML or a bad field; a bad field of a file is named with the file's path.
    """
    data: dict[str, Any] = dict(base or {})
    where = "sweep config"
    if path is not None:
        file = config_file(path, "sweeps", "sweep config")
        data, where = read_toml(file, "sweep config"), f"sweep config {file}"
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    for source in MODEL_SOURCES:  # a model named by a flag replaces the file's, whichever kind
        if source in given:
            data.update({other: None for other in MODEL_SOURCES if other != source})
    if given.get("backends") and isinstance(data.get("params"), dict):  # --backend narrows: the
        data["params"] = params_taken(data["params"], given["backends"])  # others' axes go with them
    for key, value in given.items():
        if key == "params":
            data.setdefault("params", {}).update(value)
        elif key == "timing":
            data.setdefault("timing", {}).update(value)
        else:
            data[key] = value
    try:
        cfg = SweepConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {validation_line(exc)}") from None
    if path is not None:  # what the file's fields say together, named with the file
        try:
            check_sweep(cfg, set(given))
        except ConfigError as exc:
            raise type(exc)(f"{where}: {exc}") from None
    return cfg


#: The fields :func:`shapes_of` reads: a flag among them leaves the shapes to be judged later.
SHAPE_FIELDS = frozenset({"model", "model_config", "tp", "heads", "batch", "context_lens", "qo_len", "causal",
                          "page_size"})


def check_sweep(cfg: SweepConfig, flags: set[str] = frozenset()) -> None:
    """What a sweep's fields can get wrong together, on any machine and before anything is
    measured: backend names, parameter names and values (:func:`check_param_names`,
    :func:`check_param_values`), the model and its heads at ``tp``, dtypes and query tokens
    (:func:`shapes_of`, without the memory check).  A check that reads a field named in ``flags``
    (set by a flag, :func:`sweep_overrides`' keys) is left to :func:`run_sweep`, where its error
    does not blame the file.  Raises the :class:`ConfigError` (or subclass) of the first problem."""
    if "backends" not in flags:
        for name in cfg.backends or ():
            get_backend(name)
    if not {"backends", "params"} & flags:
        check_param_values(cfg)
        check_param_names(cfg, list(cfg.backends or ()))
    if not SHAPE_FIELDS & flags:
        shapes_of(cfg, check_memory=False)


def recorded_config(store: ResultStore) -> SweepConfig:
    """The sweep configuration a run folder's manifest recorded; :class:`ResultsError` when it is
    not one (a tuning or validation run: the command that continues it; a folder of another tool,
    or a manifest edited by hand).  A run recorded before
    ``visits`` existed measured each point once: its ``visits`` is 1; one recorded before
    ``max_visits`` existed measured exactly its ``visits``."""
    try:
        manifest = store.manifest()
        refuse_search_runs(manifest.run_kind(), manifest.config, store.run_dir)
        settings = manifest.visit_settings()
        config = {**manifest.config, "visits": settings["visits"], "max_visits": settings["max_visits"]}
        return SweepConfig.model_validate(config)
    except ValidationError as exc:
        script = recording_script(manifest.config)  # a script's kernel run: never `mlabench sweep`'s to resume
        if script:
            raise ResultsError(f"{store.run_dir} was recorded by {script}, not by mlabench sweep: it "
                               "cannot be resumed (run the script again for new measurements)") from None
        raise ResultsError(f"{store.run_dir}: the manifest holds no sweep configuration "
                           f"({validation_line(exc)})") from None


def default_sweep_config(device: DeviceInfo | None = None) -> SweepConfig:
    """The sweep ``mlabench sweep`` runs with no arguments, sized for the hardware found.

    GPU: 12 heads (Kimi K3 at TP8), page 64, batch 1 and 16, contexts 4K/32K/128K, a split ladder.
    CPU: a small sweep (contexts 256 and 1024, batch 1 and 2, page 16) that finishes in a minute,
    with a 5% spread target (wall-clock samples on a shared CPU are far noisier than GPU events).
    """
    device = device or current_device()
    if device.is_gpu:
        return SweepConfig(name="default-gpu", model="kimi-k3", tp=8, batch=[1, 16],
                           context_lens=[4096, 32768, 131072],
                           params={"num_kv_splits": [1, 16, 32, 64, 128, 256]})
    return SweepConfig(name="default-cpu", model="kimi-k3", tp=8, batch=[1, 2], context_lens=[256, 1024],
                       page_size=16, params={"num_kv_splits": [1, 4, 16]}, drift_target=0.1,
                       timing=TimingConfig(budget_s=1.0, min_samples=5, warmup_iters=1, target_rel_ci=0.05))


def sweep_overrides(*, model: str | None = None, tp: int | None = None, model_config: str | Path | None = None,
                    heads: list[int] | None = None, backends: list[str] | None = None,
                    batch: list[int] | None = None, context_lens: list[int] | None = None,
                    splits: list[int] | None = None, page_size: int | None = None,
                    budget_s: float | None = None, order: str | None = None,
                    order_seed: int | None = None, qo_len: list[int] | None = None,
                    causal: bool | None = None, graph_captures: int | None = None,
                    params: dict[str, list[Any]] | None = None) -> dict[str, Any]:
    """Sweep fields changed by flags, in :class:`SweepConfig`'s layout; None where not given
    (``params`` the parameter axes, ``splits`` the ``num_kv_splits`` one, ``budget_s`` the per-point timing budget, seconds,
    and ``graph_captures`` the graphs per GPU measurement, both of the ``timing`` table,
    ``order`` and ``order_seed`` the measuring order, :mod:`mlabench.sweep.order`, ``qo_len`` the
    query-token axis and ``causal`` its mask)."""
    timing = {k: v for k, v in (("budget_s", budget_s), ("graph_captures", graph_captures)) if v is not None}
    return {
        "order": order, "order_seed": order_seed,
        "model": model, "tp": tp, "model_config": str(model_config) if model_config else None,
        "backends": backends or None, "heads": heads, "batch": batch, "context_lens": context_lens,
        "qo_len": qo_len, "causal": causal, "page_size": page_size,
        "params": {**({"num_kv_splits": splits} if splits else {}), **(params or {})} or None,
        "timing": timing or None,
    }


def resolve_sweep_config(config: str | Path | None, overrides: dict[str, Any],
                         resume: Path | None = None) -> SweepConfig:
    """The sweep to run: ``config``'s, or the default one, or a resumed run's own, changed by
    ``overrides`` (:func:`sweep_overrides`).

    Resume policy: resuming without ``config`` re-runs the configuration recorded in the run's
    manifest (flags change it, and :func:`run_sweep` then refuses a configuration that differs
    from the recorded one).  On the default sweep a heads axis without a model drops the model
    (576**-0.5 scale), a model named without ``tp`` runs at TP 1 (the default's TP 8 is Kimi
    K3's), and any override renames the run ``sweep``.  Raises :class:`ConfigError` /
    :class:`ResultsError` for a bad file, field or run folder.
    """
    given = any(v is not None for v in overrides.values())
    if resume is not None:  # before anything else: a tuning run is no sweep (an archived run is refused by
        refuse_search_run_folder(Path(resume))  # run_sweep's reopening, after another device's: a fresh user's review)
    if resume is not None and config is None:
        recorded = recorded_config(ResultStore(resume))
        if not given:
            return recorded
        return load_sweep_config(None, overrides, base=recorded.model_dump(mode="json", by_alias=True))
    if config is not None:
        return load_sweep_config(config, overrides)
    base = default_sweep_config().model_dump(mode="json", by_alias=True)
    named = overrides.get("model") or overrides.get("model_config")
    if overrides.get("heads") and not named:
        base["model"] = None
    if named and overrides.get("tp") is None:  # the default's TP 8 is Kimi K3's: a model named
        base["tp"] = 1  # here runs at --tp, else 1, as `check` runs it
    if given:
        base["name"] = "sweep"
    return load_sweep_config(None, overrides, base=base)

def shapes_of(cfg: SweepConfig, check_memory: bool = True) -> list[MLADecodeShape]:
    """Every shape of the sweep (heads x batch x context x qo_len), validated and without repeats.

    The heads axis is ``cfg.heads`` when given, else the model's local heads at ``cfg.tp``; a model
    (preset or config.json) also sets the softmax scale and the latent widths.  Each shape's size
    is checked against free memory from its numbers before it is built, unless ``check_memory``
    is false (:class:`OutOfMemoryError`: a batch of a billion requests is refused, not built); bad
    values raise :class:`ShapeError`.
    """
    spec = None
    if cfg.model or cfg.model_config_path:
        _local, _scale, spec = resolve_heads(model=cfg.model, model_config=cfg.model_config_path, tp=cfg.tp)
    if cfg.heads:
        heads_axis = cfg.heads
    elif spec is not None:
        heads_axis = [spec.local_heads(cfg.tp)]
    else:
        raise ConfigError("give a model (--model NAME --tp N, or --model-config PATH) or --heads")
    dims = {"kv_lora_rank": spec.kv_lora_rank, "qk_rope_head_dim": spec.qk_rope_head_dim,
            "softmax_scale": spec.softmax_scale()} if spec else {}
    dims.update(page_size=cfg.page_size, q_dtype=cfg.q_dtype, kv_dtype=cfg.kv_dtype, causal=cfg.causal)
    shapes = []
    for h, b, L, t in ((h, b, L, t) for h in heads_axis for b in cfg.batch for L in cfg.context_lens
                       for t in cfg.qo_len):
        if check_memory:  # before b lengths are built
            check_fits(MLADecodeShape.uniform(1, L, h, qo_len=t, **dims), repeat=b)
        shapes.append(MLADecodeShape.uniform(b, L, h, qo_len=t, **dims))
    return list(dict.fromkeys(shapes))


def check_param_values(cfg: SweepConfig) -> None:
    """Validate every value of ``cfg.params`` against each backend ``cfg.backends`` names that
    declares it (available here or not), so a bad value is named in one line even where that
    backend cannot run; :class:`ConfigError` otherwise.  Without names, a value that no backend
    declaring the parameter accepts (``num_kv_splits = [0]``) raises the first one's error; one
    that some accept is left to the backends available here when the points are built."""
    if cfg.backends:
        for b in map(get_backend, cfg.backends):
            for spec in b.params:
                for value in cfg.params.get(spec.name, ()):
                    spec.validate(value)
        return
    specs = [spec for b in map(get_backend, backend_names()) for spec in b.params]
    for name, values in cfg.params.items():
        takers = [spec for spec in specs if spec.name == name]
        for value in values:
            errors = []
            for spec in takers:
                try:
                    spec.validate(value)
                except ConfigError as exc:
                    errors.append(exc)
            if takers and len(errors) == len(takers):
                raise errors[0]


def check_param_names(cfg: SweepConfig, run: list[str]) -> None:
    """:class:`ConfigError` for a parameter of ``cfg.params`` that no backend has, or, where
    ``run`` names the sweep's backends, that none of them takes: each backend's grid reads only
    its own parameters, so it would be dropped without a word."""
    takers = param_takers()
    stray = sorted(set(cfg.params) - set(takers))
    if stray:
        raise ConfigError(f"parameter {stray[0]!r} belongs to no backend (known: {', '.join(sorted(takers))})")
    for name in sorted(cfg.params) if run else ():
        if not set(takers[name]) & set(run):
            raise ConfigError(f"parameter {name!r} is taken only by {', '.join(takers[name])}, none of the "
                              f"backends of this sweep ({', '.join(run)})")


def expand(cfg: SweepConfig, backends: list[Backend]) -> list[Point]:
    """All points of the sweep, grouped by shape.

    Raises :class:`ConfigError` as :func:`check_param_names` does, for the backends
    ``cfg.backends`` names, else ``backends``."""
    check_param_names(cfg, list(cfg.backends) if cfg.backends else [b.name for b in backends])
    points: dict[str, Point] = {}
    for shape in shapes_of(cfg):
        for b in backends:
            for params in param_grid(b, shape, cfg.params):
                point = Point(b.name, params, shape)
                points.setdefault(point.key, point)
    return list(points.values())
