"""Shared set-up of the tuner tests: a run folder and an in-process objective on a tiny shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlabench.backends import get_backend
from mlabench.measure import ShapeBench
from mlabench.results import ResultStore
from mlabench.studies import make_sampler, optuna_module
from mlabench.tune import TuneConfig, resolve_sampler, search_space, shape_dims, tune_shape
from mlabench.tune_run import run_manifest
from mlabench.tune_worker import Objective
from mlabench.workers import RecordIndex


def tiny_config(backend: str, timing, **kw: Any) -> TuneConfig:
    values = dict(backend=backend, heads=2, batch=[1], buckets=[48], page_size=16, timing=timing, trials=64)
    values.update(kw)
    return TuneConfig.model_validate(values)


def run_in_process(tmp_path: Path, cfg: TuneConfig) -> tuple[Any, ResultStore]:
    """One study of ``cfg``'s first (batch, bucket) run in this process, with an in-memory storage."""
    optuna = optuna_module()
    store = ResultStore.create(tmp_path / "run", run_manifest("run", 1.0, {}))
    backend = get_backend(cfg.backend)
    shape = tune_shape(shape_dims(cfg), cfg.batch[0], cfg.buckets[0])
    dims, fixed = search_space(backend, shape, cfg.space)
    study = optuna.create_study(sampler=make_sampler(resolve_sampler(cfg, dims), dims, 0))
    objective = Objective(backend, ShapeBench(shape, cfg.timing), dims, fixed, store, RecordIndex(store), cfg, None)
    study.optimize(objective, n_trials=cfg.trials)
    return study, store
