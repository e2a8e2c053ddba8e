"""The tuning objective and the worker loop: one process per GPU, on every machine, all on one job's studies.

A trial measures its configuration at each length of the study's bucket (the split count a
tokens-per-split or whole-tile rule gives there); its value is the geometric mean of the medians (µs; with one
length, the median), which ranks configurations as the geometric mean of their time over the best
time at each length does, and stays put while the best times improve.  Its user attributes keep,
per length, the record key, status, raw samples, spread and correctness verdict, and
``launched``: the parameters launched at each length.  Nothing is measured twice, on any machine:
a trial launching what a trial of the study already finished launched is a repeat, reused (one
another worker is measuring is waited for) and not counted towards ``--trials``; a point (a count
at a length) already in the run folder or in any trial of the study (its ``points``, or
``points_so_far`` while it runs) is reused; a point another worker is measuring (the run folder's
claim, :func:`mlabench.tune.worker_pool.claim`, or a running trial's ``measuring`` attribute) is
waited for.  A configuration that fails the correctness check or errors at any length is pruned
(its other lengths are not measured).
"""

from __future__ import annotations

import os
import sys
import time
import warnings
import zlib
from pathlib import Path
from typing import Any

from mlabench.backends import get_backend
from mlabench.backends.base import Backend
from mlabench.bench.shape_bench import ShapeBench
from mlabench.device import current_device
from mlabench.measure.stats import geomean
from mlabench.records.record import Record, point_key
from mlabench.records.store import ResultStore
from mlabench.shapes import MLADecodeShape
from mlabench.tune.space import (
    RULE_PARAM, TILE_PARAM, Dimension, TuneConfig, launched, params_at, resolve_sampler, shape_dims, study_space,
    tune_shape,
)
from mlabench.tune.storage import (
    fail_stale, grace_period_s, has_heartbeat, open_storage, optuna_module, storage_lock,
)
from mlabench.tune.studies import (
    FINISHED_STATES, StudySpec, check_device, distinct_finished, launch_key, make_sampler, recover_stale, sampler_seed,
)
from mlabench.tune.worker_pool import RecordIndex, append_shared, claim, release, worker_id

#: Environment variable carrying a storage URL to workers (kept out of files: it may hold a password).
STORAGE_ENV = "MLABENCH_TUNE_STORAGE"
#: Longest wait for another worker measuring the same configuration, seconds.
WAIT_FOR_PEER_S = 300.0
_OWN_ATTRS = ("worker", "repeat_of", "enqueued_as", "retry_of", "launched", "measuring", "points_so_far")
#: Seconds between checks for dead workers (their heartbeat) while waiting on another's measurement.
STALE_CHECK_S = 2.0
#: A study also stops after this many times ``--trials`` finished trials, repeats included: a space
#: with fewer distinct launches than ``--trials`` would otherwise keep a TPE or GP study suggesting
#: repeats for ever (the exhaustive samplers stop when they have visited every point).
MAX_TRIALS_FACTOR = 4
#: Seconds between looks at the studies while only other workers' trials are left.
POLL_S = 0.5


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
        self.stale_checked = time.monotonic()
        self.current: Any | None = None  # the trial being evaluated

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
        self.current = trial
        trial.set_user_attr("worker", worker_id())
        searched = self.suggest(trial)
        launches = launched(self.backend, self.fixed, searched, tuple(self.shapes))
        trial.set_user_attr("launched", launches)
        attrs = self._earlier(trial) or self._evaluate(trial, searched)
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        if attrs["status"] != "ok":
            raise optuna.TrialPruned(f"{attrs['status']}: {attrs['message']}"[:300])
        return float(attrs["median_us"])

    def _evaluate(self, trial: Any, searched: dict[str, Any]) -> dict[str, Any]:
        """Every length in turn, stopping at the first that is not ``ok``; each point is published
        in the trial's ``points_so_far`` as soon as it is known, for workers on other machines."""
        points = []
        for length in sorted(self.shapes):
            params = params_at(self.backend, self.fixed, searched, length)
            point = {"length": length, **self._point(trial, length, params, points)}
            points.append(point)
            trial.set_user_attr("points_so_far", points)
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
            self._pause(trial)

    def _point(self, trial: Any, length: int, params: dict[str, Any],
               earlier: list[dict[str, Any]]) -> dict[str, Any]:
        """The record of ``params`` at ``length``: already in the run folder or in a trial of the
        study (measured on any machine), or measured now once this worker holds the claims on it
        (the run folder's, :func:`mlabench.tune.worker_pool.claim`, and the study's,
        :meth:`_in_study`), or after waiting :data:`WAIT_FOR_PEER_S` for their holder.  A point
        measured here is published in the trial's ``points_so_far`` (after ``earlier``, the trial's
        points before it) before the study's claim is given up: a peer looking in between finds
        the point, never a free claim on a point already measured."""
        key = point_key(self.backend.name, params, self.shapes[length].key())
        deadline = time.monotonic() + WAIT_FOR_PEER_S
        while True:
            rec = self.index.get(key)
            if rec is not None:
                return record_attrs(rec)
            found, free = self._in_study(trial, key)
            if found is not None:
                return found
            late = time.monotonic() > deadline
            if late or (free and claim(self.store.run_dir, key)):
                try:
                    rec = self.index.get(key)  # appended between the look and the claim
                    found = record_attrs(rec) if rec is not None else self._measure(length, params)
                    trial.set_user_attr("points_so_far", [*earlier, {"length": length, **found}])
                    return found
                finally:
                    release(self.store.run_dir, key)
                    trial.set_user_attr("measuring", None)
            self._pause(trial)

    def _in_study(self, trial: Any, key: str) -> tuple[dict[str, Any] | None, bool]:
        """Holding the storage's lock: the point with record ``key`` of any trial of the study (its
        ``points`` or ``points_so_far``), else whether no other running trial is measuring it, in
        which case this trial claims it (its ``measuring`` user attribute)."""
        with storage_lock(trial.study._storage, self.store.run_dir):
            trials = trial.study.get_trials(deepcopy=False)
            for t in trials:
                for p in [*t.user_attrs.get("points", ()), *t.user_attrs.get("points_so_far", ())]:
                    if p.get("record_key") == key:
                        return {k: v for k, v in p.items() if k != "length"}, False
            if any(t.state.name == "RUNNING" and t.number != trial.number and t.user_attrs.get("measuring") == key
                   for t in trials):
                return None, False
            trial.set_user_attr("measuring", key)
            return None, True

    def _pause(self, trial: Any) -> None:
        """Wait a moment for another worker; every :data:`STALE_CHECK_S`, fail dead workers' trials
        (their heartbeat stopped, :func:`mlabench.tune.storage.fail_stale`) so nobody waits on them."""
        time.sleep(0.2)
        if time.monotonic() - self.stale_checked > STALE_CHECK_S:
            self.stale_checked = time.monotonic()
            fail_stale(trial.study)

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
    finished trials with repeats plus those running reach ``MAX_TRIALS_FACTOR x n`` -- and no trial
    waits: the enqueued ones (heuristics, whole-tile candidates, the split ladder, a dead worker's
    retries) are measured even past ``n``.  Why: with ``--trials 16`` a device-policy study at batch
    1 on an H200 enqueues about 19 (4 heuristics, 15 ladder counts up to 132), and the last ones
    cut were the ladder's largest counts, the best ones past 9K tokens in the committed validation
    (``results/h200/deploy/qo1/validate-*``: 96-132 splits)."""

    def __init__(self, n: int):
        self.n = n

    def __call__(self, study: Any, trial: Any | None = None) -> None:
        if self.reached(study, trial.number if trial is not None else None):
            study.stop()

    def reached(self, study: Any, own: int | None = None) -> bool:
        """Whether the study has its trials, counting running ones other than trial ``own``."""
        trials = study.get_trials(deepcopy=False)
        if any(t.state.name == "WAITING" for t in trials):
            return False
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


def pick_study(costs: list[float], joined: list[int], remaining: list[int]) -> int | None:
    """The study a free worker takes next (its position), or None when no study has trials left to
    start: among those with ``remaining`` trials > 0, the one the fewest workers are on
    (``joined``), then the one with the most expected seconds left (``costs`` x ``remaining``),
    then the lower position.  Every worker on every machine picks this way holding the storage's
    lock, so workers start on different studies, longest first (the longest-processing-time rule,
    Graham, "Bounds on multiprocessing timing anomalies", 1969), and a worker done early joins the
    study with the most left rather than a finished one.

    Why: workers that all start at the first study share every study, and each builds the inputs
    and fp32 references of every length of every study itself; on two H200s each measurement was
    then about 30% slower than one worker's.  A fixed deal per machine cannot know the other
    machines: two machines each walking the same order shared every study (0.98x one machine)."""
    ready = [i for i, left in enumerate(remaining) if left > 0]
    if not ready:
        return None
    return min(ready, key=lambda i: (joined[i], -costs[i] * remaining[i], i))


def worker_main(payload: dict[str, Any], index: int) -> None:
    """Run the studies of ``payload`` (``config``, ``run_dir``, ``studies``), taking them one at a
    time by :func:`pick_study`, each until it has ``trials`` finished trials, its sampler is
    exhausted or ``timeout_s`` passes; then wait, failing dead workers' trials and taking their
    retries, until no trial of any study runs anywhere.

    Raises :class:`~mlabench.errors.ResultsError` when a study measures another GPU model.
    """
    cfg = TuneConfig.model_validate(payload["config"])
    store = ResultStore(Path(payload["run_dir"]))
    storage = open_storage(os.environ.get(STORAGE_ENV) or None, store.run_dir)
    device = current_device().name
    backend = get_backend(cfg.backend)
    specs = [StudySpec(**data) for data in payload["studies"]]
    costs = [study_cost(data) for data in payload["studies"]]
    me, loaded = worker_id(), {}
    salt = zlib.crc32(me.encode()) % 1000 * 100000  # machines with one seed would suggest alike
    for position, spec in enumerate(specs):
        dims, _fixed = _space(backend, cfg, spec)
        name = resolve_sampler(cfg, dims)
        sampler = make_sampler(name, dims, sampler_seed(name, cfg.seed, position, index, salt))
        loaded[position] = optuna_module().load_study(study_name=spec.name, storage=storage, sampler=sampler)
        check_device(loaded[position], device)
    stop, visited = StopAtTrials(cfg.trials), set()
    while True:
        position, running = _take(loaded, costs, stop, storage, store.run_dir, me, visited)
        if position is None:
            if not running:
                return
            time.sleep(POLL_S)  # other workers' trials: wait for them, or for their heartbeat to stop
            continue
        visited.add(position)
        try:
            _optimize(loaded[position], specs[position], backend, cfg, store, stop)
        finally:
            with storage_lock(storage, store.run_dir):
                _join(loaded[position], me, leave=True)


def _space(backend: Backend, cfg: TuneConfig, spec: StudySpec) -> tuple[list[Dimension], dict[str, Any]]:
    return study_space(backend, tune_shape(shape_dims(cfg), spec.batch, spec.length), cfg, spec.measured(),
                       spec.max_splits)


def _take(studies: dict[int, Any], costs: list[float], stop: StopAtTrials, storage: Any, run_dir: Path,
          me: str, visited: set[int]) -> tuple[int | None, bool]:
    """Holding the storage's lock: fail dead workers' trials, pick the next study (:func:`pick_study`)
    and join it; returns its position (None: none left) and whether a trial runs anywhere.  A study
    this worker already ran (``visited``: its sampler exhausted, or ``--timeout`` passed) is taken
    again only for its waiting trials (a dead worker's retry)."""
    with storage_lock(storage, run_dir):
        joined, remaining, running = [], [], False
        for position in range(len(costs)):
            study = studies[position]
            fail_stale(study) if has_heartbeat(storage) else recover_stale(study)
            trials = study.get_trials(deepcopy=False)
            running = running or any(t.state.name == "RUNNING" for t in trials)
            joined.append(len(study.user_attrs.get("joined", [])))
            waiting = any(t.state.name == "WAITING" for t in trials)
            done = stop.reached(study) or (position in visited and not waiting)
            remaining.append(0 if done else max(1, stop.n - distinct_finished(trials)))
        position = pick_study(costs, joined, remaining)
        if position is not None:
            _join(studies[position], me, leave=False)
    return position, running


def _join(study: Any, me: str, leave: bool) -> None:
    """Add ``me`` to (or take it off) the workers on ``study`` (its ``joined`` user attribute)."""
    joined = [w for w in study.user_attrs.get("joined", []) if w != me]
    study.set_user_attr("joined", joined if leave else [*joined, me])


def _optimize(study: Any, spec: StudySpec, backend: Backend, cfg: TuneConfig, store: ResultStore,
              stop: StopAtTrials) -> None:
    dims, fixed = _space(backend, cfg, spec)
    shapes = {n: tune_shape(shape_dims(cfg), spec.batch, n) for n in spec.measured()}
    objective = Objective(backend, shapes, dims, fixed, store, RecordIndex(store), cfg,
                          store.manifest().copy_bandwidth_tbps)
    deadline = None if cfg.timeout_s is None else time.monotonic() + cfg.timeout_s
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            study.optimize(objective, timeout=left, callbacks=[stop], gc_after_trial=False)
            break
        except (ValueError, RuntimeError) as exc:
            if not dropped_late(study, objective.current, exc):
                raise
        if stop.reached(study) or (deadline is not None and time.monotonic() >= deadline):
            break
    objective.benches.clear()  # free this study's inputs before the next study's


def dropped_late(study: Any, trial: Any | None, exc: BaseException) -> bool:
    """Whether ``exc`` is Optuna refusing ``trial``'s result because another worker failed it as
    stale: this worker stalled (stopped, swapping) past the grace period, its heartbeat silent
    (:func:`mlabench.tune.storage.fail_stale`), and the trial's retry is measured elsewhere.  Then
    its late result is dropped with a ``notice:`` in this worker's log (what it appended to the run
    folder stays, and the retry reuses it) and the worker goes on.  Optuna raises
    ``UpdateFinishedTrialError`` for an attribute set on the failed trial, and ``ValueError("Cannot
    tell a FAIL trial.")`` for its result."""
    optuna = optuna_module()
    refused = isinstance(exc, optuna.exceptions.UpdateFinishedTrialError) or str(exc).startswith("Cannot tell a ")
    if trial is None or not refused or study._storage.get_trial(trial._trial_id).state.name != "FAIL":
        return False
    print(f"notice: trial {trial.number} of {study.study_name!r} was failed as stale while this worker was "
          f"stalled (no heartbeat for over {grace_period_s()} s); its late result is dropped and its retry "
          f"counts instead", file=sys.stderr, flush=True)
    return True
