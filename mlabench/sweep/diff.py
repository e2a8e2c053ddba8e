"""Two recorded runs point by point (``mlabench diff RUN_A RUN_B``): what changed, and whether it is real.

For every point timed in both runs (same key: backend, parameters, shape): the two medians, the
ratio B/A, and whether the difference is significant.  Points in one run only, and points timed in
one run but not the other, are listed.  Per backend: the geometric mean of the ratios and how many
points moved significantly each way.  Nothing is refused: runs from other GPUs, drivers or library
versions compare (that is how a machine is checked against another), with a note saying so.

Significance.  Each median's uncertainty has two parts.  Its samples give the first: the
distribution-free 95% confidence interval of the median (order statistics, see
:func:`mlabench.measure.stats.median_rel_ci`), whose relative half-width over 1.96 is a standard error.
The samples of one measurement are taken within milliseconds, though, and a point measured again
(new inputs, a new graph, another moment of the GPU) moves by more than they show: on an H200 the
same sweep twice disagreed by 0.5% at the median point while most points' samples spanned less.
A test on the samples alone (a rank test, or non-overlapping intervals) then calls most points of
two equal runs different.  So each run adds its *repeat noise*, the spread between successive
measurements of its sentinel point (:func:`mlabench.measure.stats.repeat_noise`; zero for runs
without sentinel measurements).  A point measured in several visits (:mod:`mlabench.sweep.visits`) takes
as its first part the larger of its pooled samples' standard error and that of the mean of its
visits' medians: samples within a visit are not independent draws, and a point whose visits
disagree (FlashMLA at batch 1, 8K on an H200 reads 25.0 or 26.7 µs at a visit, depending on what
the GPU ran before it; results/h200/repeatability/history-attempt/) is known no better than its
visits agree.  A point differs significantly when
``|ln(B/A)| > Z_CRITICAL * sqrt(se_A^2 + noise_A^2 + se_B^2 + noise_B^2)``: with ``Z_CRITICAL``
3, about 3 in 1000 points of two equal runs are flagged by chance, and a 5% change is flagged
wherever the combined relative uncertainty is below 1.6%.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlabench.backends import get_backend
from mlabench.errors import ConfigError, MissingResultError, MlabenchError, ResultsError
from mlabench.measure.stats import geomean, mean_rel_se, median_rel_ci, repeat_noise
from mlabench.records.provenance import is_commit, same_commit
from mlabench.records.record import CPU_RUN_NOTE, Manifest, Record, point_key
from mlabench.records.side_files import read_sentinels
from mlabench.records.store import ResultStore, describe_records, run_folders
from mlabench.run_files import SWEEP_KIND, TUNE_KIND, VALIDATION_KIND
from mlabench.shapes import MLADecodeShape
from mlabench.tables.table import PARAMS, ColumnStyle, Table, params_label

#: Normal quantile a point's |ln ratio| must exceed, in units of its combined standard error.
Z_CRITICAL = 3.0
#: The normal quantile of the medians' 95% confidence intervals.
Z_95 = 1.959964


@dataclass
class Run:
    """One run folder as the diff reads it."""

    path: Path
    manifest: Manifest
    records: dict[str, Record]
    repeat_noise: float | None
    #: Timed sentinel measurements (repeat noise needs 3).
    sentinels: int = 0


@dataclass
class PointDiff:
    """One point timed in both runs."""

    a: Record
    b: Record
    ratio: float
    z: float
    significant: bool


@dataclass
class RunDiff:
    """The whole comparison of run A (the baseline) and run B."""

    a: Run
    b: Run
    points: list[PointDiff] = field(default_factory=list)
    only_a: list[Record] = field(default_factory=list)
    only_b: list[Record] = field(default_factory=list)
    untimed: list[tuple[Record, Record]] = field(default_factory=list)
    manifest_notes: list[str] = field(default_factory=list)


def load_run(path: Path | str) -> Run:
    """Read one run folder (or a folder holding exactly one run).

    Raises :class:`ResultsError` for a folder with no run, several runs, or unreadable files.
    """
    folders = run_folders([Path(path)])
    if len(folders) > 1:
        raise ResultsError(f"{path} holds {len(folders)} runs; name one of them: "
                           + ", ".join(str(f) for f in folders))
    store = ResultStore(folders[0])
    sentinels = [s.record.stats.median_us for s in read_sentinels(store.run_dir)
                 if s.record.status == "ok" and s.record.stats is not None]
    return Run(folders[0], store.manifest(), {comparable_key(r): r for r in store.records()},
               repeat_noise(sentinels), len(sentinels))


def comparable_key(r: Record) -> str:
    """A point's identity for pairing runs recorded by different versions of mlabench: the key of
    its backend's present resolution of the parameters it recorded (a parameter added since is
    filled with its default; one left out at its default, ``omit_default``, stays out), with its
    shape.  The record's own key when its backend or a parameter is no longer known."""
    try:
        backend = get_backend(r.backend)
        shape = MLADecodeShape(**{**r.shape, "context_lens": tuple(r.shape["context_lens"])})
        return point_key(r.backend, backend.resolve_params(shape, r.params), r.shape)
    except (MlabenchError, KeyError, TypeError, ValueError):
        return r.key


def median_se(r: Record) -> float:
    """Relative standard error of a record's median (inf when untimed): from its samples, or, for a
    point measured in several visits, the standard error of the mean of the visits' medians over that
    mean (:func:`mlabench.measure.stats.mean_rel_se`) where that is larger -- the visit, not the sample, is the
    independent draw (module docstring)."""
    if r.stats is None:
        return math.inf
    visits = mean_rel_se(r.visit_medians_us or [])
    return max(median_rel_ci(r.stats.samples_us) / Z_95, visits or 0.0)


def compare_point(a: Record, b: Record, noise_a: float | None, noise_b: float | None,
                  z_critical: float = Z_CRITICAL) -> PointDiff:
    """The ratio B/A of two timed records of one point and its significance (module docstring)."""
    ratio = b.stats.median_us / a.stats.median_us
    z = z_score(ratio, combined_se(a, b, noise_a, noise_b))
    return PointDiff(a, b, ratio, z, z > z_critical)


def combined_se(a: Record, b: Record, noise_a: float | None, noise_b: float | None) -> float:
    """``sqrt(se_A^2 + noise_A^2 + se_B^2 + noise_B^2)``: the relative uncertainty of ln(B/A) of one
    point (module docstring; a missing noise counts as 0)."""
    return math.sqrt(median_se(a) ** 2 + (noise_a or 0.0) ** 2 + median_se(b) ** 2 + (noise_b or 0.0) ** 2)


def z_score(ratio: float, u: float) -> float:
    """``|ln ratio| / u``: inf for a change with no uncertainty, 0 for none."""
    return abs(math.log(ratio)) / u if u > 0 else (math.inf if ratio != 1 else 0.0)


def _timed(r: Record) -> bool:
    return r.status == "ok" and r.stats is not None and r.stats.median_us > 0


def diff_runs(path_a: Path | str, path_b: Path | str, z_critical: float = Z_CRITICAL) -> RunDiff:
    """Compare run B against run A (see the module's docstring); raises what :func:`load_run` raises,
    and :class:`MissingResultError` when the two runs have no point in common (naming what each holds)."""
    a, b = load_run(path_a), load_run(path_b)
    if not set(a.records) & set(b.records):
        apart = separating_dimensions(list(a.records.values()), list(b.records.values()))
        differ = f"they differ in {'; '.join(apart)}; " if apart else ""
        raise MissingResultError(f"the two runs have no point in common: {differ}A ({a.path.name}) holds "
                                 f"{describe_records(a.records.values())}; B ({b.path.name}) holds "
                                 f"{describe_records(b.records.values())}")
    d = RunDiff(a, b, manifest_notes=manifest_differences(a.manifest, b.manifest))
    if a.path.resolve() == b.path.resolve():
        d.manifest_notes.insert(0, f"A and B are the same run folder ({a.path}): every point is "
                                   "compared with itself")
    for key, ra in a.records.items():
        rb = b.records.get(key)
        if rb is None:
            d.only_a.append(ra)
        elif _timed(ra) and _timed(rb):
            d.points.append(compare_point(ra, rb, a.repeat_noise, b.repeat_noise, z_critical))
        else:
            d.untimed.append((ra, rb))
    d.only_b = [r for key, r in b.records.items() if key not in a.records]
    order = lambda r: (r.backend, r.num_heads, r.batch, r.context_len, r.qo_len, not r.causal,  # noqa: E731
                       sorted(r.params.items()))
    d.points.sort(key=lambda p: order(p.a))
    for rows in (d.only_a, d.only_b):
        rows.sort(key=order)
    return d


#: The dimensions of a point a diff names when two runs share none of a dimension's values: the
#: backend, the record's own shape fields, then every other field of the shape (as recorded).
DIMENSIONS = {"backend": lambda r: r.backend, "heads": lambda r: r.num_heads, "batch": lambda r: r.batch,
              "context": lambda r: r.context_len, "qo_len": lambda r: r.qo_len, "causal": lambda r: r.causal}


def separating_dimensions(a: list[Record], b: list[Record]) -> list[str]:
    """Each dimension in which runs ``a`` and ``b`` have no value in common, as ``"heads: A 12, B
    16"``: what keeps two runs from sharing a point (e.g. the same sweep at another head count).
    Empty when none does (their points differ only in combination, or in parameters)."""
    fields = {k: (lambda r, k=k: r.shape.get(k)) for r in a + b for k in r.shape if k not in ("num_heads",
                                                                                             "context_lens")}
    out = []
    for name, value in {**DIMENSIONS, **fields}.items():
        va, vb = {value(r) for r in a}, {value(r) for r in b}
        if va and vb and not va & vb:
            out.append(f"{name}: A {_values(va, name)}, B {_values(vb, name)}")
    return out


#: What a shape field's None means, for :func:`separating_dimensions` (never a bare None).
_NONE_MEANS = {"softmax_scale": "576 ** -0.5 (none given)"}


def _values(values: set[Any], name: str = "") -> str:
    shown = sorted(values, key=lambda v: (str(type(v)), v if v is not None else 0))
    text = [_NONE_MEANS.get(name, "not recorded") if v is None else str(v) for v in shown[:4]]
    return "/".join(text) + (f"/... ({len(shown)} values)" if len(shown) > 4 else "")


def manifest_differences(a: Manifest, b: Manifest) -> list[str]:
    """One note per way the two runs' set-ups differ: GPU (model, or the physical GPU by its UUID
    where both runs recorded one), driver, library versions, revision (or that a run recorded none:
    never called the same), kind of run (a sweep against a tuning run), timing settings (each kind's
    own), order; empty when they match.  The 87-94% of the note
    on other GPUs of one model is from results/h200/repeatability/history-attempt/ (runs from
    different device calls)."""
    notes = []
    if a.device.get("name") != b.device.get("name"):
        notes.append(f"different GPUs: {a.device.get('name')} vs {b.device.get('name')}")
    elif a.device.get("uuid") and b.device.get("uuid") and a.device["uuid"] != b.device["uuid"]:
        notes.append(f"different GPUs of one model ({a.device['uuid']} vs {b.device['uuid']}): on H200s, runs from "
                     "separately started machines agreed within 1% at 87-94% of points, against 96.7-100% "
                     "for two runs on one")
    elif a.host != b.host:
        notes.append(f"different hosts: {a.host} vs {b.host} (two machines: see the machine factor)")
    if a.driver != b.driver:
        notes.append(f"different drivers: {a.driver} vs {b.driver}")
    changed = [f"{k} {_shown(a.versions, k, 'not installed')} vs {_shown(b.versions, k, 'not installed')}"
               for k in sorted(set(a.versions) | set(b.versions)) if a.versions.get(k) != b.versions.get(k)]
    if changed:
        notes.append("different library versions: " + ", ".join(changed))
    rev = lambda m: short_revision(m.git_revision) + ("+changes" if m.git_dirty else "")  # noqa: E731
    unknown = [f"{side} ({m.git_revision})" for side, m in (("A", a), ("B", b)) if not is_commit(m.git_revision)]
    if unknown:  # a copy of the code without .git or a stamp records the package version alone
        notes.append(f"mlabench revision not recorded for {' and '.join(unknown)}: run from a copy of the code "
                     "without .git or a revision stamp (scripts/stamp_revision.py), so the code may differ")
    elif a.git_dirty != b.git_dirty or not same_commit(a.git_revision, b.git_revision):
        notes.append(f"different mlabench revisions: {rev(a)} vs {rev(b)}")
    kind_a, kind_b = (m.run_kind() for m in (a, b))
    if kind_a != kind_b:  # a tuning run's trials are timed as its config.tune says (a fresh user's review)
        notes.append(f"different kinds of run: A is {_KIND_NAMES.get(kind_a, kind_a)}, B {_KIND_NAMES.get(kind_b, kind_b)}"
                     " (each times its own points under its own settings)")
    for name in ("timing",) if kind_a != kind_b else ("timing", "order", "check"):
        va, vb = _settings(a, kind_a).get(name), _settings(b, kind_b).get(name)
        if va != vb:
            notes.append(f"different {name} settings: {_changed(va, vb)}")
    if kind_a == kind_b == SWEEP_KIND and a.visit_settings() != b.visit_settings():  # only sweeps visit
        notes.append(f"different visit settings: {_changed(a.visit_settings(), b.visit_settings())}")
    return notes


#: A run kind as the notes name it.
_KIND_NAMES = {SWEEP_KIND: "a sweep", TUNE_KIND: "a tuning run", VALIDATION_KIND: "a validation run"}


def _settings(m: Manifest, kind: str) -> dict[str, Any]:
    """Where a run of ``kind`` records its timing and check settings: a sweep's config, a tuning
    run's ``config.tune`` (its ``atol``/``rtol`` read as its check settings), a validation run's
    ``config.validate``."""
    key = {TUNE_KIND: "tune", VALIDATION_KIND: "validate"}.get(kind)
    if key is None:
        return m.config
    own = m.config.get(key) or {}  # a tuning run keeps its tolerances beside its other settings
    return {**own, "check": {k: own[k] for k in ("atol", "rtol") if k in own} or own.get("check")}


def _changed(va: Any, vb: Any) -> str:
    if isinstance(va, dict) and isinstance(vb, dict):
        keys = sorted(k for k in set(va) | set(vb) if va.get(k) != vb.get(k))
        return ", ".join(f"{k} {_shown(va, k)} vs {_shown(vb, k)}" for k in keys)
    return f"{'not recorded' if va is None else va} vs {'not recorded' if vb is None else vb}"


def _shown(values: dict[str, Any], key: str, none: str = "none") -> str:
    """``values[key]`` for a note: "not recorded" where the run has no such key (recorded before
    it existed), ``none`` where it recorded None (a package not installed, a setting left off)."""
    if key not in values:
        return "not recorded"
    return none if values[key] is None else str(values[key])


def agreement(points: list[PointDiff], min_us: float) -> dict[str, Any]:
    """Summary of ``points``: count, geometric-mean ratio, significant each way, and over the
    points whose run-A median is at least ``min_us``: how many, the share within 1% and 2%, the
    worst relative difference."""
    big = [abs(p.ratio - 1) for p in points if p.a.stats.median_us >= min_us]
    return {
        "points": len(points), "geomean_ratio": geomean([p.ratio for p in points]),
        "significant_slower": sum(p.significant and p.ratio > 1 for p in points),
        "significant_faster": sum(p.significant and p.ratio < 1 for p in points),
        "points_over_min": len(big),
        "within_1pct": sum(x <= 0.01 for x in big) / len(big) if big else None,
        "within_2pct": sum(x <= 0.02 for x in big) / len(big) if big else None,
        "worst": max(big) if big else None,
    }


def _pct(value: Any, digits: int = 1) -> str:
    return "—" if value is None else f"{100 * value:.{digits}f}%"


def _change(ratio: Any) -> str:
    return "—" if ratio is None else f"{100 * (ratio - 1):+.2f}%"


def _noise_text(run: Run) -> str:
    """A run's repeat noise as the summary states it, or why it is unknown (then counted as 0)."""
    if run.repeat_noise is not None:
        return _pct(run.repeat_noise)
    have = f"{run.sentinels} sentinel measurement{'s' * (run.sentinels != 1)}" if run.sentinels else "no sentinel"
    return f"unknown ({have}; 3 needed), counted as 0"


def point_params(r: Record) -> str:
    """A point's parameters, after its query tokens per request when there are several."""
    label = params_label(r.shown_params())
    return label if r.qo_len == 1 else f"qo={r.qo_label} {label}"


def _check_min_us(min_us: float) -> None:
    if not 0 <= min_us < math.inf:  # nan fails both comparisons
        raise ConfigError(f"--min-us must be a finite number >= 0 µs, got {min_us:g}")


def diff_tables(d: RunDiff, min_us: float = 20.0, show_all: bool = False) -> list[Table]:
    """The diff as tables: a summary per backend, the points (only the significant ones unless
    ``show_all``), the points not compared.  Notes carry the method and the manifests' differences.
    Raises :class:`ConfigError` for a negative ``min_us``."""
    _check_min_us(min_us)
    summary = Table(f"diff: {d.b.path.name} against {d.a.path.name}",
                    ["backend", "points", "geomean_ratio", "significant_slower", "significant_faster",
                     "points_over_min", "within_1pct", "within_2pct", "worst"],
                    styles={"backend": ColumnStyle(no_wrap=True),
                            "points": ColumnStyle(header="n", justify="right"),
                            "geomean_ratio": ColumnStyle(text=_change, header="geomean", justify="right"),
                            "significant_slower": ColumnStyle(header="slower", justify="right"),
                            "significant_faster": ColumnStyle(header="faster", justify="right"),
                            "points_over_min": ColumnStyle(header=f"≥{min_us:g}µs", justify="right"),
                            "within_1pct": ColumnStyle(text=_pct, header="in 1%", justify="right"),
                            "within_2pct": ColumnStyle(show="machine"),
                            "worst": ColumnStyle(text=lambda v: _pct(v, 2), justify="right")})
    for backend in sorted({p.a.backend for p in d.points}):
        summary.rows.append([backend, *agreement([p for p in d.points if p.a.backend == backend], min_us).values()])
    if d.points:
        summary.add_row(["all", *agreement(d.points, min_us).values()], style="bold")
    noise = ", ".join(f"{name} {_noise_text(run)}" for name, run in (("A", d.a), ("B", d.b)))
    summary.notes += [f"A = {d.a.path}, B = {d.b.path}; n points timed in both; geomean: of B median / A median "
                      "(+: B slower)",
                      f"slower / faster: points whose |ln(B/A)| exceeds {Z_CRITICAL:g} x the combined uncertainty "
                      f"of the two medians (their samples' 95% CI, or their visits' spread where larger, and each "
                      f"run's repeat noise from its "
                      f"sentinel: {noise})",
                      f"≥{min_us:g}µs, in 1%, worst: the points whose A median is ≥ {min_us:g} µs, the share "
                      "of them within 1%, the largest |B/A - 1| among them"]
    summary.notes += (d.manifest_notes or ["the two runs were recorded with the same GPU, driver, library versions, "
                                           "revision and settings"]) + [CPU_RUN_NOTE] * (d.a.manifest.on_cpu() or d.b.manifest.on_cpu())
    shown = d.points if show_all else [p for p in d.points if p.significant]
    tables = [summary]
    points = Table("points" if show_all else "points that differ significantly",
                   ["backend", "batch", "context", "params", "a_us", "b_us", "ratio", "z", "significant"],
                   styles={"params": PARAMS, "a_us": ColumnStyle(header="A µs", justify="right"),
                           "b_us": ColumnStyle(header="B µs", justify="right"),
                           "ratio": ColumnStyle(text=_change, header="change", justify="right"),
                           "z": ColumnStyle(justify="right", drop=1),
                           "significant": ColumnStyle(drop=2 if not show_all else 1)})
    points.notes.append("change: B median / A median - 1 (+: B slower; JSON and CSV give the ratio B / A); "
                        f"z: |ln(B/A)| over the combined uncertainty, significant above {Z_CRITICAL:g}")
    for p in shown:
        points.add_row([p.a.backend, p.a.batch, p.a.context_len, point_params(p.a), p.a.stats.median_us,
                        p.b.stats.median_us, p.ratio, p.z, p.significant], style="red" if p.significant else None)
    if show_all or shown:
        tables.append(points)
    if not show_all:
        summary.notes.append(f"{len(shown)} of {len(d.points)} points compared differ significantly"
                             + (" (listed below)" if shown else "") + "; --all lists every point")
    missing = Table("points not compared", ["backend", "batch", "context", "params", "a_status", "b_status"],
                    styles={"params": PARAMS, "a_status": ColumnStyle(header="in A"), "b_status": ColumnStyle(header="in B")})
    rows = [(r, r.status, "absent") for r in d.only_a] + [(r, "absent", r.status) for r in d.only_b]
    rows += [(ra, ra.status, rb.status) for ra, rb in d.untimed]
    for r, sa, sb in rows:
        missing.rows.append([r.backend, r.batch, r.context_len, point_params(r), sa, sb])
    if missing.rows:
        tables.append(missing)
    return tables


def short_revision(revision: str) -> str:
    """A git commit id cut to 12 hex digits (a shorter one whole); anything else
    (``mlabench-0.1.0``, a wheel's version) whole."""
    return revision[:12] if is_commit(revision) else revision
