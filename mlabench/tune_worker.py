"""The tuning objective and the worker loop: one process per GPU, all on one run's studies.

A trial's value is the median time (µs) of the measurement engine on the study's shape; its user
attributes keep the record key, status, raw samples, spread and correctness verdict.  Nothing is
measured twice: a configuration already finished in the study, or already recorded in the run
folder (e.g. by a worker killed before it could report), is reused, and a configuration another
worker is measuring right now is waited for.  A configuration that fails the correctness check or
errors is pruned.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from mlabench.backends import get_backend
from mlabench.backends.base import Backend
from mlabench.device import current_device
from mlabench.measure import ShapeBench
from mlabench.results import Record, ResultStore, point_key
from mlabench.studies import (FINISHED_STATES, check_device, distinct_finished, make_sampler, open_storage,
                              optuna_module)
from mlabench.tune import (Dimension, TuneConfig, full_params, resolve_sampler, search_space, shape_dims,
                           tune_shape)
from mlabench.workers import RecordIndex, append_shared, worker_id

#: Environment variable carrying a storage URL to workers (kept out of files: it may hold a password).
STORAGE_ENV = "MLABENCH_TUNE_STORAGE"
#: Longest wait for another worker measuring the same configuration, seconds.
WAIT_FOR_PEER_S = 300.0
_OWN_ATTRS = ("worker", "repeat_of", "enqueued_as", "retry_of")


def record_attrs(rec: dict[str, Any]) -> dict[str, Any]:
    """The user attributes a trial keeps from its record (a ``Record`` dumped as JSON)."""
    stats, verdict = rec.get("stats") or {}, rec.get("verdict") or {}
    return {"record_key": rec["key"], "run_id": rec["run_id"], "status": rec["status"],
            "message": rec.get("message", ""), "median_us": stats.get("median_us"),
            "median_rel_ci": stats.get("median_rel_ci"), "noisy": stats.get("noisy"),
            "samples_us": stats.get("samples_us"), "verdict_passed": verdict.get("passed"),
            "max_abs_err": verdict.get("max_abs_err")}


class Objective:
    """Optuna objective over ``backend``'s parameters on one :class:`ShapeBench`."""

    def __init__(self, backend: Backend, bench: ShapeBench, dims: list[Dimension], fixed: dict[str, Any],
                 store: ResultStore, index: RecordIndex, cfg: TuneConfig, copy_bw_tbps: float | None):
        self.backend, self.bench, self.dims, self.fixed = backend, bench, dims, fixed
        self.store, self.index, self.cfg, self.copy_bw_tbps = store, index, cfg, copy_bw_tbps
        self.run_id = store.manifest().run_id
        self.measured = 0

    def suggest(self, trial: Any) -> dict[str, Any]:
        """The searched parameters of ``trial`` (fixed ones are not Optuna parameters)."""
        return {d.name: (trial.suggest_categorical(d.name, list(d.choices)) if d.choices
                         else trial.suggest_int(d.name, d.low, d.high, log=d.log)) for d in self.dims}

    def __call__(self, trial: Any) -> float:
        optuna = optuna_module()
        trial.set_user_attr("worker", worker_id())
        searched = self.suggest(trial)
        params = full_params(self.backend, self.fixed, searched)
        attrs = self._earlier(trial, searched) or self._recorded(params) or self._measure(params)
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        if attrs["status"] != "ok":
            raise optuna.TrialPruned(f"{attrs['status']}: {attrs['message']}"[:300])
        return float(attrs["median_us"])

    def _earlier(self, trial: Any, searched: dict[str, Any]) -> dict[str, Any] | None:
        """Attributes of an earlier trial with the same params (waiting for a running one)."""
        deadline = time.monotonic() + WAIT_FOR_PEER_S
        while True:
            same = [t for t in trial.study.get_trials(deepcopy=False)
                    if t.number != trial.number and t.params == searched]
            done = [t for t in same if t.state.name in FINISHED_STATES and "status" in t.user_attrs]
            if done:
                attrs = {k: v for k, v in done[0].user_attrs.items() if k not in _OWN_ATTRS}
                return {**attrs, "repeat_of": done[0].number}
            running = [t for t in same if t.state.name == "RUNNING" and t.number < trial.number]
            if not running or time.monotonic() > deadline:
                return None
            time.sleep(0.2)

    def _recorded(self, params: dict[str, Any]) -> dict[str, Any] | None:
        rec = self.index.get(point_key(self.backend.name, params, self.bench.shape.key()))
        return record_attrs(rec) if rec is not None else None

    def _measure(self, params: dict[str, Any]) -> dict[str, Any]:
        rec: Record = self.bench.run(self.backend, params, copy_bw_tbps=self.copy_bw_tbps, run_id=self.run_id,
                                     check=self.cfg.check)
        append_shared(self.store, rec)
        self.measured += 1
        return record_attrs(rec.model_dump(mode="json"))


class StopAtTrials:
    """Optuna callback: stop once distinct finished configurations plus other workers' running
    trials reach ``n``."""

    def __init__(self, n: int):
        self.n = n

    def __call__(self, study: Any, trial: Any | None = None) -> None:
        if self.reached(study, trial.number if trial is not None else None):
            study.stop()

    def reached(self, study: Any, own: int | None = None) -> bool:
        """Whether the study has its trials, counting running ones other than trial ``own``."""
        trials = study.get_trials(deepcopy=False)
        running = sum(t.state.name == "RUNNING" and t.number != own for t in trials)
        return distinct_finished(trials) + running >= self.n


def worker_main(payload: dict[str, Any], index: int) -> None:
    """Run the studies of ``payload`` (``config``, ``run_dir``, ``studies``) in order, until each
    has ``trials`` finished trials, its sampler is exhausted or ``timeout_s`` passes.

    Raises :class:`~mlabench.errors.ResultsError` when a study measures another GPU model.
    """
    optuna = optuna_module()
    cfg = TuneConfig.model_validate(payload["config"])
    store = ResultStore(Path(payload["run_dir"]))
    manifest = store.manifest()
    storage = open_storage(os.environ.get(STORAGE_ENV) or None, store.run_dir)
    device = current_device().name
    backend = get_backend(cfg.backend)
    dims_kw, records = shape_dims(cfg), RecordIndex(store)
    for position, spec in enumerate(payload["studies"]):
        shape = tune_shape(dims_kw, spec["batch"], spec["length"])
        dims, fixed = search_space(backend, shape, cfg.space)
        sampler = make_sampler(resolve_sampler(cfg, dims), dims, cfg.seed + 1000 * index + position)
        study = optuna.load_study(study_name=spec["name"], storage=storage, sampler=sampler)
        check_device(study, device)
        stop = StopAtTrials(cfg.trials)
        if stop.reached(study):
            continue
        bench = ShapeBench(shape, cfg.timing, seed=cfg.seed)
        objective = Objective(backend, bench, dims, fixed, store, records, cfg, manifest.copy_bandwidth_tbps)
        study.optimize(objective, timeout=cfg.timeout_s, callbacks=[stop], gc_after_trial=False)
        del bench, objective
