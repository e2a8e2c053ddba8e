"""Optuna studies of a tuning run: storage, names, creation, samplers, recovery and progress.

Optuna is imported lazily (:func:`mlabench.extras.require`), never when the CLI starts.  A study's
name encodes the backend, the shape, the batch size, the context bucket, the GPU model and the
library versions (with the git revision), so trials measured on different hardware or software
never mix; its user attributes repeat them, and a worker on another GPU model refuses to join
(:func:`check_device`).  Storage: a journal file in the run folder by default, or any database
URL Optuna supports (PostgreSQL shares studies between machines).
"""

from __future__ import annotations

import gzip
import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlabench.errors import ConfigError, ResultsError
from mlabench.extras import require
from mlabench.shapes import MLADecodeShape
from mlabench.tune.space import Bucket
from mlabench.tune.worker_pool import worker_alive

JOURNAL_FILE = "study.journal"
ARCHIVED_JOURNAL_FILE = JOURNAL_FILE + ".gz"  #: a committed run keeps its journal gzipped
FINISHED_STATES = ("COMPLETE", "PRUNED")


def optuna_module() -> Any:
    """The optuna package, with its per-trial INFO logging turned down to warnings."""
    optuna = require("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for manifests and messages)."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def journal_copy(run_dir: Path, into: Path) -> Path:
    """The folder to open a run's journal from for reading: ``run_dir`` itself, or ``into`` holding
    a plain copy of an archived run's ``study.journal.gz`` (Optuna reads only a plain file).
    Raises :class:`ResultsError` when the run has no journal (nothing was tuned there)."""
    if (run_dir / JOURNAL_FILE).exists():
        return run_dir
    archived = run_dir / ARCHIVED_JOURNAL_FILE
    if not archived.exists():
        raise ResultsError(f"{run_dir}: no {JOURNAL_FILE} (or .gz): not a tuning run with a journal")
    (into / JOURNAL_FILE).write_bytes(gzip.decompress(archived.read_bytes()))
    return into


def open_storage(url: str | None, run_dir: Path) -> Any:
    """An Optuna storage: ``run_dir/study.journal`` (a ``JournalStorage``) when ``url`` is None,
    else ``RDBStorage(url)`` with heartbeats, so a trial of a worker that died is failed and retried
    once by the other workers.  Raises :class:`ConfigError` for a URL Optuna cannot open."""
    optuna = optuna_module()
    if url is None:
        from optuna.storages.journal import JournalFileBackend

        archived = run_dir / ARCHIVED_JOURNAL_FILE
        if archived.exists() and not (run_dir / JOURNAL_FILE).exists():
            raise ConfigError(f"{archived}: an archived run's journal is read-only here (tune "
                              f"--export reads it); gunzip it to add trials")
        return optuna.storages.JournalStorage(JournalFileBackend(str(run_dir / JOURNAL_FILE)))
    try:
        with warnings.catch_warnings():  # heartbeats are "experimental" in Optuna, and the way to recover
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1)
            return optuna.storages.RDBStorage(url, heartbeat_interval=15, grace_period=60,
                                              heartbeat_stale_trial_callback=retry)
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy/driver errors have no common base here
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"--storage {redact_url(url)}: cannot open ({line})") from None


@dataclass(frozen=True)
class StudySpec(Bucket):
    """One study of a run: its name and batch size, the bucket it tunes, and the most
    ``num_kv_splits`` it searches (:func:`mlabench.tune.space.wave_cap`; None: the declared range)."""

    name: str = ""
    batch: int = 1
    max_splits: int | None = None


def study_name(backend: str, shape: MLADecodeShape, bucket: Bucket, device: str,
               versions: dict[str, Any], revision: str, max_splits: int | None = None) -> str:
    """Readable, unique name of a study: backend, shape (with ``qo<T>`` for several query tokens),
    batch, bucket and the lengths it is measured at, the split cap when there is one, GPU model,
    versions."""
    libs = " ".join(f"{k} {versions[k]}" for k in ("torch", "triton", "mlabench") if versions.get(k))
    cap = "" if max_splits is None else f" | num_kv_splits <= {max_splits}"
    qo = "" if shape.qo_len == 1 else f" qo{shape.qo_len}" + ("" if shape.causal else " non-causal")
    return (f"{backend} | h{shape.num_heads} r{shape.kv_lora_rank}+{shape.qk_rope_head_dim}{qo} "
            f"page{shape.page_size} {shape.kv_dtype} | batch {shape.batch} | context {bucket.lo + 1}-{bucket.hi} "
            f"at {','.join(map(str, bucket.measured()))}{cap} | {device} | {libs} rev {revision}")


def check_device(study: Any, device: str) -> None:
    """Raise :class:`ResultsError` when ``study`` was created on another GPU model than ``device``."""
    theirs = study.user_attrs.get("device")
    if theirs is not None and theirs != device:
        raise ResultsError(f"this worker runs on {device}, but study {study.study_name!r} measures "
                           f"{theirs}: a worker on another GPU model does not join")


def prepare_study(storage: Any, spec: StudySpec, attrs: dict[str, Any],
                  enqueue: list[tuple[str, dict[str, Any]]], device: str) -> Any:
    """Create (or load) the study, check its device, fail trials of workers that died on this host
    (re-enqueueing their parameters), and enqueue ``enqueue``'s ``(label, params)`` unless already
    tried."""
    optuna = optuna_module()
    study = optuna.create_study(study_name=spec.name, storage=storage, direction="minimize",
                                load_if_exists=True)
    check_device(study, device)
    for key, value in attrs.items():
        if study.user_attrs.get(key) != value:
            study.set_user_attr(key, value)
    recover_stale(study)
    for label, params in enqueue:
        study.enqueue_trial(params, user_attrs={"enqueued_as": label}, skip_if_exists=True)
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


def make_sampler(name: str, dims: list[Any], seed: int | None) -> Any:
    """An Optuna sampler: ``tpe`` (multivariate, grouped for a conditional space, constant liar for
    parallel workers), ``gp``,
    ``grid`` (every point of the space) or ``brute`` (exhaustive, skipping running trials)."""
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


@dataclass
class StudyProgress:
    """Where one study stands: finished/running trials of the target, the best objective value so
    far (µs: the geometric mean of the medians at the study's lengths)."""

    batch: int
    bucket: str
    lengths: str
    done: int
    running: int
    total: int
    best_us: float | None
    best_params: dict[str, Any]


def study_progress(study: Any, spec: StudySpec, total: int) -> StudyProgress:
    """A :class:`StudyProgress` read from the storage now."""
    trials = study.get_trials(deepcopy=False)
    ok = [t for t in trials if t.state.name == "COMPLETE" and t.value is not None]
    best = min(ok, key=lambda t: t.value) if ok else None
    return StudyProgress(spec.batch, f"{spec.lo + 1}-{spec.hi}", ",".join(map(str, spec.measured())),
                         distinct_finished(trials),
                         sum(t.state.name == "RUNNING" for t in trials), total,
                         best.value if best else None, dict(best.params) if best else {})

