"""Driving ``vllm bench serve`` for each variant, concurrency and repeat; one run folder per run.

Layout of ``results/<run-id>/`` (append-only; a new run never reuses a folder):
``manifest.json`` (config, vllm executable, start time, each started variant's launch env
expanded; each resume's in ``resumes``), ``commands.txt``
(every command run), ``server-<variant>.log``, ``<variant>-c<conc>-r<repeat>.json`` (vLLM's saved
result; named ``<variant>-i<input len>-c<conc>-r<repeat>.json`` when ``random_input_len`` lists
several lengths; a rerun's and a result set aside: :func:`point_stem`) and ``.log``,
``results.jsonl`` (one :class:`BenchResult` per line, written as each run ends), ``table.md`` and
``table.json``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from mlabench.errors import ConfigError, DependencyError, ServerError
from mlabench.files import append_text, make_dir, read_json, read_text, user_path, write_text
from mlabench.run_files import (BENCH_LOG_SUFFIX, BENCH_RESULT_SUFFIX, BENCH_UNRECORDED_INFIX, COMMANDS_FILE,
                                MANIFEST_FILE, RESULTS_FILE, SERVE_BENCH_KIND, SERVER_LOG_PATTERN, bench_point_stem,
                                server_log_file)
from mlabench.serving.bench_process import BenchProcess, bench_process_mode, require_alive, vllm_version
from mlabench.serving.config import BenchParams, ServeConfig, Variant, expand, resolve_vllm_bin
from mlabench.serving.gpus import visible_gpus
from mlabench.serving.lifecycle import (
    ManagedServer, log_tail, require_launchable, require_reachable, served_model,
)
from mlabench.serving.results import BenchResult, judge, load_result
from mlabench.serving.run_folder import read_run, recorded_result_files  # read_run: `bench.read_run` for the CLI

Progress = Callable[[str], None]


def new_run_dir(
    results_root: Path, label: str, now: _dt.datetime | None = None, kind: str = "serve"
) -> Path:
    """Create and return a fresh ``results_root/<kind>-<UTC time>-<label>[-N]`` folder.

    Never returns an existing folder (``mkdir`` without ``exist_ok``, so two runs started in the
    same second get ``-2``, ``-3``...).
    """
    stamp = (now or _dt.datetime.now(_dt.timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    base = f"{kind}-{stamp}-{label}"
    make_dir(results_root, "results folder")
    for n in range(1, 1000):
        path = results_root / (base if n == 1 else f"{base}-{n}")
        try:
            return make_dir(path, "run folder", exist_ok=False)
        except FileExistsError:
            continue
    raise ConfigError(f"cannot make a new run folder under {results_root}")


def bench_command(
    vllm_bin: str, base_url: str, model: str, tokenizer: str, params: BenchParams,
    concurrency: int, result_dir: Path, result_filename: str, metadata: dict[str, str],
) -> list[str]:
    """argv of one ``vllm bench serve`` run (flags: vLLM ``vllm bench serve --help``).

    ``params`` holds one ``random_input_len`` (:meth:`BenchParams.for_run`; a list is refused with
    ValueError); ``--num-prompts`` and ``--num-warmups`` are its counts at ``concurrency``
    (:meth:`BenchParams.prompts_at`, :meth:`BenchParams.warmups_at`; no ``--num-warmups`` for 0).
    """
    if isinstance(params.random_input_len, list):
        raise ValueError("bench_command takes one random_input_len: give params.for_run(input_len, concurrency)")
    p = params.for_run(None, concurrency)
    argv = [
        vllm_bin, "bench", "serve", "--backend", p.backend, "--base-url", base_url,
        "--endpoint", p.endpoint, "--model", model, "--tokenizer", tokenizer,
        "--dataset-name", p.dataset_name,
    ]
    if p.dataset_name == "random":
        argv += [
            "--random-input-len", str(p.random_input_len),
            "--random-output-len", str(p.random_output_len),
            "--random-range-ratio", repr(float(p.random_range_ratio)),
        ]
    argv += [
        "--max-concurrency", str(concurrency), "--num-prompts", str(p.num_prompts),
        "--seed", str(p.seed), "--request-rate", p.request_rate,
        "--percentile-metrics", p.percentile_metrics, "--metric-percentiles", p.metric_percentiles,
    ]
    if p.num_warmups:
        argv += ["--num-warmups", str(p.num_warmups)]
    argv += [flag for on, flag in ((p.ignore_eos, "--ignore-eos"),
                                   (p.trust_remote_code, "--trust-remote-code"),
                                   (p.disable_tqdm, "--disable-tqdm")) if on]
    argv += ["--save-result", "--result-dir", str(result_dir), "--result-filename", result_filename]
    argv += list(p.extra_args)
    argv += ["--metadata", *(f"{k}={v}" for k, v in metadata.items())]
    return argv


def preflight(variants: list[Variant], vllm_bin: str, bench: bool = True) -> None:
    """What can fail before a run folder exists, checked first: every variant without ``[launch]``
    answers ``/health``, every launch command's program exists, and, for ``bench``, the vllm
    executable that runs ``vllm bench serve`` exists.

    Raises :class:`ServerError` (a server not reachable, a launch program missing) or
    :class:`DependencyError` (no vllm executable, for the benchmark or a ``{vllm_bin}`` launch), each one line.
    """
    for variant in variants:
        if variant.launch is None:
            require_started(variant)
            continue
        try:
            require_launchable(variant.launch, vllm_bin)
        except (ServerError, DependencyError) as exc:
            raise type(exc)(f"variant {variant.name!r}: {exc}") from None
    if bench and shutil.which(vllm_bin) is None:
        raise DependencyError(f"cannot run vllm bench serve: {vllm_bin!r} is not an executable program here "
                          "(set MLABENCH_VLLM_BIN, --vllm-bin or the config's vllm_bin)")


def require_started(variant: Variant) -> None:
    """Raise :class:`ServerError` unless the server of ``variant``, one without ``[launch]`` that the
    user starts, answers ``/health``; the message names the variant and says to start it (its
    ``start_hint``, else how to have serve-bench start it)."""
    try:
        require_reachable(variant.base_url)
    except ServerError as exc:
        how = (f"start it first: {variant.start_hint}" if variant.start_hint else
               "start it first, or give the variant a [variants.launch] table so that mlabench starts it")
        raise ServerError(f"variant {variant.name!r}: {exc}; {how}") from None


def discard_unmeasured(run_dir: Path, measured: str, also: str = "") -> bool:
    """Remove ``run_dir``, a folder this run made, unless ``measured`` (the file results go to)
    was written in it, or a file matching the glob ``also`` (a command's own result, written
    before serve-bench could record it: ``--resume`` keeps it); True when the folder is kept.
    Nothing measured leaves no folder behind; the logs of servers it launched (why one did not
    start: its start-up message was named while it ran) are moved first to a new folder of the
    system's temporary folder, named in a ``notice:`` on stderr."""
    if (run_dir / measured).exists() or (also and any(run_dir.glob(also))):
        return True
    logs = sorted(run_dir.glob(SERVER_LOG_PATTERN))
    if logs:
        kept = Path(tempfile.mkdtemp(prefix="mlabench-server-logs-"))
        for log in logs:
            shutil.move(str(log), kept / log.name)
        print(f"notice: nothing was measured, so {run_dir} is removed; its server logs are kept in {kept}",
              file=sys.stderr, flush=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    return False


@contextlib.contextmanager
def variant_server(
    variant: Variant, run_dir: Path, vllm_bin: str, progress: Progress
) -> Iterator[ManagedServer | None]:
    """Yield a launched server for a variant with ``[launch]``, else check ``base_url`` is up."""
    if variant.launch is None:
        require_started(variant)
        yield None
        return
    srv = ManagedServer(variant.launch, variant.base_url, run_dir / server_log_file(variant.name),
                        vllm_bin=vllm_bin)
    progress(f"[{variant.name}] launching (log: {srv.log_path}): {shlex.join(srv.argv())}")
    with srv:
        progress(f"[{variant.name}] healthy after {srv.startup_s:.0f} s")
        yield srv
    progress(f"[{variant.name}] server stopped")


def run_serve_bench(
    config: ServeConfig, results_root: Path, label: str = "serve",
    vllm_bin_flag: str | None = None, progress: Progress = lambda _: None,
    run_dir: Path | None = None, done: set[tuple[str, int | None, int, int]] | None = None,
    provenance: dict | None = None,
) -> tuple[Path, list[BenchResult]]:
    """Run every (variant, input length, concurrency, repeat): one server start per variant, every
    input length benchmarked against it (:func:`bench_points`); returns (run folder, results in
    run order).

    Results are appended to ``results.jsonl`` as each run ends, so an interrupted run keeps what
    it measured. A bench run that fails or writes no JSON becomes a ``missing``/``error`` result
    (never dropped). Raises :class:`ServerError` when a server cannot be reached, dies, or fails
    to start (fail fast: later variants are not run); servers launched here are always stopped.
    With ``done`` (:func:`finished_points` of ``run_dir``, resuming it) those points are skipped, a
    variant with none left is not started, and the manifest gets an entry in its ``resumes``
    (:func:`write_manifest`).  ``provenance`` (the command line, mlabench's revision, library
    versions: the CLI's) goes into the manifest (or the resume's entry) as it is, but for
    ``versions.vllm``: that of the vLLM executable, where it can be read.  The commands run in one
    shared process where they can (:class:`BenchProcess`; ``bench_process`` says which was planned,
    and serve-bench's progress when it could not start).
    """
    vllm_bin = resolve_vllm_bin(config.vllm_bin, vllm_bin_flag)
    bench_process_mode()  # a bad MLABENCH_BENCH_PROCESS fails before a run folder exists
    run_dir = run_dir or new_run_dir(results_root, label)
    results: list[BenchResult] = []
    recorded = recorded_result_files(run_dir)  # a resumed run's: no command writes over them
    with BenchProcess(vllm_bin, run_dir, progress) as runner:
        starting = [v for v in config.variants if points_left(config, v, done or set())]
        if done is None or starting:  # a session that runs
            write_manifest(run_dir, config, {"vllm_bin": vllm_bin, "bench_process": "shared" if runner.shared
                                             else "per-run", "launch_env": launch_env(starting),
                                             **(provenance or {})}, resumed=done is not None)
        for variant in config.variants:
            params = config.bench_for(variant)
            todo = points_left(config, variant, done or set())
            if not todo:
                progress(f"[{variant.name}] every point recorded already")
                continue
            with variant_server(variant, run_dir, vllm_bin, progress) as srv:
                model = expand(variant.model or config.model or served_model(variant.base_url))
                tokenizer = expand(config.tokenizer) if config.tokenizer else model
                for input_len, conc, rep in todo:
                    results.append(_bench_one(config, variant, params.for_run(input_len, conc), run_dir,
                                              (vllm_bin, model, tokenizer), (input_len, conc, rep),
                                              (runner, srv), progress, recorded))
                runner.close()  # one per server: none runs while the next server starts and sizes its GPU memory
    return run_dir, results


def write_manifest(run_dir: Path, config: ServeConfig, session: dict, resumed: bool) -> None:
    """Write what this session of a run is: ``session`` (``vllm_bin``, ``bench_process`` and the
    provenance) with its start time, ``VLLM_*`` variables and the GPUs a server sees (``gpus``,
    :func:`~mlabench.serving.gpus.visible_gpus`; [] on a CPU), ``versions.vllm`` replaced by the
    version the vLLM executable reports (:func:`vllm_version`, where it can be read).  A new run's
    ``manifest.json`` holds it with its kind and ``config``; a resumed run's (``resumed``) keeps
    its manifest and appends it to the list ``resumes`` (none in a run never resumed), with
    ``first_result_line``: the line of ``results.jsonl`` (1-based) its first result goes to, so
    each record can be told the session, ``bench_process`` and versions that made it.
    :class:`FileAccessError` when the manifest cannot be read or written."""
    session = {"started_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
               "vllm_bin": session["vllm_bin"], "env": env_summary(), "gpus": visible_gpus(), **session}
    version = vllm_version(session["vllm_bin"])
    if version is not None:
        session["versions"] = {**(session.get("versions") or {}), "vllm": version}
    if not resumed:
        manifest = {"kind": SERVE_BENCH_KIND, "schema_version": 1, **session, "config": config.model_dump(mode="json")}
        write_text(run_dir / MANIFEST_FILE, json.dumps(manifest, indent=2) + "\n", "run manifest")
        return
    manifest = read_json(run_dir / MANIFEST_FILE, "serve-bench run manifest")
    results = run_dir / RESULTS_FILE
    lines = len(read_text(results, "run results").splitlines()) if results.is_file() else 0
    manifest["resumes"] = [*(manifest.get("resumes") or []), {**session, "first_result_line": lines + 1}]
    write_text(run_dir / MANIFEST_FILE, json.dumps(manifest, indent=2) + "\n", "run manifest", atomic=True)


def points_left(config: ServeConfig, variant: Variant,
                done: set[tuple[str, int | None, int, int]]) -> list[tuple[int, int, int]]:
    """The :func:`bench_points` of ``variant`` that ``done`` (:func:`finished_points`) lacks."""
    several = len(config.input_lens()) > 1
    return [p for p in bench_points(config, variant)
            if (variant.name, p[0] if several else None, p[1], p[2]) not in done]


def finished_points(results: list[BenchResult], several_lens: bool) -> set[tuple[str, int | None, int, int]]:
    """``(variant, input length or None, concurrency, repeat)`` of every ``ok`` result: what a
    resumed run skips (a failed or missing point runs again; its new result supersedes the old in
    the table, :func:`~mlabench.serving.run_folder.latest_results`).  The input length counts only
    when the run has several."""
    return {(r.variant, r.input_len if several_lens else None, r.concurrency, r.repeat)
            for r in results if r.status == "ok"}


def bench_points(config: ServeConfig, variant: Variant) -> list[tuple[int, int, int]]:
    """Every (input length, concurrency, repeat) ``variant``'s server start is benchmarked at, in
    run order: each input length of its bench params (tokens), then each of its concurrencies
    (:meth:`ServeConfig.concurrencies_for`), then each repeat (0-based)."""
    return [(n, conc, rep) for n in config.bench_for(variant).input_lens()
            for conc in config.concurrencies_for(variant) for rep in range(config.repeats)]


def _bench_one(
    config: ServeConfig, variant: Variant, params: BenchParams, run_dir: Path,
    how: tuple[str, str, str], point: tuple[int, int, int],
    where: tuple[BenchProcess, ManagedServer | None], progress: Progress, recorded: set[str],
) -> BenchResult:
    """Run one ``vllm bench serve`` (``params`` already :meth:`~BenchParams.for_run`; ``how`` is
    (vllm executable, model, tokenizer), ``point`` (input length, concurrency, repeat), ``where``
    the run's :class:`BenchProcess` and the variant's launched server, if any), record its result
    in ``results.jsonl`` and return it; its files are named by :func:`point_stem` (``recorded``: the
    result files the run's records name)."""
    vllm_bin, model, tokenizer = how
    runner, srv = where
    input_len, conc, rep = point
    several = len(config.input_lens()) > 1
    stem = point_stem(run_dir, bench_point_stem(variant.name, input_len, conc, rep, several), recorded, progress)
    argv = bench_command(
        vllm_bin, variant.base_url, model, tokenizer, params, conc, run_dir, stem + BENCH_RESULT_SUFFIX,
        {"variant": variant.name, "input_len": str(input_len), "concurrency": str(conc), "repeat": str(rep)},
    )
    append_text(run_dir / COMMANDS_FILE, shlex.join(argv) + "\n", "run folder file")
    tag = f"in={input_len} " if several else ""
    progress(f"[{variant.name}] {tag}concurrency {conc}, repeat {rep + 1}/{config.repeats}")
    started = time.monotonic()
    code = runner.run(argv, run_dir / (stem + BENCH_LOG_SUFFIX), config.bench_timeout_s, srv,
                      poll_s=config.bench_poll_s)
    took_s = time.monotonic() - started
    res = judge(load_result(run_dir / (stem + BENCH_RESULT_SUFFIX), variant.name, conc, rep, run_dir),
                params.min_output_tokens()).model_copy(update={"input_len": input_len})
    if code != 0 and res.status == "ok":
        res = res.model_copy(update={"status": "error", "error": f"vllm bench serve exited {code}"})
    elif res.status == "missing":
        tail = log_tail(run_dir / (stem + BENCH_LOG_SUFFIX), 8)
        res = res.model_copy(update={"error": f"{res.error}; exit code {code}; log tail:\n{tail}"})
    append_text(run_dir / RESULTS_FILE, res.model_dump_json() + "\n", "run results", sync=True)
    tpot = f", mean TPOT {res.tpot.mean_ms:.2f} ms" if res.tpot.mean_ms is not None else ""
    progress(f"[{variant.name}] {tag}c={conc} r={rep}: {res.status}{tpot} ({took_s:.0f} s)")
    require_alive(srv)  # a server gone by the command's end (its requests failed fast): stop now
    return res


def point_stem(run_dir: Path, stem: str, recorded: set[str], progress: Progress) -> str:
    """The stem of the files the point's next command writes, so that it overwrites no result:
    ``stem`` (:func:`~mlabench.run_files.bench_point_stem`) unless ``recorded`` (the result files
    the run's records name) holds ``stem.json`` (a failed point run again by ``--resume``), then
    ``stem-2``, ``stem-3``...  A result file found at that stem with no record (its command ended as
    serve-bench was stopped, before it was recorded) is first renamed with its log to
    ``<stem>.unrecorded[-N].json`` / ``.log``, and ``progress`` says so.  :class:`FileAccessError`
    when it cannot be renamed."""
    name, n = stem, 1
    while name + BENCH_RESULT_SUFFIX in recorded:
        n += 1
        name = f"{stem}-{n}"
    found = run_dir / (name + BENCH_RESULT_SUFFIX)
    if not found.exists():
        return name
    k, aside = 1, name + BENCH_UNRECORDED_INFIX
    while any((run_dir / (aside + sfx)).exists() for sfx in (BENCH_RESULT_SUFFIX, BENCH_LOG_SUFFIX)):
        k += 1
        aside = f"{name}{BENCH_UNRECORDED_INFIX}-{k}"
    for sfx in (BENCH_RESULT_SUFFIX, BENCH_LOG_SUFFIX):
        if (run_dir / (name + sfx)).exists():
            with user_path(run_dir / (name + sfx), "unrecorded bench result"):
                (run_dir / (name + sfx)).rename(run_dir / (aside + sfx))
    progress(f"{found.name}: a result with no record (serve-bench stopped before recording it, or the record "
             f"was removed) kept as "
             f"{aside}{BENCH_RESULT_SUFFIX} with its log; the point runs again")
    return name


def launch_env(variants: list[Variant]) -> dict[str, dict[str, str]]:
    """Variant name -> the environment its [launch] adds, expanded as its server gets it
    (:meth:`~mlabench.serving.config.LaunchSpec.expanded_env`), for the variants of ``variants``
    that add some: a session's ``launch_env`` in the manifest, which ``[prediction]``'s
    ``{env:NAME}`` reads (:func:`mlabench.serving.run_folder.recorded_launch_env`)."""
    return {v.name: v.launch.expanded_env() for v in variants if v.launch is not None and v.launch.env}


def env_summary() -> dict[str, str]:
    """Environment variables that change vLLM's kernels (VLLM_*), for the manifest."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("VLLM_")}
