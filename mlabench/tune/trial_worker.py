"""The tuning objective and the worker loop: one process per GPU, all on one run's studies.

A trial measures its configuration at each length of the study's bucket (the split count a
tokens-per-split or whole-tile rule gives there); its value is the geometric mean of the medians (µs; with one
length, the median), which ranks configurations as the geometric mean of their time over the best
time at each length does, and stays put while the best times improve.  Its user attributes keep,
per length, the record key, status, raw samples, spread and correctness verdict, and
``launched``: the parameters launched at each length.  Nothing is measured twice: a trial
launching what a trial of the study already finished launched is a repeat, reused (one another
worker is measuring is waited for) and not counted towards ``--trials``, and so is a measurement already recorded in the run folder (by another
trial whose rule gives the same count at that length, or by a worker killed before it could
report); a measurement another worker is taking right now is waited for (:func:`mlabench.tune.worker_pool.claim`).
A configuration that fails the correctness check or errors at any length is pruned (its other
lengths are not measured).
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any

from mlabench.backends import get_backend
from mlabench.backends.base import Backend
from mlabench.device import current_device
from mlabench.records.record import Record, point_key
from mlabench.records.store import ResultStore
from mlabench.shapes import MLADecodeShape
from mlabench.sweep.point import ShapeBench
from mlabench.tune.choice import geomean
from mlabench.tune.space import (
    RULE_PARAM, TILE_PARAM, Dimension, TuneConfig, launched, params_at, resolve_sampler, shape_dims, study_space,
    tune_shape,
)
from mlabench.tune.studies import (
    FINISHED_STATES, StudySpec, check_device, distinct_finished, launch_key, make_sampler, open_storage, optuna_module,
)
from mlabench.tune.worker_pool import RecordIndex, append_shared, claim, release, worker_id

#: Environment variable carrying a storage URL to workers (kept out of files: it may hold a password).
STORAGE_ENV = "MLABENCH_TUNE_STORAGE"
#: Longest wait for another worker measuring the same configuration, seconds.
WAIT_FOR_PEER_S = 300.0
_OWN_ATTRS = ("worker", "repeat_of", "enqueued_as", "retry_of", "launched")
#: A study also stops after this many times ``--trials`` finished trials, repeats included: a space
#: with fewer distinct launches than ``--trials`` would otherwise keep a TPE or GP study suggesting
#: repeats for ever (the exhaustive samplers stop when they have visited every point).
MAX_TRIALS_FACTOR = 4


def record_attrs(rec: dict[str, Any]) -> dict[str, Any]:
    """The attributes a trial keeps from one record (a ``Record`` dumped as JSON): its key, status,
    median, spread, raw samples and verdict, and the split count it launched."""
    stats, verdict = rec.get("stats") or {}, rec.get("verdict") or {}
    return {"record_key": rec["key"], "run_id": rec["run_id"], "status": rec["status"],
            "message": rec.get("message", ""), "num_kv_splits": (rec.get("params") or {}).get("num_kv_splits"),
            "median_us": stats.get("median_us"), "median_rel_ci": stats.get("median_rel_ci"),
            "noisy": stats.get("noisy"), "samples_us": stats.get("samples_us"),
            "verdict_passed": verdict.get("passed"), "max_abs_err": verdict.get("max_abs_err")}


def trial_attrs(points: list[dict[str, Any]]) -> dict[str, Any]:
    """A trial's user attributes from its lengths' :func:`record_attrs` (each with its ``length``):
    ``points`` (all of them), ``record_keys``, and the ``status`` and ``message`` of the first
    length that is not ``ok`` (else ``ok``), the geometric mean of the medians and the widest spread."""
    failed = next((p for p in points if p["status"] != "ok"), None)
    medians = [p["median_us"] for p in points]
    ok = failed is None and all(m is not None for m in medians)
    return {"status": "ok" if failed is None else failed["status"],
            "message": "" if failed is None else f"at {failed['length']} tokens: {failed['message']}",
            "median_us": geomean(medians) if ok else None,
            "median_rel_ci": max(p["median_rel_ci"] or 0.0 for p in points) if ok else None,
            "record_keys": [p["record_key"] for p in points], "points": points}


class Objective:
    """Optuna objective over ``backend``'s parameters, measured at every shape of ``shapes``
    (``{length: shape}``, one bucket's lengths; a :class:`ShapeBench` is made for each when first
    needed)."""

    def __init__(self, backend: Backend, shapes: dict[int, MLADecodeShape], dims: list[Dimension],
                 fixed: dict[str, Any], store: ResultStore, index: RecordIndex, cfg: TuneConfig,
                 copy_bw_tbps: float | None):
        self.backend, self.shapes, self.dims, self.fixed = backend, shapes, dims, fixed
        self.store, self.index, self.cfg, self.copy_bw_tbps = store, index, cfg, copy_bw_tbps
        self.run_id = store.manifest().run_id
        self.benches: dict[int, ShapeBench] = {}
        self.measured = 0

    def suggest(self, trial: Any) -> dict[str, Any]:
        """The searched parameters of ``trial`` (fixed ones are not Optuna parameters);
        ``tokens_per_split`` is not suggested when the whole-tile rule is chosen (it would launch
        nothing different: the space is conditional, :func:`mlabench.tune.space.study_space`)."""
        values: dict[str, Any] = {}
        with warnings.catch_warnings():  # a heuristic enqueued beyond the wave cap: measured as is
            warnings.filterwarnings("ignore", message="Fixed parameter .* out of range")
            for d in self.dims:
                if d.name == RULE_PARAM and values.get(TILE_PARAM):
                    continue
                values[d.name] = (trial.suggest_categorical(d.name, list(d.choices)) if d.choices
                                  else trial.suggest_int(d.name, d.low, d.high, log=d.log))
        return values

    def __call__(self, trial: Any) -> float:
        optuna = optuna_module()
        trial.set_user_attr("worker", worker_id())
        searched = self.suggest(trial)
        launches = launched(self.backend, self.fixed, searched, tuple(self.shapes))
        trial.set_user_attr("launched", launches)
        attrs = self._earlier(trial) or self._evaluate(searched)
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        if attrs["status"] != "ok":
            raise optuna.TrialPruned(f"{attrs['status']}: {attrs['message']}"[:300])
        return float(attrs["median_us"])

    def _evaluate(self, searched: dict[str, Any]) -> dict[str, Any]:
        """Every length in turn, stopping at the first that is not ``ok``."""
        points = []
        for length in sorted(self.shapes):
            point = {"length": length, **self._point(length, params_at(self.backend, self.fixed, searched, length))}
            points.append(point)
            if point["status"] != "ok":
                break
        return trial_attrs(points)

    def _earlier(self, trial: Any) -> dict[str, Any] | None:
        """Attributes of an earlier trial launching the same at every length as ``trial`` (its
        ``launched`` attribute, :func:`mlabench.tune.studies.launch_key`), waiting for a running one."""
        deadline = time.monotonic() + WAIT_FOR_PEER_S
        key = launch_key(trial)
        while True:
            same = [t for t in trial.study.get_trials(deepcopy=False)
                    if t.number != trial.number and launch_key(t) == key]
            done = [t for t in same if t.state.name in FINISHED_STATES and "status" in t.user_attrs]
            if done:
                attrs = {k: v for k, v in done[0].user_attrs.items() if k not in _OWN_ATTRS}
                return {**attrs, "repeat_of": done[0].number}
            running = [t for t in same if t.state.name == "RUNNING" and t.number < trial.number]
            if not running or time.monotonic() > deadline:
                return None
            time.sleep(0.2)

    def _point(self, length: int, params: dict[str, Any]) -> dict[str, Any]:
        """The record of ``params`` at ``length``: already in the run folder, or measured now (once
        the claim on it is this worker's, or after waiting :data:`WAIT_FOR_PEER_S` for its holder)."""
        key = point_key(self.backend.name, params, self.shapes[length].key())
        deadline = time.monotonic() + WAIT_FOR_PEER_S
        while True:
            rec = self.index.get(key)
            if rec is not None:
                return record_attrs(rec)
            if claim(self.store.run_dir, key) or time.monotonic() > deadline:
                try:
                    rec = self.index.get(key)  # appended between the look and the claim
                    return record_attrs(rec) if rec is not None else self._measure(length, params)
                finally:
                    release(self.store.run_dir, key)
            time.sleep(0.2)

    def _measure(self, length: int, params: dict[str, Any]) -> dict[str, Any]:
        if length not in self.benches:
            self.benches[length] = ShapeBench(self.shapes[length], self.cfg.timing, seed=self.cfg.seed)
        rec: Record = self.benches[length].run(self.backend, params, copy_bw_tbps=self.copy_bw_tbps,
                                               run_id=self.run_id, check=self.cfg.check)
        append_shared(self.store, rec)
        self.measured += 1
        return record_attrs(rec.model_dump(mode="json"))


class StopAtTrials:
    """Optuna callback: stop once distinct finished configurations (by what they launch,
    :func:`mlabench.tune.studies.distinct_finished`) plus other workers' running trials reach ``n``, or
    finished trials with repeats plus those running reach ``MAX_TRIALS_FACTOR x n``."""

    def __init__(self, n: int):
        self.n = n

    def __call__(self, study: Any, trial: Any | None = None) -> None:
        if self.reached(study, trial.number if trial is not None else None):
            study.stop()

    def reached(self, study: Any, own: int | None = None) -> bool:
        """Whether the study has its trials, counting running ones other than trial ``own``."""
        trials = study.get_trials(deepcopy=False)
        running = sum(t.state.name == "RUNNING" and t.number != own for t in trials)
        finished = sum(t.state.name in FINISHED_STATES for t in trials)
        return distinct_finished(trials) + running >= self.n or finished + running >= MAX_TRIALS_FACTOR * self.n


#: A study's expected seconds, for dealing studies out only: ``STUDY_FIXED_S + STUDY_S_PER_TOKEN x
#: (its longest length) x batch^(1/3)``.  Least-squares fit to the 16 studies of the one-worker H200
#: tuning of kimi-k3-tp8 (results/h200/tune-kimi-k3-tp8/whole-tiles-attempt/, 20 trials a study,
#: 5.3-18.0 s each, the first one's ~7 s of Triton compilation taken out): it predicts 6.3-19.2 s
#: where 5.3-18.0 s were measured, within 1.6 s at every study and 1.2 s at 15 of the 16.
STUDY_FIXED_S = 6.3
STUDY_S_PER_TOKEN = 3.9e-5


def study_cost(spec: dict[str, Any]) -> float:
    """A study's expected measuring time in seconds, ``STUDY_FIXED_S + STUDY_S_PER_TOKEN x L x
    batch^(1/3)`` (see :data:`STUDY_FIXED_S`), L its longest length (the most of ``lengths``,
    ``length`` and ``hi`` of the study's spec); for dealing studies out."""
    lengths = [*spec.get("lengths", ()), spec.get("length", 0), spec.get("hi", 0)]
    longest = max(int(x or 0) for x in lengths)
    return STUDY_FIXED_S + STUDY_S_PER_TOKEN * longest * max(1, int(spec.get("batch", 1))) ** (1 / 3)


def deal_studies(costs: list[float], workers: int) -> list[list[int]]:
    """The studies (positions in ``costs``, expected seconds) dealt to ``workers`` workers, each
    list in the order its worker takes them: longest first, each to the worker with the least
    expected time so far (ties: the lower index), the longest-processing-time rule (Graham, "Bounds
    on multiprocessing timing anomalies", 1969), which ends within 4/3 of the best possible split."""
    n = max(1, workers)
    shares: list[list[int]] = [[] for _ in range(n)]
    loads = [0.0] * n
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        w = min(range(n), key=lambda k: (loads[k], k))
        shares[w].append(i)
        loads[w] += costs[i]
    return shares


def study_order(costs: list[float], index: int, workers: int) -> list[int]:
    """The positions of the studies (of expected times ``costs``) in the order worker ``index`` of
    ``workers`` takes them: its own share (:func:`deal_studies`), then the others' studies from the
    last each other worker would take, so a worker done early joins the studies still running or
    not yet started rather than finished ones.

    Why: workers that all start at the first study share every study, and each builds the inputs
    and fp32 references of every length of every study itself; on two H200s each measurement was
    then about 30% slower than one worker's (0.69x one worker's time).  Dealing by rank alone
    (ranks 0, 2, 4... to one worker) gives the first worker the longer study of every pair.
    Raises ValueError for an index outside ``range(workers)``."""
    if not 0 <= index < max(1, workers):
        raise ValueError(f"worker {index} of {workers}")
    shares = deal_studies(costs, workers)
    from_end = {i: (len(share) - pos, i) for share in shares for pos, i in enumerate(share)}
    return shares[index] + sorted((i for i in from_end if i not in shares[index]), key=from_end.__getitem__)


def worker_main(payload: dict[str, Any], index: int) -> None:
    """Run the studies of ``payload`` (``config``, ``run_dir``, ``studies``, ``workers``) in
    :func:`study_order`, until each has ``trials`` finished trials, its sampler is exhausted or
    ``timeout_s`` passes.

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
    costs = [study_cost(data) for data in payload["studies"]]
    for position in study_order(costs, index, payload.get("workers", 1)):
        spec = StudySpec(**payload["studies"][position])
        shapes = {n: tune_shape(dims_kw, spec.batch, n) for n in spec.measured()}
        dims, fixed = study_space(backend, tune_shape(dims_kw, spec.batch, spec.length), cfg, spec.measured(),
                                  spec.max_splits)
        sampler = make_sampler(resolve_sampler(cfg, dims), dims, cfg.seed + 1000 * index + position)
        study = optuna.load_study(study_name=spec.name, storage=storage, sampler=sampler)
        check_device(study, device)
        stop = StopAtTrials(cfg.trials)
        if stop.reached(study):
            continue
        objective = Objective(backend, shapes, dims, fixed, store, records, cfg, manifest.copy_bandwidth_tbps)
        study.optimize(objective, timeout=cfg.timeout_s, callbacks=[stop], gc_after_trial=False)
        objective.benches.clear()  # free this study's inputs before the next study's
        del objective
