"""The sections of a report, each built from recorded runs; a section the runs cannot fill says what
is missing and how to get it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from mlabench.records.record import Record
from mlabench.report.document import Block, Bullets, Code, FigureBlock, Heading, Missing, Para, TableBlock
from mlabench.report.figures import style
from mlabench.report.figures.spec import FigureSpec, Skipped
from mlabench.report.run_text import config_row
from mlabench.run_files import COMMANDS_FILE, stored_file
from mlabench.sweep.sentinel import health_notes
from mlabench.sweep.summary import compare_table, sweep_summary
from mlabench.sweep.visits import DEFAULT_VISIT_REL_SE
from mlabench.tables.table import Table


def _figures(specs: Sequence[FigureSpec], *kinds: str) -> list[Block]:
    return [FigureBlock(s.stem, s.caption, s.draw) for s in specs if s.kind in kinds]


def _range(values: Sequence[float], unit: str) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:g} {unit}" if lo == hi else f"{lo:g}-{hi:g} {unit}"


def _list(values: Any, as_text: Any = str) -> str:
    return ", ".join(as_text(v) for v in values) if values else "—"


def _sweep_text(cfg: dict[str, Any]) -> str:
    params = "; ".join(f"{k} {_list(v)}" for k, v in (cfg.get("params") or {}).items())
    qo = cfg.get("qo_len") or [1]
    qo_text = "" if qo == [1] else f"; qo_len {_list(qo)}{'' if cfg.get('causal', True) else ' non-causal'}"
    return (f"model {cfg.get('model') or '—'}, TP {cfg.get('tp')}; batch {_list(cfg.get('batch'))}; contexts "
            f"{_list(cfg.get('context_lens'), style.context_text)}{qo_text}; page {cfg.get('page_size')}; backends "
            f"{_list(cfg.get('backends')) if cfg.get('backends') else 'every available one'}"
            + (f"; {params}" if params else ""))


def _run_timing(config: dict[str, Any]) -> dict[str, Any]:
    """The ``[timing]`` settings a run recorded: a sweep's at the top of its configuration, a tuning
    run's under ``tune``, a validation run's under ``validate``; empty when the manifest has none."""
    return (config.get("timing") or (config.get("tune") or {}).get("timing")
            or (config.get("validate") or {}).get("timing") or {})


def _timing_text(timing: dict[str, Any], device_kind: str | None) -> str:
    if not timing:
        return "timing settings not recorded in this run's manifest"
    if device_kind == "cpu":
        how = "CPU wall clock"
    else:
        how = style.timing_text("graph" if timing.get("graph") else "eager", device_kind).split(",")[0]
    if timing.get("cold_cache") and device_kind != "cpu":
        how += f", cold cache ({timing.get('min_copies', 1)}-{timing.get('max_copies')} input copies)"
    warmups = timing.get("warmup_iters")
    return (f"{how}; {warmups} warm-up call{'' if warmups == 1 else 's'}, {timing.get('min_samples')}-"
            f"{timing.get('max_samples')} samples until the median's 95% CI is within "
            f"{100 * timing.get('target_rel_ci', 0):g}%, {timing.get('budget_s'):g} s budget per point")


def _units(manifest: Any) -> str:
    """What a run's recorded ``num_sms`` counts: CPU cores, AMD CUs or NVIDIA SMs."""
    if manifest.on_cpu():
        return "cores"
    return "CUs" if str(manifest.device.get("arch", "")).startswith("gfx") else "SMs"


def _clocks_text(state: dict[str, Any]) -> str:
    parts = [f"{label}{state[k]:.0f} {unit}" for k, label, unit in (
        ("sm_clock_mhz", "SM ", "MHz"), ("mem_clock_mhz", "memory ", "MHz"), ("temperature_c", "", "°C"),
        ("power_w", "", "W")) if state.get(k) is not None]
    return ", ".join(parts) or "—"


def _bandwidth_rows(m: Any) -> list[list[str]]:
    """The measured memory ceilings of a run; the floor's is the read bandwidth where recorded."""
    copy = f"{style.tbps_text(m.copy_bandwidth_tbps)} (device-to-device copy, read + write"
    if m.read_bandwidth_tbps is None:
        return [["copy bandwidth", copy + "; the floor of every point is bytes / this bandwidth)"]]
    sheet = style.tbps_text(m.datasheet_bandwidth_tbps) if m.datasheet_bandwidth_tbps else "unknown"
    return [["read bandwidth", f"{style.tbps_text(m.read_bandwidth_tbps)} (a large read-only reduction; the floor of "
                               "every point is bytes / this bandwidth)"],
            ["copy bandwidth", copy + ")"], ["datasheet bandwidth", sheet]]


#: What the report says of SM clocks read after each point by an mlabench that read NVML's GPU 0
#: of the host (its records' ``gpu_state`` has no ``at_s``): on a host of several GPUs, not
#: necessarily the one measured (results/h200/hopper-kernel/run-72fb349, run on GPU 1: 345 MHz
#: and 78 W at every point, an idle GPU, while its points read 4.3 TB/s).
OLD_OBSERVER_NOTE = ("read after each point, not while it ran, by an mlabench that read the host's first GPU: "
                     "on a host of several GPUs maybe not the one measured")


def clock_row(records: Sequence[Record]) -> list[str]:
    """The environment table's SM clock row: the range of the median SM clock each point's timed
    samples ran at (``gpu_state_during``) where recorded (the points below the run's steady clock
    are a health note, :func:`~mlabench.sweep.sentinel.health_notes`); in older records the clock
    read after each point, saying what it is."""
    during = [r.gpu_state_during["sm_clock_mhz"] for r in records if r.gpu_state_during.get("sm_clock_mhz") is not None]
    if during:
        return ["SM clock while timing", _range(during, "MHz")]
    after = [r.gpu_state for r in records if r.gpu_state.get("sm_clock_mhz") is not None]
    if not after:
        return ["SM clock after each point", "—"]
    text = _range([s["sm_clock_mhz"] for s in after], "MHz")
    return ["SM clock after each point", text + (f" ({OLD_OBSERVER_NOTE})" if all("at_s" not in s for s in after) else "")]


def kernel_environment(run: Any, records: Sequence[Record], kind: str = "Kernel run") -> Table:
    """Key/value table of one kernel, tuning or validation run (``kind`` starts its title): device,
    clocks, driver, versions, revision, command, what it measured, timing."""
    m, dev = run.manifest, run.manifest.device
    mine = [r for r in records if r.run_id == m.run_id]
    memory = f", {dev['total_memory_bytes'] / 2**30:.0f} GiB" if dev.get("total_memory_bytes") else ""
    settings = m.visit_settings()
    visits, most = settings["visits"], settings["max_visits"]
    further = (f" (up to {most} where they disagreed, until their mean's standard error was "
               f"{100 * (settings['visit_rel_se'] or DEFAULT_VISIT_REL_SE):g}% or less)" if most > visits else "")
    rows = [
        ["run", f"{m.run_id} ({run.path})"], ["recorded", m.created],
        ["command", " ".join(m.command)],
        ["git revision", m.git_revision[:12] + (" (with uncommitted changes)" if m.git_dirty else "")],
        ["device", f"{dev.get('name')} ({dev.get('arch')}, {dev.get('num_sms')} "
                   f"{_units(m)}{memory})"],
        ["driver", m.driver], ["clocks at start", _clocks_text(m.gpu_state)],
        clock_row(mine),
        ["versions", ", ".join(f"{k} {v}" for k, v in m.versions.items() if v)],
        *_bandwidth_rows(m),
        list(config_row(m.config) or ("sweep", _sweep_text(m.config))),
        ["timing", _timing_text(_run_timing(m.config), dev.get("kind"))
         + (f"; each point in {visits} visits spread over the run{further}, samples pooled" if visits > 1 else "")],
        ["points", f"{len(mine)}" + (f" of {m.planned_points} planned" if m.planned_points else "")
         + f" ({sum(r.status == 'ok' for r in mine)} ok)"],
    ]
    rows += [["health", note] for note in health_notes(m, mine)]
    return Table(f"{kind} {m.run_id}", ["field", "value"], rows)


def serve_environment(run: Any) -> Table:
    """Key/value table of one serve-bench run: vLLM, model, variants, workload, environment."""
    conf, b = run.config, run.config.bench
    variants = [f"{v.name}: " + (f"launched by mlabench: {' '.join(v.launch.command)}" if v.launch
                                 else f"already running at {v.base_url}") for v in conf.variants]
    versions = sorted({r.vllm_version for r in run.results if r.vllm_version})
    rows = [
        ["run", str(run.path)], ["started", run.manifest.get("started_utc", "—")],
        ["description", conf.description or "—"],
        ["vllm", f"{run.manifest.get('vllm_bin', '—')}" + (f" ({', '.join(versions)})" if versions else "")],
        ["model", f"{conf.model or 'first served model'} (tokenizer {conf.tokenizer or 'the model'})"],
        ["variants", "; ".join(variants)],
        ["workload", f"{b.dataset_name}, {', '.join(map(str, conf.input_lens()))} in / {b.random_output_len} "
                     f"out tokens, {b.prompts_text(conf.concurrencies)} prompts, {b.warmups_text(conf.concurrencies)}, request rate {b.request_rate}, "
                     f"concurrency {', '.join(map(str, conf.concurrencies))}, {conf.repeats} repeat(s)"],
        ["VLLM_* environment", ", ".join(f"{k}={v}" for k, v in run.manifest.get("env", {}).items()) or "none set"],
        ["commands", f"{stored_file(run.path / COMMANDS_FILE)}"],
    ]
    return Table(f"Serve-bench run {run.name}", ["field", "value"], rows)


def correctness_table(records: Sequence[Record]) -> Table:
    """Per backend: configurations and points checked, how many passed, the worst errors seen
    (relative ones from records with the relative verdict; older records carry only absolute ones)."""
    t = Table("Correctness of every measured point against the fp32 reference",
              ["backend", "configurations", "points", "passed", "not ok", "worst rel RMSE", "worst rel max err",
               "worst max abs err"])
    for backend in sorted({r.backend for r in records}):
        mine = [r for r in records if r.backend == backend]
        verdicts = [r.verdict for r in mine if r.verdict]
        bad = Counter(r.status for r in mine if r.status != "ok")
        t.rows.append([backend, len({str(sorted(r.params.items())) for r in mine}), len(mine),
                       sum(r.status == "ok" for r in mine),
                       ", ".join(f"{k} {n}" for k, n in sorted(bad.items())) or "0",
                       max((v.rel_rmse for v in verdicts if v.rel_rmse is not None), default=None),
                       max((v.rel_max_err for v in verdicts if v.rel_max_err is not None), default=None),
                       max((v.max_abs_err for v in verdicts), default=None)])
    v = next((r.verdict for r in records if r.verdict), None)
    if v is not None and v.rel_rmse_limit is not None:
        rule = (f"; limits: relative RMSE {v.rel_rmse_limit:.3g}, max error {v.rel_max_err_limit:.3g} "
                f"(both relative to the reference's RMS), on the input sets {', '.join(v.by_input_set)}")
    elif v is not None and v.atol is not None:
        rule = f"; atol={v.atol:g} rtol={v.rtol or 0:g}"
    else:
        rule = ""
    t.notes.append("each point is checked on its own inputs, output poisoned with NaN first" + rule
                   + "; a point that is not ok is never shown as a time")
    return t


def environment(runs: Any) -> list[Block]:
    """A key/value table per run: what ran where, with which versions and commands."""
    blocks: list[Block] = [Heading("Environment")]
    blocks += [TableBlock(kernel_environment(k, runs.records)) for k in runs.kernel_runs]
    blocks += [TableBlock(kernel_environment(t, t.records, "Tuning run")) for t in runs.tune_runs]
    blocks += [TableBlock(kernel_environment(v, v.records, "Validation run")) for v in runs.validation_runs]
    blocks += [TableBlock(serve_environment(s)) for s in runs.serve_runs]
    if not runs.manifests:
        blocks.append(Missing("no kernel run (`mlabench sweep`) nor tuning run among the folders given: no GPU, "
                              "clocks or library versions of a kernel measurement to show"))
    return blocks


def kernel_sections(runs: Any, families: dict[str, str], specs: Sequence[FigureSpec]) -> list[Block]:
    """Correctness, latency and floor, best split count, and padded persistent vs split-KV."""
    recs = runs.records
    if not recs:
        return [Heading("Kernels"), Missing("no kernel sweep records among the folders given (run `mlabench "
                                             "sweep`, then pass its folder to --from)")]
    blocks: list[Block] = [Heading("Correctness"), TableBlock(correctness_table(recs)),
                           Heading("Latency and the memory-bandwidth floor")]
    blocks += _figures(specs, "latency", "pct-of-floor") or [Missing("no correct, timed point to draw")]
    blocks.append(Heading("Best split count"))
    split_kv = [r for r in recs if families.get(r.backend) == "split-kv"]
    if split_kv:
        summary = sweep_summary(split_kv)
        summary.title = "Best split count per split-KV backend, batch and context (µs per call)"
        blocks += [TableBlock(summary)] + _figures(specs, "split-sweep", "split-heatmap")
    else:
        blocks.append(Missing("no split-KV backend in these runs"))
    blocks.append(Heading("Padded persistent vs best split-KV"))
    table = compare_table(recs, families)
    if any(row[-1] is not None for row in table.rows):
        blocks += [TableBlock(table)] + _figures(specs, "persistent-vs-splitkv")
    else:
        blocks.append(Missing("no batch and context where both a persistent and a split-KV backend passed"))
    return blocks


def serving_section(runs: Any, specs: Sequence[FigureSpec]) -> list[Block]:
    """The serve-bench TPOT table of each serve run (the serve-bench table's own numbers) and figure."""
    from mlabench.serving.table import body, failure_lines, headers, table_of

    blocks: list[Block] = [Heading("Serving: TPOT by concurrency")]
    if not runs.serve_runs:
        return blocks + [Missing("no serve-bench run among the folders given (`mlabench serve-bench "
                                 "configs/serve/...`, then pass its run folder to --from)")]
    for run in runs.serve_runs:
        conf = run.config
        t = table_of(conf, run.results)
        by = "input length and concurrency" if t.by_input_len else "concurrency"
        table = Table(f"{run.name}: TPOT by {by} (speedup vs {t.baseline}, {t.stat} TPOT)",
                      headers(t), body(t))
        table.notes += failure_lines(t)
        blocks.append(TableBlock(table))
        blocks += _prediction_block(conf, t, runs.records, run.launch_env)
        blocks += [f for f in _figures(specs, "serving-tpot") if f.stem.endswith(run.name)
                   or len(runs.serve_runs) == 1]
    return blocks


def _prediction_block(conf: Any, table: Any, records: Sequence[Record], launch_env: dict) -> list[Block]:
    """The table of `serve-bench --from-run RUN --predict-from SWEEP...` (the run's recorded
    ``[prediction]``, ``{env:NAME}`` read from its ``launch_env``) when sweep ``records`` were given
    and the run has a valid ``[prediction]``; nothing otherwise (the figure's caption says why none)."""
    from mlabench.deploy.prediction import PredictionSpec, measured_steps, prediction_rows, prediction_table
    from mlabench.errors import ConfigError

    if not records or not conf.prediction:
        return []
    try:
        spec = PredictionSpec.of(conf.prediction, [v.name for v in conf.variants], launch_env, conf.input_lens(),
                                 conf.concurrencies)
    except ConfigError:
        return []
    t = prediction_table(spec, prediction_rows(spec, measured_steps(table, conf.input_lens()[0]), list(records),
                                               conf.bench.random_output_len), table.stat)
    # the report renders columns by name (no styles): name them as serve-bench prints them
    return [TableBlock(Table(t.title, [t.style(c).header or c for c in t.columns], t.rows, t.notes))]


def figures_section(specs: Sequence[FigureSpec], skipped: Sequence[Skipped], figure_dir: str | None) -> list[Block]:
    """The figures drawn (files under ``figure_dir``, or inline when None) and each kind skipped, with why."""
    where = f" (under {figure_dir}/)" if figure_dir else " (inline above)"
    blocks: list[Block] = [Heading("Figures"),
                           Para(f"{len(specs)} figures{where}: " + ", ".join(s.stem for s in specs) + "."
                                if specs else "No figure could be drawn from these runs.")]
    if skipped:
        blocks.append(Bullets([s.line() for s in skipped]))
    return blocks


def header(runs: Any, title: str, command: str | None = None) -> list[Block]:
    """Title, the runs read, the commands that measured them and ``command`` (the report's own)."""
    kinds = ([f"{k.path} (kernel run, {len([r for r in runs.records if r.run_id == k.manifest.run_id])} points)"
              for k in runs.kernel_runs]
             + [f"{t.path} (tuning run, {len(t.records)} configurations measured)" for t in runs.tune_runs]
             + [f"{v.path} (validation run, {len(v.points or [])} points)" for v in runs.validation_runs]
             + [f"{s.path} (serve-bench run)" for s in runs.serve_runs]
             + [f"{g.path} (graph-check result, {len(g.rows)} rows)" for g in runs.graph_checks])
    blocks: list[Block] = [Heading(title, 1), Para("Runs read:"), Bullets(kinds)]
    commands = sorted({" ".join(m.command) for m in runs.manifests})
    if commands:
        blocks += [Para("Measured with:"), Code("\n".join(commands))]
    if command:
        blocks += [Para("This report:"), Code(command)]
    return blocks


def report_title(runs: Any) -> str:
    """'mlabench report: <device> · <model> TP<n>' from the kernel and tuning runs (the serve runs' and
    graph-check results' names without one)."""
    where = [runs.device_name] if runs.device_name else []
    models = {style.run_model(k.manifest.config) for k in runs.kernel_runs}
    models |= {style.run_model(t.config) for t in runs.tune_runs}
    if len(models) == 1 and next(iter(models))[0]:
        where.append(style.model_text(*next(iter(models)), at=" "))
    if (runs.serve_runs or runs.graph_checks) and not where:
        where.append(", ".join([s.name for s in runs.serve_runs] + [g.name for g in runs.graph_checks]))
    return "mlabench report" + (f": {' · '.join(where)}" if where else "")

