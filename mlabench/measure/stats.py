"""One statistics type for timing samples, and the stopping rule's spread estimate.

All values are microseconds; printers format them, nothing here rounds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field


class Stats(BaseModel):
    """Summary of timing samples (µs each), raw samples kept."""

    model_config = ConfigDict(extra="forbid")

    n: int = Field(description="Number of samples.")
    median_us: float = Field(description="Median sample, µs.")
    iqr_us: float = Field(description="Inter-quartile range (p75 - p25), µs.")
    min_us: float = Field(description="Fastest sample, µs.")
    max_us: float = Field(description="Slowest sample, µs.")
    mean_us: float = Field(description="Mean sample, µs.")
    median_rel_ci: float = Field(
        description="Half-width of the 95% confidence interval of the median over the median."
    )
    converged: bool = Field(description="True when median_rel_ci reached the target before the budget.")
    noisy: bool = Field(description="True when the spread stayed above the target (a flag, not a filter).")
    samples_us: list[float] = Field(description="Raw samples in the order taken, µs.")
    calls_per_sample: int | None = Field(
        None, description="Calls one sample held (its time divided by them); None in runs recorded before it was.")
    graph_captures: int | None = Field(
        None, description="Graphs the samples were replayed from in turn; None for eager launches, the CPU "
                          "and runs recorded before it was (one graph).")
    capture_medians_us: list[float] | None = Field(
        None, description="Each graph's own median, µs, in capture order, when the samples came from more than "
                          "one graph (a pooled record: every visit's, visit after visit); None otherwise.")


def quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted, non-empty list (NumPy's default method)."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def median_rel_ci(samples: list[float], z: float = 1.96) -> float:
    """Relative half-width of a distribution-free confidence interval of the median.

    The interval is bounded by the order statistics of rank ``n/2 -+ z*sqrt(n)/2`` (normal
    approximation to the binomial; Conover, *Practical Nonparametric Statistics*, §3.2).  Returns
    ``inf`` for fewer than 3 samples or a non-positive median.
    """
    n = len(samples)
    if n < 3:
        return math.inf
    xs = sorted(samples)
    med = statistics.median(xs)
    if med <= 0:
        return math.inf
    half = z * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n - 1, math.ceil(n / 2 + half) - 1)
    return (xs[hi] - xs[lo]) / 2 / med


def mean_rel_se(values: list[float]) -> float | None:
    """The standard error of the mean of ``values`` over that mean (sample standard deviation /
    sqrt(n) / mean); None with fewer than two values or a mean that is not positive."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / math.sqrt(len(values)) / mean if mean > 0 else None


def geomean(values: list[float]) -> float | None:
    """The geometric mean of positive ``values`` (ratios, µs): None for none, the value itself
    (exactly) for one.  Raises ``ValueError`` for a value <= 0 (outside ``math.log``'s domain)."""
    if not values:
        return None
    return values[0] if len(values) == 1 else math.exp(statistics.fmean(math.log(v) for v in values))


def repeat_noise(medians_us: Sequence[float]) -> float | None:
    """Relative standard deviation of re-measuring one point, from successive medians (µs, in the
    order measured: a sweep's sentinel, :mod:`mlabench.sweep.sentinel`).

    The mean square successive difference of the log medians, halved (von Neumann's estimator: a
    slow drift barely inflates it); None for fewer than 3 medians.
    """
    logs = [math.log(m) for m in medians_us if m > 0]
    if len(logs) < 3:
        return None
    diffs = [(b - a) ** 2 for a, b in zip(logs, logs[1:])]
    return math.sqrt(sum(diffs) / (2 * len(diffs)))


def summarize(samples_us: list[float], target_rel_ci: float = 0.01) -> Stats:
    """Build :class:`Stats` from raw samples; raises ValueError on an empty list."""
    if not samples_us:
        raise ValueError("no samples")
    xs = sorted(samples_us)
    rel = median_rel_ci(samples_us)
    ok = rel <= target_rel_ci
    return Stats(
        n=len(xs), median_us=statistics.median(xs), iqr_us=quantile(xs, 0.75) - quantile(xs, 0.25),
        min_us=xs[0], max_us=xs[-1], mean_us=statistics.fmean(xs), median_rel_ci=rel,
        converged=ok, noisy=not ok, samples_us=list(samples_us),
    )
