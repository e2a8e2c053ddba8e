"""Decode steps predicted from microbenchmarks, beside the steps and TPOT a server measured.

A decode step of an MLA model is the attention kernel once per layer plus everything else (weight
reads of the projections and MLP, norms, sampling, the scheduler).  With ``L`` layers, a kernel's
microbenchmarked time ``a(B, N)`` per layer at batch ``B`` and context ``N``, and the step's
non-attention time ``R(B)``::

    predicted step(variant, N, c) = R(c) + L * a_variant(c, N)

at concurrency ``c`` (the server decodes ``c`` requests a step).  The measured step it is held
against is the mean TPOT at concurrency 1 (every step decodes the one request) and the median
inter-token latency above it: there the mean TPOT also carries the prefill of the other requests
(a request decodes while later ones are prefilled in the same steps), which no decode
microbenchmark sees; the rows show that share of the mean TPOT beside the prediction.
``R`` is measured once per concurrency, from one reference variant at one short input length where
attention is a small share of the step: ``R(c) = step(reference, N_short, c) - L *
a_reference(c, N_short)``; so the reference's prediction at ``N_short`` equals its measurement by
construction, and every other (variant, length) is a true prediction.  The best reference is a
variant whose server calls the microbenchmarked kernel as timed: a backend whose server wrapper
adds work per layer puts that work into every other variant's ``R`` (mlabench's plugin runs the
backend's defaults on vLLM's query halves as they lie: docs/vllm-plugin.md).  What a
gap shows: work around the kernel in the server that the microbenchmark does not time, launch gaps,
and the context growing while it decodes.  Users say microbenchmarks over-promise; the ``error %``
column says by how much.

The spec is the serve config's ``[prediction]`` table (:class:`PredictionSpec`), the attention
times come from sweep run folders (``mlabench sweep``), the measured steps from a serve-bench run.
"""

from __future__ import annotations

import fnmatch
import glob
import re
from dataclasses import dataclass
from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from mlabench.errors import ConfigError, ResultsError
from mlabench.files import validation_line
from mlabench.records.record import Record
from mlabench.tables.table import ColumnStyle, Table

#: ``{env:NAME}`` in a kernel parameter of ``[prediction]``: NAME's value in the variant's launch env.
_ENV_REF = re.compile(r"\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
#: What is left of a launch env reference that is not ``{env:NAME}`` (``{env:}``, ``{Env:X}``,
#: ``{env: X}``, an unclosed ``{env:X``, a shell's ``$X``): refused rather than matched as text.
_BAD_ENV_REF = re.compile(r"\{\s*env|\$\{?[A-Za-z_]", re.IGNORECASE)
#: A parameter value naming a path, with an optional ``word:`` prefix (``device:results/.../policy.json``).
_PATH_VALUE = re.compile(r"([a-z]+:)?([^:]*/[^:]*)")


def value_matches(have: Any, want: Any) -> bool:
    """A record's parameter value ``have`` against a ``[prediction]`` one ``want``, as text where
    ``*`` and ``?`` match as in file names.  A path value also matches the same path written from
    another folder: with one of the two relative, its parts are the other's last parts
    (``device:results/h200/.../policy.json`` matches the ``device:/work/main/results/h200/.../policy.json``
    a sweep recorded run from its checkout, and the other way)."""
    have, want = str(have), str(want)
    if fnmatch.fnmatchcase(have, want):
        return True
    a, b = _PATH_VALUE.fullmatch(have), _PATH_VALUE.fullmatch(want)
    if not (a and b and a[1] == b[1]):
        return False
    have_parts, want_parts = PurePosixPath(a[2]).parts, PurePosixPath(b[2]).parts
    n = min(len(have_parts), len(want_parts))
    if PurePosixPath(a[2] if len(have_parts) == n else b[2]).is_absolute():
        return False  # two absolute paths: the whole text decides
    return all(fnmatch.fnmatchcase(h, w) for h, w in zip(have_parts[-n:], want_parts[-n:]))


class KernelRef(BaseModel):
    """The microbenchmark of the kernel a variant's server runs: a backend and the parameters its
    records must have (values compared by :func:`value_matches`: ``*`` and ``?`` match as in file
    names, e.g. ``split_policy = "device:*"``; ``{env:NAME}`` is the value of NAME in the variant's launch env
    as the serve-bench run recorded it: :meth:`PredictionSpec.of`), with ``by_concurrency`` adding
    or replacing some at one concurrency (a count a captured graph froze differs by batch size)."""

    model_config = ConfigDict(extra="forbid")
    backend: str = Field(description="mlabench backend name, e.g. gluon-splitkv.")
    params: dict[str, Any] = Field(default_factory=dict, description="Parameters a record must match.")
    by_concurrency: dict[int, dict[str, Any]] = Field(
        default_factory=dict, description="Concurrency -> parameters that hold at that concurrency only.")

    def params_at(self, concurrency: int) -> dict[str, Any]:
        """The parameters a record must match at ``concurrency``: ``params`` with ``by_concurrency``'s."""
        return {**self.params, **self.by_concurrency.get(concurrency, {})}

    def matches(self, record: Record, concurrency: int) -> bool:
        """True when ``record`` is this backend with every parameter named for ``concurrency``
        matching."""
        wanted = self.params_at(concurrency)
        return record.backend == self.backend and all(
            name in record.params and value_matches(record.params[name], want) for name, want in wanted.items())


class PredictionSpec(BaseModel):
    """``[prediction]`` of a serve config: ``layers`` (attention calls per decode step), the
    ``reference`` variant and ``short_input_len`` that give the non-attention time, and per
    variant the :class:`KernelRef` of its kernel (variants without one are measured only)."""

    model_config = ConfigDict(extra="forbid")
    layers: int = Field(gt=0, description="MLA layers of the served model (61 for the Kimi K3 proxy).")
    reference: str = Field(description="Variant whose short-context TPOT gives the non-attention time.")
    short_input_len: int = Field(gt=0, description="Input length of that measurement, tokens.")
    kernels: dict[str, KernelRef] = Field(description="Variant name -> the kernel its server runs.")
    _notes: list[str] = PrivateAttr(default_factory=list)

    @classmethod
    def of(cls, table: dict[str, Any] | None, variants: Iterable[str],
           launch_env: Mapping[str, Mapping[str, list[str]]] | None = None, input_lens: Iterable[int] = (),
           concurrencies: Iterable[int] = (), backends: Mapping[str, Iterable[str]] | None = None) -> PredictionSpec:
        """Validate a config's ``[prediction]`` against its ``variants``; :class:`ConfigError`
        (one line) when there is none, it is malformed, its reference is not among ``variants``, a
        kernel names a backend or parameter not in ``backends`` (name -> parameter names:
        :func:`mlabench.backends.backend_params`, when given), or ``short_input_len`` is not among
        ``input_lens`` (the run's or config's input lengths, when given).
        Kernels of variants not among them are left out, with a note: a run of some of a config's
        variants (``serve-bench --variant``) records the config's whole ``[prediction]``, and a
        CONFIG given with ``--from-run`` lends its ``[prediction]`` to a run that may lack some of
        its variants; a note too for a ``by_concurrency`` key not among ``concurrencies``.
        ``launch_env`` (variant -> variable -> values, as
        :func:`~mlabench.serving.run_folder.recorded_launch_env` reads a run) fills ``{env:NAME}``
        in kernel parameters: ``split_policy = "device:{env:MLABENCH_SPLIT_POLICY}"`` reads the
        records of the policy the server ran, not any policy's; :class:`ConfigError` where the run
        recorded no value of NAME for that variant, or several (resumed with another)."""
        if not table:
            raise ConfigError("the serve config has no [prediction] table (layers, reference, "
                              "short_input_len, kernels): nothing says which kernel each variant runs")
        try:
            spec = cls.model_validate(table)
        except ValidationError as exc:
            raise ConfigError(f"[prediction]: {validation_line(exc)}") from None
        variants, input_lens, concurrencies = list(variants), sorted(set(input_lens)), set(concurrencies)
        if spec.reference not in variants:
            raise ConfigError(f"[prediction] reference {spec.reference!r} is no variant of the run or config it "
                              f"is read with (it has {', '.join(variants)})")
        if input_lens and spec.short_input_len not in input_lens:
            raise ConfigError(f"[prediction] short_input_len {spec.short_input_len} is no input length of the run "
                              f"or config it is read with ({', '.join(map(str, input_lens))}): the reference's step "
                              "there gives the non-attention time")
        for name, ref in spec.kernels.items():
            if backends is not None:
                _check_kernel(name, ref, backends)
            spec._notes.extend(f"[prediction] kernels.{name}.by_concurrency {c}: no concurrency {c} runs here "
                               "(unused)" for c in ref.by_concurrency if concurrencies and c not in concurrencies)
        spec._notes.extend(f"[prediction] kernels.{name}: no variant {name} here (left out)"
                           for name in spec.kernels if name not in variants)
        spec.kernels = {name: ref for name, ref in spec.kernels.items() if name in variants}
        if spec.reference not in spec.kernels:
            raise ConfigError(f"[prediction] reference {spec.reference!r} needs an entry in kernels")
        for name, ref in spec.kernels.items():
            spec.kernels[name] = spec._with_launch_env(name, ref, (launch_env or {}).get(name, {}))
        return spec

    def _with_launch_env(self, variant: str, ref: KernelRef, env: Mapping[str, list[str]]) -> KernelRef:
        """``ref`` with each ``{env:NAME}`` in its parameter values replaced by ``variant``'s one
        recorded value of NAME (escaped: matched as it is, not as a pattern); a note for the table
        names each.  :class:`ConfigError` where the run recorded no value or several."""
        def fill(match: re.Match) -> str:
            values = env.get(match.group(1), [])
            if len(values) != 1:
                raise ConfigError(
                    f"[prediction] kernels.{variant} reads {match.group(0)}: " +
                    (f"{variant}'s server ran with {len(values)} values of it across the run's sessions "
                     f"({'; '.join(values)})" if values else
                     f"the run records no {match.group(1)} in {variant}'s launch env (runs before serve-bench "
                     "recorded launch envs record none, or its [variants.launch] env lacks it)") +
                    "; write the value itself instead (a path value may be a pattern, e.g. device:*; with "
                    "--from-run: in a copy of the config, given as CONFIG)")
            self._notes.append(f"{variant}: {match.group(0)} is {values[0]}, as its server was launched")
            return glob.escape(values[0])

        def filled(params: dict[str, Any]) -> dict[str, Any]:
            out = {k: _ENV_REF.sub(fill, v) if isinstance(v, str) else v for k, v in params.items()}
            for k, v in params.items():
                if isinstance(v, str) and _BAD_ENV_REF.search(_ENV_REF.sub("", v)):
                    raise ConfigError(f"[prediction] kernels.{variant} {k} = {v!r}: a launch env value is "
                                      "written {env:NAME}, NAME a variable of the variant's [variants.launch] env")
            return out

        return ref.model_copy(update={"params": filled(ref.params),
                                      "by_concurrency": {c: filled(p) for c, p in ref.by_concurrency.items()}})


def _check_kernel(variant: str, ref: KernelRef, backends: Mapping[str, Iterable[str]]) -> None:
    """:class:`ConfigError` (one line) where ``ref`` names a backend not in ``backends``, or a
    parameter its backend does not take (a typo would only find no record)."""
    if ref.backend not in backends:
        raise ConfigError(f"[prediction] kernels.{variant}: unknown backend {ref.backend!r} "
                          f"(known: {', '.join(backends)})")
    known = tuple(backends[ref.backend])
    for name in [*ref.params, *(k for p in ref.by_concurrency.values() for k in p)]:
        if name not in known:
            raise ConfigError(f"[prediction] kernels.{variant}: {ref.backend} has no parameter {name!r} "
                              f"(it has {', '.join(known) or 'none'})")


def attention_us(records: Iterable[Record], kernel: KernelRef, batch: int, context_len: int) -> float | None:
    """Median µs per call of the fastest correct record of ``kernel`` at ``batch`` one-token
    requests of ``context_len`` tokens; None when no such record exists (a fast wrong answer
    never predicts anything).  Raises :class:`ResultsError` when those records hold several
    shapes (heads, page size, dtypes, MLA widths): the fastest of a 12-head and a 16-head sweep
    is no served model's time, and ``--predict-from`` a folder reads every sweep under it."""
    found = _point_records(records, kernel, batch, context_len)
    shapes = sorted({_shape_words(r) for r in found})
    if len(shapes) > 1:
        raise ResultsError(f"the records of {kernel.backend} at batch {batch}, context {context_len} hold "
                           f"{len(shapes)} shapes ({'; '.join(shapes)}): give --predict-from the sweeps of the "
                           "served shape only")
    return min(r.median_us for r in found) if found else None


def pattern_values(records: Iterable[Record], kernel: KernelRef, batch: int, context_len: int) -> list[str]:
    """What the parameters ``kernel`` names by a pattern (``*`` or ``?``: ``split_policy = "device:*"``)
    held in the correct records :func:`attention_us` reads at this point, the fastest record's first
    (``split_policy=device:.../qo1-k3/.../policy.json``); [] without such a parameter or record.
    More than one: records of several policies matched, and the fastest stands for the served one."""
    wanted = sorted(k for k, v in kernel.params_at(batch).items() if any(c in str(v) for c in "*?"))
    found = sorted(_point_records(records, kernel, batch, context_len) if wanted else [], key=lambda r: r.median_us)
    return list(dict.fromkeys(" ".join(f"{k}={r.params.get(k)}" for k in wanted) for r in found))


def _point_records(records: Iterable[Record], kernel: KernelRef, batch: int, context_len: int) -> list[Record]:
    """The correct, timed one-token records of ``kernel`` at ``batch`` requests of ``context_len`` tokens."""
    return [r for r in records if kernel.matches(r, batch) and r.batch == batch and r.context_len == context_len
            and r.qo_len == 1 and r.status == "ok" and r.median_us is not None]


def _shape_words(record: Record) -> str:
    """A record's shape apart from its lengths, in words (``12 heads, page 64, bfloat16/bfloat16, 512+64``)."""
    s = record.shape
    return (f"{record.num_heads} heads, page {s.get('page_size')}, {s.get('q_dtype')}/{s.get('kv_dtype')}, "
            f"{s.get('kv_lora_rank')}+{s.get('qk_rope_head_dim')}")


def served_attention_us(records: list[Record], kernel: KernelRef, batch: int, input_len: int,
                        output_len: int) -> tuple[float | None, int]:
    """``(µs, context)``: :func:`attention_us` at the middle of the served decode, ``input_len +
    output_len // 2`` tokens (a decode step's context runs from ``input_len + 1`` to ``input_len +
    output_len - 1``, so a split policy's bucket edge at the input length is timed on the side the
    server runs), else at ``input_len`` (sweeps that timed the input lengths themselves)."""
    for context in dict.fromkeys([input_len + output_len // 2, input_len]):
        us = attention_us(records, kernel, batch, context)
        if us is not None:
            return us, context
    return None, input_len + output_len // 2


@dataclass(frozen=True)
class MeasuredStep:
    """What a serve-bench cell measured for one (variant, input length, concurrency), ms: its mean
    TPOT (or the table's statistic), and its decode step (:func:`measured_step`)."""

    tpot_ms: float
    step_ms: float
    step_from: str


def measured_step(concurrency: int, tpot_ms: float, itl_median_ms: float | None) -> MeasuredStep:
    """The decode step a prediction is held against (module docstring): the TPOT at concurrency 1,
    the median inter-token latency above it (the TPOT when the run recorded no ITL)."""
    if concurrency == 1 or itl_median_ms is None:
        return MeasuredStep(tpot_ms, tpot_ms, "TPOT")
    return MeasuredStep(tpot_ms, itl_median_ms, "p50 ITL")


def non_attention_ms(step_ms: float, layers: int, attn_us: float) -> float:
    """``R = step - layers * attention``: the step's time outside attention, ms."""
    return step_ms - layers * attn_us / 1000.0


def predicted_step_ms(rest_ms: float, layers: int, attn_us: float) -> float:
    """``R + layers * attention``, ms (module docstring)."""
    return rest_ms + layers * attn_us / 1000.0


def measured_steps(table: Any, only_len: int) -> dict[tuple[str, int, int], MeasuredStep]:
    """The ok cells of a :class:`mlabench.serving.table.ServeTable` as ``(variant, input_len,
    concurrency) ->`` :class:`MeasuredStep` (the mean TPOT whatever the table's ``stat``: a predicted
    step is a mean one, and the share outside it compares the mean TPOT with the median ITL;
    variants in the table's order, the config's), the input of :func:`prediction_rows`;
    ``only_len`` (tokens) stands for the input length of a run of one length, whose rows have none."""
    return {(c.variant, r.input_len or only_len, r.concurrency): measured_step(r.concurrency, c.tpot_mean_ms,
                                                                               c.itl_median_ms)
            for r in table.rows for c in r.cells if c.status == "ok" and c.tpot_mean_ms}


#: How a row's ``why`` begins where the sweeps hold no correct record of its kernel at its point.
NO_RECORD = "no correct"


def prediction_rows(spec: PredictionSpec, measured: dict[tuple[str, int, int], MeasuredStep],
                    records: list[Record], output_len: int = 0) -> list[dict[str, Any]]:
    """One row per measured (input length, concurrency, variant), by input length and concurrency,
    the variants of each in the order of ``measured`` (the serve config's, from
    :func:`measured_steps`): measured and predicted step (ms), their gap, the TPOT and the share of
    it outside the step (the other requests' prefill at concurrency above 1), the attention µs per
    layer and the share of the step it predicts.  ``measured`` maps ``(variant, input_len,
    concurrency)`` to :class:`MeasuredStep`.  A row's ``predicted`` is None (with ``why``) where a
    record or the reference is missing.  Attention is read at the middle of the decode
    (:func:`served_attention_us`, ``output_len`` the output tokens a request decodes; the row's
    ``attention_context``, None where no record was read: ``why`` names the contexts tried)."""
    rest: dict[int, float | None] = {}
    for conc in sorted({c for _, _, c in measured}):
        ref = measured.get((spec.reference, spec.short_input_len, conc))
        attn, _ = served_attention_us(records, spec.kernels[spec.reference], conc, spec.short_input_len, output_len)
        rest[conc] = None if ref is None or attn is None else non_attention_ms(ref.step_ms, spec.layers, attn)
    rows = []
    for (variant, input_len, conc), got in sorted(measured.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        kernel = spec.kernels.get(variant)
        attn, context = (served_attention_us(records, kernel, conc, input_len, output_len) if kernel
                         else (None, input_len))
        why = ("no kernel named in [prediction]" if kernel is None else
               f"{NO_RECORD} {kernel.backend} record{_params_text(kernel, conc)} at batch {conc}, context "
               f"{context}" + (f" or {input_len}" if context != input_len else "") if attn is None else
               f"no non-attention time at c={conc} ({spec.reference} at {spec.short_input_len})"
               if rest[conc] is None else "")
        pred = None if why else predicted_step_ms(rest[conc], spec.layers, attn)
        matched = pattern_values(records, kernel, conc, context) if kernel and attn is not None else []
        rows.append({"input_len": input_len, "concurrency": conc, "variant": variant,
                     "measured_ms": got.step_ms, "step_from": got.step_from, "predicted_ms": pred,
                     "error_pct": None if pred is None else 100.0 * (pred - got.step_ms) / got.step_ms,
                     "tpot_ms": got.tpot_ms, "outside_step_pct": 100.0 * (got.tpot_ms - got.step_ms) / got.tpot_ms,
                     "attention_us": attn, "attention_context": None if attn is None else context,
                     "attention_share_pct": None if pred is None else 100.0 * spec.layers * attn / 1000.0 / pred,
                     "why": why, "kernel_records": matched})
    return rows


def _params_text(kernel: KernelRef, concurrency: int) -> str:
    """`` with num_kv_splits=256`` for a reason line: the parameters a record had to match, but for
    those it had to hold empty (``split_policy = ""``: "split_policy=" read as a value left out)."""
    wanted = {k: v for k, v in kernel.params_at(concurrency).items() if v != ""}
    return " with " + " ".join(f"{k}={v}" for k, v in wanted.items()) if wanted else ""


def prediction_table(spec: PredictionSpec, rows: list[dict[str, Any]], stat: str = "mean") -> Table:
    """The rows of :func:`prediction_rows` as a table, grouped by input length and concurrency;
    ``stat``, the measured table's TPOT statistic, only gets a note when it is not the mean (the
    prediction holds the mean: :func:`measured_steps`)."""
    columns = ["input_len", "concurrency", "variant", "measured_ms", "step_from", "predicted_ms", "error_pct",
               "tpot_ms", "outside_step_pct", "attention_us", "attention_context", "attention_share_pct"]
    table = Table(
        title=f"decode step measured and predicted ({spec.layers} layers x attention µs + the "
              f"non-attention time of {spec.reference} at {spec.short_input_len} tokens)",
        columns=columns, rows=[[r[c] for c in columns] for r in rows], group_by="input_len",
        styles={"input_len": ColumnStyle(header="input len"),
                "measured_ms": ColumnStyle(header="measured step ms"),
                "step_from": ColumnStyle(header="step from"),
                "predicted_ms": ColumnStyle(header="predicted step ms"),
                "error_pct": ColumnStyle(header="error %", text=lambda v: "—" if v is None else f"{v:.2f}"),
                "tpot_ms": ColumnStyle(header="mean TPOT ms"),
                "outside_step_pct": ColumnStyle(header="TPOT outside step %", text=_pct1),
                "attention_us": ColumnStyle(header="attention µs/layer"),
                "attention_context": ColumnStyle(header="at context"),
                "attention_share_pct": ColumnStyle(header="attention % of step", text=_pct1)})
    table.notes.append(f"error % = (predicted - measured) / measured; at {spec.short_input_len} tokens "
                       f"{spec.reference}'s prediction is its measurement by construction")
    table.notes.append("measured step (\"step from\"): TPOT at concurrency 1, where every step decodes the one "
                       "request; p50 ITL above it, the median inter-token latency over every token of every "
                       "request, the typical decode step; "
                       "TPOT outside step % = (mean TPOT - step) / TPOT: at concurrency above 1 the "
                       "prefill of the other requests, which no decode microbenchmark sees")
    if stat != "mean":
        table.notes.append(f"the prediction holds the mean TPOT and the median ITL, not the {stat} TPOT of the "
                           "table above: a predicted step is a mean one")
    table.notes.extend(dict.fromkeys(f"{r['variant']}: {r['why']}" for r in rows if r["why"]))
    table.notes.extend(dict.fromkeys(spec._notes))
    table.notes.extend(_records_used(rows))
    return table


def _pct1(value: float | None) -> str:
    """A share in % to one decimal (``—`` for none), in every table alike."""
    return "—" if value is None else f"{value:.1f}"


def _records_used(rows: list[dict[str, Any]]) -> list[str]:
    """Notes naming, per variant, the records its [prediction] pattern matched (the points each
    value gave), and where records of several values matched at one point (the fastest was read,
    which need not be the one the server ran: narrow the pattern, or give --predict-from only the
    served one's sweeps)."""
    used: dict[tuple[str, str], list[str]] = {}
    notes = []
    for r in rows:
        if r.get("kernel_records"):
            used.setdefault((r["variant"], r["kernel_records"][0]), []).append(f"{r['input_len']}/c={r['concurrency']}")
        if len(r.get("kernel_records") or []) > 1:
            notes.append(f"{r['variant']} at {r['input_len']} tokens, c={r['concurrency']}: records of "
                         f"{len(r['kernel_records'])} values match ({'; '.join(r['kernel_records'])}); the fastest "
                         "is read, which need not be the served one: narrow [prediction] or --predict-from")
    return [f"{variant} read {value} at {', '.join(points)}" for (variant, value), points in used.items()] + notes
