import itertools
import math
import random

import pytest

from mlabench.device import DeviceInfo
from mlabench.measure.stats import median_rel_ci, quantile, summarize
from mlabench.measure.timing import TimingConfig, cold_cache_copies, run_until_stable, time_calls


def test_summary_statistics():
    s = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.n, s.median_us, s.min_us, s.max_us, s.mean_us) == (5, 3.0, 1.0, 5.0, 3.0)
    assert s.iqr_us == pytest.approx(2.0)  # p75 4 - p25 2
    assert s.samples_us == [5.0, 1.0, 3.0, 2.0, 4.0]  # raw order kept
    assert quantile([1.0, 2.0], 0.5) == 1.5


def test_median_ci_shrinks_with_samples_and_noise():
    rng = random.Random(0)
    tight = [100 + rng.gauss(0, 0.5) for _ in range(200)]
    loose = [100 + rng.gauss(0, 20) for _ in range(200)]
    assert median_rel_ci(tight) < 0.002 < median_rel_ci(loose)
    assert median_rel_ci(tight[:20]) > median_rel_ci(tight)
    assert median_rel_ci([1.0, 2.0]) == math.inf


def test_stopping_rule_stops_early_on_stable_samples():
    rng = random.Random(1)
    calls = []
    cfg = TimingConfig(warmup_iters=4, min_samples=10, max_samples=500, target_rel_ci=0.01)
    stats = run_until_stable(lambda: calls.append(1) or 50 + rng.random() * 0.1, cfg)
    assert stats.n == 10 and stats.converged and not stats.noisy
    assert len(calls) == 14  # 4 warm-ups discarded


def test_stopping_rule_flags_noisy_points_at_the_budget():
    rng = random.Random(2)
    ticks = itertools.count()
    clock = lambda: next(ticks) * 0.1  # noqa: E731 - each call advances 0.1 s
    cfg = TimingConfig(warmup_iters=0, min_samples=5, max_samples=1000, target_rel_ci=0.001, budget_s=2.0)
    stats = run_until_stable(lambda: rng.choice([10.0, 30.0]), cfg, clock=clock)
    assert stats.noisy and not stats.converged
    assert 5 <= stats.n <= 25  # stopped by the 2 s budget, not max_samples


def test_stopping_rule_respects_max_samples():
    rng = random.Random(3)
    cfg = TimingConfig(warmup_iters=0, min_samples=3, max_samples=7, target_rel_ci=1e-9, budget_s=1e9)
    assert run_until_stable(lambda: rng.random() + 1, cfg).n == 7


def test_cold_cache_copies():
    gpu = DeviceInfo("cuda", "cuda", "H200", 132, 60 * 2**20, "sm_90", 0)
    cpu = DeviceInfo("cpu", "cpu", "cpu", 2, 0, "cpu", 0)
    cfg = TimingConfig()
    assert cold_cache_copies(2**20, gpu, cfg) == 64  # capped at max_copies
    assert cold_cache_copies(10 * 2**20, gpu, cfg) == 12  # ceil(120 / 10)
    assert cold_cache_copies(2**31, gpu, cfg) == 4  # at least min_copies, each its own allocation
    assert cold_cache_copies(2**31, gpu, TimingConfig(min_copies=1)) == 1
    assert cold_cache_copies(2**20, cpu, cfg) == 1
    assert cold_cache_copies(2**20, gpu, TimingConfig(cold_cache=False)) == 1
    unknown_l2 = DeviceInfo("cuda", "cuda", "H200", 132, 0, "sm_90", 0)
    assert cold_cache_copies(2**20, unknown_l2, cfg) == 1  # no L2 size: no rotation, not min_copies


def test_wall_clock_timing_on_cpu_divides_by_copies():
    import time

    cpu = DeviceInfo("cpu", "cpu", "cpu", 2, 0, "cpu", 0)
    cfg = TimingConfig(warmup_iters=1, min_samples=5, max_samples=5)
    one = lambda: time.sleep(0.002)  # noqa: E731
    stats = time_calls([one, one, one, one], cfg, use_graph=False, device=cpu)
    assert 1800 < stats.median_us < 20000  # per call, not per pass of four
    assert stats.calls_per_sample == 4  # the record says how many calls each sample held
    assert stats.graph_captures is None  # no graph on the CPU, whatever graph_captures says
    assert time_calls([one], cfg.model_copy(update={"graph_captures": 4}), use_graph=True,
                      device=cpu).graph_captures is None


def test_cpu_timing_runs_on_a_set_thread_count_and_gives_it_back():
    """Issue 25 item 11: under load the CPU sweep's medians came out as multiples of ~4 ms with
    torch's default threads; with one thread two runs agreed.  The CPU path sets torch's threads
    (``cpu_threads``, default 1) while it times, and restores them after."""
    import torch

    cpu = DeviceInfo("cpu", "cpu", "cpu", 2, 0, "cpu", 0)
    seen = []
    before = torch.get_num_threads()
    cfg = TimingConfig(warmup_iters=0, min_samples=3, max_samples=3)
    assert cfg.cpu_threads == 1
    time_calls([lambda: seen.append(torch.get_num_threads())], cfg, use_graph=False, device=cpu)
    assert set(seen) == {1} and torch.get_num_threads() == before
    seen.clear()
    time_calls([lambda: seen.append(torch.get_num_threads())], cfg.model_copy(update={"cpu_threads": 2}),
               use_graph=False, device=cpu)
    assert set(seen) == {2} and torch.get_num_threads() == before
