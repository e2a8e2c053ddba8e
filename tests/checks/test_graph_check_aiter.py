"""graph-check of aiter-gluon and aiter-asm on the CPU, over the fake AITER of every manifest range
(tests/backends/aiter/fakes.py): captured at 1 token as a server does, replayed after refresh at
longer contexts.  The CPU engine replays by calling again, and the fake's Gluon count follows the
``min_kv_seq_len`` argument frozen at capture, as AITER's does before v0.1.20; timed on a virtual
clock that the fake kernel advances per 64-token block of its longest split, a count frozen at 1
is slow here too, without the noise of the machine."""

from __future__ import annotations

import pytest

from mlabench.backends.aiter.manifest import load_manifest
from mlabench.checks.graph_check import EagerEngine, GraphCheckConfig, Subject, run_graph_check
from mlabench.measure.timing import TimingConfig
from tests.backends.aiter.fakes import aiter_available_on_cpu, install_fake_aiter

FAST = TimingConfig(warmup_iters=0, min_samples=3, max_samples=3, budget_s=0.05)
#: Splits AITER's budget kernel (v0.1.20 on) runs for one request of L tokens at batch 1, 12 heads.
BUDGET_SPLITS = {64: 1, 4096: 64}


def graph_check(rng, monkeypatch, tmp_path, block_us=0.0, subjects=("aiter-gluon", "aiter-asm"), **kw):
    """Rows by (backend, context) of a graph-check over the fake AITER of range ``rng``."""
    fake = install_fake_aiter(monkeypatch, tmp_path, rng)
    if block_us:
        fake.time_kernels_only(monkeypatch, block_us)
    aiter_available_on_cpu(monkeypatch)
    cfg = GraphCheckConfig(**{**dict(num_heads=12, batches=(1,), contexts=tuple(BUDGET_SPLITS), page_size=64,
                                     dtype="bfloat16", capture_len=1, splits=(1, 64), timing=FAST), **kw})
    result = run_graph_check(cfg, [Subject(name) for name in subjects], engine=EagerEngine())
    return fake.rule("gluon_bh16_splits") == "bounded", {(r.backend, r.context_len): r for r in result.rows}


@pytest.mark.parametrize("rng", [r.name for r in load_manifest().ranges])
def test_both_aiter_backends_run_to_the_end_at_every_tag(monkeypatch, tmp_path, rng):
    bounded, rows = graph_check(rng, monkeypatch, tmp_path)
    assert len(rows) == 4
    for length, per_request in BUDGET_SPLITS.items():
        gluon, asm = rows["aiter-gluon", length], rows["aiter-asm", length]
        assert gluon.correct and asm.correct and gluon.graph_us and gluon.tuned_us and asm.tuned_us
        # bounded: the count frozen at capture (min_kv_seq_len 1: 1 split); budget: what runs now
        assert gluon.captured_splits == (1 if bounded else per_request)
        # bounded: steered through min_kv_seq_len; budget: AITER's own choice prepared at L
        assert gluon.tuned_splits in ((1, 64) if bounded else (per_request,))
        assert asm.captured_splits is None and asm.tuned_splits is None


@pytest.mark.parametrize("rng", ["v0.1.19.post2", "v0.1.20"])
def test_the_frozen_count_is_flagged_at_long_contexts_before_v0_1_20(monkeypatch, tmp_path, rng):
    bounded, rows = graph_check(rng, monkeypatch, tmp_path, block_us=10.0, subjects=("aiter-gluon",))
    short, long = rows["aiter-gluon", 64], rows["aiter-gluon", 4096]
    assert (short.graph_us, short.tuned_us, long.tuned_us) == (10.0, 10.0, 10.0)  # one block a split
    assert not short.flagged and long.flagged is bounded
    if bounded:  # 1 split frozen at capture walks 64 blocks
        assert long.graph_us == 640.0 and long.tuned_splits == 64
        assert long.note == "6300% slower than tuned; split count frozen at capture"
    else:
        assert long.graph_us == 10.0 and long.captured_splits == long.tuned_splits == 64


def test_a_call_aiter_refuses_at_the_capture_length_is_a_flagged_row(monkeypatch, tmp_path):
    """64 heads at batch 64: AITER asserts min_kv_seq_len > 784, which a capture at 1 token breaks."""
    _, rows = graph_check("v0.1.20", monkeypatch, tmp_path, subjects=("aiter-gluon",), num_heads=64,
                          batches=(64,), contexts=(1024,), page_size=64, splits=(1,))
    row = rows["aiter-gluon", 1024]
    assert row.flagged and "min_kv_seq_len > 784" in row.note and row.graph_us is None
    assert row.tuned_splits == 4 and row.tuned_us  # AITER's own count, prepared at 1024 tokens
