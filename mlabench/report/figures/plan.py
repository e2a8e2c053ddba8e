"""Figures from recorded runs (``mlabench plot``, and the figures of ``mlabench report``).

A figure is data plus drawing: :mod:`mlabench.report.figures.data` (sweeps, serving),
:mod:`mlabench.report.figures.tuning_data` (tuning and validation runs) and :mod:`mlabench.report.figures.graph_check_data`
(graph-check results) turn runs into the numbers of a figure (pure, tested without matplotlib);
:mod:`mlabench.report.figures.draw` and :mod:`mlabench.report.figures.draw_tuning` draw them. :func:`plan`
decides which figures the runs can give, and says why for each kind it cannot (a figure whose data
is absent is skipped, never drawn empty). Importing this package does not import matplotlib.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from mlabench.errors import ConfigError
from mlabench.files import make_dir, write_bytes
from mlabench.report.figures import data as D, graph_check_data as G, style, tuning_data as T
from mlabench.report.figures.spec import FigureSpec, Skipped
from mlabench.run_files import POLICY_FILE, VALIDATION_FILE

KINDS: dict[str, str] = {
    "latency": "decode latency vs context length per backend, with the floor (log-log)",
    "pct-of-floor": "% of the floor vs context length per backend",
    "split-sweep": "latency vs num_kv_splits per context, the best starred (each split-KV backend)",
    "split-heatmap": "context x num_kv_splits, µs relative to each context's best (each split-KV backend)",
    "persistent-vs-splitkv": "speedup of padded persistent kernels over the best split-KV count",
    "serving-tpot": "serve-bench TPOT per (input length,) concurrency and variant, with the speedup over the baseline",
    "tuned-policy": "a tuning run's policy: num_kv_splits vs context length, against the public heuristics",
    "tuning-history": "each tuning study's trials in the order measured, with the best so far (per batch)",
    "tuning-regret": "regret of the tuned policy and the heuristics on a validation run's held-out lengths",
    "graph-check": "slowdown of a decode graph captured once vs the call tuned for each context length",
}
#: Kinds drawn from kernel sweep records (a sweep or compare run).
SWEEP_KINDS = ("latency", "pct-of-floor", "split-sweep", "split-heatmap", "persistent-vs-splitkv")
FORMATS = ("png", "svg")


def _where_text(device: str | None, heads: int | None, model: Any, tp: Any, qo_len: int, causal: bool,
                page: Any, dtype: str | None, mode: str, device_kind: str | None,
                name_one_token: bool = False) -> str:
    """Device, heads (with the model and TP when known), query tokens, page, dtype, timing: ' · '-joined.

    One query token is named only with ``name_one_token`` (when figures of other qo_lens stand beside it)."""
    label = style.model_text(model, tp)
    heads_text = f"{heads} heads" + (f" ({label})" if label else "") if heads else ""
    if qo_len == 1:
        qo = "1 query token" if name_one_token else ""
    else:
        qo = f"{qo_len} query tokens" + ("" if causal else " (non-causal)")
    parts = [device or "unknown device", heads_text, qo, f"page {page}" if page else "",
             style.DTYPE_SHORT.get(dtype or "", dtype or ""), style.timing_text(mode, device_kind) if mode else ""]
    return " · ".join(p for p in parts if p)


def _where(runs: Any, group: D.ShapeGroup, records: Sequence[Any], name_one_token: bool = False) -> str:
    """Device, model (when every kernel run names the same one), heads, page, dtype, timing; then the
    backends with records in the group but no correct one, and their status (``not drawn: ...``)."""
    mode = next((r.timing_mode for r in records if r.timing_mode), "")
    models = {style.run_model(k.manifest.config) for k in runs.kernel_runs}
    model, tp = models.pop() if len(models) == 1 else (None, None)
    where = _where_text(runs.device_name, group.num_heads, model, tp, group.qo_len, group.causal,
                        group.page_size, group.kv_dtype or "?", mode,
                        runs.kernel_runs[0].manifest.device.get("kind") if runs.kernel_runs else None, name_one_token)
    absent = ", ".join(f"{b} ({why})" for b, why in D.backends_without_result(records).items())
    where += _interrupted(runs, records)
    return f"{where} · not drawn: {absent}" if absent else where


def _interrupted(runs: Any, records: Sequence[Any]) -> str:
    """`` · interrupted: 15 of 24 points`` for the kernel runs with ``records`` in the figure that
    recorded fewer points than they planned (each named by its id where there are several), else
    ''.  A fresh user's review: a figure of a cut-short run dropped its missing columns and did not
    say so.  A run drawn in another shape group's figure only is not named here."""
    drawn = {r.run_id for r in records}
    keys: dict[str, set[str]] = {}
    for r in runs.records:
        if r.run_id in drawn:
            keys.setdefault(r.run_id, set()).add(r.key)
    several = len(runs.kernel_runs) > 1
    cut = [f"{k.manifest.run_id + ' ' if several else ''}{len(keys[k.manifest.run_id])} of "
           f"{k.manifest.planned_points} points" for k in runs.kernel_runs
           if k.manifest.run_id in drawn and len(keys[k.manifest.run_id]) < (k.manifest.planned_points or 0)]
    return f" · interrupted: {', '.join(cut)}" if cut else ""


def _run_where(manifest: Any, records: Sequence[Any], model: Any = None, tp: Any = None) -> str:
    """:func:`_where_text` of a tuning or validation run, from its manifest and first record."""
    first = records[0] if records else None
    shape = first.shape if first else {}
    return _where_text(str(manifest.device.get("name")), first.num_heads if first else None, model, tp,
                       first.qo_len if first else 1, first.causal if first else True, shape.get("page_size"),
                       shape.get("kv_dtype"), first.timing_mode if first else "", manifest.device.get("kind"))


def _groups(runs: Any) -> list[tuple[str, str, list[Any]]]:
    """``(stem suffix, where text, records)`` per shape group; no suffix when there is one group."""
    groups = D.shape_groups(runs.records)
    several_qo = len({(g.qo_len, g.causal) for g in groups}) > 1
    out = []
    for g, recs in groups.items():
        dtype = style.DTYPE_SHORT.get(g.kv_dtype or "", g.kv_dtype)
        qo = "" if g.qo_len == 1 else f"-qo{g.qo_len}" + ("" if g.causal else "nc")
        suffix = "" if len(groups) == 1 else f"-h{g.num_heads}-p{g.page_size}-{dtype}{qo}"
        out.append((suffix, _where(runs, g, recs, several_qo), recs))
    return out


def _latency(runs: Any, families: dict[str, str], kind: str) -> list[FigureSpec] | str:
    specs = []
    for suffix, where, recs in _groups(runs):
        data = D.latency_vs_context(recs)
        if not data.curves:
            continue
        bw = D.floor_bandwidth_text(data)
        if kind == "latency":
            title = "MLA decode latency vs context length, best correct configuration per backend"
            caption = (f"Median µs per decode call of each backend's fastest correct configuration; dashed: the "
                       f"floor, bytes the call must move / the run's measured {data.floor_bandwidth} bandwidth "
                       f"({bw}).")
            specs.append(FigureSpec(kind, "latency-vs-context" + suffix, caption,
                                    partial(_draw().latency, data, title, where, "us")))
        elif any(p.pct_of_floor is not None for cs in data.curves.values() for c in cs for p in c.points):
            title = "Share of the memory-bandwidth floor reached, best correct configuration per backend"
            caption = (f"100 x floor µs / measured µs; the floor uses the streaming read bandwidth ({bw})."
                       if data.floor_bandwidth == "read" else
                       f"100 x floor µs / measured µs; the floor uses the copy bandwidth ({bw}, read + write), "
                       "so a read-mostly kernel can pass 100% by a few percent.")
            specs.append(FigureSpec(kind, "pct-of-floor-vs-context" + suffix, caption,
                                    partial(_draw().latency, data, title, where, "pct")))
    return specs or "no correct, timed kernel records among the runs given"


def _split_spec(kind: str, backend: str, run: str, curves: dict[int, list[D.SplitCurve]], suffix: str,
                where: str) -> FigureSpec:
    """The split-sweep or split-heatmap figure of ``backend`` in one run (``run`` named where the
    runs given are several: each gets its own figure)."""
    stem = f"{kind}-{backend}{suffix}" + (f"-{run}" if run else "")
    of = backend + (f" (run {run})" if run else "")
    where += f" · run {run}" if run else ""
    if kind == "split-sweep":
        title = f"{backend}: latency vs num_kv_splits at each context length (★ = best)"
        caption = (f"{of}: median µs per call against the split count that ran (under a split policy, the "
                   "policy's choice), a line per context.")
        return FigureSpec(kind, stem, caption, partial(_draw().split_sweep, curves, title, where))
    maps = {b: D.split_heatmap(cs) for b, cs in curves.items()}
    title = f"{backend}: latency relative to each context's best split count (boxed; ✗ = not correct, – = not measured)"
    caption = (f"{of}: each cell is µs / the fastest correct split count at that context (boxed); the colour "
               "scale is logarithmic.")
    return FigureSpec(kind, stem, caption, partial(_draw().split_heatmap, maps, title, where))


def _splits(runs: Any, families: dict[str, str], kind: str) -> list[FigureSpec] | str:
    specs = []
    for suffix, where, group in _groups(runs):
        for run, recs in D.runs_apart(group):  # runs are never pooled: a figure of each
            for backend in D.split_kv_backends(recs, families):
                curves = D.split_sweep(recs, backend)
                if any(c.best_splits is not None for cs in curves.values() for c in cs):
                    specs.append(_split_spec(kind, backend, run, curves, suffix, where))
    return specs or "no split-KV backend measured at more than one num_kv_splits with a correct result"


def _persistent(runs: Any, families: dict[str, str], kind: str) -> list[FigureSpec] | str:
    specs = []
    for suffix, where, recs in _groups(runs):
        points = D.persistent_vs_splitkv(recs, families)
        if points:
            title = "Padded persistent kernels vs the best split count of split-KV"
            caption = ("Speedup = best split-KV µs / persistent µs at each batch and context (the persistent "
                       "kernels pad the heads to 16); above 1.0 padding wins.")
            specs.append(FigureSpec(kind, "persistent-vs-splitkv" + suffix, caption,
                                    partial(_draw().speedups, points, title, where)))
    return specs or "no batch and context where both a persistent and a split-KV backend have a correct result"


def _serving(runs: Any, families: dict[str, str], kind: str) -> list[FigureSpec] | str:
    specs = []
    for run in runs.serve_runs:
        data = D.serving_tpot(run, records=runs.records, prediction=runs.prediction)
        if not any(b.tpot_ms is not None for b in data.bars):
            continue
        suffix = "" if len(runs.serve_runs) == 1 else f"-{run.name}"
        by = "input length and concurrency" if data.input_lens else "concurrency"
        title = f"Serving TPOT by {by} ({data.stat} TPOT; speedup vs {data.baseline})"
        caption = (f"{run.name}: {data.stat} time per output token of each server variant, labelled with the "
                   f"speedup over {data.baseline} (baseline TPOT / variant TPOT)"
                   + ("; a panel per input length and concurrency, each on its own axis" if data.input_lens
                      else "") + _predicted_caption(data) + ".")
        note = f"serving-tpot{suffix}: no TPOT predicted: {data.predicted_note}" if data.predicted_note else ""
        specs.append(FigureSpec(kind, "serving-tpot" + suffix, caption,
                                partial(_draw_serving().serving, data, title, f"{data.description} · {data.workload}"),
                                note))
    return specs or "no serve-bench run with a TPOT result among the runs given"


def _predicted_caption(data: D.ServingData) -> str:
    """The caption's words on the predicted TPOT: what the dashed lines are, why there are none
    although sweep runs were given, or nothing (no sweep run given)."""
    if any(b.predicted_ms is not None for b in data.bars):
        recorded = data.prediction_source == D.ServingData.prediction_source
        return (f"; dashed: TPOT predicted from the sweep runs given by {data.prediction_source} "
                f"(non-attention time from {data.predicted_reference} at its short input length), as "
                f"`serve-bench {'' if recorded else 'CONFIG '}--from-run RUN --predict-from` prints it"
                f"{' without a CONFIG' if recorded else ''}, "
                "where its measured step is the TPOT (concurrency 1; above it the step is held against the "
                "median ITL in that table, not against the TPOT drawn here; docs/vllm-plugin.md)")
    return f"; no TPOT predicted from the sweep runs given: {data.predicted_note}" if data.predicted_note else ""


def _suffix(items: Sequence[Any], item: Any) -> str:
    return "" if len(items) == 1 else f"-{item.name}"


def _tuned_policy(runs: Any, families: dict[str, str], kind: str) -> list[FigureSpec] | str:
    specs, why = [], []
    for run in runs.tune_runs:
        steps = T.policy_steps(run, runs.validation_runs)
        if not steps:
            why.append(f"tuning run {run.name} has no {POLICY_FILE} (unfinished: `mlabench tune --resume` it, "
                       "or `mlabench tune --export` it)")
            continue
        backend = run.config["backend"]
        validated = any(p.held_out_best for p in steps)
        caption = (f"{run.name}: the policy's num_kv_splits at each context length (thick), each public "
                   "heuristic's choice for the same shape on this GPU (dashed), and the fastest trial of each "
                   "bucket's study (diamonds)" + (", and the fastest of the split ladder at each held-out "
                                                  "length of its validation (dots)" if validated else "")
                   + "; a dashed line on the thick one picks the policy's count there (the dashed lines are "
                   "drawn up to 3 points apart, so that those which coincide show side by side).")
        specs.append(FigureSpec(kind, "tuned-policy" + _suffix(runs.tune_runs, run), caption, partial(
            _draw_tuning().policy_steps, steps, backend,
            f"{backend}: tuned num_kv_splits per context length vs the public heuristics",
            _run_where(run.manifest, run.records, *style.run_model(run.config)))))
    return specs or "; ".join(why) or "no tuning run (`mlabench tune`) among the runs given"


def _tuning_history(runs: Any, families: dict[str, str], kind: str) -> list[FigureSpec] | str:
    specs = []
    for run in runs.tune_runs:
        backend = run.config["backend"]
        where = _run_where(run.manifest, run.records, *style.run_model(run.config))
        for batch, histories in T.tuning_history(run).items():
            if not any(h.trials for h in histories):
                continue
            title = (f"{backend} tuning at batch {batch}: each study's trials in the order measured, "
                     "best so far")
            caption = (f"{run.name}, batch {batch}: median µs of every configuration a study measured, in "
                       "order (the public heuristics first, squares), the best so far, and the policy's "
                       "choice (star); a configuration suggested again is reused, not measured again.")
            specs.append(FigureSpec(kind, f"tuning-history-b{batch}" + _suffix(runs.tune_runs, run), caption,
                                    partial(_draw_tuning().tuning_history, histories, backend, title, where)))
    return specs or ("no tuning run (`mlabench tune`) among the runs given" if not runs.tune_runs
                     else "no trial recorded in the tuning runs given")


def _tuning_regret(runs: Any, families: dict[str, str], kind: str) -> list[FigureSpec] | str:
    specs = []
    for run in runs.validation_runs:
        panels = T.validation_regret(run)
        if not panels:
            continue
        backend = run.manifest.config["validate"].get("backend", "policy")
        caption = (f"{run.name}: regret = time / best time - 1 at each held-out length, best = the fastest "
                   "correct configuration measured there (split ladder, policy, heuristics); the policy of "
                   f"tuning run {run.policy_run_id or 'not recorded'}. The heuristics are drawn over the policy's "
                   "broad line and up to 3 points apart, so that lines which coincide show; the legend counts "
                   "the points where each heuristic ran the policy's time.")
        specs.append(FigureSpec(kind, "tuning-regret" + _suffix(runs.validation_runs, run), caption, partial(
            _draw_tuning().regret, panels, backend,
            f"{backend}: regret of the tuned policy and the public heuristics on held-out context lengths",
            _run_where(run.manifest, run.records))))
    return specs or ("no validation run (`mlabench tune --validate`) among the runs given"
                     if not runs.validation_runs else f"the validation runs given have no {VALIDATION_FILE}")


def _graph_check(runs: Any, families: dict[str, str], kind: str) -> list[FigureSpec] | str:
    groups = G.graph_check_slowdown(runs.graph_checks)
    specs = []
    for data, stem in zip(groups, G.figure_stems(groups)):
        caption = (f"Slowdown = captured graph µs / µs of the same backend prepared for that context length "
                   f"(its fastest split count where it has one), both graph-replayed; from "
                   f"{', '.join(data.sources)}.")
        specs.append(FigureSpec(kind, stem, caption, partial(
            _draw_tuning().graph_check, data,
            "Decode graph captured once vs the call tuned for each context length",
            f"{data.where} · {data.capture}, replayed after the per-step refresh")))
    return specs or ("no graph-check result (the JSON of `mlabench graph-check --save FILE`) among the paths "
                     "given" if not runs.graph_checks else "the graph-check results given have no rows")


_PLANNERS = {"latency": _latency, "pct-of-floor": _latency, "split-sweep": _splits,
             "split-heatmap": _splits, "persistent-vs-splitkv": _persistent, "serving-tpot": _serving,
             "tuned-policy": _tuned_policy, "tuning-history": _tuning_history, "tuning-regret": _tuning_regret,
             "graph-check": _graph_check}


def _draw() -> Any:
    from mlabench.report.figures import draw

    return draw


def _draw_serving() -> Any:
    from mlabench.report.figures import draw_serving

    return draw_serving


def _draw_tuning() -> Any:
    from mlabench.report.figures import draw_tuning

    return draw_tuning


def plan(runs: Any, kinds: Sequence[str] | None = None,
         families: dict[str, str] | None = None) -> tuple[list[FigureSpec], list[Skipped]]:
    """The figures ``runs`` (a :class:`mlabench.report.runs.Runs`) can give, of ``kinds`` (default: all).

    Returns the figures to draw and, for each kind with nothing to draw, a :class:`Skipped` saying
    why. An unknown kind raises :class:`ConfigError` listing the known ones.
    """
    from mlabench.backends import backend_families

    kinds = list(dict.fromkeys(kinds or KINDS))
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ConfigError(f"unknown figure kind {unknown[0]!r}; known: {', '.join(KINDS)}")
    families = families if families is not None else backend_families()
    specs: list[FigureSpec] = []
    skipped: list[Skipped] = []
    for kind in kinds:
        if kind in SWEEP_KINDS and not runs.records:
            skipped.append(Skipped(kind, "no kernel sweep records among the runs given"))
            continue
        made = _PLANNERS[kind](runs, families, kind)
        if isinstance(made, str):
            skipped.append(Skipped(kind, made))
        else:
            specs.extend(made)
    return specs, skipped


def render(spec: FigureSpec, fmt: str = "png") -> bytes:
    """Draw ``spec`` and return the image file's bytes: ``png`` (256 colours) or ``svg`` (no timestamp)."""
    fig = spec.draw()
    if fmt == "png":
        return _draw().png_bytes(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, metadata={"Date": None})
    return buf.getvalue()


def write_figures(runs: Any, out_dir: Path, kinds: Sequence[str] | None = None,
                  formats: Sequence[str] = ("png",)) -> tuple[list[tuple[FigureSpec, list[Path]]], list[Skipped]]:
    """Draw the figures of ``runs`` into ``out_dir`` as ``<stem>.<format>`` (derived files: an
    existing figure of the same name is replaced). Returns each figure with its files, and the kinds
    skipped. :class:`ConfigError` for an unknown kind or format.
    """
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise ConfigError(f"figure format must be one of {', '.join(FORMATS)}, got {bad[0] if bad else 'none'!r} "
                          "(plot writes figure files; its --format is their file format, not a table's)")
    specs, skipped = plan(runs, kinds)
    if specs:
        make_dir(out_dir, "figure folder")
    written = []
    for spec in specs:
        paths = [write_bytes(out_dir / f"{spec.stem}.{fmt}", render(spec, fmt), "figure") for fmt in formats]
        written.append((spec, paths))
    return written, skipped
