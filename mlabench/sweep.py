"""Sweep configuration, grid expansion and resumable runs.

A sweep is backends x batch x context lengths x heads, and per backend the product of its
parameter axes (``num_kv_splits``, ``head_padding``, ...).  Everything is validated before a run
folder is created, so bad input leaves nothing half-written.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mlabench.backends import backend_names, get_backend
from mlabench.backends.base import Backend
from mlabench.device import DeviceInfo, current_device
from mlabench.configfile import read_toml, validation_line
from mlabench.errors import BackendUnavailableError, ConfigError, MlabenchError
from mlabench.inputs import check_fits
from mlabench.measure import ShapeBench
from mlabench.observers import driver_version, gpu_state
from mlabench.results import (Manifest, Record, ResultStore, command_line, git_revision, library_versions,
                              new_run_id, point_key, utc_now)
from mlabench.shapes import MLADecodeShape, configs_dir, resolve_heads
from mlabench.timing import TimingConfig, measure_copy_bandwidth_tbps
from mlabench.verdict import DEFAULT_ATOL, DEFAULT_RTOL


class CheckConfig(BaseModel):
    """Tolerances of the per-point correctness check (``[check]`` table)."""

    model_config = ConfigDict(extra="forbid")
    atol: float = Field(DEFAULT_ATOL, gt=0, description="Absolute tolerance.")
    rtol: float = Field(DEFAULT_RTOL, ge=0, description="Relative tolerance.")


class SweepConfig(BaseModel):
    """A sweep, as read from ``configs/sweeps/*.toml`` and/or flags."""

    name: str = Field("sweep", description="Run-id prefix.")
    model: str | None = Field(None, description="Model preset under configs/models/.")
    model_config_path: str | None = Field(None, alias="model_config", description="A model's HF config.json.")
    tp: int = Field(1, description="Tensor-parallel size dividing the model's heads.")
    heads: list[int] | None = Field(None, description="Local heads axis (instead of, or equal to, the model's).")
    backends: list[str] | None = Field(None, description="Backends to run; default: every available non-reference one.")
    batch: list[int] = Field([1], description="Batch sizes.")
    context_lens: list[int] = Field([4096], description="Context lengths, tokens (one per point, all requests equal).")
    page_size: int = Field(64, description="KV-cache page size.")
    q_dtype: str = Field("bfloat16", description="Query/output dtype.")
    kv_dtype: str = Field("bfloat16", description="Latent cache dtype.")
    seed: int = Field(0, description="Seed of the random inputs.")
    params: dict[str, list[Any]] = Field(default_factory=dict, description="Parameter axes, e.g. num_kv_splits = [1, 16].")
    check: CheckConfig = Field(default_factory=CheckConfig)
    timing: TimingConfig = Field(default_factory=TimingConfig)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("batch", "context_lens")
    @classmethod
    def _positive(cls, v: list[int], info: Any) -> list[int]:
        if not v:
            raise ValueError("must not be empty")
        for x in v:
            if x <= 0:
                raise ValueError(f"must be > 0, got {x}")
        return v

    @field_validator("params")
    @classmethod
    def _axes(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for name, values in v.items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"params.{name} must be a non-empty list")
        return v


def load_sweep_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> SweepConfig:
    """Read a sweep TOML (``configs/sweeps/<name>.toml`` may be given by name) and apply overrides.

    Raises :class:`ConfigError` with one line for a missing file, bad TOML or a bad field.
    """
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.exists() and not p.suffix:
            p = configs_dir() / "sweeps" / f"{path}.toml"
        data = read_toml(p, "sweep config")
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key == "params":
            data.setdefault("params", {}).update(value)
        elif key == "timing":
            data.setdefault("timing", {}).update(value)
        else:
            data[key] = value
    try:
        return SweepConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"sweep config: {validation_line(exc)}") from None


def default_sweep_config(device: DeviceInfo | None = None) -> SweepConfig:
    """The sweep ``mlabench sweep`` runs with no arguments, sized for the hardware found.

    GPU: 12 heads (Kimi K3 at TP8), page 64, batch 1 and 16, contexts 4K/32K/128K, a split ladder.
    CPU: a small sweep (contexts 256 and 1024, batch 1 and 2, page 16) that finishes in a minute.
    """
    device = device or current_device()
    if device.is_gpu:
        return SweepConfig(name="default-gpu", model="kimi-k3", tp=8, batch=[1, 16],
                           context_lens=[4096, 32768, 131072],
                           params={"num_kv_splits": [1, 16, 32, 64, 128, 256]})
    return SweepConfig(name="default-cpu", model="kimi-k3", tp=8, batch=[1, 2], context_lens=[256, 1024],
                       page_size=16, params={"num_kv_splits": [1, 4, 16]},
                       timing=TimingConfig(budget_s=0.5, min_samples=5, warmup_iters=1))


@dataclass(frozen=True)
class Point:
    """One configuration to measure."""

    backend: str
    params: dict[str, Any]
    shape: MLADecodeShape

    @property
    def key(self) -> str:
        return point_key(self.backend, self.params, self.shape.key())


def param_grid(backend: Backend, shape: MLADecodeShape, axes: dict[str, list[Any]],
               all_choices: bool = False) -> list[dict[str, Any]]:
    """Parameter dicts for ``backend``: the product of the axes it has (others at their default).

    With ``all_choices`` a string parameter with no axis given takes every choice (used by
    ``check``).  Values are validated (:class:`ConfigError` on a bad one) and de-duplicated.
    """
    lists = []
    for spec in backend.params:
        if spec.name in axes:
            lists.append([spec.validate(v) for v in axes[spec.name]])
        elif all_choices and spec.choices:
            lists.append(list(spec.choices))
        else:
            lists.append([spec.default_for(shape)])
    seen, out = set(), []
    for combo in itertools.product(*lists):
        params = dict(zip(backend.param_names(), combo))
        marker = tuple(sorted(params.items(), key=lambda kv: kv[0]))
        if marker not in seen:
            seen.add(marker)
            out.append(params)
    return out


def select_backends(names: list[str] | None, include_reference: bool = False, strict: bool = True,
                    warn: Callable[[str], None] | None = None) -> list[Backend]:
    """Backends named, or by default every available non-reference one native to the device found
    (GPU kernels on a GPU; on a CPU the portable PyTorch ones, not GPU kernels in an interpreter).

    Unknown names raise :class:`UnknownBackendError`.  A named backend that is unavailable raises
    :class:`BackendUnavailableError` when ``strict`` (names from flags), else is left out with a
    ``warn`` line (names from a shipped config that must run on any hardware).
    """
    device = current_device()
    if names:
        chosen = [get_backend(n) for n in names]  # unknown names raise here, before anything runs
        keep = []
        for b in chosen:
            ok, why = b.available()
            if ok:
                keep.append(b)
            elif strict:
                raise BackendUnavailableError(f"backend {b.name} is not available here: {why}")
            elif warn:
                warn(f"skipping {b.name}: not available here ({why})")
        return keep
    return [b for b in map(get_backend, backend_names())
            if b.available()[0] and (include_reference or not b.is_reference)
            and b.gpu_kernel == device.is_gpu]


def shapes_of(cfg: SweepConfig) -> list[MLADecodeShape]:
    """Every shape of the sweep (heads x batch x context), validated."""
    local, scale, _ = resolve_heads(model=cfg.model, model_config=cfg.model_config_path, tp=cfg.tp,
                                    heads=cfg.heads[0] if cfg.heads and len(cfg.heads) == 1 else None)
    heads_axis = cfg.heads if cfg.heads and (cfg.model is None and cfg.model_config_path is None) else [local]
    return [MLADecodeShape.uniform(b, L, h, page_size=cfg.page_size, q_dtype=cfg.q_dtype,
                                   kv_dtype=cfg.kv_dtype, softmax_scale=scale)
            for h in heads_axis for b in cfg.batch for L in cfg.context_lens]


def expand(cfg: SweepConfig, backends: list[Backend]) -> list[Point]:
    """All points of the sweep, grouped by shape; parameters not in any backend raise ConfigError."""
    known = {p.name for b in map(get_backend, backend_names()) for p in b.params}
    stray = sorted(set(cfg.params) - known)
    if stray:
        raise ConfigError(f"parameter {stray[0]!r} belongs to no backend (known: {', '.join(sorted(known))})")
    points = []
    for shape in shapes_of(cfg):
        for b in backends:
            for params in param_grid(b, shape, cfg.params):
                points.append(Point(b.name, params, shape))
    return points


def make_manifest(run_id: str, cfg: SweepConfig, copy_bw_tbps: float) -> Manifest:
    dev = current_device()
    rev, dirty = git_revision()
    import socket

    return Manifest(
        run_id=run_id, created=utc_now(), command=command_line(), git_revision=rev, git_dirty=dirty,
        host=socket.gethostname(), device=dict(dev.__dict__), gpu_state=gpu_state(), driver=driver_version(),
        versions=library_versions(), copy_bandwidth_tbps=copy_bw_tbps,
        config=cfg.model_dump(mode="json", by_alias=True),
    )


ProgressFn = Callable[[Point, Record | None, int, int], None]


def run_sweep(cfg: SweepConfig, results_root: Path = Path("results"), resume: Path | None = None,
              progress: ProgressFn | None = None, time_it: bool = True, strict_backends: bool = True,
              warn: Callable[[str], None] | None = None) -> tuple[ResultStore, list[Record]]:
    """Run (or resume) a sweep; returns the store and every record of the run.

    Validation (backends, parameters, shapes, memory) happens before any file is written.  With
    ``resume`` the points already in ``resume/results.jsonl`` are skipped; the folder must have been
    recorded on the same device, driver, library versions and git revision.
    """
    backends = select_backends(cfg.backends, strict=strict_backends, warn=warn)
    if not backends:
        raise BackendUnavailableError("no backend available here (see `mlabench backends`)")
    points = expand(cfg, backends)
    for shape in {p.shape for p in points}:
        check_fits(shape)
    if resume is not None:
        here = make_manifest("resume", cfg, 0.0).identity()
        store = ResultStore.open_existing(resume, identity=here)
        copy_bw = store.manifest().copy_bandwidth_tbps
    else:
        copy_bw = measure_copy_bandwidth_tbps()
        run_id = new_run_id(cfg.name)
        store = ResultStore.create(results_root / run_id, make_manifest(run_id, cfg, copy_bw))
    run_id = store.manifest().run_id
    done = store.finished_keys()
    todo = [p for p in points if p.key not in done]
    total, finished = len(points), len(points) - len(todo)
    by_shape: dict[MLADecodeShape, list[Point]] = {}
    for p in todo:
        by_shape.setdefault(p.shape, []).append(p)
    for shape, shape_points in by_shape.items():
        bench = ShapeBench(shape, cfg.timing, seed=cfg.seed)
        for p in shape_points:
            rec = bench.run(get_backend(p.backend), p.params, copy_bw_tbps=copy_bw, run_id=run_id,
                            atol=cfg.check.atol, rtol=cfg.check.rtol, time_it=time_it)
            store.append(rec)
            finished += 1
            if progress:
                progress(p, rec, finished, total)
        del bench
    store.write_csv()
    return store, store.records()


def records_of(runs: Iterable[Path]) -> list[Record]:
    """Every record of the given run folders (read-only)."""
    out: list[Record] = []
    for run in runs:
        store = ResultStore(Path(run))
        if not store.jsonl.exists():
            raise MlabenchError(f"{run}: no results.jsonl")
        out.extend(store.records())
    return out
