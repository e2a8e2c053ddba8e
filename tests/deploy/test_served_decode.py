"""The plugin's per-process decode state without a GPU: grid split counts in each mode, the
workspace every step fits in, and which device table a batch size reads."""

import pytest
import torch

from mlabench.deploy.served_decode import ServedDecode, grid_splits, served_pdl, served_variant, workspace_slots
from mlabench.policy.device_table import SplitPolicy

POLICY = SplitPolicy.create({1: [(4096, 32), (131072, 128)], 16: [(4096, 4), (131072, 16)]})


def test_device_mode_sizes_the_grid_for_the_batchs_largest_count():
    assert grid_splits(POLICY, "device", 1, 10) == 128
    assert grid_splits(POLICY, "device", 8, 10) == 128   # batch 8 reads batch 1's rows
    assert grid_splits(POLICY, "device", 16, 10) == 16


def test_host_mode_takes_the_longest_contexts_count():
    assert grid_splits(POLICY, "host", 1, 4000) == 32
    assert grid_splits(POLICY, "host", 1, 110000) == 128
    assert grid_splits(POLICY, "host", 16, 4096) == 4
    assert grid_splits(POLICY, "host", 16, 0) == 4      # a padded step's 0 reads the first row
    with pytest.raises(ValueError):
        grid_splits(POLICY, "fixed", 1, 10)


def test_the_workspace_fits_every_batch_up_to_the_largest():
    # batch 15 reads batch 1's rows (128 splits): 15 x 128 slots beat 16 x 16
    assert workspace_slots(POLICY, 16) == 15 * 128
    assert workspace_slots(POLICY, 1) == 128


def test_tables_by_batch_size_and_none_in_host_mode():
    served = ServedDecode(POLICY, "device", 12, 16, "cpu")
    assert served.table_for(1).tolist()[:2] == [[4096, 32], [131072, 128]]
    assert served.table_for(15) is served.table_for(1)
    assert served.table_for(16).tolist()[0] == [4096, 4]
    assert ServedDecode(POLICY, "host", 12, 16, "cpu").table_for(16) is None
    assert served._partial_out.shape == (15 * 128, 12, 512) and served._partial_out.dtype == torch.float32


def test_a_call_passes_the_grid_and_table_and_host_mode_logs_each_count_once(monkeypatch):
    import logging

    import mlabench.kernels.gluon_splitkv as kernel

    lines = []

    class Lines(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    calls = []
    monkeypatch.setattr(kernel, "kv_descriptors", lambda cache: ("descriptors", cache.shape))
    monkeypatch.setattr(kernel, "mla_decode_gluon_splitkv",
                        lambda q, cache, bt, lens, out, splits, scale, **kw: calls.append((splits, kw)) or out)
    q, cache = torch.zeros(16, 12, 576), torch.zeros(8, 64, 576)
    bt, lens = torch.zeros(16, 2, dtype=torch.int32), torch.ones(16, dtype=torch.int32)
    device = ServedDecode(POLICY, "device", 12, 16, "cpu")
    out = device(q, cache, bt, lens, 5000, 0.1)
    assert out.shape == (16, 12, 512) and calls[-1][0] == 16
    assert calls[-1][1]["split_policy"] is device.table_for(16) and calls[-1][1]["pdl"] == 0
    assert calls[-1][1]["descriptors"] == ("descriptors", (8, 64, 1, 576))
    host = ServedDecode(POLICY, "host", 12, 16, "cpu")
    log, handler = logging.getLogger("vllm.mlabench"), Lines(logging.INFO)
    # a logging config read earlier in the process (alembic's, in the tuner's tests) disables the
    # loggers that existed then, this one included
    level, disabled, log.level, log.disabled = log.level, log.disabled, logging.INFO, False
    log.addHandler(handler)
    try:
        for longest in (110000, 110000, 3000):
            host(q[:1], cache, bt[:1], lens[:1], longest, 0.1)
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.disabled = disabled
    assert [c[0] for c in calls[-3:]] == [128, 128, 32] and calls[-1][1]["split_policy"] is None
    assert lines == ["mlabench: host split count 128 for a step of 1 requests (longest context 110000)",
                     "mlabench: host split count 32 for a step of 1 requests (longest context 3000)"]


def test_a_call_passes_vllms_query_halves_to_the_kernel_as_they_lie(monkeypatch):
    """The plugin's decode takes vLLM's ``(latent, rope)`` and hands both to the kernel unchanged
    (no concatenation, no copy: a kernel fewer per layer in the captured step); one 576-wide q goes
    as q with no ``q_rope``."""
    import mlabench.kernels.gluon_splitkv as kernel
    from tests.kernels.helpers import vllm_query_halves

    calls = []
    monkeypatch.setattr(kernel, "kv_descriptors", lambda cache: "descriptors")
    monkeypatch.setattr(kernel, "mla_decode_gluon_splitkv",
                        lambda q, cache, bt, lens, out, splits, scale, **kw: calls.append((q, kw)) or out)
    q, cache = torch.zeros(16, 12, 576, dtype=torch.bfloat16), torch.zeros(8, 64, 576, dtype=torch.bfloat16)
    bt, lens = torch.zeros(16, 2, dtype=torch.int32), torch.ones(16, dtype=torch.int32)
    served = ServedDecode(POLICY, "device", 12, 16, "cpu")
    halves = vllm_query_halves(q)
    out = served(halves, cache, bt, lens, 5000, 0.1)
    assert out.shape == (16, 12, 512) and out.dtype == torch.bfloat16
    assert calls[-1][0] is halves[0] and calls[-1][1]["q_rope"] is halves[1]
    served(q, cache, bt, lens, 5000, 0.1)
    assert calls[-1][0] is q and calls[-1][1]["q_rope"] is None


def test_the_plugin_runs_the_kernel_a_sweep_of_the_backend_times():
    """The TPOT prediction's reference is the plugin, predicted from a sweep of gluon-splitkv at
    its defaults: the served calls ran without the PDL prologue those points had (the committed
    serving sweeps record pdl_prologue 1).  The plugin now takes the backend's defaults, and the
    wide merge (the grid in device mode at 16 requests does not fit the fused one)."""
    from mlabench.backends.gluon import LAZY_SUM, O_SPLIT, PDL_PROLOGUE

    variant = served_variant()
    assert (variant.o_split, variant.lazy_sum, variant.pdl_prologue, variant.fused_merge) == (
        O_SPLIT.default, bool(LAZY_SUM.default), bool(PDL_PROLOGUE.default), False)
    assert grid_splits(POLICY, "device", 16, 10) * 16 > 132  # why the fused merge cannot run there


def test_a_call_runs_the_served_variant(monkeypatch):
    import mlabench.kernels.gluon_splitkv as kernel

    calls = []
    monkeypatch.setattr(kernel, "kv_descriptors", lambda cache: "descriptors")
    monkeypatch.setattr(kernel, "mla_decode_gluon_splitkv",
                        lambda q, cache, bt, lens, out, splits, scale, **kw: calls.append(kw) or out)
    q, cache = torch.zeros(1, 12, 576), torch.zeros(8, 64, 576)
    ServedDecode(POLICY, "device", 12, 16, "cpu")(q, cache, torch.zeros(1, 2, dtype=torch.int32),
                                                 torch.ones(1, dtype=torch.int32), 100, 0.1)
    assert calls[-1]["variant"] == served_variant() and calls[-1]["variant"].pdl_prologue
    assert calls[-1]["pdl"] == 0  # device mode: no PDL merge at batch 1 either (served_pdl)
    ServedDecode(POLICY, "host", 12, 16, "cpu")(q, cache, torch.zeros(1, 2, dtype=torch.int32),
                                               torch.ones(1, dtype=torch.int32), 100, 0.1)
    assert calls[-1]["pdl"] == 1  # host mode: the backend's default at batch 1


def test_served_pdl_is_the_backends_default_but_in_device_mode():
    from mlabench.backends.gluon import PDL
    from mlabench.shapes import MLADecodeShape

    for batch in (1, 2, 16):
        shape = MLADecodeShape(num_heads=12, context_lens=(4096,) * batch)
        assert served_pdl("host", batch) == PDL.default_for(shape)
        assert served_pdl("device", batch) == 0
