"""The ``tune`` command: Optuna search of split counts per context bucket, validation, export.

Thin: parse flags, call :func:`mlabench.tune.run.run_tune`, :func:`mlabench.tune.validation_run.validate_policy`
or :func:`mlabench.tune.run.export_run`, render.  Optuna is imported only when the command runs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from mlabench.cli.options import (
    Batch, BudgetS, Format, Json, Markdown, Model, ModelConfig, NonCausal, QoLen, ResultsDir, Resume,
    SweepFile, Tp, fraction, int_list, non_causal_applies, output_format,
)
from mlabench.cli.output import emit, err, fail, progress_bar
from mlabench.cli.tune_flags import refuse_unused_flags
from mlabench.errors import ConfigError
from mlabench.run_files import (JOURNAL_FILE, POLICY_FILE, POLICY_HEADER_FILE, POLICY_MODULE_FILE, RESULTS_FILE,
                                VALIDATION_FILE, VALIDATION_TABLE_FILE)


def parse_rule_range(text: str | None) -> dict[str, int] | str | None:
    """``--tokens-per-split``: ``"LOW:HIGH"`` -> ``{low, high}``; ``"off"`` -> ``"off"``; None -> None."""
    if text is None or text == "off":
        return text
    low, sep, high = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return {"low": int(low), "high": int(high)}
    except ValueError:
        raise ConfigError(f"--tokens-per-split takes LOW:HIGH (e.g. 1:4096) or off, got {text!r}") from None


def parse_space(items: list[str] | None) -> dict[str, dict[str, Any]] | None:
    """``["num_kv_splits=1:256", "head_padding=zero"]`` -> ``{name: {low, high} | {choices}}``."""
    if not items:
        return None
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise ConfigError(f"--space takes NAME=LOW:HIGH or NAME=A,B,..., got {item!r}")
        if ":" in value:
            low, _, high = value.partition(":")
            try:
                out[name] = {"low": int(low), "high": int(high)}
            except ValueError:
                raise ConfigError(f"--space {name}: LOW:HIGH must be integers, got {value!r}") from None
        else:
            out[name] = {"choices": [v for v in value.split(",") if v]}
    return out


class LiveView:
    """A Rich live table on stderr: per study, trials done/total and the best so far; an ETA."""

    def __init__(self) -> None:
        from rich.live import Live

        self.start = time.monotonic()
        self.live = Live(console=err, refresh_per_second=2, transient=False)

    def __call__(self, progress: list[Any]) -> None:
        from rich.table import Table as RichTable

        done, total = sum(p.done for p in progress), sum(p.total for p in progress)
        elapsed = time.monotonic() - self.start
        eta = f"{elapsed / done * max(0, total - done):.0f} s" if done else "—"
        t = RichTable(title=f"tune: {done}/{total} trials, {elapsed:.0f} s elapsed, ETA {eta}")
        for col in ("batch", "bucket", "lengths", "trials", "running", "best µs", "best params"):
            t.add_column(col)
        for p in progress:
            best = "—" if p.best_us is None else f"{p.best_us:.1f}"
            params = " ".join(f"{k}={v}" for k, v in p.best_params.items()) or "—"
            t.add_row(str(p.batch), p.bucket, p.lengths, f"{p.done}/{p.total}", str(p.running), best, params)
        if not self.live.is_started:
            self.live.start()
        self.live.update(t)

    def stop(self) -> None:
        """Leave the last table on screen and stop refreshing; off a terminal (a log file) Rich ends
        the table without a newline, so one is added for the next line."""
        if self.live.is_started:
            self.live.stop()
            if not err.is_terminal:
                err.line()


#: The options of ``tune`` that no other command has.
BackendFlag = Annotated[str | None, typer.Option(metavar="NAME", help="Backend to tune, e.g. triton-splitkv.")]
TuneHeads = Annotated[str | None, typer.Option("--heads", metavar="H", help="Local heads, e.g. 12, without a model.")]
TunePageSize = Annotated[int | None, typer.Option(
    "--page-size", metavar="N", help="KV page size: 1, 16 or 64 (default: the --config sweep's, else 64).")]
BucketsFlag = Annotated[str | None, typer.Option(
    metavar="L[,L...]", help="Context bucket upper edges, e.g. 1024,4096,32768,131072.")]
RepresentativeFlag = Annotated[str | None, typer.Option(
    metavar="geomean|upper", help="With one length per bucket, the length measured: geomean or upper.")]
LengthsPerBucketFlag = Annotated[int | None, typer.Option(
    metavar="K",
    help="Lengths measured per bucket, log-spaced from its lower edge + 1 (the first bucket's: half its upper "
         "edge) to its upper edge (default 3; 1: the representative length only).")]
CombineFlag = Annotated[str | None, typer.Option(
    metavar="worst|geomean",
    help="How a configuration's times at a bucket's lengths combine, each over the best time there: the "
         "worst (default) or the geometric mean. With --export: choose again this way.")]
MaxWavesFlag = Annotated[float | None, typer.Option(
    metavar="W",
    help="Search num_kv_splits only up to W waves of the programs the backend runs at once (batch x splits x"
         " head tiles <= W x resident programs), where it says how many (default 1.0; 0: no cap). Public "
         "heuristics beyond it are still measured.")]
TokensPerSplitFlag = Annotated[str | None, typer.Option(
    metavar="LOW:HIGH|off",
    help="Also search split counts that grow with the length, clamp(ceil(L / t), 1, num_kv_splits), t in "
         "LOW:HIGH (default 1:4096; 1 is a fixed count); off: fixed counts only.")]
WholeTilesFlag = Annotated[bool | None, typer.Option(
    "--whole-tiles/--no-whole-tiles",
    help="Where --tokens-per-split is searched and the backend declares the tile its splits are made of "
         "(triton-splitkv: 32 tokens), also search the whole-tile rule (the fewest splits of whole tiles, at"
         " most num_kv_splits) and measure it first at one wave, half and a quarter of one (default: on).")]
EdgesPerOctaveFlag = Annotated[int | None, typer.Option(
    metavar="K",
    help="Cut each bucket between two given edges into sub-buckets of at most 2^(1/K) in length, each a study "
         "(e.g. 4: 1024,1218,1448,...,4096), for a policy read from device memory (default: the given edges).")]
DevicePolicyFlag = Annotated[bool, typer.Option(
    "--device-policy",
    help="Tune for split_policy=device: search num_kv_splits only, the backend's other parameters at their "
         "defaults for the batch size, as the graph that reads its counts from device memory runs them "
         "(--space still names any to search).")]
DtypeFlag = Annotated[str | None, typer.Option(metavar="DTYPE", help="q and KV dtype (default bfloat16).")]
SamplerFlag = Annotated[str | None, typer.Option(
    metavar="auto|tpe|gp|grid|brute", help="auto, tpe, gp, grid or brute.")]
TrialsFlag = Annotated[int | None, typer.Option(metavar="N", help="Finished trials per study (heuristics included; the enqueued ones all run, even past N).")]
TimeoutFlag = Annotated[float | None, typer.Option(metavar="SECONDS", help="Seconds per study and worker.")]
SpaceFlag = Annotated[list[str] | None, typer.Option(
    metavar="NAME=SPEC",
    help="Narrow a parameter's search space: NAME=LOW:HIGH or NAME=A,B (the range tune draws from; "
         "other commands set values with --param NAME=V[,V...]).")]
NoiseFlag = Annotated[str | None, typer.Option(
    metavar="FRACTION", help="Ties within this fraction of the best (0.01 or 1%; default 1%).")]
NoHeuristicsFlag = Annotated[bool, typer.Option("--no-heuristics", help="Do not enqueue the public heuristics.")]
StorageFlag = Annotated[str | None, typer.Option(
    metavar="URL",
    help="Optuna storage URL (e.g. postgresql://...); default: a journal file in the run folder.")]
GpusFlag = Annotated[str | None, typer.Option(metavar="N[,N...]", help="One worker per GPU, e.g. 0,1.")]
WorkersFlag = Annotated[int | None, typer.Option(
    metavar="N", help="Worker processes sharing this host's devices (without --gpus).")]
ValidateFlag = Annotated[Path | None, typer.Option(
    metavar="POLICY",
    help="Measure this policy JSON on held-out lengths instead.")]
LengthsFlag = Annotated[int | None, typer.Option(
    metavar="N", help="With --validate: lengths per batch size (48; 0 with --context: those only).")]
ContextFlag = Annotated[str | None, typer.Option(
    "--context", metavar="L[,L...]",
    help="With --validate: also these lengths, wherever they fall, e.g. the contexts a server decodes "
         "at (4160 for 4096-token prompts).")]
MinContextFlag = Annotated[int | None, typer.Option(
    metavar="L", help="With --validate: shortest length (default: the policy's shortest tuned length).")]
MaxContextFlag = Annotated[int | None, typer.Option(
    metavar="L", help="With --validate: longest length (default: the policy's last bucket).")]
LadderFlag = Annotated[str | None, typer.Option(
    metavar="N[,N...]", help="With --validate: split counts of the exhaustive reference.")]
SeedFlag = Annotated[int | None, typer.Option(
    metavar="N", help="With --validate: draw the held-out lengths with this seed (default: a fresh one, printed).")]
ToleranceFlag = Annotated[str | None, typer.Option(
    metavar="FRACTION",
    help="With --validate: the target, every held-out length within this fraction (0.03 or 3%) of the best "
         "split count measured there (default 0.03); exit code 1 when a length misses it.")]
FromRunFlag = Annotated[list[Path] | None, typer.Option(
    "--from-run", metavar="RUN",
    help="With --validate: score the policy on what RUN recorded (validation, tuning or sweep runs, at "
         "any depth; repeatable), no GPU, nothing written.")]
ExportFlag = Annotated[Path | None, typer.Option(metavar="RUN", help="Rebuild the policy files of this tuning run.")]
PagesRuleFlag = Annotated[str | None, typer.Option(metavar="B[,B...]", help=(
    "With --export: at these batch sizes, counts that follow the length by pages per split, fitted across "
    "the run's lengths (a --device-policy run; docs/tuning-device.md), not one count per bucket."))]
AllowIncompleteFlag = Annotated[bool, typer.Option(
    "--allow-incomplete",
    help="With --export: write the policy although a study has trials running, waiting or missing.")]


def tune(
    backend: BackendFlag = None, config: SweepFile = None, model: Model = None, tp: Tp = None,
    model_config: ModelConfig = None, heads: TuneHeads = None, batch: Batch = None, buckets: BucketsFlag = None,
    representative: RepresentativeFlag = None, lengths_per_bucket: LengthsPerBucketFlag = None,
    combine: CombineFlag = None, max_waves: MaxWavesFlag = None, tokens_per_split: TokensPerSplitFlag = None,
    whole_tiles: WholeTilesFlag = None, edges_per_octave: EdgesPerOctaveFlag = None,
    device_policy: DevicePolicyFlag = False, page_size: TunePageSize = None, qo_len: QoLen = None,
    non_causal: NonCausal = False, dtype: DtypeFlag = None, sampler: SamplerFlag = None, trials: TrialsFlag = None,
    timeout: TimeoutFlag = None, space: SpaceFlag = None, noise: NoiseFlag = None,
    no_heuristics: NoHeuristicsFlag = False, budget_s: BudgetS = None, storage: StorageFlag = None,
    gpus: GpusFlag = None, workers: WorkersFlag = None, results_dir: ResultsDir = Path("results"),
    resume: Resume = None, validate: ValidateFlag = None, lengths: LengthsFlag = None, context: ContextFlag = None,
    min_context: MinContextFlag = None, max_context: MaxContextFlag = None, ladder: LadderFlag = None,
    seed: SeedFlag = None, tolerance: ToleranceFlag = None, from_run: FromRunFlag = None, export: ExportFlag = None,
    allow_incomplete: AllowIncompleteFlag = False, pages_rule: PagesRuleFlag = None,
    format: Format = None, as_json: Json = False, markdown: Markdown = False,
) -> None:
    """Tune split counts (and launch parameters) per batch and context bucket; write a policy.

    One Optuna study per (batch, bucket); the public heuristics are the first trials; results in
    results/<run-id>/ with policy.json, policy.h and policy.py.  See docs/tuning.md.
    """
    fmt = output_format(format, as_json, markdown)
    refuse_unused_flags(locals())
    if validate is not None:
        return _validate(validate, backend, (lengths, min_context, max_context, ladder, seed, budget_s, context),
                         results_dir, fmt, resume, fraction(tolerance, "--tolerance"), from_run)
    if export is not None:
        from mlabench.tune.run import export_run

        return _report(export_run(export, storage, fraction(noise, "--noise"), combine, allow_incomplete,
                                  int_list(pages_rule, "--pages-rule", "--pages-rule batch size")), fmt)
    from mlabench.tune.run import requested_config, run_tune
    from mlabench.tune.worker_pool import worker_devices

    rule = parse_rule_range(tokens_per_split)
    values = {"backend": _one_backend(backend), "model": model, "tp": tp, "model_config": str(model_config) if model_config else None,
              "heads": _one_value(int_list(heads, "--heads", "heads"), "--heads"),
              "batch": int_list(batch, "--batch", "batch"),
              "buckets": int_list(buckets, "--buckets", "--buckets"), "representative": representative,
              "lengths_per_bucket": lengths_per_bucket, "combine": combine, "max_waves": max_waves,
              "tokens_per_split": rule, "whole_tiles": whole_tiles, "edges_per_octave": edges_per_octave,
              "device_policy": True if device_policy else None,
              "page_size": page_size, "q_dtype": dtype, "kv_dtype": dtype, "qo_len": qo_len,
              "causal": False if non_causal else None, "sampler": sampler, "trials": trials, "timeout_s": timeout,
              "space": parse_space(space), "noise": fraction(noise, "--noise"), "heuristics": False if no_heuristics else None,
              "timing": {"budget_s": budget_s, "eager": False} if budget_s is not None else None, "storage": storage}
    cfg = _representative_applies(requested_config(values, config, resume), representative)
    non_causal_applies(non_causal, [cfg.qo_len])
    devices = worker_devices(gpus, workers)
    view = LiveView()
    try:
        result = run_tune(cfg, results_dir, resume, devices, monitor=view)
    finally:
        view.stop()
    _report(result, fmt)
    journal = f", {JOURNAL_FILE}" if (result.store.run_dir / JOURNAL_FILE).exists() else ""
    err.print(f"results: {result.store.run_dir}/ ({POLICY_FILE}, {POLICY_HEADER_FILE}, {POLICY_MODULE_FILE}, "
              f"{RESULTS_FILE}{journal})",
              markup=False)


def _representative_applies(cfg: Any, representative: str | None) -> Any:
    """``cfg`` (a :class:`~mlabench.tune.space.TuneConfig`); :class:`ConfigError` where
    ``--representative`` was given and a bucket measures more than one length (it picks the one)."""
    if representative is not None and cfg.lengths_per_bucket != 1:
        raise ConfigError(f"--representative picks a bucket's one measured length: give it with --lengths-per-bucket"
                          f" 1 (this run measures {cfg.lengths_per_bucket} lengths a bucket, edge to edge)")
    return cfg


def _one_value(values: list[int] | None, flag: str) -> int | None:
    """The one value of a flag that tune takes once (``--heads``); :class:`ConfigError` naming
    the values given where there are several."""
    if values is not None and len(values) != 1:
        raise ConfigError(f"{flag} takes one value when tuning, got {','.join(map(str, values))}")
    return values[0] if values else None


def _one_backend(backend: str | None) -> str | None:
    """``--backend`` of a tuning run: one name (a study searches one kernel's parameters);
    :class:`ConfigError` for a list, which would be looked up as one unknown name."""
    if backend is not None and "," in backend:
        raise ConfigError(f"tune takes one backend a run, got --backend {backend}: tune each in its own run "
                          "(sweep --backend a,b measures several side by side)")
    return backend


#: At a narrow terminal (80 columns in a log) the choice table leaves out, as far as it must, the
#: splits cap, the pruned count, the lengths, the heuristic's worst %, the best µs, the trials, the
#: heuristic's name and µs, then the chosen worst % (batch, bucket, chosen, its µs and the speedup
#: stay; JSON keeps them all).
CHOICE_DROPS = {"splits cap": 9, "pruned": 8, "lengths": 7, "heuristic worst %": 6, "best µs": 5, "trials": 4,
                "best heuristic": 3, "heuristic µs": 2, "chosen worst %": 1}


def choice_table(choices: list[Any]) -> Any:
    """The tune run's choice per batch and bucket (:class:`~mlabench.tune.choice.BucketChoice`), with
    a note per bucket where the tie rule chose; fits 80 columns (:data:`CHOICE_DROPS`)."""
    from mlabench.policy.tuned import describe_choice
    from mlabench.tables.table import ColumnStyle, Table

    table = Table("Choice per batch and context bucket (µs: geometric mean over the bucket's lengths of the "
                  "medians; worst %: the worst time over the best measured at each of those lengths)",
                  ["batch", "bucket", "lengths", "splits cap", "trials", "pruned", "chosen", "chosen µs",
                   "chosen worst %", "best µs", "best heuristic", "heuristic µs", "heuristic worst %", "speedup"],
                  styles={name: ColumnStyle(drop=n) for name, n in CHOICE_DROPS.items()})
    for c in choices:
        speedup = c.best_heuristic_us / c.chosen_us if c.best_heuristic_us else None
        table.rows.append([c.batch, c.bucket, ",".join(map(str, c.lengths)), c.max_splits, c.finished, c.pruned,
                           describe_choice(c.chosen, c.tokens_per_split, c.tile_tokens), c.chosen_us,
                           100 * c.chosen_worst, c.best_us, c.best_heuristic, c.best_heuristic_us,
                           None if c.best_heuristic_worst is None else 100 * c.best_heuristic_worst, speedup])
    table.notes.append("trials, pruned: distinct configurations by what they launch at the bucket's lengths "
                       "(a repeat reuses the earlier measurement and does not count towards --trials)")
    table.notes += [f"batch {c.batch}, context {c.bucket}: {c.tie}" for c in choices if c.tie]
    return table


def _report(result: Any, fmt: str) -> None:
    from mlabench.policy.tuned import TILES_NOTATION
    from mlabench.records.record import CPU_RUN_NOTE
    from mlabench.tables.table import Table

    choices = choice_table(result.choices)
    choices.notes += [CPU_RUN_NOTE] * result.store.manifest().on_cpu()
    policy = Table(f"Policy for {result.policy.backend} on {result.policy.device} (adjacent buckets merged; "
                   "L: the context length)", ["batch", "max context", "params"])
    for b in result.policy.batches:
        policy.rows += [[b.batch, e.max_context_len, e.describe()] for e in b.entries]
    if any(c.tile_tokens for c in result.choices):
        policy.notes.append(TILES_NOTATION)
    emit([choices, policy], fmt)
    if result.note:  # tune --export: the policy files already there were kept, or left as they were
        err.print(f"note: {result.note}", markup=False)


def _validate(path: Path, backend: str | None, grid: tuple[Any, ...], results_dir: Path, fmt: str,
              resume: Path | None, tolerance: float | None, from_run: list[Path] | None = None) -> None:
    """``tune --validate``; ``grid``: --lengths, --min-context, --max-context, --ladder, --seed, --budget-s,
    --context; ``from_run``: score on those runs' records instead of measuring
    (:func:`~mlabench.tune.rescore.recorded_validation`), with none of ``grid`` or ``resume``.
    ``backend`` (--backend), when given, must be the policy's: a policy is measured on its own backend.
    Exits 1 (:func:`~mlabench.cli.output.fail`, as ``graph-check`` does) when a measured length misses
    the target ``tolerance`` (--tolerance, default
    :data:`~mlabench.tune.validation.TARGET_TOLERANCE`), after the tables and the results line."""
    from mlabench.policy.tuned import load_policy
    from mlabench.tune.space import tune_timing
    from mlabench.tune.validation import (TARGET_TOLERANCE, policy_span, span_note, target_misses, target_verdict,
                                          validation_tables)
    from mlabench.tune.validation_run import validate_policy

    lengths, low, high, ladder, seed, budget_s, context = grid
    extra = int_list(context, "--context", "context length") or []
    tolerance = TARGET_TOLERANCE if tolerance is None else tolerance  # in [0, 1): options.fraction
    policy = load_policy(path)
    if backend is not None and backend != policy.backend:
        raise ConfigError(f"tune --validate measures a policy on its own backend ({policy.backend}), not --backend "
                          f"{backend}: leave --backend out or give the policy of {backend}")
    if from_run:
        return _validate_recorded(policy, from_run, resume is not None or any(v is not None for v in grid),
                                  TARGET_TOLERANCE if tolerance is None else tolerance, fmt)
    if resume is not None and any(v is not None for v in grid):
        raise ConfigError("tune --validate --resume continues with the recorded lengths, ladder, seed and timing; "
                          "leave out --lengths, --context, --min-context, --max-context, --ladder, --seed and "
                          "--budget-s")
    span = policy_span(policy)
    lo, hi = span[0] if low is None else low, span[1] if high is None else high
    if lengths is not None and lengths < (0 if extra else 1):  # before the progress bar
        raise ConfigError(f"tune --validate needs --lengths >= 1 (or 0 with --context), got {lengths}")
    if not 1 <= lo < hi:
        given = lambda flag, v, what: f"{flag} {v}" + ("" if what is not None else " (the policy's)")  # noqa: E731
        raise ConfigError(f"tune --validate needs 1 <= --min-context < --max-context, got "
                          f"{given('--min-context', lo, low)} and {given('--max-context', hi, high)}")
    measured = ([lo, hi] if lengths != 0 else []) + extra  # the span of what is measured: drawn and --context
    if resume is None and (note := span_note(policy, min(measured), max(measured))):
        err.print(f"note: {note}")
    ladder_counts = int_list(ladder, "--ladder", "--ladder")
    timing = tune_timing().model_copy(update={"budget_s": budget_s}) if budget_s else None
    with progress_bar("validate") as update:
        result = validate_policy(policy, lengths, lo, hi, ladder_counts, timing, results_dir, update, seed=seed,
                                 resume=resume, policy_path=path, tolerance=tolerance, extra_lengths=extra)
    emit(validation_tables(result), fmt)
    err.print(f"results: {result.store.run_dir}/ ({VALIDATION_TABLE_FILE}, {VALIDATION_FILE}, {RESULTS_FILE})",
              markup=False)
    if target_misses(result.points, tolerance):
        fail(target_verdict(result.points, tolerance, result.given))


def _validate_recorded(policy: Any, runs: list[Path], measuring: bool, tolerance: float, fmt: str) -> None:
    """``tune --validate POLICY --from-run RUN``: the tables of
    :func:`~mlabench.tune.rescore.recorded_validation`; exit 1 when a point misses ``tolerance``.
    ``measuring``: a flag of a measured validation was given (--resume, --lengths...): refused."""
    from mlabench.tune.rescore import recorded_validation
    from mlabench.tune.validation import target_misses, target_verdict, validation_tables

    if measuring:
        raise ConfigError("tune --validate --from-run scores the policy at the recorded points; leave out "
                          "--resume, --lengths, --context, --min-context, --max-context, --ladder, --seed and "
                          "--budget-s")
    result, notes = recorded_validation(policy, runs, tolerance)
    tables = validation_tables(result)
    tables[0].notes += notes
    emit(tables, fmt)
    if target_misses(result.points, tolerance):
        fail(target_verdict(result.points, tolerance, recorded=True, left_out=result.left_out))


#: The commands of this group, registered by :mod:`mlabench.cli.app`.
COMMANDS = {"tune": tune}
