"""The data of each figure: pure functions from recorded results, no matplotlib.

Only records whose status is ``ok`` (correct on their own inputs, timed) are drawn as times: a fast
wrong answer never shows as a win. Times are medians per decode call, µs; the floor is the one the
records carry (``floor_us`` = bytes the call must move / the run's measured copy bandwidth).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlabench.records.record import Record
from mlabench.report.figures import style
from mlabench.sweep.summary import best_ok, compare_table, split_count


@dataclass(frozen=True)
class ShapeGroup:
    """Records that share a figure: same local heads, page size, cache dtype, and query tokens per
    request with their mask (1 and causal for plain decode)."""

    num_heads: int
    page_size: int | None
    kv_dtype: str | None
    qo_len: int = 1
    causal: bool = True


def shape_groups(records: Iterable[Record]) -> dict[ShapeGroup, list[Record]]:
    """Records by :class:`ShapeGroup`, groups in (heads, page size, dtype, qo_len) order."""
    groups: dict[ShapeGroup, list[Record]] = {}
    for r in records:
        key = ShapeGroup(r.num_heads, r.shape.get("page_size"), r.shape.get("kv_dtype"), r.qo_len, r.causal)
        groups.setdefault(key, []).append(r)
    return dict(sorted(groups.items(), key=lambda kv: (kv[0].num_heads, kv[0].page_size or 0,
                                                       kv[0].kv_dtype or "", kv[0].qo_len, not kv[0].causal)))


def backends_without_result(records: Iterable[Record]) -> dict[str, str]:
    """Backends with records here but none ``ok``, each with its records' most common status
    (``unsupported``, ``incorrect``, ``error``, ...): what a figure of these records leaves out, and why.
    Backends in name order."""
    statuses: dict[str, Counter] = {}
    for r in records:
        statuses.setdefault(r.backend, Counter())[r.status] += 1
    return {b: c.most_common(1)[0][0] for b, c in sorted(statuses.items()) if "ok" not in c}


def _by(records: Iterable[Record], *fields: str) -> dict[tuple, list[Record]]:
    out: dict[tuple, list[Record]] = {}
    for r in records:
        out.setdefault(tuple(getattr(r, f) for f in fields), []).append(r)
    return dict(sorted(out.items()))


@dataclass
class BestPoint:
    """The fastest correct configuration of one backend at one (batch, context)."""

    context_len: int
    median_us: float
    pct_of_floor: float | None
    params: dict[str, Any]
    noisy: bool


@dataclass
class BackendCurve:
    """One backend's best configuration per context, at one batch size (of one run, ``run``, where
    the records are of several; empty when of one)."""

    backend: str
    points: list[BestPoint]
    run: str = ""

    @property
    def label(self) -> str:
        """``backend``, or ``backend (run id)`` where the figure holds several runs."""
        return f"{self.backend} ({self.run})" if self.run else self.backend


@dataclass
class LatencyData:
    """Figures (a) and (b): per batch, a curve per backend and the floor per context (µs)."""

    curves: dict[int, list[BackendCurve]]
    floor_us: dict[int, list[tuple[int, float]]]
    copy_bandwidth_tbps: float | None
    timing_mode: str
    floor_bandwidth: str = "copy"
    floor_bandwidth_tbps: float | None = None  #: the highest of the runs': the floor drawn is its
    floor_bandwidths_tbps: list[float] = field(default_factory=list)  #: each run's, highest first


def floor_bandwidth_text(data: LatencyData) -> str:
    """The bandwidth the drawn floor divides by, e.g. ``4.46 TB/s``; over runs that measured
    different ones, the highest (the floor drawn, the lowest time) and each run's."""
    bws = data.floor_bandwidths_tbps
    if not bws:
        return "measured"
    if len(bws) == 1:
        return style.tbps_text(bws[0])
    return f"{style.tbps_text(bws[0])}, the highest of the runs': {', '.join(f'{b:.3g}' for b in bws)} TB/s"


def floor_text(data: LatencyData) -> str:
    """``read bandwidth (4.46 TB/s)``: which bandwidth the floor is of (:func:`floor_bandwidth_text`)."""
    return f"{data.floor_bandwidth} bandwidth ({floor_bandwidth_text(data)})"


def latency_vs_context(records: Sequence[Record]) -> LatencyData:
    """Best correct time per (batch, backend, context), and the floor per (batch, context).  Records
    of several runs give a curve per run, labelled ``backend (run id)``.

    A backend with no ``ok`` record at a context has no point there (the curve skips it).
    """
    curves: dict[int, list[BackendCurve]] = {}
    several = len({r.run_id for r in records}) > 1  # one curve per run: runs are never pooled
    for (batch, backend, run), recs in _by(records, "batch", "backend", "run_id").items():
        points = []
        for (ctx,), at_ctx in _by(recs, "context_len").items():
            best = best_ok(at_ctx)
            if best is not None:
                points.append(BestPoint(ctx, best.stats.median_us, best.pct_of_floor, best.params,
                                        best.stats.noisy))
        if points:
            curves.setdefault(batch, []).append(BackendCurve(backend, points, run if several else ""))
    floors: dict[int, list[tuple[int, float]]] = {}
    for (batch, ctx), recs in _by(records, "batch", "context_len").items():
        known = [r.floor_us for r in recs if r.floor_us]
        if known and batch in curves:
            floors.setdefault(batch, []).append((ctx, min(known)))
    bw = next((r.copy_bandwidth_tbps for r in records if r.copy_bandwidth_tbps), None)
    mode = next((r.timing_mode for r in records if r.timing_mode), "")
    timed = [r for r in records if r.floor_us]
    read = bool(timed) and all(r.floor_bandwidth == "read" for r in timed)
    bws = sorted({b for r in timed if (b := r.read_bandwidth_tbps if read else r.copy_bandwidth_tbps)}, reverse=True)
    return LatencyData(curves, floors, bw, mode, "read" if read else "copy", bws[0] if bws else None, bws)


@dataclass
class SplitCurve:
    """One context of one split-KV backend at one batch: time per ``num_kv_splits`` that ran (a split
    policy's choice where a point has one, :func:`mlabench.sweep.summary.split_count`).

    ``median_us[i]`` is None where no configuration with ``splits[i]`` passed (then
    ``statuses[i]`` says why: incorrect, error, unsupported, timeout or missing).
    """

    context_len: int
    splits: list[int]
    median_us: list[float | None]
    statuses: list[str]
    best_splits: int | None = None
    best_us: float | None = None


def runs_apart(records: Sequence[Record]) -> list[tuple[str, list[Record]]]:
    """``records`` by run, runs in id order, for figures that must not pool runs: ``[("", records)]``
    when they are of one run (nothing to name), else ``(run id, its records)`` per run."""
    by_run = _by(records, "run_id")
    if len(by_run) <= 1:
        return [("", list(records))]
    return [(run, recs) for (run,), recs in by_run.items()]


def split_kv_backends(records: Sequence[Record], families: dict[str, str]) -> list[str]:
    """Split-KV backends of ``records`` that were measured at more than one split count."""
    seen: dict[str, set[int]] = {}
    for r in records:
        if families.get(r.backend) == "split-kv" and split_count(r) is not None:
            seen.setdefault(r.backend, set()).add(split_count(r))
    return sorted(b for b, s in seen.items() if len(s) > 1)


def split_sweep(records: Sequence[Record], backend: str) -> dict[int, list[SplitCurve]]:
    """Figure (c): per batch, per context, ``backend``'s time against the split count that ran (under
    a split policy, the policy's choice, not the count asked for), over the counts recorded at that
    batch (each panel its own: a count run only at another batch is no column of this one).
    ``records`` of several runs are pooled here: give one run's (:func:`runs_apart`)."""
    mine = [r for r in records if r.backend == backend and split_count(r) is not None]
    counts: dict[int, set[int]] = {}
    for r in mine:
        counts.setdefault(r.batch, set()).add(split_count(r))
    out: dict[int, list[SplitCurve]] = {}
    for (batch, ctx), recs in _by(mine, "batch", "context_len").items():
        splits = sorted(counts[batch])
        curve = SplitCurve(ctx, splits, [], [])
        for s in splits:
            at = [r for r in recs if split_count(r) == s]
            best = best_ok(at)
            curve.median_us.append(best.stats.median_us if best else None)
            curve.statuses.append("ok" if best else (at[0].status if at else "missing"))
        timed = [(us, s) for us, s in zip(curve.median_us, splits) if us is not None]
        if timed:
            curve.best_us, curve.best_splits = min(timed)
        out.setdefault(batch, []).append(curve)
    return out


@dataclass
class Heatmap:
    """Figure (c), second part: rows are contexts, columns split counts, cells µs / the row's best
    (``measured[i][j]`` False: that count was not run at that context; ``best_us[i]``: the row's
    best µs, None where no count passed)."""

    contexts: list[int]
    splits: list[int]
    ratio: list[list[float | None]] = field(default_factory=list)
    best_column: list[int | None] = field(default_factory=list)
    measured: list[list[bool]] = field(default_factory=list)
    best_us: list[float | None] = field(default_factory=list)


def split_heatmap(curves: Sequence[SplitCurve]) -> Heatmap:
    """Each context's times relative to its best (1.0 = the best split count; None = not ok), and
    whether each cell was measured at all (a sweep need not run every count at every context)."""
    heat = Heatmap([c.context_len for c in curves], list(curves[0].splits) if curves else [])
    for c in curves:
        heat.ratio.append([us / c.best_us if us is not None and c.best_us else None for us in c.median_us])
        heat.measured.append([status != "missing" for status in c.statuses])
        heat.best_column.append(c.splits.index(c.best_splits) if c.best_splits is not None else None)
        heat.best_us.append(c.best_us)
    return heat


@dataclass
class Speedup:
    """Figure (d): one padded persistent backend against the best split count of a split-KV one."""

    batch: int
    context_len: int
    persistent: str
    split_kv: str
    speedup: float
    persistent_us: float
    split_kv_us: float
    best_splits: int | None


def persistent_vs_splitkv(records: Sequence[Record], families: dict[str, str]) -> list[Speedup]:
    """Speedup = best split-KV µs / persistent µs per (batch, context, pair), from the compare table.

    Above 1, padding the heads to 16 and running the persistent kernel wins. Pairs with a side that
    has no correct record at that point are left out.
    """
    rows = compare_table(records, families).as_dicts()
    return [Speedup(r["batch"], r["context"], r["persistent"], r["split-KV"], r["speedup"], r["µs"],
                    r["split-KV µs"], r["best splits"])
            for r in rows if r["speedup"] is not None]


@dataclass
class TpotBar:
    """Figure (e): one variant at one concurrency (and input length, tokens, where the run has
    several); ``tpot_ms`` None when no result was recorded, or when the variant's config leaves
    that length out (``planned`` False: "not run", neither missing nor failed)."""

    concurrency: int
    variant: str
    tpot_ms: float | None
    speedup: float | None
    status: str
    input_len: int | None = None
    planned: bool = True
    predicted_ms: float | None = None  #: TPOT predicted from kernel sweeps (:func:`predictions`), ms


@dataclass
class ServingData:
    """Figure (e): TPOT per (input length,) concurrency and variant of one serve-bench run;
    ``input_lens`` (tokens) empty when the run has one length."""

    run_name: str
    description: str
    baseline: str
    stat: str
    variants: list[str]
    concurrencies: list[int]
    bars: list[TpotBar]
    workload: str
    input_lens: list[int] = field(default_factory=list)
    predicted_note: str = ""  #: why no bar has a prediction although sweep records were given
    predicted_reference: str = ""  #: the [prediction]'s reference variant, where bars have a prediction
    prediction_source: str = "the run's recorded [prediction]"  #: which [prediction] the bars' predictions follow
    no_dash_note: str = ""  #: where some bars have a prediction, why the others have none (one short line)

    def bar(self, variant: str, concurrency: int, input_len: int | None = None) -> TpotBar:
        """The bar of ``variant`` at ``concurrency`` (and ``input_len``); KeyError when there is none."""
        for b in self.bars:
            if (b.variant, b.concurrency, b.input_len) == (variant, concurrency, input_len):
                return b
        raise KeyError((variant, concurrency, input_len))


def serving_tpot(run: Any, stat: str = "mean", records: Sequence[Record] = (),
                 prediction: tuple[dict[str, Any], str] | None = None) -> ServingData:
    """TPOT (``stat``: mean, median or p99; ms) and speedup over the baseline of a serve-bench run.

    ``run`` is a :class:`mlabench.records.readers.ServeRun`; the numbers are the serve-bench table's
    (:func:`mlabench.serving.table.table_of`: repeats averaged, worst status kept, speedup against
    the baseline at the same input length and concurrency).  A run of several input lengths has a
    bar per (input length, concurrency, variant); a variant whose own ``bench.random_input_len``
    leaves a length out has a bar there with ``planned`` False.  With sweep ``records`` and a
    ``[prediction]`` in the run's config, each bar the prediction covers gets ``predicted_ms``
    (:func:`predictions`); ``prediction`` (a serve config's ``[prediction]`` table and its words,
    "the [prediction] of CONFIG") replaces the recorded one, as ``serve-bench CONFIG --from-run``.
    """
    from mlabench.serving.table import table_of, tpot_of

    conf = run.config
    table = table_of(conf, run.results, stat)  # type: ignore[arg-type]
    bars = [TpotBar(row.concurrency, c.variant, tpot_of(c, table.stat), c.speedup, c.status, row.input_len,
                    c.planned) for row in table.rows for c in row.cells]
    lens = conf.input_lens()
    b = conf.bench
    tokens = f" {', '.join(map(str, lens))} in / {b.random_output_len} out tokens" if b.dataset_name == "random" else ""
    workload = f"{b.dataset_name}{tokens}, {b.prompts_text(conf.concurrencies)} prompts"
    data = ServingData(run.name, conf.description or conf.model or run.name, conf.baseline, stat,
                       [v.name for v in conf.variants], list(conf.concurrencies), bars, workload,
                       lens if table.by_input_len else [])
    if prediction is not None:
        conf = conf.model_copy(update={"prediction": prediction[0]})
        data.prediction_source = prediction[1]
    if records:
        data.predicted_note = predictions(data, conf, table, records, run.launch_env)
    return data


def predictions(data: ServingData, conf: Any, table: Any, records: Sequence[Record], launch_env: dict) -> str:
    """Set ``predicted_ms`` of ``data``'s bars: TPOT predicted from the kernel ``records`` as
    ``serve-bench --predict-from`` prints it (:mod:`mlabench.deploy.prediction`, the run's
    ``[prediction]``, ``{env:NAME}`` read from its ``launch_env``).  Returns why no bar got one
    ("" when some did): no or a malformed ``[prediction]``, or no record it matches."""
    from mlabench.deploy.prediction import PredictionSpec, measured_steps, prediction_rows
    from mlabench.errors import ConfigError

    try:
        spec = PredictionSpec.of(conf.prediction, data.variants, launch_env, conf.input_lens(), conf.concurrencies)
    except ConfigError as exc:
        return str(exc)
    rows = prediction_rows(spec, measured_steps(table, conf.input_lens()[0]), list(records),
                           conf.bench.random_output_len)
    for r in rows:
        if r["predicted_ms"] is not None and r["step_from"] == "TPOT":  # a bar is a TPOT: above c=1 the step is not
            data.bar(r["variant"], r["concurrency"], r["input_len"] if data.input_lens else None).predicted_ms = \
                r["predicted_ms"]
    data.predicted_reference = spec.reference
    if any(b.predicted_ms is not None for b in data.bars):
        data.no_dash_note = _no_dash_note(rows, bool(data.input_lens))
    if any(b.predicted_ms is not None for b in data.bars):
        return ""
    if any(r["predicted_ms"] is not None for r in rows):  # every predicted step is above concurrency 1
        return ("the run has no concurrency-1 point, and above it the predicted step is the median ITL, not the "
                "TPOT drawn (`serve-bench --from-run RUN --predict-from SWEEP...` prints it)")
    return "; ".join(sorted({f"{r['variant']}: {r['why']}" for r in rows if r["why"]})) or "no measured TPOT to predict"


def _no_dash_note(rows: list[dict[str, Any]], by_len: bool) -> str:
    """``no dash: above concurrency 1 (...); mlabench-host at 32768, 100000 in (no sweep record)``:
    why the measured bars of :func:`predictions`' ``rows`` without a predicted TPOT have none, or ""."""
    from mlabench.deploy.prediction import NO_RECORD

    parts = ["above concurrency 1 (the predicted step there is the median ITL, not the TPOT drawn)"] \
        * any(r["step_from"] != "TPOT" for r in rows)
    missing: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if r["step_from"] == "TPOT" and r["predicted_ms"] is None:
            why = "no sweep record" if r["why"].startswith(NO_RECORD) else r["why"]
            where = f"{r['input_len']}" if by_len else f"c={r['concurrency']}"
            missing.setdefault((r["variant"], why), []).append(where)
    parts += [f"{v} at {', '.join(dict.fromkeys(at))}{' in' if by_len else ''} ({why})"
              for (v, why), at in missing.items()]
    return "no dash: " + "; ".join(parts) if parts else ""
