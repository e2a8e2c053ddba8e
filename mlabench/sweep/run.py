"""Running a sweep: its run folder and manifest, the GPU warm-up, then :class:`~mlabench.sweep.runner.SweepRunner`
over the points of :mod:`mlabench.sweep.config` (imported only by the CLI).

A new run is validated whole before its folder is created, so bad input leaves nothing half-written;
``--resume`` reopens a folder and measures only what it lacks.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlabench.backends.base import Backend
from mlabench.backends.registry import backend_packages, select_backends
from mlabench.device import current_device
from mlabench.errors import BackendUnavailableError, ConfigError, ResultsError
from mlabench.inputs import check_fits
from mlabench.measure.bandwidth import (
    datasheet_bandwidth_tbps, measure_copy_bandwidth_tbps, measure_read_ceiling,
)
from mlabench.measure.observers import driver_version, gpu_state
from mlabench.measure.steady import warm_up
from mlabench.records.provenance import command_line, git_revision, library_versions
from mlabench.records.record import Manifest, Record, new_run_id, utc_now
from mlabench.records.store import ResultStore
from mlabench.run_files import SWEEP_KIND
from mlabench.shapes import model_spec, scale_note
from mlabench.sweep.config import Point, SweepConfig, check_param_values, expand, recorded_config
from mlabench.sweep.order import order_points
from mlabench.sweep.runner import ProgressFn, SweepRunner, choose_sentinel
from mlabench.sweep.visits import DEFAULT_GPU_VISITS, MAX_VISITS_FACTOR, read_visits


def make_manifest(run_id: str, cfg: SweepConfig, copy_bw_tbps: float, read_bw_tbps: float | None = None,
                  warmups: list[dict[str, Any]] | None = None, read_ceiling: dict[str, Any] | None = None,
                  planned_points: int | None = None) -> Manifest:
    """The manifest of a new sweep run: :func:`kernel_run_manifest` with ``cfg`` as its configuration,
    the softmax scale its model sets (:func:`~mlabench.shapes.scale_note`) and the points it will
    record (``planned_points``)."""
    manifest = kernel_run_manifest(run_id, cfg.model_dump(mode="json", by_alias=True), copy_bw_tbps, read_bw_tbps,
                                   warmups, read_ceiling)
    return manifest.model_copy(update={"softmax_scale": scale_note(model_spec(cfg.model, cfg.model_config_path)),
                                       "planned_points": planned_points})


def kernel_run_manifest(run_id: str, config: dict[str, Any], copy_bw_tbps: float, read_bw_tbps: float | None = None,
                        warmups: list[dict[str, Any]] | None = None,
                        read_ceiling: dict[str, Any] | None = None) -> Manifest:
    """The manifest of a new kernel run (kind :data:`~mlabench.run_files.SWEEP_KIND`) (a folder ``compare``, ``plot``, ``report`` and ``diff`` read):
    this process's identity (device, driver, library versions, git revision, command line), the
    measured copy and read bandwidths (TB/s) beside the datasheet's, how the read one was found
    (``read_ceiling``: :meth:`~mlabench.measure.bandwidth.ReadCeiling.as_dict`), ``config`` (a sweep's
    :class:`SweepConfig` fields, or a script's grid in the same layout) and the GPU warm-ups.

    For sweeps (:func:`make_manifest`) and scripts that measure with :class:`~mlabench.bench.shape_bench.ShapeBench`
    outside a sweep (``scripts/h200_hopper_kernel.py``).
    """
    dev = current_device()
    rev, dirty = git_revision()
    import socket

    return Manifest(
        run_id=run_id, created=utc_now(), command=command_line(), git_revision=rev, git_dirty=dirty,
        host=socket.gethostname(), device=dict(dev.__dict__), gpu_state=gpu_state(), driver=driver_version(),
        versions=library_versions(backend_packages()), copy_bandwidth_tbps=copy_bw_tbps,
        read_bandwidth_tbps=read_bw_tbps, read_ceiling=read_ceiling,
        datasheet_bandwidth_tbps=datasheet_bandwidth_tbps(dev.name), config=config, warmups=warmups or [],
        kind=SWEEP_KIND,
    )


def run_sweep(cfg: SweepConfig, results_root: Path = Path("results"), resume: Path | None = None,
              progress: ProgressFn | None = None, time_it: bool = True, strict_backends: bool = True,
              warn: Callable[[str], None] | None = None,
              check_backends: Callable[[list[Backend]], None] | None = None) -> tuple[ResultStore, list[Record]]:
    """Run (or resume) a sweep; returns the store and every record of the run.

    Validation (backends, parameters, shapes, memory) happens before any file is written.  With
    ``resume`` the points already in ``resume/results.jsonl`` are skipped (a run with every point
    recorded is returned as it is: nothing measured, only its CSV written again); the folder must have been
    recorded with the same configuration (its order seed is taken when ``cfg`` has none), device,
    driver, library versions and git revision (:class:`ConfigError` / :class:`ResultsError`).  The GPU is warmed up to steady clocks first
    (:func:`~mlabench.measure.steady.warm_up`); a new run then measures the copy and read bandwidths.  The
    points run in ``cfg.order``, each in ``cfg.visits`` visits (default: 4 on a GPU when timing, else
    1; recorded resolved) with the sentinel (:class:`~mlabench.sweep.runner.SweepRunner`);
    ``progress(point, record, done, total)`` is called before each point (``record`` None) and
    after it.  Ctrl-C saves the CSV and raises :class:`Interrupted`, naming the folder to resume.
    ``check_backends(backends)``, given, judges the backends that would run (after the shapes are
    judged, before anything is written or measured) and raises to refuse them.
    """
    if cfg.visits is None:  # recorded resolved, so a resumed run keeps its own
        cfg = cfg.model_copy(update={"visits": DEFAULT_GPU_VISITS if time_it and current_device().is_gpu else 1})
    if cfg.max_visits is None:
        cfg = cfg.model_copy(update={"max_visits": MAX_VISITS_FACTOR * cfg.visits if cfg.visits > 1 else 1})
    store = None
    if resume is not None:  # before backends are looked for here: a run of another device says so first
        store, cfg = _reopen(cfg, resume)
    points = _points(cfg, strict_backends, warn, check_backends)
    if cfg.max_visits < cfg.visits:
        raise ConfigError(f"--max-visits {cfg.max_visits} is below --visits {cfg.visits} (max_visits, visits)")
    if cfg.max_visits > cfg.visits == 1:
        raise ConfigError(f"--max-visits {cfg.max_visits} needs --visits 2 or more: a point's visits are "
                          "compared once it has two")
    if store is not None:
        store.drop_torn_line()
        if {p.key for p in points} <= store.finished_keys():
            if warn:  # nothing to measure: no warm-up, no sentinel, only the CSV written again
                warn(f"{store.run_dir}: every one of its {len(points)} points is recorded; nothing to measure")
            store.write_csv()
            return store, store.records()
    elif cfg.order_seed is None:
        cfg = cfg.model_copy(update={"order_seed": secrets.randbelow(2**31)})
    steady = warm_up(cfg.timing)
    if store is None:
        copy_bw, ceiling = measure_copy_bandwidth_tbps(), measure_read_ceiling()
        run_id = new_run_id(cfg.name)
        store = ResultStore.create(results_root / run_id, make_manifest(
            run_id, cfg, copy_bw, ceiling.tbps, [steady.model_dump()], ceiling.as_dict(), len(points)))
    else:
        store.update_manifest(warmups=[*store.manifest().warmups, steady.model_dump()])
        if warn:
            measured = sum(map(len, read_visits(store.run_dir).values())) if cfg.visits > 1 else 0
            planned = f"{cfg.visits * len(points)}" + (f" to {cfg.max_visits * len(points)}"
                                                        if cfg.max_visits > cfg.visits else "")
            visits = f" ({measured} visits measured of {planned} planned)" if cfg.visits > 1 else ""
            warn(f"resuming {store.run_dir}: {len(store.finished_keys())} of {len(points)} points already "
                 f"recorded{visits}")
    runner = SweepRunner(cfg, store, steady_mhz=steady.sm_clock_mhz, time_it=time_it)
    runner.run(order_points(points, cfg.order, cfg.order_seed), choose_sentinel(points), progress)
    return store, store.records()


def _points(cfg: SweepConfig, strict_backends: bool, warn: Callable[[str], None] | None,
            check_backends: Callable[[list[Backend]], None] | None) -> list[Point]:
    """The points of ``cfg``, judged before anything is written (:func:`run_sweep`'s arguments):
    parameter values, backends, that every shape fits, then ``check_backends``."""
    check_param_values(cfg)
    backends = select_backends(cfg.backends, strict=strict_backends, warn=warn)
    if not backends:
        raise BackendUnavailableError("no backend available here (see `mlabench backends`)")
    points = expand(cfg, backends)
    for shape in {p.shape for p in points}:
        check_fits(shape)
    if check_backends is not None:
        check_backends(backends)
    return points


def _reopen(cfg: SweepConfig, resume: Path) -> tuple[ResultStore, SweepConfig]:
    """The run folder to resume and ``cfg`` with its recorded order seed (when ``cfg`` has none);
    refuses another identity (device first: an H200 sweep resumed on a CPU listed its backends as
    unavailable here, then said "no backend available here": a fresh user's review) or another
    configuration (naming the settings that differ) before anything in the folder changes."""
    store = ResultStore.open_existing(resume, identity=make_manifest("resume", cfg, 0.0).identity(),
                                      repair=False)
    recorded = recorded_config(store)
    seed = recorded.order_seed if cfg.order_seed is None else cfg.order_seed
    asked = cfg.model_copy(update={"order_seed": seed})
    if recorded != asked:
        theirs, ours = recorded.model_dump(), asked.model_dump()
        diff = sorted(k for k in ours if ours[k] != theirs.get(k))
        which = (f" ({diff[0]}: {theirs.get(diff[0])} there, {ours[diff[0]]} asked"
                 f"{''.join(f', {k}' for k in diff[1:])})" if diff else "")
        raise ConfigError(f"{resume} was recorded with another sweep configuration{which}; resume it "
                          "without flags that change the sweep, or start a new run")
    return store, asked
