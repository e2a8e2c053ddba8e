"""Kernel commands: ``backends``, ``check``, ``sweep``, ``compare``."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from mlabench.errors import ConfigError

out = Console()
err = Console(stderr=True)


def _ints(text: str | None, flag: str) -> list[int] | None:
    """``"1,2, 4"`` -> ``[1, 2, 4]``; ConfigError naming ``flag`` on anything else."""
    if text is None:
        return None
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ConfigError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values:
        raise ConfigError(f"{flag} is empty")
    return values


def _positive(values: list[int] | None, what: str) -> list[int] | None:
    for v in values or []:
        if v <= 0:
            raise ConfigError(f"{what} must be > 0, got {v}")
    return values


def _emit(tables: list, as_json: bool, markdown: bool) -> None:
    from mlabench.tables import to_json, to_markdown, to_rich

    if as_json:
        sys.stdout.write(to_json(tables) + "\n")
    elif markdown:
        sys.stdout.write("\n".join(to_markdown(t) for t in tables))
    else:
        for t in tables:
            out.print(to_rich(t))


def register(app: typer.Typer) -> None:
    """Add the kernel commands to ``app``."""

    @app.command()
    def backends(as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False) -> None:
        """List every backend: available here or not, and why."""
        import json

        from mlabench.backends import backend_names, get_backend
        from mlabench.device import current_device
        from mlabench.tables import Table

        dev = current_device()
        t = Table(f"Backends on {dev.name} ({dev.kind}, {dev.arch})",
                  ["backend", "family", "available", "reason / parameters", "summary"])
        for name in backend_names():
            b = get_backend(name)
            ok, why = b.available()
            params = ", ".join(p.name for p in b.params) or "—"
            t.rows.append([name, b.family, ok, why if not ok else f"params: {params}", b.summary])
        if as_json:
            sys.stdout.write(json.dumps(t.as_dicts(), indent=2) + "\n")
        else:
            _emit([t], False, False)

    @app.command()
    def check(
        model: Annotated[str | None, typer.Option(help="Model preset (configs/models/).")] = None,
        tp: Annotated[int, typer.Option(help="Tensor-parallel size.")] = 1,
        model_config: Annotated[Path | None, typer.Option(help="A model's HF config.json.")] = None,
        heads: Annotated[int | None, typer.Option(help="Local heads (without a model; default 12).")] = None,
        backend: Annotated[list[str] | None, typer.Option(help="Backend(s); default: all.")] = None,
        splits: Annotated[str | None, typer.Option(help="num_kv_splits to check, e.g. 1,3,16,64,256.")] = None,
        batch: Annotated[int | None, typer.Option(help="Requests of --context's one length.")] = None,
        context: Annotated[str | None, typer.Option(help="Context lengths, e.g. 4096, or 1,100,4097 (one request each).")] = None,
        page_size: Annotated[int, typer.Option(help="KV page size: 1, 16 or 64.")] = 64,
        dtype: Annotated[str, typer.Option(help="q and KV dtype.")] = "bfloat16",
        atol: Annotated[float, typer.Option(help="Absolute tolerance.")] = 1e-2,
        rtol: Annotated[float, typer.Option(help="Relative tolerance.")] = 1e-2,
        seed: Annotated[int, typer.Option(help="Input seed.")] = 0,
        as_json: Annotated[bool, typer.Option("--json")] = False,
        markdown: Annotated[bool, typer.Option("--markdown")] = False,
    ) -> None:
        """Check every backend against the fp32 reference; exit 1 on any failure."""
        from mlabench.check import DEFAULT_CHECK_SPLITS, default_check_shapes, run_check
        from mlabench.shapes import MLADecodeShape, resolve_heads
        from mlabench.tables import check_table

        _one_format(as_json, markdown)
        for name, tol, low in (("--atol", atol, 0.0), ("--rtol", rtol, 0.0)):
            if not math.isfinite(tol) or tol < low or (name == "--atol" and tol == 0):
                raise ConfigError(f"{name} must be a finite number {'> 0' if name == '--atol' else '>= 0'}, got {tol}")
        if heads is None and not (model or model_config):
            heads = 12
        h, scale, spec = resolve_heads(model=model, model_config=model_config, tp=tp, heads=heads)
        dims = {"kv_lora_rank": spec.kv_lora_rank, "qk_rope_head_dim": spec.qk_rope_head_dim} if spec else {}
        ctx = _positive(_ints(context, "--context"), "context length")
        split_list = list(dict.fromkeys(_positive(_ints(splits, "--splits"), "--splits") or DEFAULT_CHECK_SPLITS))
        if batch is not None and (batch <= 0 or ctx is None or len(ctx) != 1):
            raise ConfigError("--batch takes a value > 0 and exactly one --context length "
                              "(a ragged batch is --context L1,L2,... without --batch)")
        if ctx is None:
            shapes = default_check_shapes(h, scale, page_size, dtype, **dims)
        else:
            lens = tuple(ctx) * (batch or 1)
            shapes = [MLADecodeShape.create(num_heads=h, context_lens=lens, page_size=page_size,
                                            q_dtype=dtype, kv_dtype=dtype, softmax_scale=scale, **dims)]
        records, unavailable = run_check(shapes, backend, split_list, atol, rtol, seed)
        table = check_table(records)
        table.notes += [f"not available here: {n} ({why})" for n, why in unavailable.items()]
        _emit([table], as_json, markdown)
        failed = [r for r in records if r.status in ("incorrect", "error")]
        if failed:
            err.print(f"[red]{len(failed)} of {len(records)} checks failed[/red]")
            raise typer.Exit(1)

    @app.command()
    def sweep(
        config: Annotated[str | None, typer.Option(help="Sweep TOML (path, or a name under configs/sweeps/).")] = None,
        model: Annotated[str | None, typer.Option(help="Model preset.")] = None,
        tp: Annotated[int | None, typer.Option(help="Tensor-parallel size.")] = None,
        model_config: Annotated[Path | None, typer.Option(help="A model's HF config.json.")] = None,
        heads: Annotated[str | None, typer.Option(help="Local heads axis, e.g. 8,12,16.")] = None,
        backend: Annotated[list[str] | None, typer.Option(help="Backend(s); default: every available.")] = None,
        batch: Annotated[str | None, typer.Option(help="Batch sizes, e.g. 1,16.")] = None,
        context: Annotated[str | None, typer.Option(help="Context lengths, e.g. 4096,131072.")] = None,
        splits: Annotated[str | None, typer.Option(help="num_kv_splits axis, e.g. 1,16,64.")] = None,
        page_size: Annotated[int | None, typer.Option(help="KV page size: 1, 16 or 64.")] = None,
        budget_s: Annotated[float | None, typer.Option(help="Timing budget per point, seconds.")] = None,
        results_dir: Annotated[Path, typer.Option(help="Where run folders go.")] = Path("results"),
        resume: Annotated[Path | None, typer.Option(help="Resume this run folder (skips finished points).")] = None,
        as_json: Annotated[bool, typer.Option("--json")] = False,
        markdown: Annotated[bool, typer.Option("--markdown")] = False,
    ) -> None:
        """Microbenchmark backends over batch x context x splits; results in results/<run-id>/.

        Flags change the default sweep (or --config's); --heads without a model sets the heads axis.
        """
        from mlabench.device import current_device
        from mlabench.tables import sweep_summary

        _one_format(as_json, markdown)
        axes = _axes(model, tp, model_config, heads, backend, batch, context, splits, page_size, budget_s)
        cfg = _sweep_config(config, axes, resume)
        if not current_device().is_gpu and cfg.name == "default-cpu":
            err.print(f"[yellow]No GPU found: running a small CPU sweep ({cfg.name}) on "
                      f"{current_device().name}.[/yellow]")
        store, records = _run_with_progress(cfg, results_dir, resume, strict=bool(backend))
        _emit([sweep_summary(records)], as_json, markdown)
        err.print(f"results: {store.run_dir}/ (results.jsonl, results.csv, manifest.json)")

    @app.command()
    def compare(
        config: Annotated[str | None, typer.Option(help="Sweep TOML naming backends and axes.")] = None,
        from_run: Annotated[list[Path] | None, typer.Option("--from", help="Only read these run folders (or folders holding runs).")] = None,
        resume: Annotated[Path | None, typer.Option(help="Measure what is missing into this run folder.")] = None,
        model: Annotated[str | None, typer.Option(help="Model preset.")] = None,
        tp: Annotated[int | None, typer.Option(help="Tensor-parallel size.")] = None,
        model_config: Annotated[Path | None, typer.Option(help="A model's HF config.json.")] = None,
        heads: Annotated[str | None, typer.Option(help="Local heads axis.")] = None,
        batch: Annotated[str | None, typer.Option(help="Batch sizes (with --from: a filter).")] = None,
        context: Annotated[str | None, typer.Option(help="Context lengths (with --from: a filter).")] = None,
        splits: Annotated[str | None, typer.Option(help="num_kv_splits axis.")] = None,
        backend: Annotated[list[str] | None, typer.Option(help="Backend(s) (with --from: a filter).")] = None,
        page_size: Annotated[int | None, typer.Option(help="KV page size: 1, 16 or 64.")] = None,
        budget_s: Annotated[float | None, typer.Option(help="Timing budget per point, seconds.")] = None,
        results_dir: Annotated[Path, typer.Option(help="Where run folders go.")] = Path("results"),
        as_json: Annotated[bool, typer.Option("--json")] = False,
        markdown: Annotated[bool, typer.Option("--markdown")] = False,
    ) -> None:
        """Padded persistent kernels vs the best split count of split-KV kernels, per batch and context.

        With --from it only reads recorded runs; otherwise it measures (or, with --resume, completes)
        the sweep it needs first.
        """
        from mlabench.backends import backend_names, get_backend
        from mlabench.results import records_of
        from mlabench.tables import compare_table

        _one_format(as_json, markdown)
        if from_run:
            if config or resume or any(v is not None for v in (model, tp, model_config, heads, splits, page_size, budget_s)):
                raise ConfigError("--from only reads recorded runs: it takes --batch, --context and "
                                  "--backend as filters, nothing else")
            for name in backend or []:
                get_backend(name)  # unknown names fail here
            keep_b, keep_c = _ints(batch, "--batch"), _ints(context, "--context")
            records = [r for r in records_of(from_run)
                       if (not keep_b or r.batch in keep_b) and (not keep_c or r.context_len in keep_c)
                       and (not backend or r.backend in backend)]
        else:
            axes = _axes(model, tp, model_config, heads, backend, batch, context, splits, page_size, budget_s)
            _store, records = _run_with_progress(_sweep_config(config, axes, resume), results_dir, resume,
                                                 strict=bool(backend))
        families = {n: get_backend(n).family for n in backend_names()}
        _emit([compare_table(records, families)], as_json, markdown)


def _one_format(as_json: bool, markdown: bool) -> None:
    if as_json and markdown:
        raise ConfigError("choose one of --json and --markdown")


def _axes(model, tp, model_config, heads, backend, batch, context, splits, page_size, budget_s) -> dict[str, Any]:
    """Sweep overrides from flags; None where a flag was not given."""
    return {
        "model": model, "tp": tp, "model_config": str(model_config) if model_config else None,
        "backends": backend or None,
        "heads": _positive(_ints(heads, "--heads"), "heads"),
        "batch": _positive(_ints(batch, "--batch"), "batch"),
        "context_lens": _positive(_ints(context, "--context"), "context length"),
        "page_size": page_size,
        "params": {"num_kv_splits": _positive(_ints(splits, "--splits"), "--splits")} if splits else None,
        "timing": {"budget_s": budget_s} if budget_s is not None else None,
    }


def _sweep_config(config: str | None, axes: dict[str, Any], resume: Path | None):
    """The sweep to run: --config's (or the default one, or a resumed run's own), changed by flags.

    ``--heads`` without a model on the default sweep drops its model (576**-0.5 scale).
    """
    from mlabench.results import ResultStore
    from mlabench.sweep import SweepConfig, default_sweep_config, load_sweep_config

    given = any(v is not None for v in axes.values())
    if resume is not None and config is None:
        recorded = SweepConfig.model_validate(ResultStore(resume).manifest().config)
        if not given:
            return recorded
        return load_sweep_config(None, axes, base=recorded.model_dump(mode="json", by_alias=True))
    if config is not None:
        return load_sweep_config(config, axes)
    base = default_sweep_config().model_dump(mode="json", by_alias=True)
    if axes["heads"] and not (axes["model"] or axes["model_config"]):
        base["model"] = None
    if given:
        base["name"] = "sweep"
    return load_sweep_config(None, axes, base=base)


def _run_with_progress(cfg, results_dir: Path, resume: Path | None, strict: bool):
    """Run the sweep; the progress bar starts with the first finished point, after validation."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mlabench.sweep import run_sweep

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=err, transient=False)
    task = None

    def progress(point, record, done, total):
        nonlocal task
        if task is None:
            bar.start()
            task = bar.add_task("sweep", total=total)
        bar.update(task, total=total, completed=done,
                   description=f"{point.backend} {point.shape.label()} {record.status if record else ''}")

    try:
        return run_sweep(cfg, results_dir, resume, progress, strict_backends=strict,
                         warn=lambda line: err.print(f"[yellow]{line}[/yellow]"))
    finally:
        if task is not None:
            bar.stop()
