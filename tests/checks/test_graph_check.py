"""graph-check on the CPU: the orchestration with :class:`EagerEngine` (no graph: host choices are
not frozen there, so nothing here can show the slowdown a GPU shows), the flag rule, the table, the
subjects, and the one-line refusal without a GPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from mlabench import cli
from mlabench.checks.graph_check import (
    EagerEngine, GraphCheckConfig, GraphCheckResult, GraphCheckRow, GraphEngine, Subject, assess, run_graph_check,
    subjects_for,
)
from mlabench.checks.graph_check_table import graph_check_table
from mlabench.device import current_device
from mlabench.errors import ConfigError, GPURequiredError
from mlabench.measure.timing import TimingConfig, cold_cache_copies
from mlabench.policy.device_table import load_split_policy
from mlabench.shapes import MLADecodeShape
from mlabench.tables.render import to_json, to_markdown

FAST = TimingConfig(warmup_iters=0, min_samples=3, max_samples=3, budget_s=0.05)


def small_config(**kw) -> GraphCheckConfig:
    base = dict(num_heads=4, batches=(2,), contexts=(48, 160), page_size=16, dtype="float16",
                capture_len=1, splits=(1, 3), timing=FAST)
    return GraphCheckConfig(**{**base, **kw})


def test_policy_modes_and_portable_backends(tmp_path):
    cfg = small_config()
    subjects = subjects_for(["triton-splitkv", "torch-splitkv", "reference"], ["host", "device"])
    assert [s.label for s in subjects] == ["triton-splitkv split_policy=host",
                                           "triton-splitkv split_policy=device", "torch-splitkv", "reference"]
    policy_path = tmp_path / "policy.json"
    result = run_graph_check(cfg, subjects, engine=EagerEngine(), policy_path=policy_path)
    by = {(r.subject, r.context_len): r for r in result.rows}
    # Input copies rotated: one on the CPU; on a GPU enough to pass the L2 twice at the shortest
    # context (the shapes here are tiny, so every copy fits).
    shortest = MLADecodeShape.create(num_heads=4, context_lens=(48, 48), page_size=16, q_dtype="float16",
                                     kv_dtype="float16")
    copies = cold_cache_copies(shortest.min_bytes_moved, current_device(), cfg.timing)
    assert current_device().is_gpu or copies == 1
    assert len(result.rows) == 4 * 2 and result.copies == {2: copies}
    # The policy is the tuned counts of this run, written where the policy subjects read it.
    policy = load_split_policy(policy_path)
    assert policy.tables == result.policy.tables
    tuned = {L: by[("triton-splitkv split_policy=host", L)].tuned_splits for L in cfg.contexts}
    assert policy.tables[2] == tuple((L, tuned[L]) for L in cfg.contexts)
    assert set(tuned.values()) <= set(cfg.splits)
    for L in cfg.contexts:
        host, device = by[("triton-splitkv split_policy=host", L)], by[("triton-splitkv split_policy=device", L)]
        assert host.captured_splits == policy.lookup(2, cfg.capture_len)  # chosen at capture
        assert device.captured_splits == "per request"
        assert host.correct and device.correct and by[("torch-splitkv", L)].correct
        assert host.refresh_us > 0 and device.refresh_us >= 0
        assert by[("torch-splitkv", L)].tuned_splits in cfg.splits
        ref = by[("reference", L)]  # not graph-safe: flagged, never timed
        assert ref.flagged and "not graph-safe" in ref.note and ref.graph_us is None
    table = graph_check_table(result, cfg)
    text = to_markdown(table)
    assert "split_policy=device" in text and "flagged" in text and "reference" in table.notes[0]
    assert f"device: {current_device().name}" in table.notes  # plots name the device from it
    rows = json.loads(to_json([table]))[0]["rows"]
    assert len(rows) == 8 and {"graph_us", "tuned_us", "slowdown_pct", "refresh_us"} <= set(rows[0])


def test_a_given_policy_is_used(tmp_path):
    given = tmp_path / "given.json"
    given.write_text('{"num_kv_splits": {"1": [[64, 3], [1000, 2]]}}')
    out = tmp_path / "used.json"
    cfg = small_config(contexts=(48,), splits=(1,))
    result = run_graph_check(cfg, [Subject("triton-splitkv", policy_mode="host")], engine=EagerEngine(),
                             policy=load_split_policy(given), policy_path=out)
    assert result.rows[0].captured_splits == 3 and result.rows[0].correct
    assert load_split_policy(out).tables == {1: ((64, 3), (1000, 2))}


def row(**kw) -> GraphCheckRow:
    return GraphCheckRow(**{**dict(subject="s", backend="b", batch=1, context_len=100000, capture_len=1,
                                   graph_us=100.0, tuned_us=60.0, tuned_splits=64, captured_splits=8,
                                   correct=True), **kw})


def test_flag_rule():
    slow = assess(row(), 0.05)
    assert slow.flagged and slow.note == "67% slower than tuned; split count frozen at capture"
    assert assess(row(captured_splits="per request"), 0.05).note == "67% slower than tuned"
    assert not assess(row(graph_us=62.9), 0.05).flagged  # 4.8% slower: within 5%
    assert assess(row(graph_us=63.1), 0.05).flagged
    # Issue 35 item 15: a graph faster than tuned (a slowdown of -50%, beyond the tolerance in size)
    # is no fault: flagging |slowdown| > tolerance would flag it
    fast = assess(row(graph_us=30.0), 0.05)
    assert fast.slowdown == pytest.approx(-0.5) and not fast.flagged and fast.note == ""
    wrong = assess(row(graph_us=50.0, correct=False), 0.05)
    assert wrong.flagged and "stale" in wrong.note
    assert not assess(row(tuned_us=None), 0.05).flagged and row(tuned_us=None).slowdown is None
    cfg = small_config()
    table = graph_check_table(GraphCheckResult(rows=[assess(row(), 0.05)]), cfg)
    assert table.row_styles == ["red"] and "flagged (wrong, or > 5% slower than tuned): s" in table.notes[0]


def test_config_and_subject_errors():
    with pytest.raises(ConfigError, match="host or device"):
        subjects_for(["triton-splitkv"], ["sideways"])
    assert [s.label for s in subjects_for(["triton-persistent"], ["host"])] == ["triton-persistent"]
    for bad in (dict(contexts=()), dict(capture_len=0), dict(tolerance=-1.0)):
        with pytest.raises(ConfigError):
            run_graph_check(small_config(**bad), [Subject("torch-splitkv")], engine=EagerEngine())
    with pytest.raises(ConfigError, match="policy_path"):
        run_graph_check(small_config(), [Subject("triton-splitkv", policy_mode="device")], engine=EagerEngine())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")
def test_refuses_without_a_gpu_in_one_line(monkeypatch, capsys):
    with pytest.raises(GPURequiredError):
        GraphEngine()
    monkeypatch.setattr(sys, "argv", ["mlabench", "graph-check", "--context", "4096"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    err = capsys.readouterr().err
    assert exc.value.code == 3 and err.strip().count("\n") == 0  # cannot run here, not bad input
    assert err.startswith("error: graph-check needs a CUDA or ROCm GPU")


def test_an_unwritable_save_is_refused_before_the_gpu_work_and_a_failed_write_keeps_the_table(
        tmp_path, monkeypatch, capsys):
    """A fresh user's review: `--save` was written before the table was printed and checked only
    then, so a bad path lost a whole GPU run.  Now a path that cannot be written is bad input
    before anything runs (exit 2, not the no-GPU 3), and the table prints before the file is written."""
    import mlabench.checks.graph_check as gc
    from mlabench.errors import FileAccessError

    (tmp_path / "a-file").write_text("")
    for flag, path, line in (("--save", tmp_path, f"error: --save {tmp_path} is a folder: give a file name"),
                             ("--policy-out", tmp_path / "a-file" / "p.json",
                              f"error: --policy-out {tmp_path}/a-file/p.json: its folder {tmp_path}/a-file is a file")):
        monkeypatch.setattr(sys, "argv", ["mlabench", "graph-check", flag, str(path)])
        with pytest.raises(SystemExit) as exc:
            cli.main()
        assert exc.value.code == 2 and capsys.readouterr().err.strip() == line
    if Path("/proc/self").is_dir():  # a folder that takes no new file (the last review's "left alone")
        monkeypatch.setattr(sys, "argv", ["mlabench", "graph-check", "--save", "/proc/mlabench-x/t.json"])
        with pytest.raises(SystemExit) as exc:
            cli.main()
        said = capsys.readouterr().err.strip()  # root may write in /proc but make nothing there
        assert exc.value.code == 2 and said in ("error: --save /proc/mlabench-x/t.json: nothing can be created in /proc",
                                                "error: --save /proc/mlabench-x/t.json: permission denied"), said
    monkeypatch.setattr(gc, "run_graph_check", lambda *a, **k: GraphCheckResult(rows=[assess(row(), 0.05)]))
    import mlabench.cli.graph_check_command as command

    def full_disk(path, text, what, atomic=False):
        raise FileAccessError(f"{what} could not be written (no space left on device): {path}")
    monkeypatch.setattr(command, "write_text", full_disk)
    monkeypatch.setattr(sys, "argv", ["mlabench", "graph-check", "--backend", "torch-splitkv", "--context", "64",
                                      "--save", str(tmp_path / "t.json"), "--json"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and "no space left" in err
    assert json.loads(out)[0]["rows"]  # the table was printed all the same


class FailingEngine(EagerEngine):
    def capture(self, fns):
        raise RuntimeError("operation not permitted when stream is capturing")


def test_a_call_that_cannot_be_captured_is_a_flagged_row():
    result = run_graph_check(small_config(contexts=(48,)), [Subject("torch-splitkv")], engine=FailingEngine())
    r, = result.rows
    assert r.flagged and r.note == "capture failed: operation not permitted when stream is capturing"
    assert r.tuned_us is None and r.graph_us is None


def test_the_json_names_the_device_per_row_and_a_small_speedup_is_not_minus_zero():
    """Issue 25 item 14: graph-check's JSON rows did not say the device (only a note did), and a
    replay 0.03% faster than tuned printed "-0.0" as its slowdown."""
    cfg = small_config()
    result = GraphCheckResult(rows=[assess(row(graph_us=59.98), 0.05), assess(row(graph_us=90.0), 0.05)],
                              device="NVIDIA H200")
    table = graph_check_table(result, cfg)
    rows = json.loads(to_json([table]))[0]["rows"]
    assert [r["device"] for r in rows] == ["NVIDIA H200", "NVIDIA H200"]
    _headers, texts = table.texts()
    assert "device" not in _headers                         # a note says it to people
    slower = _headers.index("slower %")
    assert [t[slower] for t in texts] == ["0.0", "+50.0"]


def test_each_row_times_the_graph_and_the_tuned_call_side_by_side(monkeypatch):
    """The count search runs before the capture, over many allocations; the row's two times come
    from the graph and the chosen count prepared again at that length, timed in turn."""
    from mlabench.checks import graph_bench

    timed = []
    real = graph_bench.replay_us
    monkeypatch.setattr(graph_bench, "replay_us", lambda replay, calls, cfg: timed.append(replay) or real(replay, calls, cfg))
    captures = []

    class Engine(EagerEngine):
        def capture(self, fns):
            replay = super().capture(fns)
            captures.append(replay)
            return replay

    cfg = small_config(contexts=(48, 160), splits=(1, 3))
    result = run_graph_check(cfg, [Subject("torch-splitkv")], engine=Engine())
    # 2 counts x 2 lengths searched, the subject captured once, and one tuned call a length again
    assert len(captures) == 4 + 1 + 2
    graph = captures[4]
    turns = 2 * graph_bench.SIDE_BY_SIDE_ROUNDS
    assert timed[:4] == captures[:4] and len(timed) == 4 + 2 * turns  # the search, then per length
    per_length = [timed[4:4 + turns], timed[4 + turns:]]
    for k, turns in enumerate(per_length):  # graph, tuned, graph, tuned, ...
        assert turns[0::2] == [graph] * graph_bench.SIDE_BY_SIDE_ROUNDS
        assert turns[1::2] == [captures[5 + k]] * graph_bench.SIDE_BY_SIDE_ROUNDS
    assert all(r.correct and r.tuned_us and r.graph_us for r in result.rows)
    assert all(r.tuned_splits in (1, 3) for r in result.rows)


@pytest.mark.parametrize("bad, message", [
    (dict(num_heads=300), "^num_heads: must be 1..256"),
    (dict(contexts=(4096, 99_999_999_999)), "^context_lens: context length must be <= 2,147,483,647"),
    (dict(capture_len=10**12), "^--capture-len: context_lens: context length must be <="),
    (dict(batches=(10**8,), contexts=(131072,)), "KV pages .* cannot be one decode step"),
])
def test_heads_lengths_and_batch_are_checked_before_any_gpu_work(bad, message):
    """A fresh user's graph-check --heads 300 passed the flag checks and met the GPU refusal
    (exit 3) where sweep refuses the same value (exit 2)."""
    from mlabench.errors import ShapeError

    with pytest.raises(ShapeError, match=message):
        small_config(**bad).validate()
