"""How many calls one GPU sample holds (issue 13 item 5): enough work that one launch is spread thin
at every shape, whole passes over the cold-cache copies."""

import pytest

from mlabench.device import DeviceInfo
from mlabench.measure.timing import TimingConfig, calls_per_replay, time_calls

CFG = TimingConfig()  # 2000 µs of work, at least 1 call, at most 4096


@pytest.mark.parametrize("call_us, copies, calls", [
    (10.8, 64, 192),    # batch 1, 1K on an H200: 186 calls of work, rounded up to 3 passes over 64 copies
    (32.0, 4, 64),      # batch 1, 32K: 63 calls -> 16 passes over 4 copies
    (73.0, 1, 28),      # batch 1, 128K
    (750.0, 1, 3),      # batch 16, 128K: 3 calls make 2 ms
    (10_000.0, 1, 1),   # one split at 128K: one call is already 10 ms
    (0.001, 1, 4096),   # capped
])
def test_calls_per_replay_holds_the_same_work_at_every_shape(call_us, copies, calls):
    n = calls_per_replay(call_us, copies, CFG)
    assert n == calls and n % copies == 0
    assert n * call_us >= CFG.min_replay_us or n == CFG.max_calls_per_replay or n == copies


def test_calls_per_replay_honours_a_fixed_count_and_never_drops_a_copy():
    fixed = TimingConfig(min_replay_us=0, min_calls_per_replay=256)
    assert [calls_per_replay(t, c, fixed) for t, c in [(10.0, 64), (30.0, 4), (70.0, 1)]] == [256, 256, 256]
    assert calls_per_replay(10.0, 64, TimingConfig(min_replay_us=0)) == 64  # one pass at least
    assert calls_per_replay(1.0, 64, TimingConfig(max_calls_per_replay=10)) == 64


def test_cpu_samples_hold_one_pass_and_say_so():
    import time

    cpu = DeviceInfo("cpu", "cpu", "cpu", 2, 0, "cpu", 0)
    stats = time_calls([lambda: time.sleep(0.001)] * 3, TimingConfig(warmup_iters=0, min_samples=3, max_samples=3),
                       use_graph=False, device=cpu)
    assert stats.calls_per_sample == 3 and stats.n == 3
