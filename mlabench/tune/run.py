"""A tuning run: the run folder, its studies, the workers, and the policy they lead to.

:func:`run_tune` validates everything, creates (or resumes) ``results/<run-id>/`` with its manifest,
creates the studies and enqueues the public heuristics and the whole-tile candidates
(:mod:`mlabench.tune.seeded_trials`), starts one worker per device
(:mod:`mlabench.tune.worker_pool`, :func:`mlabench.tune.trial_worker.worker_main`), reports progress while they
run, then chooses per study and writes the policy (``policy.json``, ``policy.h``, ``policy.py``).
:func:`export_run` rebuilds the policy of a finished run (e.g. after workers on other machines).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from mlabench.backends import get_backend
from mlabench.backends.registry import backend_packages
from mlabench.device import current_device
from mlabench.errors import (BackendUnavailableError, ConfigError, GPURequiredError, Interrupted, ResultsError,
                             UnsupportedShapeError, WorkerError)
from mlabench.files import validation_line
from mlabench.inputs import check_fits
from mlabench.policy.exports import export_policy
from mlabench.policy.tuned import Policy
from mlabench.records.kinds import refuse_search_runs, run_kind
from mlabench.records.provenance import git_revision, library_versions
from mlabench.records.record import Manifest, utc_now
from mlabench.records.store import ResultStore, refuse_archived
from mlabench.run_files import JOURNAL_FILE, TUNE_KIND, VALIDATION_KIND, WORKERS_FOLDER
from mlabench.shapes import model_spec, scale_note
from mlabench.tune.choice import BucketChoice, build_policy, study_choice
from mlabench.tune.edges import fine_edges
from mlabench.tune.manifest import fresh_run_id, run_manifest
from mlabench.tune.neighbour_ties import adopt_neighbour_ties
from mlabench.tune.page_rule import pages_rule_policy, wave_caps
from mlabench.tune.seeded_trials import heuristic_trials, ladder_trials, page_trials, whole_tile_trials
from mlabench.tune.space import (LEGACY_FIELDS, TuneConfig, buckets_of, launched, load_tune_config, resolve_sampler,
                                 shape_dims, space_size, study_space, tune_shape, wave_cap)
from mlabench.tune.storage import journal_copy, journal_lost, load_studies, open_storage, optuna_module, redact_url
from mlabench.tune.studies import (FINISHED_STATES, StudyProgress, StudySpec, check_device, check_identity,
                                   distinct_finished, prepare_study, repeats_note, study_name, study_progress,
                                   wait_for_other_machines)
from mlabench.tune.trial_worker import MAX_TRIALS_FACTOR, POLL_S, STORAGE_ENV
from mlabench.tune.worker_pool import start_workers, supervise

Monitor = Callable[[list[StudyProgress]], None]


@dataclass
class TuneResult:
    """A finished tuning run: its folder, the policy, each study's choice and the exported files."""

    store: ResultStore
    policy: Policy
    choices: list[BucketChoice]
    exports: dict[str, Path]
    note: str = ""  # what became of the policy files already there (``tune --export``), else ""


def gpu_model(devices: list[str | None]) -> str:
    """The one GPU model of ``devices`` (CUDA/HIP indices; None: this process's first device).

    Raises :class:`ConfigError` when ``--gpus`` names GPUs of different models or a GPU that does not
    exist, and :class:`GPURequiredError` (exit 3) when there is no GPU.
    """
    import torch

    named = [d for d in devices if d is not None]
    if not named:
        return current_device().name
    if not torch.cuda.is_available():
        raise GPURequiredError("--gpus needs GPUs, and this machine has none (leave it out to run on the CPU)")
    count = torch.cuda.device_count()
    bad = [d for d in named if int(d) >= count]
    if bad:
        raise ConfigError(f"--gpus: GPU {bad[0]} does not exist ({count} visible)")
    models = {d: torch.cuda.get_device_name(int(d)) for d in named}
    if len(set(models.values())) > 1:
        raise ConfigError("--gpus names GPUs of different models (a study measures one model): "
                          + ", ".join(f"{d}: {m}" for d, m in models.items()))
    return models[named[0]]

def _manifest(run_id: str, cfg: TuneConfig, specs: list[StudySpec], copy_bw: float, device: str) -> Manifest:
    config = cfg.model_dump(mode="json", by_alias=True)
    if cfg.storage:
        config["storage"] = redact_url(cfg.storage)
    manifest = run_manifest(run_id, copy_bw, {"tune": config, "studies": [dataclasses.asdict(s) for s in specs]},
                            device, kind=TUNE_KIND)
    return manifest.model_copy(update={"softmax_scale": scale_note(model_spec(cfg.model, cfg.model_config_path))})

def recorded_config(run_dir: Path) -> tuple[TuneConfig, list[StudySpec]]:
    """The configuration and studies a tuning run folder was created with (:class:`ResultsError`
    when the folder holds no tuning run)."""
    manifest = ResultStore(run_dir).manifest()
    refuse_search_runs(manifest.run_kind(), manifest.config, run_dir, reader=TUNE_KIND)
    config = manifest.config
    if "tune" not in config:
        raise ResultsError(f"{run_dir} is not a tuning run (its manifest has no tune configuration)")
    recorded = {**LEGACY_FIELDS, **config["tune"]}  # a run from before a field: what it measured then
    return TuneConfig.model_validate(recorded), [StudySpec(**s) for s in config["studies"]]


def requested_config(values: dict[str, Any], config: str | Path | None, resume: Path | None) -> TuneConfig:
    """The configuration a ``tune`` command asks for: the run ``resume`` as recorded (with
    ``values["storage"]``), else ``config`` (a sweep TOML) under the flag ``values`` (None: not given;
    ``tokens_per_split="off"``: fixed split counts only).

    Raises :class:`ConfigError` for another flag, or ``config``, beside ``resume``, an archived
    ``resume`` run, no ``backend``, or neither ``buckets`` nor ``config``.
    """
    if resume is not None:
        if any(v is not None for k, v in values.items() if k != "storage") or config:
            raise ConfigError("--resume continues the run as recorded: only --storage, --gpus and --workers go with it")
        recorded = recorded_config(resume)[0]  # first: a gzipped run of another kind is named as such
        refuse_archived(resume)
        return recorded.model_copy(update={"storage": values.get("storage")})
    if values.get("backend") is None:
        raise ConfigError("give --backend (e.g. triton-splitkv)")
    if values.get("buckets") is None and config is None:
        raise ConfigError("give --buckets (context bucket edges) or --config (a sweep TOML)")
    if values.get("tokens_per_split") == "off":
        cfg = load_tune_config(config, {**values, "tokens_per_split": None})
        return cfg.model_copy(update={"tokens_per_split": None})
    return load_tune_config(config, values)


def _storage_url(cfg: TuneConfig, recorded: str | None) -> str | None:
    """The storage URL to open on resume: the one given again, which must match the recorded one."""
    if recorded is None:
        return cfg.storage
    if cfg.storage is None or redact_url(cfg.storage) != recorded:
        raise ConfigError(f"this run's studies are in {recorded}: give --storage with that URL again")
    return cfg.storage


def plan(cfg: TuneConfig) -> list[StudySpec]:
    """The run's studies, batch by batch, bucket by bucket; validates the backend and every shape
    (:class:`BackendUnavailableError`, :class:`UnsupportedShapeError`, :class:`ConfigError`)."""
    backend = get_backend(cfg.backend)
    ok, why = backend.available()
    if not ok:
        raise BackendUnavailableError(f"backend {backend.name} is not available here: {why}")
    dims_kw = shape_dims(cfg)
    specs = []
    for batch in cfg.batch:
        for bucket in buckets_of(fine_edges(cfg.buckets, cfg.edges_per_octave), cfg.representative,
                                 cfg.lengths_per_bucket):
            for length in bucket.measured():
                shape = tune_shape(dims_kw, batch, length)
                ok, why = backend.supports(shape)
                if not ok:
                    raise UnsupportedShapeError(f"{backend.name}: {shape.label()}: {why}")
                check_fits(shape)
            shape = tune_shape(dims_kw, batch, bucket.length)
            cap = wave_cap(backend, shape, cfg.max_waves)
            study_space(backend, shape, cfg, bucket.measured(), cap)
            name = study_name(backend.name, shape, bucket)
            specs.append(StudySpec(bucket.lo, bucket.hi, bucket.length, bucket.lengths, name=name, batch=batch,
                                   max_splits=cap))
    return specs


def run_tune(cfg: TuneConfig, results_root: Path = Path("results"), resume: Path | None = None,
             devices: list[str | None] | None = None, monitor: Monitor | None = None) -> TuneResult:
    """Tune (or resume tuning) ``cfg`` with one worker per entry of ``devices``; returns the run.

    Everything is validated before a folder is written.  Ctrl-C stops the workers and raises
    :class:`Interrupted` naming the command that resumes; trials finished so far are kept.
    """
    devices = devices or [None]
    device = gpu_model(devices)
    rev, dirty = git_revision()
    versions = library_versions(backend_packages())
    specs = plan(cfg)
    revision = rev[:12] + ("+dirty" if dirty else "")
    if resume is not None:
        storage_url, storage, store, specs = _reopen(cfg, resume, _manifest("resume", cfg, specs, 0.0, device))
    else:
        from mlabench.measure.bandwidth import measure_copy_bandwidth_tbps

        storage_url = cfg.storage
        storage = open_storage(storage_url, results_root) if storage_url else None  # before any folder
        if storage is not None:
            _check_joinable(storage, cfg, specs, device, versions, revision)
        copy_bw = measure_copy_bandwidth_tbps()
        _free_cached_memory()
        run_id = fresh_run_id(results_root, cfg.name)
        store = ResultStore.create(results_root / run_id, _manifest(run_id, cfg, specs, copy_bw, device))
        storage = storage or open_storage(None, store.run_dir)
    studies = [_prepare(storage, cfg, spec, store, device, _identity(cfg, spec, device, store.manifest().versions, revision))
               for spec in specs]
    payload = {"config": cfg.model_dump(mode="json", by_alias=True, exclude={"storage"}),
               "run_dir": str(store.run_dir), "studies": [dataclasses.asdict(s) for s in specs], "workers": len(devices)}
    totals = [_target(cfg, spec) for spec in specs]
    poll = (lambda: monitor([study_progress(st, sp, n) for st, sp, n in zip(studies, specs, totals)])) if monitor else None
    import torch

    env = {STORAGE_ENV: storage_url} if storage_url else {}
    workers = start_workers("mlabench.tune.trial_worker:worker_main", payload, devices, store.run_dir / WORKERS_FOLDER,
                            rocm=torch.version.hip is not None, extra_env=env)
    try:
        supervise(workers, poll)
    except KeyboardInterrupt:
        store.write_csv()
        raise Interrupted(f"interrupted: trials so far are kept in {store.run_dir}; continue with: "
                          f"mlabench tune --resume {store.run_dir}") from None
    except WorkerError as exc:  # a worker failed (e.g. a full disk): its error, and how to go on
        raise WorkerError(f"{exc}; trials so far are kept in {store.run_dir}; continue with: "
                          f"mlabench tune --resume {store.run_dir}", exc.exit_code) from None
    store.write_csv()
    wait_for_other_machines(studies, POLL_S)
    return _finish(cfg, store, studies, specs, device, versions, allow_incomplete=False)


def _reopen(cfg: TuneConfig, resume: Path, here: Manifest) -> tuple[str | None, Any, ResultStore, list[StudySpec]]:
    """``(storage URL, storage, store, studies)`` of the tuning run ``resume``, after checking,
    before anything is written to it, that ``cfg`` is its configuration, that its storage (a URL
    given again, or its ``study.journal``) is there, and that ``here`` (this process's manifest)
    has its identity; :class:`ConfigError` / :class:`ResultsError` otherwise."""
    recorded, recorded_specs = recorded_config(resume)
    storage_url = _storage_url(cfg, recorded.storage)
    if recorded.model_copy(update={"storage": None}) != cfg.model_copy(update={"storage": None}):
        raise ConfigError(f"{resume} was recorded with another tuning configuration; resume it without flags")
    if storage_url is None and (lost := journal_lost(Path(resume))):  # Optuna would start every study afresh
        raise ResultsError(f"{resume}: {lost} {JOURNAL_FILE}: the trials its studies ran are not there, so a resume "
                           "would start every study over beside the records it holds; restore it, or start a new run")
    storage = open_storage(storage_url, resume)
    return storage_url, storage, ResultStore.open_existing(resume, identity=here.identity()), recorded_specs


def _incomplete(cfg: TuneConfig, study: Any, spec: StudySpec) -> str:
    """What a study lacks, in words ("" when finished): trials still running or waiting, or fewer
    than its target (:func:`_target`) when nothing but ``--timeout`` could have stopped it."""
    trials = study.get_trials(deepcopy=False)
    states = [t.state.name for t in trials]
    target, running, waiting = _target(cfg, spec), states.count("RUNNING"), states.count("WAITING")
    finished = sum(s in FINISHED_STATES for s in states)
    distinct = distinct_finished(trials)
    missing = cfg.timeout_s is None and distinct < target and finished < MAX_TRIALS_FACTOR * target
    if not (running or missing or (waiting and distinct < target)):
        return ""
    return (f"batch {spec.batch} context {spec.lo + 1}-{spec.hi}: {distinct}/{target} trials, {running} running, "
            f"{waiting} waiting")


def _free_cached_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _target(cfg: TuneConfig, spec: StudySpec) -> int:
    """Trials a study will finish: ``trials`` (the whole space when an exhaustive sampler has fewer
    points), or its enqueued trials (:func:`_enqueued`) where they are more: every one is measured
    (:class:`~mlabench.tune.trial_worker.StopAtTrials`).  Enqueued trials count as the study counts
    its trials, by what they launch at its lengths (:func:`~mlabench.tune.space.launched`): two
    heuristics launching the same counts are one (``aiter-gluon-0.1.19`` and ``vllm-triton`` both
    1 split up to 64 tokens; counted by their parameters, a study finished at 3 of a target of 4)."""
    backend = get_backend(cfg.backend)
    shape = tune_shape(shape_dims(cfg), spec.batch, spec.length)
    dims, fixed = study_space(backend, shape, cfg, spec.measured(), spec.max_splits)
    seeds = len({json.dumps(launched(backend, fixed, p, spec.measured()), sort_keys=True)
                 for _, p in _enqueued(backend, shape, cfg, spec)})
    if resolve_sampler(cfg, dims) in ("grid", "brute"):
        return min(max(cfg.trials, seeds), space_size(dims))
    return max(cfg.trials, seeds)


def _identity(cfg: TuneConfig, spec: StudySpec, device: str, versions: dict[str, Any], revision: str) -> dict[str, Any]:
    """A study's identity (:func:`mlabench.tune.studies.check_identity`): everything that changes what
    its trials measure."""
    shape = tune_shape(shape_dims(cfg), spec.batch, spec.length)
    space = {"space": {k: v.model_dump(mode="json") for k, v in cfg.space.items()}, "whole_tiles": cfg.whole_tiles,
             "tokens_per_split": cfg.tokens_per_split.model_dump(mode="json") if cfg.tokens_per_split else None}
    if cfg.device_policy:  # only then: the studies of runs recorded before it keep their identity
        space["device_policy"] = True
    return {"device": device, "backend": cfg.backend, "batch": spec.batch, "bucket_lo": spec.lo,
            "bucket_hi": spec.hi, "length": spec.length, "lengths": list(spec.measured()), "shape": shape.key(),
            "versions": versions, "revision": revision, "max_waves": cfg.max_waves, "max_splits": spec.max_splits,
            "search": space, "seed": cfg.seed, "timing": cfg.timing.model_dump(mode="json"),
            "tolerances": {"atol": cfg.atol, "rtol": cfg.rtol}}


def _check_joinable(storage: Any, cfg: TuneConfig, specs: list[StudySpec], device: str, versions: dict[str, Any],
                    revision: str) -> None:
    """Refuse, before any run folder is written, to join a study of ``storage`` made another way."""
    optuna = optuna_module()
    names = set(optuna.get_all_study_names(storage))
    for spec in specs:
        if spec.name in names:
            study = optuna.load_study(study_name=spec.name, storage=storage)
            check_device(study, device)
            check_identity(study, _identity(cfg, spec, device, versions, revision))


def _prepare(storage: Any, cfg: TuneConfig, spec: StudySpec, store: ResultStore, device: str,
             identity: dict[str, Any]) -> Any:
    """Create or join ``spec``'s study, with ``identity`` and this run's id as its user attributes."""
    backend = get_backend(cfg.backend)
    shape = tune_shape(shape_dims(cfg), spec.batch, spec.length)
    enqueue = _enqueued(backend, shape, cfg, spec)
    attrs = {**identity, "run_id": store.manifest().run_id}
    return prepare_study(storage, spec, attrs, enqueue, device, store.run_dir)


def _enqueued(backend: Any, shape: Any, cfg: TuneConfig, spec: StudySpec) -> list[tuple[str, dict[str, Any]]]:
    """The trials every study measures first: the public heuristics (unless ``cfg.heuristics`` is
    off), then the whole-tile candidates (where the study searches that rule; clamped to the
    searched range) and, for ``cfg.device_policy``, the split ladder up to one wave
    (:func:`~mlabench.tune.seeded_trials.ladder_trials`) and the counts that cut each of the study's
    lengths into whole page splits (:func:`~mlabench.tune.seeded_trials.page_trials`).  The heuristics' counts stay as declared beyond the study's wave cap
    (Optuna records a fixed value outside the searched range, and TPE and GP take it; the choice
    may still pick it); an exhaustive sampler cannot hold a trial outside its grid, so there the
    count is clamped to the cap."""
    capped, _fixed = study_space(backend, shape, cfg, spec.measured(), spec.max_splits)
    tiles = whole_tile_trials(backend, shape, capped)
    if cfg.device_policy:  # a device policy's studies also measure the split ladder up to one wave,
        num_sms = current_device().num_sms  # and the counts giving each length whole page splits
        tiles += ladder_trials(backend, shape, capped, num_sms, spec.max_splits)
        tiles += page_trials(backend, shape, capped, spec.measured(), num_sms, spec.max_splits)
    if not cfg.heuristics:
        return tiles
    dims, _fixed = study_space(backend, shape, cfg, spec.measured())
    trials = heuristic_trials(backend, shape, dims, current_device().num_sms)
    if spec.max_splits is not None and resolve_sampler(cfg, capped) in ("grid", "brute"):
        trials = [(name, {**p, "num_kv_splits": min(p["num_kv_splits"], spec.max_splits)}) for name, p in trials]
    return trials + tiles


def _finish(cfg: TuneConfig, store: ResultStore, studies: list[Any], specs: list[StudySpec], device: str,
            versions: dict[str, Any], allow_incomplete: bool, pages_rule: list[int] | None = None) -> TuneResult:
    """Choose per study and write the policy; refuses (:class:`ResultsError`) when a study has
    trials running or waiting, or fewer than its target without a ``--timeout``, unless
    ``allow_incomplete``.  ``pages_rule``: batch sizes whose counts follow the length
    (:func:`~mlabench.tune.page_rule.pages_rule_policy`) instead of the bucket choices."""
    short = [line for st, sp in zip(studies, specs) if (line := _incomplete(cfg, st, sp))]
    if short and not allow_incomplete:
        raise ResultsError(f"{len(short)} of {len(specs)} studies are not finished ({short[0]}{'; ...' if len(short) > 1 else ''}):"
                           f" their policy would rest on part of the search; wait for the workers (if they stopped: "
                           f"tune --resume {store.run_dir}) and run tune --export {store.run_dir}, or add "
                           "--allow-incomplete to export it as it is")
    backend = get_backend(cfg.backend)
    dims_kw = shape_dims(cfg)
    rows: list[BucketChoice] = []
    for study, spec in zip(studies, specs):
        _dims, fixed = study_space(backend, tune_shape(dims_kw, spec.batch, spec.length), cfg, spec.measured(),
                                   spec.max_splits)
        row = study_choice(study.get_trials(deepcopy=False), spec, spec.batch, backend, fixed, cfg.noise, cfg.combine)
        rows.append(dataclasses.replace(row, max_splits=spec.max_splits))
    source = {"run_id": store.manifest().run_id, "noise": cfg.noise, "created": utc_now(),
              "studies": [s.name for s in specs], "buckets": fine_edges(cfg.buckets, cfg.edges_per_octave),
              "representative": cfg.representative,
              "lengths_per_bucket": cfg.lengths_per_bucket, "combine": cfg.combine,
              "lengths": sorted({n for s in specs for n in s.measured()})}
    rows = adopt_neighbour_ties(rows)
    policy, rule_note = build_policy(cfg, rows, device, versions, source), ""
    if pages_rule:
        caps = wave_caps(cfg, specs, store.manifest().device.get("num_sms"))
        policy, rule_note = pages_rule_policy(policy, store.records(), pages_rule, cfg.page_size, caps, cfg.device_policy)
    paths, note = export_policy(policy, store.run_dir)
    repeats = repeats_note(studies, specs, [_target(cfg, sp) for sp in specs], MAX_TRIALS_FACTOR)
    return TuneResult(store, policy, rows, paths, "; ".join(n for n in (rule_note, note, repeats) if n))


def export_run(run_dir: Path, storage: str | None = None, noise: float | None = None,
               combine: str | None = None, allow_incomplete: bool = False,
               pages_rule: list[int] | None = None) -> TuneResult:
    """Rebuild and write the policy of a tuning run from its studies (``noise`` and ``combine``
    override the run's: the choice is made again from what was measured, nothing is measured;
    ``pages_rule``: batch sizes whose counts are derived across lengths, :mod:`mlabench.tune.page_rule`).
    Raises :class:`ResultsError` for a study with trials running or missing, unless ``allow_incomplete``."""
    if run_kind(run_dir) == VALIDATION_KIND:
        raise ResultsError(f"{run_dir} is a validation run, not a tuning run: --export takes the tuning run whose "
                           f"policy it validated (tune --validate POLICY --from-run {run_dir} scores a policy on its records)")
    cfg, specs = recorded_config(run_dir)
    url = _storage_url(cfg.model_copy(update={"storage": storage}), cfg.storage)
    overrides = {k: v for k, v in (("noise", noise), ("combine", combine)) if v is not None}
    try:
        cfg = TuneConfig.model_validate({**cfg.model_dump(by_alias=True), **overrides})
    except ValidationError as exc:
        raise ConfigError(f"tune --export: {validation_line(exc)}") from None
    store = ResultStore(run_dir)
    with tempfile.TemporaryDirectory(prefix="mlabench-journal-") as scratch:
        handle = open_storage(url, run_dir if url else journal_copy(run_dir, Path(scratch)))
        where = f"--storage {redact_url(url)}" if url else f"{run_dir}'s study journal"
        studies = load_studies([s.name for s in specs], handle, where)
        manifest = store.manifest()
        return _finish(cfg, store, studies, specs, str(manifest.device.get("name")), manifest.versions,
                       allow_incomplete, pages_rule)

