"""The statistics and the stopping rule to the value: each number worked out by hand here.

The tests in test_stats_timing.py check directions (a wider spread gives a wider interval); these
pin the values, so an off-by-one order statistic, a wrong z or a target ignored in favour of the
default all fail.
"""

import itertools
import math
import statistics

import pytest

from mlabench.measure.stats import geomean, median_rel_ci, quantile, summarize
from mlabench.measure.timing import TimingConfig, run_until_stable


@pytest.mark.parametrize("q, want", [(0.0, 1.0), (0.25, 1.75), (0.5, 3.0), (0.75, 5.0), (1.0, 8.0)])
def test_quantile_interpolates_between_neighbours(q, want):
    # [1, 2, 4, 8]: position q * 3; q=0.5 -> 1.5, half way from 2 to 4
    assert quantile([1.0, 2.0, 4.0, 8.0], q) == want


def test_quantile_is_numpys_default_and_refuses_no_values():
    xs = sorted([3.0, 17.0, 5.5, 9.0, 1.25, 40.0, 2.0])
    p25, _p50, p75 = statistics.quantiles(xs, n=4, method="inclusive")  # the same linear method
    assert quantile(xs, 0.25) == pytest.approx(p25) and quantile(xs, 0.75) == pytest.approx(p75)
    with pytest.raises(ValueError, match="^quantile of no values$"):
        quantile([], 0.5)


@pytest.mark.parametrize("samples, want", [
    # n=3: ranks 1.5 -+ 1.70 -> order statistics 0 and 2 (0-based): (3 - 1) / 2 / 2
    ([1.0, 2.0, 3.0], 0.5),
    # a median below 1 is still a median
    ([0.25, 0.5, 0.75], 0.5),
    # n=10: ranks 5 -+ 3.10 -> x[1] and x[8] (the exact binomial 95% interval of the median of 10
    # is x(2)..x(9), 1-based, too): (9 - 2) / 2 / 5.5
    ([float(v) for v in range(10, 0, -1)], 7 / 11),
    # n=100: ranks 50 -+ 9.8 -> x[40] and x[59]: (60 - 41) / 2 / 50.5
    ([float(v) for v in range(1, 101)], 19 / 101),
])
def test_median_ci_half_width_to_the_value(samples, want):
    assert median_rel_ci(samples) == pytest.approx(want, rel=1e-12)


def test_median_ci_z_is_a_parameter():
    # z = 1: ranks 5 -+ 1.58 -> x[3] and x[6] of 1..10: (7 - 4) / 2 / 5.5
    assert median_rel_ci([float(v) for v in range(1, 11)], z=1.0) == pytest.approx(3 / 11)


@pytest.mark.parametrize("samples", [[1.0, 2.0], [0.0, 0.0, 0.0], [-3.0, -2.0, -1.0]])
def test_median_ci_is_infinite_without_three_samples_or_a_positive_median(samples):
    assert median_rel_ci(samples) == math.inf


def test_summarize_values_and_default_target():
    s = summarize([2.0, 6.0, 4.0, 3.0, 5.0])
    assert (s.n, s.median_us, s.min_us, s.max_us, s.mean_us, s.iqr_us) == (5, 4.0, 2.0, 6.0, 4.0, 2.0)
    assert s.median_rel_ci == 0.5  # n=5: x[0] and x[4]: (6 - 2) / 2 / 4
    assert s.noisy and not s.converged  # the default target is 1%
    assert summarize([2.0, 6.0, 4.0, 3.0, 5.0], target_rel_ci=0.6).converged
    with pytest.raises(ValueError, match="^no samples$"):
        summarize([])


def test_a_spread_exactly_at_the_target_converges_in_both_places():
    """The stopping rule stops at a half-width equal to the target; the flag must agree."""
    samples = [2.0, 3.0, 4.0, 5.0, 6.0]  # half-width exactly 0.5 (binary fractions, no rounding)
    s = summarize(samples, target_rel_ci=0.5)
    assert s.converged and not s.noisy
    cfg = TimingConfig(warmup_iters=0, min_samples=5, max_samples=50, target_rel_ci=0.5, budget_s=1e9)
    stats = run_until_stable(iter(samples * 10).__next__, cfg)
    assert stats.n == 5 and stats.converged and not stats.noisy


def _ten_percent_spread():
    """90 and 110 in turn: two modes 20% apart, so the median's CI spans both however many samples
    are taken (relative half-width 0.1 at an even count, 0.11 at an odd one)."""
    return itertools.cycle([90.0, 110.0]).__next__


def test_stopping_rule_uses_the_configured_target_not_one_percent():
    loose = TimingConfig(warmup_iters=0, min_samples=10, max_samples=60, target_rel_ci=0.3, budget_s=1e9)
    stats = run_until_stable(_ten_percent_spread(), loose)
    assert stats.n == 10 and stats.converged and not stats.noisy
    assert stats.median_rel_ci == pytest.approx(0.1)
    tight = loose.model_copy(update={"target_rel_ci": 0.05})
    stats = run_until_stable(_ten_percent_spread(), tight)
    assert stats.n == 60 and stats.noisy and not stats.converged  # ran to max_samples, flagged


def test_budget_counts_from_the_first_timed_sample():
    """Warm-ups are not timed samples: a budget of 1 s with a 0.25 s clock step allows 5 samples."""
    ticks = itertools.count()
    cfg = TimingConfig(warmup_iters=3, min_samples=3, max_samples=100, target_rel_ci=1e-9, budget_s=1.0)
    stats = run_until_stable(_ten_percent_spread(), cfg, clock=lambda: 1000.0 + next(ticks) * 0.25)
    # clock read at the start (t0) and after samples 3, 4, ...: t0 + 0.25, 0.5, 0.75, 1.0 -> stop at 6
    assert stats.n == 6 and stats.noisy


def test_geomean_of_none_one_and_several_values():
    """The one ``geomean`` (issue 36: diff and tune each had one): None for none, a single value
    exactly (tune's choice compares it with the value itself), the n-th root of the product."""
    assert geomean([]) is None
    assert geomean([0.1]) == 0.1
    assert geomean([2.0, 8.0]) == pytest.approx(4.0, rel=1e-15)
    assert geomean([1.1, 1.25]) == pytest.approx((1.1 * 1.25) ** 0.5, rel=1e-15)
    with pytest.raises(ValueError):
        geomean([1.0, 0.0])
