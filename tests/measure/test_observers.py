"""gpu_state() through a stand-in NVML: the GPU torch calls cuda:0, throttle counters, no raising."""

from __future__ import annotations

import types

import pytest

from mlabench.device import DeviceInfo
from mlabench.measure import observers

GPU = DeviceInfo(kind="cuda", torch_device="cuda", name="stand-in", num_sms=132, l2_bytes=0, arch="sm_90",
                 total_memory_bytes=1)


def fake_nvml(*, uuid_ok: bool = True, violations: bool = True, reasons: str = "event") -> types.SimpleNamespace:
    """An NVML with two GPUs: index 0 reads 1980 MHz, the one with UUID GPU-bbb 1755 MHz."""
    handles = {"idx0": 1980, "uuid-b": 1755}

    def by_uuid(uuid: str) -> str:
        if not uuid_ok or uuid != "GPU-bbb":
            raise RuntimeError("not found")
        return "uuid-b"

    def violation(h, policy):
        if not violations:
            raise RuntimeError("not supported")
        return types.SimpleNamespace(violationTime={0: 1_000, 1: 20}[policy] + (5 if h == "uuid-b" else 0))

    nvml = types.SimpleNamespace(
        NVML_CLOCK_SM=0, NVML_CLOCK_MEM=1, NVML_TEMPERATURE_GPU=0, NVML_PERF_POLICY_POWER=0,
        NVML_PERF_POLICY_THERMAL=1,
        nvmlDeviceGetHandleByUUID=by_uuid, nvmlDeviceGetHandleByIndex=lambda i: "idx0",
        nvmlDeviceGetClockInfo=lambda h, c: handles[h] if c == 0 else 3201,
        nvmlDeviceGetTemperature=lambda h, t: 40, nvmlDeviceGetPowerUsage=lambda h: 512_500,
        nvmlDeviceGetTotalEnergyConsumption=lambda h: 123_456, nvmlDeviceGetViolationStatus=violation)
    if reasons == "event":
        nvml.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x4
    elif reasons == "throttle":  # drivers before the rename
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x20
    return nvml


@pytest.fixture
def use(monkeypatch):
    def install(nvml, uuid: str = "bbb") -> None:
        observers._nvml_handle.cache_clear()
        monkeypatch.setattr(observers, "_nvml", lambda: nvml)
        monkeypatch.setattr(observers, "current_device", lambda: GPU)
        monkeypatch.setattr("torch.cuda.get_device_properties", lambda i: types.SimpleNamespace(uuid=uuid))
    yield install
    observers._nvml_handle.cache_clear()


def test_reads_the_gpu_torch_sees_not_the_hosts_first(use):
    use(fake_nvml())
    s = observers.gpu_state()
    assert s["sm_clock_mhz"] == 1755 and s["mem_clock_mhz"] == 3201 and s["power_w"] == 512.5
    assert s["power_violation_ns"] == 1_005 and s["thermal_violation_ns"] == 25
    assert s["clocks_event_reasons"] == 0x4 and s["energy_mj"] == 123_456
    assert isinstance(s["at_s"], float)


def test_unreadable_uuid_falls_back_to_index_zero(use):
    use(fake_nvml(uuid_ok=False))
    assert observers.gpu_state()["sm_clock_mhz"] == 1980


def test_unsupported_counters_are_left_out_not_raised(use):
    use(fake_nvml(violations=False, reasons="none"))
    s = observers.gpu_state()
    assert s["sm_clock_mhz"] == 1755
    assert not {"power_violation_ns", "thermal_violation_ns", "clocks_event_reasons"} & set(s)


def test_older_driver_names_the_reasons_throttle(use):
    use(fake_nvml(reasons="throttle"))
    assert observers.gpu_state()["clocks_event_reasons"] == 0x20


def test_a_failing_clock_read_gives_an_empty_dict(use):
    nvml = fake_nvml()
    nvml.nvmlDeviceGetClockInfo = lambda h, c: (_ for _ in ()).throw(RuntimeError("gone"))
    use(nvml)
    assert observers.gpu_state() == {}


def test_cpu_reads_nothing():
    if observers.current_device().kind != "cpu":
        pytest.skip("a GPU is present")
    assert observers.gpu_state() == {}
