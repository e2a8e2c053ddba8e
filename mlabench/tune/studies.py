"""Optuna studies of a tuning run: names, identity, creation and seeding, samplers, recovery, progress.

Optuna is imported lazily (:func:`mlabench.extras.require`), never when the CLI starts.  A study's
name encodes the backend, the shape, the batch size and the context bucket: the same command on
any machine names the same studies.  Everything else that changes what a trial means (GPU model,
library versions and git revision, timing, search space, wave cap, correctness tolerances) is its
identity, kept in its user attributes: a worker that differs refuses to join, naming what differs
(:func:`check_device`, :func:`check_identity`).  Storage: :mod:`mlabench.tune.storage`.
"""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlabench.errors import ConfigError, ResultsError
from mlabench.records.provenance import same_commit
from mlabench.shapes import MLADecodeShape
from mlabench.tune.space import RULE_PARAM, TILE_PARAM, Bucket
from mlabench.tune.storage import fail_stale, grace_period_s, has_heartbeat, optuna_module, storage_lock
from mlabench.tune.worker_pool import worker_alive

FINISHED_STATES = ("COMPLETE", "PRUNED")


@dataclass(frozen=True)
class StudySpec(Bucket):
    """One study of a run: its name and batch size, the bucket it tunes, and the most
    ``num_kv_splits`` it searches (:func:`mlabench.tune.space.wave_cap`; None: the declared range)."""

    name: str = ""
    batch: int = 1
    max_splits: int | None = None


def study_name(backend: str, shape: MLADecodeShape, bucket: Bucket) -> str:
    """Readable name of a study: backend, shape (with ``qo<T>`` for several query tokens), batch,
    bucket and the lengths it is measured at.  What else changes what a trial means (GPU model,
    versions, revision, timing, search space) is the study's identity (:func:`check_identity`):
    a machine that differs is refused rather than silently making studies of its own."""
    qo = "" if shape.qo_len == 1 else f" qo{shape.qo_len}" + ("" if shape.causal else " non-causal")
    return (f"{backend} | h{shape.num_heads} r{shape.kv_lora_rank}+{shape.qk_rope_head_dim}{qo} "
            f"page{shape.page_size} {shape.kv_dtype} | batch {shape.batch} | context {bucket.lo + 1}-{bucket.hi} "
            f"at {','.join(map(str, bucket.measured()))}")


def check_device(study: Any, device: str) -> None:
    """Raise :class:`ResultsError` when ``study`` was created on another GPU model than ``device``."""
    theirs = study.user_attrs.get("device")
    if theirs is not None and theirs != device:
        raise ResultsError(f"this worker runs on {device}, but study {study.study_name!r} measures "
                           f"{theirs}: a worker on another GPU model does not join")


#: User attributes of a study that are not its identity (who made it, and the seeding marker).
NOT_IDENTITY = ("run_id", "seeded", "joined")


def check_identity(study: Any, identity: dict[str, Any]) -> None:
    """Raise :class:`ResultsError` naming, in one line, every setting of ``identity`` (flattened,
    e.g. ``timing.budget_s``) whose value differs from the one ``study`` was made with."""
    have = study.user_attrs  # one read of the storage
    mine = _flat(json.loads(json.dumps(identity, sort_keys=True, default=str)))
    theirs = _flat({k: v for k, v in have.items() if k in identity})
    differ = [f"{k} {theirs.get(k, '(none)')!s} there, {mine.get(k, '(none)')!s} here"
              for k in sorted(set(mine) | set(theirs)) if k.split(".")[0] in have and theirs.get(k) != mine.get(k)
              and not (k == "revision" and same_commit(str(theirs.get(k)), str(mine.get(k))))]  # a short id
    if differ:
        raise ResultsError(f"study {study.study_name!r} measures trials another way ({'; '.join(differ)}): a run "
                           "resumes, and a machine joins, only with the same settings, software and GPU; go back to "
                           "the revision and versions it names, or start a new run (with a shared --storage: "
                           "another one)")


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        return {k: v for key, sub in value.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): value}


def prepare_study(storage: Any, spec: StudySpec, attrs: dict[str, Any],
                  enqueue: list[tuple[str, dict[str, Any]]], device: str, run_dir: Path) -> Any:
    """Create (or join) the study holding the storage's lock (:func:`storage_lock`): check its GPU
    model (:func:`check_device`) and identity (``attrs``, :func:`check_identity`), fail the trials
    of workers that died (:func:`fail_stale`, or on this host :func:`recover_stale` for a storage
    without heartbeats), and enqueue ``enqueue``'s ``(label, params)`` once per study, whoever comes
    first (its ``seeded`` user attribute).  Raises :class:`ResultsError` on a mismatch."""
    optuna = optuna_module()
    with storage_lock(storage, run_dir):
        study = optuna.create_study(study_name=spec.name, storage=storage, direction="minimize",
                                    load_if_exists=True)
        check_device(study, device)
        check_identity(study, {k: v for k, v in attrs.items() if k not in NOT_IDENTITY})
        have = study.user_attrs
        for key, value in attrs.items():
            if key not in have:
                study.set_user_attr(key, value)
        fail_stale(study) if has_heartbeat(storage) else recover_stale(study)
        if not have.get("seeded"):
            for label, params in enqueue:
                study.enqueue_trial(params, user_attrs={"enqueued_as": label}, skip_if_exists=True)
            study.set_user_attr("seeded", True)
    return study


def recover_stale(study: Any) -> int:
    """Fail RUNNING trials whose worker on this host is gone (e.g. ``kill -9``) and enqueue their
    parameters again (once), so the configuration is still measured; returns how many were failed.

    Optuna's ``skip_if_exists`` would skip them (it counts failed trials too), and an exhaustive
    sampler takes a failed trial's point as visited, hence the explicit re-enqueue.
    """
    optuna = optuna_module()
    trials = study.get_trials(deepcopy=False)
    stale = [t for t in trials if t.state.name == "RUNNING"
             and worker_alive(str(t.user_attrs.get("worker", ""))) is False]
    live = {json.dumps(_params_of(t), sort_keys=True) for t in trials if t.state.name != "FAIL" and t not in stale}
    for t in stale:
        study._storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
        key = json.dumps(dict(t.params), sort_keys=True)
        if t.params and key not in live:
            study.enqueue_trial(dict(t.params), user_attrs={"retry_of": t.number})
            live.add(key)
    return len(stale)


def _params_of(trial: Any) -> dict[str, Any]:
    """A trial's parameters, or the fixed ones of a trial still waiting in the queue."""
    return dict(trial.params) or dict(trial.system_attrs.get("fixed_params", {}))


def sampler_seed(name: str, seed: int, position: int, worker: int, salt: int) -> int:
    """The seed of one worker's sampler for the study at ``position``: ``seed + position`` for
    ``grid``, the same in every worker on every machine, because Optuna's ``GridSampler`` shuffles
    its grid by the seed and its workers share trials by grid index (with one seed per worker, index
    3 is another point in each: two workers on a 6-point grid ended at 4-5 distinct points, the grid
    "exhausted"); other samplers get ``worker`` (index on this machine) and ``salt`` (this machine's)
    added, so that parallel workers suggest different points."""
    if name == "grid":
        return seed + position
    return seed + 1000 * worker + position + salt


def make_sampler(name: str, dims: list[Any], seed: int | None) -> Any:
    """An Optuna sampler: ``tpe`` (multivariate, grouped for a conditional space, constant liar for
    parallel workers), ``gp``,
    ``grid`` (every point of the space; give every worker the same ``seed``, :func:`sampler_seed`)
    or ``brute`` (exhaustive, skipping running trials)."""
    optuna = optuna_module()
    samplers = optuna.samplers
    if name == "tpe":  # group: the space is conditional when the whole-tile rule is searched
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True)
    if name == "gp":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return samplers.GPSampler(seed=seed)
    if name == "grid":
        return samplers.GridSampler({d.name: d.values() for d in dims}, seed=seed)
    if name == "brute":
        with warnings.catch_warnings():  # experimental since Optuna 3.1, and still the exhaustive one
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return samplers.BruteForceSampler(seed=seed)
    raise ConfigError(f"unknown sampler {name!r} (tpe, gp, grid, brute or auto)")


def launch_key(trial: Any) -> str:
    """What ``trial`` launches, as a key: its ``launched`` user attribute (the parameters launched
    at each of the study's lengths, :func:`mlabench.tune.space.launched`), or its params for a trial
    recorded before that attribute."""
    launched = trial.user_attrs.get("launched")
    return json.dumps(launched if launched is not None else dict(trial.params), sort_keys=True)


def distinct_finished(trials: list[Any]) -> int:
    """Distinct configurations among COMPLETE and PRUNED ``trials``, by what they launch
    (:func:`launch_key`): what counts towards ``--trials``.  A repeat (the same params again, or
    other params launching the same counts at every length, e.g. two ``tokens_per_split`` values
    that round alike) is reused rather than measured again, and does not count."""
    return len({launch_key(t) for t in trials if t.state.name in FINISHED_STATES})


def repeats_note(studies: list[Any], specs: list[StudySpec], targets: list[int], factor: int) -> str:
    """A note naming the studies that stopped short of their target of distinct configurations
    (``targets``, by :func:`distinct_finished`) because ``factor`` x the target of trials had
    finished, repeats included (the cap of :class:`~mlabench.tune.trial_worker.StopAtTrials`:
    the sampler kept suggesting launches already measured); "" when none did."""
    short = []
    for study, spec, target in zip(studies, specs, targets):
        trials = study.get_trials(deepcopy=False)
        distinct, finished = distinct_finished(trials), sum(t.state.name in FINISHED_STATES for t in trials)
        if distinct < target and finished >= factor * target:
            short.append(f"batch {spec.batch} context {spec.lo + 1}-{spec.hi}: {distinct}/{target}")
    return (f"{len(short)} of {len(specs)} studies stopped short of --trials distinct configurations "
            f"({'; '.join(short)}): their sampler kept suggesting launches already measured until {factor}x "
            "--trials had run, so the space there holds few others it finds; fewer --trials, or a narrower "
            "--space, says the same in less time") if short else ""


@dataclass
class StudyProgress:
    """Where one study stands: finished/running trials of the target, the best objective value so
    far (µs: the geometric mean of the medians at the study's lengths) and what that trial launched
    (:func:`launched_params`)."""

    batch: int
    bucket: str
    lengths: str
    done: int
    running: int
    total: int
    best_us: float | None
    best_params: dict[str, Any]


def launched_params(trial: Any) -> dict[str, Any]:
    """What ``trial`` launched of its searched parameters, one value each: the value where every
    length of the study launched the same, else each length's in length order joined by ``/`` (a
    ``tokens_per_split`` rule is shown as the ``num_kv_splits=4/8/16`` it launched, not as the
    sampled cap).  Its params for a trial recorded before the ``launched`` attribute."""
    launches = trial.user_attrs.get("launched")
    if not launches:
        return dict(trial.params)
    per_length = [params for _, params in sorted(launches, key=lambda item: item[0])]
    shown = {}
    for key in dict.fromkeys(k for k in trial.params if k not in (RULE_PARAM, TILE_PARAM)):
        values = [params.get(key, "—") for params in per_length]
        shown[key] = values[0] if len(set(map(str, values))) == 1 else "/".join(map(str, values))
    return shown


def study_progress(study: Any, spec: StudySpec, total: int) -> StudyProgress:
    """A :class:`StudyProgress` read from the storage now."""
    trials = study.get_trials(deepcopy=False)
    ok = [t for t in trials if t.state.name == "COMPLETE" and t.value is not None]
    best = min(ok, key=lambda t: t.value) if ok else None
    return StudyProgress(spec.batch, f"{spec.lo + 1}-{spec.hi}", ",".join(map(str, spec.measured())),
                         distinct_finished(trials),
                         sum(t.state.name == "RUNNING" for t in trials), total,
                         best.value if best else None, launched_params(best) if best else {})


def wait_for_other_machines(studies: list[Any], poll_s: float) -> None:
    """Wait, at most twice :func:`~mlabench.tune.storage.grace_period_s`, while a trial of another
    machine sharing the storage still runs (looking every ``poll_s`` seconds): this machine's
    workers stop once they see none running, and another machine may start a last one (a retry)
    just after, which the export would then refuse as unfinished.  A dead machine's trial is failed
    by the heartbeats within that time."""
    deadline = time.monotonic() + 2 * grace_period_s()
    while time.monotonic() < deadline and any(t.state.name == "RUNNING" for st in studies
                                              for t in st.get_trials(deepcopy=False)):
        time.sleep(poll_s)
