"""Steady state before measuring (issue 13 item 1), with a stand-in clock, load and reader."""

import itertools

from mlabench.measure.steady import below_steady, is_steady, wait_until_steady


class FakeGpu:
    """A GPU whose SM clock ramps from idle (375 MHz) to 1980 MHz over ``ramp_s`` seconds of load,
    and whose power settles with it; each burst of load takes 0.1 s of the stand-in clock."""

    def __init__(self, ramp_s=3.0, jitter_mhz=0.0):
        self.t, self.ramp_s, self.jitter = 0.0, ramp_s, itertools.cycle([0.0, jitter_mhz, -jitter_mhz])
        self.bursts = 0

    def clock(self):
        return self.t

    def work(self):
        self.t += 0.1
        self.bursts += 1

    def read(self):
        frac = min(1.0, self.t / self.ramp_s) if self.ramp_s else 1.0
        return {"sm_clock_mhz": 375 + frac * (1980 - 375) + next(self.jitter), "power_w": 90 + frac * 400,
                "temperature_c": 30 + 10 * frac}


def test_waits_for_the_clock_to_settle_then_stops():
    gpu = FakeGpu(ramp_s=3.0)
    s = wait_until_steady(gpu.work, gpu.read, min_s=1.0, max_s=30.0, clock=gpu.clock, window_s=2.0)
    assert s.steady is True and "steady after" in s.reason
    assert 5.0 <= s.elapsed_s <= 5.2  # the ramp (3 s) plus a full 2 s window of steady readings
    assert s.sm_clock_mhz == 1980 and s.power_w == 490 and s.readings == gpu.bursts


def test_gives_up_at_the_time_limit_and_says_so():
    gpu = FakeGpu(ramp_s=100.0)  # still ramping when the limit passes
    s = wait_until_steady(gpu.work, gpu.read, min_s=1.0, max_s=10.0, clock=gpu.clock)
    assert s.steady is False and "time limit" in s.reason and 10.0 <= s.elapsed_s < 10.2


def test_small_jitter_is_steady_and_the_minimum_time_is_kept():
    gpu = FakeGpu(ramp_s=0.0, jitter_mhz=7.0)  # +-7 MHz around 1980: a 0.7% spread
    s = wait_until_steady(gpu.work, gpu.read, min_s=5.0, max_s=30.0, clock=gpu.clock)
    assert s.steady is True and 5.0 <= s.elapsed_s < 5.2


def test_unreadable_clocks_run_the_minimum_and_say_so():
    gpu = FakeGpu()
    s = wait_until_steady(gpu.work, lambda: {}, min_s=2.0, max_s=3.0, clock=gpu.clock)
    assert s.steady is None and "not readable" in s.reason and s.readings == 0


def test_is_steady_needs_three_readings_and_a_settled_power():
    steady = [{"sm_clock_mhz": 1980, "power_w": 450}] * 3
    assert is_steady(steady) and not is_steady(steady[:2])
    assert not is_steady(steady[:2] + [{"sm_clock_mhz": 1980, "power_w": 600}])
    assert not is_steady(steady[:2] + [{"sm_clock_mhz": 1700, "power_w": 450}])


def test_a_point_below_the_steady_clock_is_flagged():
    assert below_steady({"sm_clock_mhz": 1980}, {"sm_clock_mhz": 1980}, 1980) is False
    assert below_steady({"sm_clock_mhz": 1500}, {"sm_clock_mhz": 1980}, 1980) is True
    assert below_steady({}, {"sm_clock_mhz": 1950}, 1980) is True  # more than 1% below
    assert below_steady({}, {}, 1980) is None and below_steady({"sm_clock_mhz": 1}, {}, None) is None
