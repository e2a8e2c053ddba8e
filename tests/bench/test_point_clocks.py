"""A point's record holds the SM clock its recorded timing ran at (issue 35 item 7): the readings
taken while the graph samples ran, or the eager ones where the eager time is recorded."""

from __future__ import annotations

import pytest

from mlabench.bench import shape_bench as point
from mlabench.bench.shape_bench import ShapeBench
from mlabench.device import DeviceInfo
from mlabench.measure.stats import summarize
from mlabench.measure.timing import TimingConfig

GPU = DeviceInfo(kind="cuda", torch_device="cuda", name="stand-in", num_sms=132, l2_bytes=0, arch="sm_90",
                 total_memory_bytes=1)


@pytest.fixture
def bench(monkeypatch):
    """A ShapeBench on a stand-in GPU whose time_calls reads the clock once per sample: 1980 MHz
    in graph samples, 1500 in eager ones."""
    clock = {"mhz": 0}

    def time_calls(calls, cfg, *, use_graph, during=None, device=None):
        clock["mhz"] = 1980 if use_graph else 1500
        for _ in range(3):
            during()
        return summarize([1.0, 1.0, 1.0])

    monkeypatch.setattr(point, "time_calls", time_calls)
    monkeypatch.setattr("mlabench.measure.observers.clock_now", lambda: {"sm_clock_mhz": clock["mhz"]})
    b = ShapeBench.__new__(ShapeBench)
    b.device, b.timing = GPU, TimingConfig()
    return b


def test_the_graph_timings_clocks_are_recorded_not_the_eager_ones(bench):
    out = bench._time([lambda: None], graph_safe=True)
    assert out["mode"] == "graph" and out["clocks"]["sm_clock_mhz"] == 1980 and out["clocks"]["readings"] == 3


def test_an_eager_time_records_the_eager_clocks(bench):
    out = bench._time([lambda: None], graph_safe=False)
    assert out["mode"] == "eager" and out["clocks"] == {"sm_clock_mhz": 1500, "sm_clock_min_mhz": 1500,
                                                       "sm_clock_max_mhz": 1500, "readings": 3}
