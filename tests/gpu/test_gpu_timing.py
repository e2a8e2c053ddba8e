"""GPU-only timing tests (skipped without a GPU): the memory ceilings, the replay length, warm-up.

They compare times with times, so they need the GPU to themselves: beside other pytest-xdist
workers' kernels a call measured 160 µs at 64 calls per replay and 189 µs at 256 (30 µs alone), so
under xdist they skip, and scripts/h200_tests.sh runs this file on its own.
"""

import os
import statistics

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU"),
              pytest.mark.skipif(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1,
                                 reason="timing needs the GPU to itself, not shared with other xdist "
                                        "workers (scripts/h200_tests.sh runs this file alone)")]


def test_read_bandwidth_is_above_copy_and_below_the_datasheet():
    from mlabench.device import current_device
    from mlabench.measure.bandwidth import (
        datasheet_bandwidth_tbps, measure_copy_bandwidth_tbps, measure_read_bandwidth_tbps,
    )

    read, copy = measure_read_bandwidth_tbps(), measure_copy_bandwidth_tbps()
    assert read > 0.9 * copy
    sheet = datasheet_bandwidth_tbps(current_device().name)
    if sheet:
        assert read < 1.02 * sheet


def test_a_replay_holds_the_planned_work_and_per_call_time_is_flat():
    """A replay holds whole passes over the copies and at least ``min_replay_us`` of work, and its
    time divided by the calls it held does not depend on how many it held: a replay's one launch
    (a few µs) is 0.2% of 64 calls of ~30 µs, while a miscount of one pass over the 4 copies
    moves the ratio of the two by 4.6%, past the 2% allowed.  Each is timed three times, in turn,
    and the medians compared: one timing of each, one after the other, differed by 2.3% on an
    H100 whose clock drifted by up to 5% within a sweep."""
    from mlabench.backends import get_backend
    from mlabench.measure.timing import TimingConfig
    from mlabench.shapes import MLADecodeShape
    from mlabench.bench.shape_bench import ShapeBench

    backend = get_backend("triton-splitkv")
    bench = ShapeBench(MLADecodeShape.uniform(1, 32768, 12, page_size=64), TimingConfig(eager=False))
    rec = bench.run(backend, {"num_kv_splits": 64}, copy_bw_tbps=None, run_id="t")
    s = rec.stats
    assert rec.status == "ok" and s.calls_per_sample % len(bench.inputs) == 0
    assert s.calls_per_sample * s.median_us >= 0.9 * TimingConfig().min_replay_us
    per_call = {64: [], 256: []}
    for _ in range(3):  # in turn, so a drifting clock moves both alike
        for n in per_call:
            bench.timing = TimingConfig(eager=False, min_replay_us=0, min_calls_per_replay=n)
            per_call[n].append(bench.run(backend, {"num_kv_splits": 64}, copy_bw_tbps=None,
                                         run_id="t").stats.median_us)
    assert statistics.median(per_call[64]) == pytest.approx(statistics.median(per_call[256]),
                                                            rel=0.02)


def test_samples_taken_from_several_captures_in_turn():
    """``graph_captures`` graphs are held and replayed in turn; each replays the same work, so the
    per-call time stays within 3% of one graph's (FlashMLA's two speeds aside)."""
    from mlabench.backends import get_backend
    from mlabench.measure.timing import TimingConfig, time_calls
    from mlabench.shapes import MLADecodeShape
    from mlabench.bench.shape_bench import ShapeBench

    bench = ShapeBench(MLADecodeShape.uniform(1, 32768, 12, page_size=64), TimingConfig(eager=False))
    fns = [get_backend("triton-splitkv").prepare(x, {"num_kv_splits": 64}).fn for x in bench.inputs]
    one = time_calls(fns, TimingConfig(eager=False), use_graph=True)
    four = time_calls(fns, TimingConfig(eager=False, graph_captures=4, min_samples=12), use_graph=True)
    assert one.graph_captures == 1 and four.graph_captures == 4
    assert four.median_us == pytest.approx(one.median_us, rel=0.03)
    assert len(four.capture_medians_us) == 4 and one.capture_medians_us is None
    assert min(four.capture_medians_us) <= four.median_us <= max(four.capture_medians_us)
    assert time_calls(fns, TimingConfig(graph_captures=4), use_graph=False).graph_captures is None


def test_warm_up_reads_the_clocks():
    from mlabench.measure.steady import warm_up
    from mlabench.measure.timing import TimingConfig

    s = warm_up(TimingConfig(steady_min_s=1.0, steady_max_s=10.0))
    assert s.elapsed_s >= 1.0 and (s.steady is None or s.sm_clock_mhz > 0)
