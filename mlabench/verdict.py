"""Correctness verdict of one backend output against the fp32 reference, and its tolerances."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from mlabench.errors import ConfigError

if TYPE_CHECKING:  # torch is imported where outputs are compared, so reading results needs none
    import torch

DEFAULT_ATOL = 1e-2
DEFAULT_RTOL = 1e-2


class CheckConfig(BaseModel):
    """Tolerances of the correctness check (a sweep's ``[check]`` table, or ``check``'s flags):
    an output passes when ``|out - ref| <= atol + rtol * |ref|`` everywhere."""

    model_config = ConfigDict(extra="forbid")
    atol: float = Field(DEFAULT_ATOL, gt=0, description="Absolute tolerance.")
    rtol: float = Field(DEFAULT_RTOL, ge=0, description="Relative tolerance.")


def check_config(atol: float, rtol: float) -> CheckConfig:
    """Tolerances given as flags, checked: ``atol`` finite and > 0, ``rtol`` finite and >= 0.

    Raises :class:`ConfigError` naming the flag (``--atol`` / ``--rtol``) and the bad value.
    """
    for flag, tol, positive in (("--atol", atol, True), ("--rtol", rtol, False)):
        if not math.isfinite(tol) or tol < 0 or (positive and tol == 0):
            raise ConfigError(f"{flag} must be a finite number {'> 0' if positive else '>= 0'}, got {tol}")
    return CheckConfig(atol=atol, rtol=rtol)


class Verdict(BaseModel):
    """How one output compares with the reference (all errors on the float32 difference)."""

    model_config = ConfigDict(extra="forbid")

    passed: bool = Field(description="Shape right, all finite, and |out - ref| <= atol + rtol * |ref| everywhere.")
    shape_ok: bool = Field(description="Output shape equals the reference shape.")
    all_finite: bool = Field(description="No NaN (e.g. an unwritten poisoned element) or Inf.")
    max_abs_err: float = Field(description="max |out - ref|.")
    rmse: float = Field(description="sqrt(mean((out - ref)^2)).")
    cosine: float = Field(description="Cosine similarity of the flattened out and ref.")
    atol: float = Field(description="Absolute tolerance used.")
    rtol: float = Field(description="Relative tolerance used.")
    output_shape: list[int] = Field(description="Shape of the output checked.")


def compare_outputs(out: torch.Tensor, ref: torch.Tensor, atol: float = DEFAULT_ATOL,
                    rtol: float = DEFAULT_RTOL) -> Verdict:
    """Compare ``out`` with ``ref`` (both ``[B, H, 512]``; any float dtype, any device).

    The tolerance rule is ``torch.allclose``'s: ``|out - ref| <= atol + rtol * |ref|``.  A shape
    mismatch gives a failed verdict with NaN errors rather than raising.
    """
    import torch

    shape = list(out.shape)
    if out.shape != ref.shape:
        nan = float("nan")
        return Verdict(passed=False, shape_ok=False, all_finite=bool(torch.isfinite(out).all()),
                       max_abs_err=nan, rmse=nan, cosine=nan, atol=atol, rtol=rtol, output_shape=shape)
    o = out.detach().float()
    r = ref.detach().float().to(o.device)
    finite = bool(torch.isfinite(o).all())
    diff = (o - r).abs()
    max_abs = float(diff.max()) if diff.numel() else 0.0
    rmse = float(diff.pow(2).mean().sqrt()) if diff.numel() else 0.0
    cos = float(torch.nn.functional.cosine_similarity(o.flatten(), r.flatten(), dim=0)) if finite else float("nan")
    within = bool((diff <= atol + rtol * r.abs()).all()) if finite else False
    return Verdict(passed=finite and within, shape_ok=True, all_finite=finite, max_abs_err=max_abs,
                   rmse=rmse, cosine=cos, atol=atol, rtol=rtol, output_shape=shape)
