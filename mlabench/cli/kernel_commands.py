"""Kernel commands: ``backends``, ``check``, ``sweep``, ``compare``.

Each parses its flags, calls one library function (:mod:`mlabench.sweep.check`, :mod:`mlabench.sweep.config`,
:mod:`mlabench.sweep.compare`) and renders a :class:`~mlabench.tables.table.Table`.  Library modules are
imported inside the commands, so that ``mlabench --help`` does not load torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mlabench.cli.options import (
    Backends, Batch, BudgetS, CheckBatch, CheckContext, CheckHeads, CompareBatch, CompareContext, CompareQoLens,
    Context, Format, GraphCaptures, Heads, Json, Markdown, MaxVisits, Model, ModelConfig, NonCausal, Order, OrderSeed,
    PageSize, Params, PlainPageSize, PlainTp, QoLens, ResultsDir, Resume, Splits, SweepFile, Tp, Visits,
    backend_params, int_list, name_list, non_causal_applies, output_format, page_size_flag,
    refuse_results_dir_on_resume,
)
from mlabench.cli.output import emit, fail, notice, progress_bar
from mlabench.errors import ConfigError, MissingResultError
from mlabench.run_files import MANIFEST_FILE, RESULTS_CSV_FILE, RESULTS_FILE


def backends(format: Format = None, as_json: Json = False, markdown: Markdown = False,
             show_params: Annotated[bool, typer.Option(
                 "--params", help="Also list every backend's parameters (available here or not): "
                 "values, default, whether tune searches it, what it does.")] = False) -> None:
    """List every backend: available here or not, and why; for library backends, the installed
    version and the behaviour rules in force; with ``--params`` every parameter of every backend."""
    from mlabench.backends import backend_names, get_backend
    from mlabench.device import current_device
    from mlabench.tables.table import ColumnStyle, Table

    fmt = output_format(format, as_json, markdown)
    dev = current_device()
    machine = ColumnStyle(show="machine")  # people read both in "available here" (80 columns)
    t = Table(f"Backends on {dev.name} ({dev.kind}, {dev.arch})",
              ["backend", "family", "available", "reason / parameters", "available here", "summary"],
              styles={"available": machine, "reason / parameters": machine,
                      "available here": ColumnStyle(show="human")})
    for name in backend_names():
        b = get_backend(name)
        ok, why = b.available()
        params = ", ".join(p.name for p in b.params) or "—"
        reason = why if not ok else f"params: {params}"
        t.rows.append([name, b.family, ok, reason, f"yes; {reason}" if ok else f"no: {reason}", b.summary])
        details = b.details()  # e.g. the installed library's version and the rules in force
        if details:
            t.notes.append(f"{name}: {details}")
    emit([t, _params_table()] if show_params else [t], fmt)


def _params_table():
    """Every backend's parameters: values (choices or an integer range), the default (a callable
    default depends on the shape: its help says how), searched by ``tune`` or not, and the help."""
    from mlabench.backends import backend_names, get_backend
    from mlabench.tables.table import Table

    t = Table("Backend parameters (set them with --param NAME=V[,V...], in a sweep config's [params] table, or "
              "search them with tune --space)",
              ["backend", "parameter", "values", "default", "tuned", "what it does"])
    for name in backend_names():
        for p in get_backend(name).params:
            values = ("|".join(p.choices) if p.choices else
                      f"{p.low}-{p.high}" if p.low is not None and p.high is not None else p.kind.__name__)
            default = "per shape" if callable(p.default) else repr(p.default)
            tuned = p.searched and bool(p.choices or (p.kind is int and p.high is not None))
            t.rows.append([name, p.name, values, default, "yes" if tuned else "no", p.help])
    return t


def check(
    model: Model = None, tp: PlainTp = None, model_config: ModelConfig = None, heads: CheckHeads = None,
    backend: Backends = None, splits: Splits = None, param: Params = None, batch: CheckBatch = None,
    context: CheckContext = None,
    qo_len: QoLens = None, non_causal: NonCausal = False, page_size: PlainPageSize = None,
    dtype: Annotated[str, typer.Option(metavar="DTYPE", help="q and KV dtype.")] = "bfloat16",
    rel_rmse_limit: Annotated[float | None, typer.Option(
        metavar="X", help="Largest relative RMSE (RMSE / RMS of the reference) that passes; default from "
        "the dtype.")] = None,
    rel_max_err_limit: Annotated[float | None, typer.Option(
        metavar="X", help="Largest max |error| / RMS of the reference that passes; default from the dtype.")] = None,
    inputs: Annotated[str | None, typer.Option(
        metavar="SETS", help="Input sets, e.g. random,needles (default: random,needles,peaky,flat).")] = None,
    atol: Annotated[float | None, typer.Option(
        metavar="X", help="Also require |out - ref| <= atol + rtol |ref|.")] = None,
    rtol: Annotated[float | None, typer.Option(metavar="X", help="Relative part of that elementwise bound.")] = None,
    seed: Annotated[int, typer.Option(metavar="N", help="Input seed.")] = 0,
    format: Format = None, as_json: Json = False, markdown: Markdown = False,
) -> None:
    """Check every backend against the fp32 reference; exit 1 on any failure."""
    from mlabench.checks.verdict import check_config
    from mlabench.shapes import model_spec, scale_note
    from mlabench.sweep.check import DEFAULT_CHECK_SPLITS, check_failures, check_shapes, check_table, run_check

    fmt = output_format(format, as_json, markdown)
    input_sets = [x.strip() for x in inputs.split(",") if x.strip()] if inputs is not None else None
    tol = check_config(atol, rtol, rel_rmse_limit, rel_max_err_limit, input_sets)
    qo_lens = int_list(qo_len, "--qo-len", "--qo-len")
    non_causal_applies(non_causal, qo_lens or [1])
    axes = backend_params(param, splits, name_list(backend)) or {}
    shapes = check_shapes(model=model, model_config=model_config, tp=tp, heads=int_list(heads, "--heads"),
                          context_lens=int_list(context, "--context", "context length"),
                          batch=int_list(batch, "--batch"), page_size=page_size_flag(page_size), dtype=dtype,
                          qo_lens=qo_lens, causal=not non_causal)
    split_list = axes.pop("num_kv_splits", None) or DEFAULT_CHECK_SPLITS
    with progress_bar("check") as update:
        records, unavailable = run_check(shapes, name_list(backend), split_list, tol, seed, update, params=axes)
    table = check_table(records, unavailable)
    table.notes.append(scale_note(model_spec(model, model_config)))
    emit([table], fmt)
    failed = check_failures(records)
    if failed:
        fail(f"{len(failed)} of {len(records)} checks failed")


def sweep(
    config: SweepFile = None, model: Model = None, tp: Tp = None, model_config: ModelConfig = None,
    heads: Heads = None, backend: Backends = None, batch: Batch = None, context: Context = None,
    qo_len: QoLens = None, non_causal: NonCausal = False,
    splits: Splits = None, param: Params = None, page_size: PageSize = None, budget_s: BudgetS = None,
    results_dir: ResultsDir = Path("results"), resume: Resume = None, order: Order = None,
    order_seed: OrderSeed = None, visits: Visits = None, max_visits: MaxVisits = None,
    graph_captures: GraphCaptures = None, format: Format = None, as_json: Json = False, markdown: Markdown = False,
    verbose: Annotated[bool, typer.Option(
        "--verbose", help="Every drifting window on its own line with its points (default: one line per kind "
        "of note; the details are in the manifest).")] = False,
) -> None:
    """Microbenchmark backends over batch x context x splits; results in results/<run-id>/.

    Flags change the default sweep (or --config's); --heads without a model sets the heads axis.
    """
    from mlabench.device import current_device
    from mlabench.sweep.config import resolve_sweep_config
    from mlabench.sweep.sentinel import ceilings_note, health_notes
    from mlabench.sweep.summary import sweep_summary

    fmt = output_format(format, as_json, markdown)
    overrides = _overrides(model, tp, model_config, heads, backend, batch, context,
                           backend_params(param, splits, name_list(backend)),
                           page_size_flag(page_size), budget_s, qo_len, non_causal, graph_captures)
    overrides.update(order=order.value if order else None, order_seed=order_seed, visits=visits,
                     max_visits=max_visits)
    cfg = resolve_sweep_config(config, overrides, resume)
    _flags_apply(cfg, param, splits, non_causal)
    if not current_device().is_gpu and cfg.name == "default-cpu":
        notice(f"No GPU found: running a small CPU sweep ({cfg.name}) on {current_device().name}.")
    store, records = _run_with_progress(cfg, results_dir, resume, strict=bool(backend))
    summary = sweep_summary(records)
    manifest = store.manifest()
    summary.notes += [ceilings_note(manifest), *filter(None, [manifest.softmax_scale]),
                      *health_notes(manifest, records, verbose)]
    emit([summary], fmt)
    _results_went_to(store)


def compare(
    config: SweepFile = None,
    from_run: Annotated[list[Path] | None, typer.Option(
        "--from", metavar="RUN",
        help="Only read this run folder (or a folder holding runs at any depth); repeatable.")] = None,
    resume: Annotated[Path | None, typer.Option(
        metavar="RUN", help="Measure what is missing into this run folder.")] = None,
    model: Model = None, tp: Tp = None, model_config: ModelConfig = None, heads: Heads = None,
    batch: CompareBatch = None, context: CompareContext = None, qo_len: CompareQoLens = None,
    non_causal: NonCausal = False,
    splits: Splits = None, param: Params = None, backend: Backends = None,
    page_size: PageSize = None, budget_s: BudgetS = None, results_dir: ResultsDir = Path("results"),
    format: Format = None, as_json: Json = False, markdown: Markdown = False,
) -> None:
    """Padded persistent kernels vs the best split count of split-KV kernels, per batch and context
    (and per qo_len: which path wins at each).

    With --from it only reads recorded runs; otherwise it measures (or, with --resume, completes)
    the sweep it needs first.
    """
    from mlabench.backends import backend_families
    from mlabench.sweep.compare import check_both_paths_run, check_comparable, recorded_records, winners_table
    from mlabench.sweep.summary import compare_table

    fmt = output_format(format, as_json, markdown)
    families = backend_families()
    if from_run:
        if config or resume or non_causal or results_dir != Path("results") or any(
                v is not None for v in (model, tp, model_config, heads, splits, param, page_size, budget_s)):
            raise ConfigError("--from only reads recorded runs: it takes --batch, --context, --qo-len and "
                              "--backend as filters, nothing else")
        records = recorded_records(from_run, int_list(batch, "--batch", "batch"),
                                   int_list(context, "--context", "context length"),
                                   name_list(backend), int_list(qo_len, "--qo-len", "--qo-len"))
    else:
        from mlabench.sweep.config import resolve_sweep_config

        overrides = _overrides(model, tp, model_config, heads, backend, batch, context,
                               backend_params(param, splits, name_list(backend)), page_size, budget_s, qo_len,
                               non_causal)
        cfg = resolve_sweep_config(config, overrides, resume)
        _flags_apply(cfg, param, splits, non_causal)
        store, records = _run_with_progress(cfg, results_dir, resume, strict=bool(backend), check_backends=lambda
                                            run: check_both_paths_run([b.name for b in run], cfg.backends, families))
    try:
        check_comparable(records, families)  # nothing to compare: the error alone, exit 1, no table of dashes
    except MissingResultError:
        if not from_run:
            _results_went_to(store)  # what was measured is kept
        raise
    tables = [compare_table(records, families)]
    if len({(r.qo_len, r.causal) for r in records}) > 1:
        tables.append(winners_table(records, families))
    emit(tables, fmt)
    if not from_run:
        _results_went_to(store)


#: The commands of this group, registered by :mod:`mlabench.cli.app`.
COMMANDS = {"backends": backends, "check": check, "sweep": sweep, "compare": compare}


def _overrides(model, tp, model_config, heads, backend, batch, context, params, page_size, budget_s,
               qo_len=None, non_causal=False, graph_captures=None) -> dict:
    """The sweep flags, parsed, as :func:`mlabench.sweep.config.sweep_overrides` (``params``: the
    axes of :func:`~mlabench.cli.options.backend_params`)."""
    from mlabench.sweep.config import sweep_overrides

    return sweep_overrides(
        model=model, tp=tp, model_config=model_config, heads=int_list(heads, "--heads", "heads"),
        backends=name_list(backend), batch=int_list(batch, "--batch", "batch"),
        context_lens=int_list(context, "--context", "context length"),
        params=params, page_size=page_size, budget_s=budget_s,
        qo_len=int_list(qo_len, "--qo-len", "--qo-len"), causal=False if non_causal else None,
        graph_captures=graph_captures)


def _flags_apply(cfg, param: list[str] | None, splits: str | None, non_causal: bool) -> None:
    """Refuse ``--non-causal``, ``--param`` and ``--splits`` where the sweep ``cfg`` they resolved
    into gives them nothing to change (every qo_len 1; no backend of the sweep, a config's named
    ones included, that takes the parameter)."""
    non_causal_applies(non_causal, cfg.qo_len)
    backend_params(param, splits, cfg.backends)


def _run_with_progress(cfg, results_dir: Path, resume: Path | None, strict: bool, check_backends=None):
    """Run the sweep with a progress bar from its first point (``check_backends``: run_sweep's).
    Raises :class:`ConfigError` for ``--results-dir`` beside ``--resume`` (it was ignored)."""
    from mlabench.sweep.run import run_sweep

    refuse_results_dir_on_resume(resume, results_dir)
    with progress_bar("sweep") as update:
        def progress(point, record, done, total):
            status = record.status if record else "…"
            update(done, total, f"{point.backend} {point.shape.label()} {status}")

        return run_sweep(cfg, results_dir, resume, progress, strict_backends=strict, warn=notice,
                         check_backends=check_backends)


def _results_went_to(store) -> None:
    notice(f"results: {store.run_dir}/ ({RESULTS_FILE}, {RESULTS_CSV_FILE}, {MANIFEST_FILE})", style="")
