"""``mlabench serve-bench`` and ``mlabench serve-check``: thin wrappers over :mod:`mlabench.serving`.

Tables go to stdout (Rich, or ``--markdown`` / ``--json``), progress to stderr. Exit codes: 0 all
good; 1 a table with failed requests or missing results, or a greedy check that failed;
2 an error the user can cause (raised as ServerError / ConfigError, printed by ``cli.main``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from mlabench.errors import ConfigError
from mlabench.serving import bench, check, config as cfg, table as tbl
from mlabench.serving.lifecycle import served_model

err = Console(stderr=True)


def _exit(code: int) -> None:
    # SystemExit, not typer.Exit: cli.main runs the app with standalone_mode=False, where click
    # returns typer.Exit's code instead of raising it, and the code would be lost.
    if code:
        raise SystemExit(code)


def _progress(message: str) -> None:
    err.print(message, markup=False, highlight=False)


def _rich_table(t: tbl.ServeTable) -> Table:
    """Terminal layout: one block of rows per concurrency, one row per variant (fits 80 columns;
    the markdown export keeps one row per concurrency with per-variant columns)."""
    out = Table(title=f"TPOT by concurrency (speedup vs {t.baseline}, {t.stat} TPOT)")
    out.add_column("conc", justify="right")
    out.add_column("variant")
    for h in tbl.CELL_HEADERS:
        out.add_column(h.format(stat=t.stat).replace("completed/failed", "done/failed"),
                       justify="right", no_wrap=h in ("speedup", "completed/failed"))
    for row in t.rows:
        for i, cell in enumerate(row.cells):
            texts = tbl.cell_texts(cell, t.stat, cell.variant == t.baseline)
            style = None if cell.status == "ok" else "red"
            out.add_row(str(row.concurrency) if i == 0 else "", cell.variant, *texts, style=style,
                        end_section=i == len(row.cells) - 1)
    return out


def _emit(t: tbl.ServeTable, run_dir: Path | None, markdown: bool, as_json: bool) -> None:
    if run_dir is not None:
        (run_dir / "table.md").write_text(tbl.to_markdown(t))
        (run_dir / "table.json").write_text(tbl.to_json(t))
    if as_json:
        typer.echo(tbl.to_json(t), nl=False)
    elif markdown:
        typer.echo(tbl.to_markdown(t), nl=False)
    else:
        Console().print(_rich_table(t))
        for r in t.rows:
            for c in r.cells:
                if c.status != "ok":
                    err.print(f"[red]c={r.concurrency} {c.variant}: {c.status}[/red] "
                              + "; ".join(c.errors)[:2000])
    if run_dir is not None:
        err.print(f"run folder: {run_dir}")


def serve_bench(
    config_path: Optional[Path] = typer.Argument(None, metavar="CONFIG",
                                                 help="configs/serve/*.toml"),
    set_: List[str] = typer.Option([], "--set", help="Override a config key: bench.num_prompts=8"),
    concurrency: List[int] = typer.Option([], "--concurrency", "-c", help="Replace concurrencies."),
    repeats: Optional[int] = typer.Option(None, "--repeats", help="Runs per (variant, concurrency)."),
    results_dir: Path = typer.Option(Path("results"), "--results-dir", help="Parent of run folders."),
    label: Optional[str] = typer.Option(None, "--label", help="Run folder label (default: config name)."),
    vllm_bin: Optional[str] = typer.Option(None, "--vllm-bin", help="vllm executable (> $MLABENCH_VLLM_BIN > config)."),
    stat: str = typer.Option("mean", "--stat", help="TPOT statistic for speedup: mean, median, p99."),
    from_run: Optional[Path] = typer.Option(None, "--from-run", help="Re-render a saved run folder; runs nothing."),
    markdown: bool = typer.Option(False, "--markdown", help="Print the table as markdown."),
    as_json: bool = typer.Option(False, "--json", help="Print the table as JSON."),
) -> None:
    """Benchmark server variants with `vllm bench serve`; table of TPOT per concurrency."""
    if stat not in ("mean", "median", "p99"):
        raise ConfigError(f"--stat must be mean, median or p99, not {stat!r}")
    if from_run is not None:
        conf, results = bench.read_run(from_run)
        t = tbl.build_table(results, [v.name for v in conf.variants], conf.concurrencies,
                            conf.baseline, stat)  # type: ignore[arg-type]
        _emit(t, None, markdown, as_json)
        _exit(0 if t.ok else 1)
        return
    if config_path is None:
        raise ConfigError("give a serve config (configs/serve/*.toml) or --from-run RUN_DIR")
    overrides = list(set_)
    if concurrency:
        overrides.append(f"concurrencies={json.dumps(concurrency)}")
    if repeats is not None:
        overrides.append(f"repeats={repeats}")
    conf = cfg.load_config(config_path, overrides)
    run_dir = bench.new_run_dir(results_dir, label or config_path.stem)
    err.print(f"run folder: {run_dir}")
    try:
        _, results = bench.run_serve_bench(conf, results_dir, vllm_bin_flag=vllm_bin,
                                           progress=_progress, run_dir=run_dir)
    except BaseException as exc:
        if (run_dir / "results.jsonl").exists():  # keep what was measured, then re-raise
            _, partial = bench.read_run(run_dir)
            t = tbl.build_table(partial, [v.name for v in conf.variants], conf.concurrencies,
                                conf.baseline, stat)  # type: ignore[arg-type]
            (run_dir / "table.md").write_text(tbl.to_markdown(t))
            (run_dir / "table.json").write_text(tbl.to_json(t))
        err.print(f"partial results kept in {run_dir}")
        if isinstance(exc, KeyboardInterrupt):  # servers are stopped by now
            err.print("aborted")
            raise SystemExit(130) from None
        raise
    t = tbl.build_table(results, [v.name for v in conf.variants], conf.concurrencies,
                        conf.baseline, stat)  # type: ignore[arg-type]
    _emit(t, run_dir, markdown, as_json)
    if not t.ok:
        _exit(1)


def serve_check(
    config_path: Optional[Path] = typer.Argument(None, metavar="[CONFIG]", help="configs/serve/*.toml"),
    fixture: Path = typer.Option(..., "--fixture", help="Greedy fixture JSON to compare with (or write)."),
    save_fixture: bool = typer.Option(False, "--save-fixture", help="Record the fixture instead of comparing."),
    variant: Optional[str] = typer.Option(None, "--variant", help="Variant to check (default: baseline)."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="A running server instead of a config."),
    model: Optional[str] = typer.Option(None, "--model", help="Model id (default: config, else /v1/models)."),
    tokens: Optional[int] = typer.Option(None, "--tokens", "-n", help="N output tokens (default 64)."),
    prompt: Optional[str] = typer.Option(None, "--prompt", help="Replace the fixed prompt."),
    tie_threshold: Optional[float] = typer.Option(None, "--tie-threshold", help="Near-tie gap, nats."),
    strict: bool = typer.Option(False, "--strict", help="A near-tie divergence fails too."),
    results_dir: Path = typer.Option(Path("results"), "--results-dir", help="Where launched servers log."),
    vllm_bin: Optional[str] = typer.Option(None, "--vllm-bin", help="vllm executable for a launch."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Greedy output check: temperature 0, logprobs, N tokens; compare token ids with a fixture."""
    if (config_path is None) == (base_url is None):
        raise ConfigError("give either a serve CONFIG or --base-url (not both)")
    if config_path is not None:
        conf = cfg.load_config(config_path)
    else:
        conf = cfg.config_from_url(base_url, model)  # type: ignore[arg-type]
    var = conf.variant(variant or conf.baseline)
    upd = {k: v for k, v in dict(max_tokens=tokens, prompt=prompt,
                                 tie_threshold=tie_threshold).items() if v is not None}
    try:
        params = conf.check.model_copy(update=upd)
        params = cfg.CheckParams.model_validate(params.model_dump())
    except ValueError as exc:
        raise ConfigError(f"bad check option: {str(exc).splitlines()[-1]}") from None
    expected = None if save_fixture else check.load_fixture(fixture)
    run_dir = bench.new_run_dir(results_dir, var.name, kind="check") if var.launch else None
    try:
        with bench.variant_server(var, run_dir or Path("."),
                                  cfg.resolve_vllm_bin(conf.vllm_bin, vllm_bin), _progress):
            mid = model or var.model or conf.model or served_model(var.base_url)
            out = check.request_greedy(var.base_url, mid, params)
    except KeyboardInterrupt:  # the launched server is stopped by now
        err.print("aborted")
        raise SystemExit(130) from None
    if save_fixture:
        report = check.validate_alone(out)
        if report.verdict == "match":
            check.save_fixture(out, fixture)
            err.print(f"fixture written: {fixture} ({len(out.token_ids)} tokens)")
    else:
        report = check.compare(out, expected, params.tie_threshold)  # type: ignore[arg-type]
    if run_dir is not None:
        (run_dir / "check.json").write_text(report.model_dump_json(indent=2) + "\n")
    if as_json:
        typer.echo(report.model_dump_json(indent=2))
    else:
        color = {"match": "green", "near_tie_divergence": "yellow"}.get(report.verdict, "red")
        Console().print(f"[{color}]{report.verdict}[/{color}]: {report.n_tokens}/"
                        f"{report.expected_tokens} tokens, logprobs finite: {report.all_finite}, "
                        f"matched prefix {report.matched_prefix}")
        for p in report.problems:
            Console().print(f"  {p}")
    ok = report.verdict == "match" or (report.verdict == "near_tie_divergence" and not strict)
    if not ok:
        _exit(1)


def register(app: typer.Typer) -> None:
    """Add ``serve-bench`` and ``serve-check`` to ``app``."""
    app.command("serve-bench")(serve_bench)
    app.command("serve-check")(serve_check)
