"""The clock a point's timed samples ran at (issue 35 item 7): read on the host while each timed
GPU sample runs, not after the timing (the GPU idles then) nor before it; a point whose samples ran
below the steady clock is flagged by that reading.  On the CPU, with stand-in events and NVML."""

from __future__ import annotations

import types

import pytest

from mlabench.device import DeviceInfo
from mlabench.measure import observers, timing
from mlabench.measure.observers import ClockSampler, clocks_summary, pooled_clocks
from mlabench.measure.steady import below_steady
from mlabench.measure.timing import TimingConfig, time_calls

GPU = DeviceInfo(kind="cuda", torch_device="cuda", name="stand-in", num_sms=132, l2_bytes=0, arch="sm_90",
                 total_memory_bytes=1)


class FakeGpuTimeline:
    """Stand-in CUDA events and a GPU whose SM clock is 1980 MHz while work is queued and not yet
    waited for, 345 MHz (idle) otherwise; ``log`` holds what happened, in order."""

    def __init__(self):
        self.log: list[str] = []
        self.busy = False
        timeline = self

        class Event:
            def __init__(self, enable_timing=False):
                pass

            def record(self):
                timeline.log.append("record")

            def synchronize(self):
                timeline.log.append("wait")
                timeline.busy = False

            def elapsed_time(self, other):
                return 0.5  # ms

        self.Event = Event

    def step(self):
        self.log.append("replay")
        self.busy = True

    def read(self):
        self.log.append("read")
        return {"sm_clock_mhz": 1980 if self.busy else 345, "power_w": 600.0 if self.busy else 78.0}


@pytest.fixture
def gpu(monkeypatch):
    fake = FakeGpuTimeline()
    monkeypatch.setattr(timing.torch.cuda, "Event", fake.Event)
    monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(timing, "_gpu_step", lambda calls, use_graph: fake.step)
    return fake


def test_the_reading_is_taken_while_the_replay_runs(gpu):
    clocks = ClockSampler(gpu.read)
    timing._event_us(gpu.step, during=clocks)
    assert gpu.log == ["record", "replay", "record", "read", "wait"]
    assert clocks.summary()["sm_clock_mhz"] == 1980  # read after the wait, it was 345: the GPU idles


def test_one_reading_per_timed_sample_none_in_warm_up_or_pilot(gpu):
    cfg = TimingConfig(warmup_iters=2, min_samples=5, max_samples=5, lead_us=0)
    clocks = ClockSampler(gpu.read)
    stats = time_calls([lambda: None], cfg, use_graph=True, device=GPU, during=clocks)
    assert stats.n == 5 and gpu.log.count("read") == 5 and gpu.log.count("replay") == 3 + 2 + 5
    assert clocks.summary() == {"sm_clock_mhz": 1980, "sm_clock_min_mhz": 1980, "sm_clock_max_mhz": 1980,
                                "readings": 5, "power_w": 600.0}


def test_summaries_and_their_pooling_over_visits():
    assert ClockSampler(lambda: {}).summary() == {}  # CPU / unreadable: nothing recorded
    a, b = clocks_summary([1980, 1980, 1500], [500.0, 520.0, 400.0]), clocks_summary([1700])
    assert a == {"sm_clock_mhz": 1980, "sm_clock_min_mhz": 1500, "sm_clock_max_mhz": 1980, "readings": 3,
                 "power_w": 500.0}
    assert pooled_clocks([a, b, {}]) == {"sm_clock_mhz": 1840.0, "sm_clock_min_mhz": 1500,
                                         "sm_clock_max_mhz": 1980, "readings": 4, "power_w": 500.0}
    assert pooled_clocks([{}, {}]) == {}


def test_the_flag_judges_the_clock_while_timing_over_the_idle_readings_around_it():
    idle, busy = {"sm_clock_mhz": 345}, {"sm_clock_mhz": 1980}
    # idle before and after (checks, set-up, the wait), steady while timing: not below steady
    assert below_steady(idle, idle, 1980, during={"sm_clock_mhz": 1980}) is False
    # full clocks around it, throttled while the samples ran: below steady
    assert below_steady(busy, busy, 1980, during={"sm_clock_mhz": 1500, "sm_clock_max_mhz": 1980}) is True
    # records without the reading keep the old rule
    assert below_steady(idle, busy, 1980, during={}) is True
    assert below_steady(idle, idle, None, during={"sm_clock_mhz": 1980}) is None


def test_clock_now_reads_the_measured_gpu_and_is_empty_where_unreadable(monkeypatch):
    nvml = types.SimpleNamespace(NVML_CLOCK_SM=0, nvmlDeviceGetClockInfo=lambda h, c: {"b": 1755}[h],
                                 nvmlDeviceGetPowerUsage=lambda h: 512_500)
    monkeypatch.setattr(observers, "_nvml", lambda: nvml)
    monkeypatch.setattr(observers, "_nvml_handle", lambda: "b")
    monkeypatch.setattr(observers, "current_device", lambda: GPU)
    assert observers.clock_now() == {"sm_clock_mhz": 1755, "power_w": 512.5}
    monkeypatch.setattr(observers, "_nvml_handle", lambda: "a")  # NVML raises: nothing, no exception
    assert observers.clock_now() == {}
    monkeypatch.setattr(observers, "current_device", lambda: DeviceInfo("cpu", "cpu", "cpu", 2, 0, "cpu", 0))
    assert observers.clock_now() == {}
