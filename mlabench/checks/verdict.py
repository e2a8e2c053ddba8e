"""Correctness verdict of one backend output against the fp32 reference, and its limits.

An output passes when its shape is the reference's, every element is finite, and its error relative
to the reference's own scale is within limits derived from the dtypes' rounding:

- relative RMSE: ``rms(out - ref) / rms(ref)``;
- normalised max error: ``max |out - ref| / rms(ref)`` (one bad element, or one request or head
  gone wrong among many, shows here while the RMSE averages it away).

Why relative: MLA decode outputs have a mean magnitude of about 0.04 at any context length, so an
absolute bound such as ``atol = rtol = 1e-2`` accepts errors of a quarter of the signal (a softmax
scale off by 5%, or a split merge that averages partials, passed it).

The limits are ``REL_RMSE_ROUNDINGS`` (2) and ``REL_MAX_ROUNDINGS`` (16) times the unit roundoff
``u`` of the coarsest dtype the kernel computes in (:func:`unit_roundoff`); bf16: 0.0078 and
0.0625.  A correct kernel rounds its softmax weights once before the value product and its output
once; measured on every input set it sits at a relative RMSE of about 0.45 u and a normalised max
error of 2-3 u (bf16: 0.0017-0.0020 and 0.008-0.011).  Broken split-KV kernels measured the same
way (bf16, 12 heads, 16 splits, 4096 / 32768 tokens, random inputs): a softmax scale off by
1% gives 0.011 / 0.010, by 5% 0.056 / 0.051; dropping the last 1/16 of the context 0.13 / 0.056;
an averaging merge 0.042 / 0.0063 (caught at 32768 tokens only by the needle inputs, at 0.34).
Every input set's numbers, and the reasons for these limits: ``docs/correctness.md``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from mlabench.errors import ConfigError

if TYPE_CHECKING:  # torch is imported where outputs are compared, so reading results needs none
    import torch

#: Unit roundoff ``u`` (half the machine epsilon: the largest relative error of one rounding) of
#: the dtypes a kernel computes in.  float32 counts as TF32 (10 stored mantissa bits, the input
#: precision of fp32 dot products on NVIDIA tensor cores, Triton's default for fp32 ``tl.dot``),
#: doubled to 2^-10: TF32 rounds q and k too, and the softmax scale amplifies that score error
#: (simulated at DeepSeek-V3's scale 0.135, 32768 tokens: relative RMSE 0.0007, normalised max
#: error 0.0072, i.e. 0.7 u and 7 u of this u).  The fp8 entries are for fp8 latent caches (not
#: supported yet), whose kernels also round softmax weights to fp8.
UNIT_ROUNDOFF = {
    "float32": 2.0**-10,
    "bfloat16": 2.0**-8,
    "float16": 2.0**-11,
    "float8_e4m3fn": 2.0**-4,
    "float8_e5m2": 2.0**-3,
}
#: Relative RMSE limit in units of u: a correct kernel sits near 0.45 u, a 1% scale error in bf16 at 2.8 u.
REL_RMSE_ROUNDINGS = 2.0
#: Normalised max-error limit in units of u: a correct kernel's largest element error is 2-3 u of
#: the reference's RMS (one rounding of an element several RMS large).
REL_MAX_ROUNDINGS = 16.0
#: Input sets every verdict is taken on (see :mod:`mlabench.checks.input_sets`).
INPUT_SETS = ("random", "needles", "peaky", "flat")


def unit_roundoff(*dtypes: str) -> float:
    """The largest ``u`` of ``dtypes`` (names as in :class:`MLADecodeShape`: ``"bfloat16"``...).

    Raises :class:`ConfigError` for a dtype not in :data:`UNIT_ROUNDOFF`.
    """
    unknown = [d for d in dtypes if d not in UNIT_ROUNDOFF]
    if unknown or not dtypes:
        raise ConfigError(f"no rounding known for dtype {unknown[0] if unknown else None!r} "
                          f"(known: {', '.join(UNIT_ROUNDOFF)})")
    return max(UNIT_ROUNDOFF[d] for d in dtypes)


class ErrorLimits(BaseModel):
    """The relative-error limits one verdict applies."""

    model_config = ConfigDict(extra="forbid")
    rel_rmse: float = Field(gt=0, description="Largest relative RMSE that passes.")
    rel_max_err: float = Field(gt=0, description="Largest normalised max error that passes.")

    @classmethod
    def for_dtypes(cls, *dtypes: str) -> ErrorLimits:
        """Limits from the coarsest of ``dtypes`` (output, cache): ``REL_*_ROUNDINGS * u``."""
        u = unit_roundoff(*dtypes)
        return cls(rel_rmse=REL_RMSE_ROUNDINGS * u, rel_max_err=REL_MAX_ROUNDINGS * u)


class CheckConfig(BaseModel):
    """How outputs are checked (a sweep's ``[check]`` table, or ``check``'s flags).

    The relative limits default to the dtypes' (:meth:`ErrorLimits.for_dtypes`).  ``atol`` /
    ``rtol``, when given, add the elementwise test ``|out - ref| <= atol + rtol * |ref|`` (sweep
    files written before the relative verdict set both to 1e-2).
    """

    model_config = ConfigDict(extra="forbid", strict=True)  # as SweepConfig
    rel_rmse_limit: float | None = Field(None, gt=0,
                                         description="Relative RMSE limit; None: from the dtypes.")
    rel_max_err_limit: float | None = Field(None, gt=0,
                                            description="Normalised max-error limit; None: from the dtypes.")
    input_sets: list[str] = Field(list(INPUT_SETS), min_length=1,
                                  description="Verification input sets: random, needles, peaky, flat.")
    atol: float | None = Field(None, gt=0, description="Elementwise absolute tolerance (optional).")
    rtol: float | None = Field(None, ge=0, description="Elementwise relative tolerance (optional).")

    def limits(self, *dtypes: str) -> ErrorLimits:
        """The limits for outputs of ``dtypes``: the given ones, the dtypes' otherwise."""
        base = ErrorLimits.for_dtypes(*dtypes)
        return ErrorLimits(rel_rmse=self.rel_rmse_limit or base.rel_rmse,
                           rel_max_err=self.rel_max_err_limit or base.rel_max_err)

    def model_post_init(self, _context: object) -> None:
        unknown = [s for s in self.input_sets if s not in INPUT_SETS]
        if unknown:
            raise ValueError(f"unknown input set {unknown[0]!r} (known: {', '.join(INPUT_SETS)})")


def check_config(atol: float | None = None, rtol: float | None = None, rel_rmse: float | None = None,
                 rel_max_err: float | None = None, input_sets: list[str] | None = None) -> CheckConfig:
    """A :class:`CheckConfig` from flags, checked: each given number finite and > 0 (``rtol`` >= 0).

    Raises :class:`ConfigError` naming the flag and the bad value, ``rtol`` without ``atol`` (it
    only widens the ``atol`` bound), or an unknown input set.
    """
    for flag, value, positive in (("--atol", atol, True), ("--rtol", rtol, False),
                                  ("--rel-rmse-limit", rel_rmse, True),
                                  ("--rel-max-err-limit", rel_max_err, True)):
        if value is not None and (not math.isfinite(value) or value < 0 or (positive and value == 0)):
            raise ConfigError(f"{flag} must be a finite number {'> 0' if positive else '>= 0'}, got {value}")
    if rtol is not None and atol is None:  # the bound is atol + rtol |ref|: rtol alone would go unused
        raise ConfigError("--rtol needs --atol (the bound is |out - ref| <= atol + rtol |ref|)")
    unknown = [s for s in input_sets or [] if s not in INPUT_SETS]
    if unknown:
        raise ConfigError(f"--inputs: unknown input set {unknown[0]!r} (known: {', '.join(INPUT_SETS)})")
    return CheckConfig(atol=atol, rtol=rtol, rel_rmse_limit=rel_rmse, rel_max_err_limit=rel_max_err,
                       input_sets=list(input_sets or INPUT_SETS))


class Verdict(BaseModel):
    """How one output compares with the reference (all errors on the float64 difference).

    A point's verdict is that of its worst input set (``input_set``), with every set's own verdict
    under ``by_input_set``.  Records written before the relative verdict carry ``atol``/``rtol``
    and none of the relative fields.
    """

    model_config = ConfigDict(extra="forbid")

    passed: bool = Field(description="Shape right, all finite, relative errors within their limits "
                                     "(and |out - ref| <= atol + rtol * |ref| where atol is set).")
    shape_ok: bool = Field(description="Output shape equals the reference shape.")
    all_finite: bool = Field(description="No NaN (e.g. an unwritten poisoned element) or Inf.")
    max_abs_err: float = Field(description="max |out - ref|.")
    rmse: float = Field(description="sqrt(mean((out - ref)^2)).")
    cosine: float = Field(description="Cosine similarity of the flattened out and ref.")
    atol: float | None = Field(None, description="Elementwise absolute tolerance used, if any.")
    rtol: float | None = Field(None, description="Elementwise relative tolerance used, if any.")
    output_shape: list[int] = Field(description="Shape of the output checked.")
    ref_rms: float | None = Field(None, description="sqrt(mean(ref^2)), the scale errors are relative to.")
    rel_rmse: float | None = Field(None, description="rmse / ref_rms.")
    rel_max_err: float | None = Field(None, description="max_abs_err / ref_rms (normalised max error).")
    rel_rmse_limit: float | None = Field(None, description="Relative RMSE limit applied.")
    rel_max_err_limit: float | None = Field(None, description="Normalised max-error limit applied.")
    worst_index: list[int] | None = Field(None, description="[request, head, column] of max |out - ref|.")
    input_set: str | None = Field(None, description="Input set these numbers come from.")
    missing: str = Field("", description="Which needle tokens the output lacks or counts twice, where known.")
    by_input_set: dict[str, Verdict] = Field(default_factory=dict, description="Verdict per input set.")


def compare_outputs(out: torch.Tensor, ref: torch.Tensor, limits: ErrorLimits | None = None,
                    atol: float | None = None, rtol: float | None = None) -> Verdict:
    """Compare ``out`` with ``ref`` (both ``[B, H, 512]``; any float dtype, any device).

    ``limits`` default to those of ``out``'s dtype (:meth:`ErrorLimits.for_dtypes`).  A shape
    mismatch gives a failed verdict with NaN errors rather than raising; a reference that is all
    zeros makes any nonzero error infinite.  ``atol`` given adds ``torch.allclose``'s elementwise
    rule ``|out - ref| <= atol + rtol * |ref|`` (``rtol`` None counts as 0).
    """
    import torch

    limits = limits or ErrorLimits.for_dtypes(str(out.dtype).removeprefix("torch."))
    shape = list(out.shape)
    common = dict(atol=atol, rtol=rtol, output_shape=shape, rel_rmse_limit=limits.rel_rmse,
                  rel_max_err_limit=limits.rel_max_err)
    if out.shape != ref.shape:
        nan = float("nan")
        return Verdict(passed=False, shape_ok=False, all_finite=bool(torch.isfinite(out).all()),
                       max_abs_err=nan, rmse=nan, cosine=nan, **common)
    o = out.detach().double()
    r = ref.detach().double().to(o.device)
    finite = bool(torch.isfinite(o).all())
    diff = (o - r).abs()
    n = diff.numel()
    max_abs = float(diff.max()) if n else 0.0
    rmse = float(diff.pow(2).mean().sqrt()) if n else 0.0
    ref_rms = float(r.pow(2).mean().sqrt()) if n else 0.0
    cos = (float(torch.nn.functional.cosine_similarity(o.flatten(), r.flatten(), dim=0))
           if finite and n else math.nan)
    rel_rmse, rel_max = _relative(rmse, ref_rms), _relative(max_abs, ref_rms)
    worst = [int(i) for i in torch.unravel_index(diff.nan_to_num(math.inf).argmax(), diff.shape)] if n else None
    within = finite and rel_rmse <= limits.rel_rmse and rel_max <= limits.rel_max_err
    if within and atol is not None:
        within = bool((diff <= atol + (rtol or 0.0) * r.abs()).all())
    return Verdict(passed=within, shape_ok=True, all_finite=finite, max_abs_err=max_abs, rmse=rmse,
                   cosine=cos, ref_rms=ref_rms, rel_rmse=rel_rmse, rel_max_err=rel_max,
                   worst_index=worst, **common)


def _relative(err: float, scale: float) -> float:
    if math.isnan(err):
        return math.nan
    if scale > 0:
        return err / scale
    return 0.0 if err == 0 else math.inf


def worst_verdict(by_input_set: dict[str, Verdict]) -> Verdict:
    """One verdict for a point checked on several input sets: the first failing set's numbers
    (else the set closest to its relative-RMSE limit), passed only if every set passed, each set's
    own verdict kept under ``by_input_set``.  Raises ValueError when empty."""
    if not by_input_set:
        raise ValueError("no input set was checked")

    def badness(item: tuple[str, Verdict]) -> tuple[bool, float]:
        v = item[1]
        ratio = (v.rel_rmse or 0.0) / (v.rel_rmse_limit or 1.0)
        return (not v.passed, ratio if not math.isnan(ratio) else math.inf)

    name, worst = max(by_input_set.items(), key=badness)
    return worst.model_copy(update={"passed": all(v.passed for v in by_input_set.values()),
                                    "input_set": name, "by_input_set": dict(by_input_set)})


Verdict.model_rebuild()
