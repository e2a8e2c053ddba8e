"""Per-kernel GPU time of gluon-splitkv's graph-replayed call at batch 1 (issue 34 item 2): stage 1
and the merge apart, for split counts launched from the host and for device split policies, with
and without PDL, so that what device mode costs can be put on a stage.

Each case is prepared as a sweep prepares it, captured in a CUDA graph, replayed (µs per replay by
device events: ``graph_us``), then replayed under ``torch.profiler`` (each kernel's mean device
time a replay: ``kernels_us``; with PDL the merge's time includes its wait for stage 1, so compare
kernel times without PDL and whole replays with it).  One warm input, no cold-cache rotation: the
stage split, not the absolute time, is the point (``mlabench sweep`` measures those).

    python3 scripts/h200_stage_times.py --policy NAME=PATH [--policy ...] --out FILE.jsonl

Prints a markdown table; FILE.jsonl gets a record per case.  NVIDIA Hopper only.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from mlabench.backends import get_backend
from mlabench.inputs import make_inputs
from mlabench.shapes import MLADecodeShape


def cases(policies: dict[str, str], lengths: list[int], counts: list[int]) -> list[tuple[int, str, dict]]:
    """``(length, label, params)`` for each length: each host count and each device policy, PDL 1 and 0."""
    out = []
    for length in lengths:
        for pdl in (1, 0):
            out += [(length, f"host {n}", {"num_kv_splits": n, "pdl": pdl}) for n in counts]
            out += [(length, f"device {name}", {"split_policy": f"device:{path}", "pdl": pdl})
                    for name, path in policies.items()]
    return out


def replay_us(graph: torch.cuda.CUDAGraph, replays: int) -> float:
    """Mean µs per replay by device events, after 50 warm-up replays."""
    for _ in range(50):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / replays


def kernel_us(graph: torch.cuda.CUDAGraph, replays: int) -> tuple[dict[str, float], dict[str, float]]:
    """Each kernel's device time per replay (µs), by name, from ``torch.profiler``; and the
    replay's timeline (:func:`timeline`)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    total: dict[str, float] = collections.defaultdict(float)
    kernels = []
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total[event.name.split("(")[0][:48]] += event.device_time / replays
            kernels.append((event.time_range.start, event.time_range.end, "merge" in event.name))
    return {name: round(us, 2) for name, us in total.items()}, timeline(sorted(kernels))


def timeline(kernels: list[tuple[float, float, bool]]) -> dict[str, float]:
    """Median µs, over replays of stage 1 then the merge (``(start, end, is_merge)`` by start), of:
    stage 1's span (``stage1``), the merge's start after stage 1's (``merge_start``), the merge's
    end after stage 1's (``merge_tail``) and the next stage 1's start after the merge's end
    (``gap``); empty when the kernels are not in that order."""
    rows = []
    for i in range(len(kernels) - 2):
        (s1, e1, m1), (s2, e2, m2), (s3, _, m3) = kernels[i:i + 3]
        if not m1 and m2 and not m3:
            rows.append((e1 - s1, s2 - s1, e2 - e1, s3 - e2))
    if not rows:
        return {}
    return {key: round(statistics.median_high(col), 2)
            for key, col in zip(("stage1", "merge_start", "merge_tail", "gap"), zip(*rows))}


def measure(length: int, params: dict) -> dict:
    """One case: prepared, captured, timed whole and by kernel."""
    backend = get_backend("gluon-splitkv")
    shape = MLADecodeShape(num_heads=12, context_lens=(length,))
    inputs = make_inputs(shape, poison=False)
    call = backend.prepare(inputs, backend.resolve_params(shape, dict(params)))
    for _ in range(3):
        call.fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call.fn()
    kernels, spans = kernel_us(graph, 200)
    return {"graph_us": round(replay_us(graph, 400), 2), "kernels_us": kernels, "timeline_us": spans,
            "effective": {k: call.effective_params.get(k) for k in ("num_kv_splits", "pdl", "pdl_prologue")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--context", default="1024,4096,8192")
    parser.add_argument("--splits", default="16,32,132")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    policies = dict(p.split("=", 1) for p in args.policy)
    todo = cases(policies, [int(x) for x in args.context.split(",")], [int(x) for x in args.splits.split(",")])
    print("| context | launch | pdl | graph µs | stage 1 µs | merge µs | span: stage 1 | merge start | merge tail | gap |\n"
          "|---|---|---|---|---|---|---|---|---|---|")
    with open(args.out, "a") as out:
        for length, label, params in todo:
            row = {"context": length, "launch": label, "params": params, **measure(length, params)}
            out.write(json.dumps(row) + "\n")
            k = row["kernels_us"]
            stage1 = sum(v for n, v in k.items() if "stage1" in n or "split_loop" in n)
            merge = sum(v for n, v in k.items() if "merge" in n)
            t = row["timeline_us"]
            spans = " | ".join(str(t.get(key, "")) for key in ("stage1", "merge_start", "merge_tail", "gap"))
            print(f"| {length} | {label} | {params['pdl']} | {row['graph_us']} | {stage1:.2f} | {merge:.2f} | {spans} |",
                  flush=True)


if __name__ == "__main__":
    main()
