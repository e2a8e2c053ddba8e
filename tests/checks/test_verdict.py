"""compare_outputs on every path, the limits each dtype gets, the worst of several input sets, and
records written before the relative verdict."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from mlabench.checks.verdict import (
    CheckConfig, ErrorLimits, Verdict, check_config, compare_outputs, unit_roundoff, worst_verdict,
)
from mlabench.errors import ConfigError
from mlabench.records.record import Record

FIXTURE = Path(__file__).parents[1] / "report/fixtures/h200-kimi-k3-tp8/kimi-k3-tp8-20261130-105953-511"
BF16 = ErrorLimits.for_dtypes("bfloat16")


@pytest.fixture
def ref() -> torch.Tensor:
    """A reference of MLA decode's scale: ``[4, 12, 512]`` fp32, RMS about 0.04."""
    return torch.randn(4, 12, 512, generator=torch.Generator().manual_seed(0)) * 0.04


def test_a_correctly_rounded_output_passes_with_its_errors_relative_to_the_reference(ref):
    v = compare_outputs(ref.to(torch.bfloat16), ref)
    assert v.passed and v.shape_ok and v.all_finite and v.output_shape == [4, 12, 512]
    assert v.ref_rms == pytest.approx(float(ref.double().pow(2).mean().sqrt()))
    assert v.rel_rmse == pytest.approx(v.rmse / v.ref_rms) and v.rel_max_err == pytest.approx(v.max_abs_err / v.ref_rms)
    assert 0 < v.rel_rmse < 2**-8 and v.rel_max_err <= 2**-8 * float(ref.abs().max()) / v.ref_rms
    assert (v.rel_rmse_limit, v.rel_max_err_limit) == (2 * 2**-8, 16 * 2**-8)  # limits of bf16, the output's
    assert v.atol is None and v.cosine > 0.9999


@pytest.mark.parametrize("where", [(0, 0, 0), (3, 11, 511), (2, 5, 100)])
def test_nan_anywhere_fails(ref, where):
    out = ref.clone()
    out[where] = math.nan
    v = compare_outputs(out, ref)
    assert not v.passed and not v.all_finite and math.isnan(v.cosine)
    assert v.worst_index == list(where)
    out[where] = math.inf
    assert not compare_outputs(out, ref).all_finite


def test_a_wrong_shape_fails_without_raising(ref):
    v = compare_outputs(ref[:, :11], ref)
    assert not v.passed and not v.shape_ok and v.all_finite and v.output_shape == [4, 11, 512]
    assert math.isnan(v.max_abs_err) and v.rel_rmse is None


def test_one_bad_element_fails_on_the_max_error_while_the_rmse_stays_small(ref):
    out = ref.clone()
    out[1, 7, 300] += 0.1 * v_rms(ref)  # 0.1 of the signal's RMS, in one of 24576 elements
    v = compare_outputs(out, ref, BF16)
    assert v.rel_rmse < BF16.rel_rmse  # averaged away: 0.1 / sqrt(24576)
    assert v.rel_max_err == pytest.approx(0.1, rel=1e-6) and v.rel_max_err > BF16.rel_max_err
    assert not v.passed and v.worst_index == [1, 7, 300]
    out[1, 7, 300] = ref[1, 7, 300] + 0.01 * v_rms(ref)  # below bf16's max-error limit (0.0625)
    assert compare_outputs(out, ref, BF16).passed


@pytest.mark.parametrize("factor, passes", [(1.001, True), (1.005, True), (1.01, False), (1.05, False), (0.95, False)])
def test_a_uniformly_scaled_output_fails_from_1_percent(ref, factor, passes):
    v = compare_outputs(ref * factor, ref, BF16)
    assert v.rel_rmse == pytest.approx(abs(factor - 1), rel=1e-4)  # fp32 products round at ~6e-8
    assert v.passed is passes
    assert compare_outputs(ref * factor, ref, BF16, atol=1e-2, rtol=1e-2).passed is passes  # atol adds nothing here
    assert compare_outputs(ref * 1.05, ref, ErrorLimits(rel_rmse=1, rel_max_err=1), atol=1e-2, rtol=1e-2).passed


def test_the_elementwise_bound_applies_when_given(ref):
    out = ref.clone()
    out[0, 0, 0] += 0.005
    assert compare_outputs(out, ref, ErrorLimits(rel_rmse=1, rel_max_err=1)).passed
    v = compare_outputs(out, ref, ErrorLimits(rel_rmse=1, rel_max_err=1), atol=1e-3, rtol=0.0)
    assert not v.passed and (v.atol, v.rtol) == (1e-3, 0.0)
    wide = ErrorLimits(rel_rmse=1, rel_max_err=1)  # rtol scales with |ref| (about 0.04 here)
    assert compare_outputs(ref * 1.02, ref, wide, atol=1e-9, rtol=0.025).passed
    assert not compare_outputs(ref * 1.05, ref, wide, atol=1e-9, rtol=0.025).passed


def test_a_zero_reference_makes_any_error_infinite():
    zero = torch.zeros(1, 2, 512)
    assert compare_outputs(zero.clone(), zero).passed
    v = compare_outputs(zero + 1e-6, zero)
    assert not v.passed and v.rel_rmse == math.inf


def test_an_error_exactly_at_each_limit_passes(ref):
    """The limits are the largest errors that pass: relative RMSE, normalised max error, atol."""
    out = ref * 1.003
    measured = compare_outputs(out, ref, ErrorLimits(rel_rmse=1, rel_max_err=1))
    at_limits = ErrorLimits(rel_rmse=measured.rel_rmse, rel_max_err=measured.rel_max_err)
    assert compare_outputs(out, ref, at_limits).passed
    assert compare_outputs(out, ref, ErrorLimits(rel_rmse=1, rel_max_err=1), atol=measured.max_abs_err).passed


def test_an_empty_output_has_no_error_and_passes():
    empty = torch.zeros(0, 12, 512)
    v = compare_outputs(empty, empty)
    assert v.passed and (v.max_abs_err, v.rmse, v.ref_rms, v.rel_rmse, v.rel_max_err) == (0, 0, 0, 0, 0)
    assert v.worst_index is None and math.isnan(v.cosine)


def test_limits_follow_the_coarsest_dtype():
    assert unit_roundoff("bfloat16") == 2**-8 and unit_roundoff("float16") == 2**-11
    assert unit_roundoff("float32") == 2**-10  # TF32 dot products, with q and k rounded too
    assert unit_roundoff("bfloat16", "float8_e4m3fn") == 2**-4  # an fp8 cache rounds coarser
    assert ErrorLimits.for_dtypes("float16") == ErrorLimits(rel_rmse=2**-10, rel_max_err=2**-7)
    with pytest.raises(ConfigError, match=r"^no rounding known for dtype 'int8' \(known: float32, bfloat16, "
                                          r"float16, float8_e4m3fn, float8_e5m2\)$"):
        unit_roundoff("int8")
    with pytest.raises(ConfigError, match="^no rounding known for dtype None "):
        unit_roundoff()
    assert CheckConfig(rel_rmse_limit=0.05).limits("bfloat16") == ErrorLimits(rel_rmse=0.05, rel_max_err=2**-4)


def test_the_worst_input_set_decides_and_each_set_is_kept(ref):
    good = compare_outputs(ref.to(torch.bfloat16), ref)
    close = compare_outputs(ref * 1.005, ref, BF16)
    bad = compare_outputs(ref * 1.02, ref, BF16).model_copy(update={"missing": "request 0 token 9 missing"})
    v = worst_verdict({"random": good, "flat": close})
    assert v.passed and v.input_set == "flat" and set(v.by_input_set) == {"random", "flat"}
    v = worst_verdict({"random": good, "needles": bad, "flat": close})
    assert not v.passed and v.input_set == "needles" and v.missing == "request 0 token 9 missing"
    assert v.by_input_set["random"].passed
    again = Verdict.model_validate_json(v.model_dump_json())
    assert again == v
    with pytest.raises(ValueError, match="^no input set was checked$"):
        worst_verdict({})


def test_among_passing_sets_the_one_nearest_its_own_limit_is_shown(ref):
    """Nearness is the relative RMSE over the set's limit: a smaller error under a tight limit is
    worse than a larger one under a loose limit."""
    tight = compare_outputs(ref * 1.004, ref, BF16)  # 0.004 of 0.0078: half the limit
    loose = compare_outputs(ref * 1.005, ref, ErrorLimits(rel_rmse=0.05, rel_max_err=0.5))  # a tenth
    assert tight.passed and loose.passed and tight.rel_rmse < loose.rel_rmse
    assert worst_verdict({"random": loose, "flat": tight}).input_set == "flat"
    exact = compare_outputs(ref, ref, BF16)  # no error at all: the nearest to nothing
    assert exact.rel_rmse == 0 and worst_verdict({"random": exact, "flat": tight}).input_set == "flat"


def test_a_set_with_nan_errors_is_the_worst_of_the_failing_sets(ref):
    bad = compare_outputs(ref * 1.02, ref, BF16)
    nan = ref.clone()
    nan[0, 0, 0] = math.nan
    broken = compare_outputs(nan, ref, BF16)
    assert not bad.passed and math.isnan(broken.rel_rmse)
    assert worst_verdict({"random": bad, "needles": broken}).input_set == "needles"


def test_records_written_before_the_relative_verdict_still_parse():
    line = (FIXTURE / "results.jsonl").read_text().splitlines()[0]
    record = Record.model_validate(json.loads(line))
    v = record.verdict
    assert v.passed and (v.atol, v.rtol) == (0.01, 0.01) and v.rel_rmse is None and v.by_input_set == {}


def test_check_flags_are_checked():
    cfg = check_config(rel_rmse=0.01, input_sets=["random", "needles"])
    assert cfg.rel_rmse_limit == 0.01 and cfg.input_sets == ["random", "needles"] and cfg.atol is None
    assert check_config().input_sets == ["random", "needles", "peaky", "flat"]
    every = check_config(atol=0.02, rtol=0.03, rel_rmse=0.004, rel_max_err=0.05, input_sets=["flat"])
    assert every == CheckConfig(atol=0.02, rtol=0.03, rel_rmse_limit=0.004, rel_max_err_limit=0.05,
                                input_sets=["flat"])  # no flag dropped on the way
    for kw, message in [({"atol": math.nan}, "--atol must be a finite number > 0, got nan"),
                        ({"atol": 0.0}, "--atol must be a finite number > 0"),
                        ({"rtol": -1.0}, "--rtol must be a finite number >= 0"),
                        ({"rel_rmse": math.inf}, "--rel-rmse-limit must be a finite number > 0"),
                        ({"rel_max_err": 0.0}, "--rel-max-err-limit must be a finite number > 0"),
                        ({"input_sets": ["random", "spiky"]},
                         r"^--inputs: unknown input set 'spiky' \(known: random, needles, peaky, flat\)$")]:
        with pytest.raises(ConfigError, match=message):
            check_config(**kw)
    with pytest.raises(ValueError, match=r"unknown input set 'spiky' \(known: random, needles, peaky, flat\)"):
        CheckConfig(input_sets=["spiky"])


def v_rms(x: torch.Tensor) -> float:
    return float(x.double().pow(2).mean().sqrt())
