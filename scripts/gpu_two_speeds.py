#!/usr/bin/env python
"""How a point with two speeds moves between them over time (issue 13).

FlashMLA at batch 1, 8K tokens read either about 25.0 or 26.7 µs at a visit on an H200, moving
between the two within seconds, in a mix that differed from run to run
(results/h200/repeatability/adaptive-visits-attempt/).  This script measures such a point as a sweep
visits it -- a fresh graph capture, 10 samples -- again and again for ``--seconds``, with a load
between visits like the rest of a sweep (``--load``: a batch-16, 128K-token split-KV decode for
about ``--load-ms``), and prints each visit's time and speed, the share of slow visits, how long
each speed lasts (runs of visits at one speed), and how many visits each of two runs needs for the
means of their visits to agree within 1% or 2% (95% of the time, treating visits as independent
draws at the share measured; runs of one speed make it more)::

    python3 scripts/gpu_two_speeds.py --out OUT/two-speeds.json > OUT/two-speeds.md

Needs a GPU (and FlashMLA for the default point).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from mlabench.backends import get_backend  # noqa: E402
from mlabench.measure import ShapeBench  # noqa: E402
from mlabench.shapes import MLADecodeShape  # noqa: E402
from mlabench.steady import warm_up  # noqa: E402
from mlabench.timing import TimingConfig, spin_rate_now, time_calls  # noqa: E402


def visits_needed(share: float, gap: float, bound: float, z: float = 1.96) -> int | None:
    """Visits per run for the means of two runs' visits to agree within ``bound`` (relative) 95% of
    the time, for a point slow by ``gap`` (relative) at a ``share`` of independent visits: one visit's
    relative standard deviation is sd = sqrt(share (1 - share)) x gap, the difference of two means of
    n visits has sd x sqrt(2 / n), so n = 2 (z sd / bound)^2.  None without two speeds."""
    sd = math.sqrt(share * (1 - share)) * gap
    return math.ceil(2 * (z * sd / bound) ** 2) if sd > 0 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="flashmla")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--seconds", type=float, default=150.0, help="how long to keep visiting")
    ap.add_argument("--load-ms", type=float, default=300.0, help="load between visits, ms (0: none)")
    ap.add_argument("--graph-captures", type=int, default=1,
                    help="graphs captured per visit, samples from each in turn: whether the speed belongs to a "
                         "capture (captures of one visit disagree) or to the moment (they agree)")
    ap.add_argument("--input-sets", type=int, default=1,
                    help="independent input allocations (each its own cold-cache copies and backend call), all "
                         "held, each timed at every visit: whether the speed belongs to where the inputs landed "
                         "(a set keeps its speed from visit to visit) or to the moment (the sets of a visit agree)")
    ap.add_argument("--out", type=Path, help="write every visit here as JSON")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: needs a GPU")
    backend = get_backend(args.backend)
    ok, why = backend.available()
    if not ok:
        raise SystemExit(f"error: {args.backend}: {why}")
    print(f"warm-up: {warm_up(TimingConfig()).reason}\n", flush=True)
    per_visit = 10 * args.graph_captures
    timing = TimingConfig(eager=False, min_samples=per_visit, max_samples=per_visit, budget_s=1e9,
                          graph_captures=args.graph_captures)
    shape = MLADecodeShape.uniform(args.batch, args.context, 12, page_size=64)
    benches = [ShapeBench(shape, timing, seed=100 * i) for i in range(args.input_sets)]
    fn_sets = [[backend.prepare(x, {}).fn for x in bench.inputs] for bench in benches]
    load = None
    if args.load_ms > 0:
        heavy = ShapeBench(MLADecodeShape.uniform(16, 131072, 12, page_size=64), timing, copies=1)
        load = get_backend("triton-splitkv").prepare(heavy.inputs[0], {"num_kv_splits": 16}).fn
    start, visits, draws, clocks = time.monotonic(), [], [], []
    while time.monotonic() - start < args.seconds:
        draws.append([])
        before = spin_rate_now(200_000)
        for fns in fn_sets:
            stats = time_calls(fns, timing, use_graph=True)
            draws[-1] += stats.capture_medians_us or [stats.median_us]
        visits.append((time.monotonic() - start, statistics.fmean(draws[-1])))
        clocks.append((before, spin_rate_now(200_000)))
        if load is not None:
            until = time.monotonic() + args.load_ms / 1000
            while time.monotonic() < until:
                for _ in range(20):
                    load()
                torch.cuda.synchronize()
    times = [us for _, us in visits]
    every = [us for d in draws for us in d]  # the speeds split between the fastest and slowest graph
    lo, hi = min(every), max(every)
    cut = (lo + hi) / 2
    slow = [us > cut for us in times]
    fast_us = [us for us, s in zip(times, slow) if not s]
    slow_us = [us for us, s in zip(times, slow) if s]
    runs, n = [], 1
    for a, b in zip(slow, slow[1:]):
        if a == b:
            n += 1
        else:
            runs.append(n)
            n = 1
    runs.append(n)
    share = sum(slow) / len(slow)
    gap = statistics.median(slow_us) / statistics.median(fast_us) - 1 if fast_us and slow_us else 0.0
    print(f"{args.backend}, batch {args.batch}, {args.context} tokens: {len(visits)} visits in "
          f"{visits[-1][0]:.0f} s, a load of {args.load_ms:g} ms between them")
    print(f"fast: {len(fast_us)} visits, median {statistics.median(fast_us) if fast_us else float('nan'):.2f} µs; "
          f"slow: {len(slow_us)}, median {statistics.median(slow_us) if slow_us else float('nan'):.2f} µs "
          f"(speeds split at {cut:.2f} µs; gap {100 * gap:.1f}%)")
    print(f"slow share {100 * share:.1f}%; {len(runs) - 1} changes of speed; runs of one speed: median "
          f"{statistics.median(runs):g} visits, longest {max(runs)} "
          f"({max(runs) * visits[-1][0] / len(visits):.0f} s)")
    for bound in (0.01, 0.02):
        need = visits_needed(share, gap, bound)
        print(f"visits per run for two runs' means to agree within {100 * bound:g}%, 95% of the time, if "
              f"independent: {need if need is not None else '-'}")
    units = args.input_sets * args.graph_captures
    if units > 1:
        mixed = sum(1 for d in draws if min(d) <= cut < max(d))
        print(f"{args.input_sets} input sets x {args.graph_captures} graphs per visit, 10 samples each; visits "
              f"whose graphs ran at both speeds: {mixed} of {len(draws)}")
    if args.input_sets > 1:
        per_set = [[us > cut for d in draws for us in d[k * args.graph_captures:(k + 1) * args.graph_captures]]
                   for k in range(args.input_sets)]
        print("slow share of each input set over the visits: "
              + ", ".join(f"{100 * sum(x) / len(x):.0f}%" for x in per_set))
    for name, pick in (("fast", False), ("slow", True)):
        got = [c for c, s in zip(clocks, slow) if s == pick]
        if got:
            print(f"SM clock around the {name} visits (a spin timed with events, before / after): median "
                  f"{statistics.median(b for b, _ in got):.0f} / {statistics.median(a for _, a in got):.0f} MHz")
    print("\n| s | µs (mean of its graphs' medians) | speed | SM clock before / after, MHz "
          "| each graph's median, µs (input set by input set) |\n|---|---|---|---|---|")
    for (t, us), s, d, (b, a) in zip(visits, slow, draws, clocks):
        graphs = ", ".join(f"{x:.2f}" for x in d)
        print(f"| {t:.1f} | {us:.2f} | {'slow' if s else 'fast'} | {b:.0f} / {a:.0f} | {graphs} |")
    if args.out:
        args.out.write_text(json.dumps({"backend": args.backend, "batch": args.batch, "context": args.context,
                                        "load_ms": args.load_ms, "graph_captures": args.graph_captures,
                                        "input_sets": args.input_sets,
                                        "visits": visits, "capture_medians_us": draws, "spin_clock_mhz": clocks,
                                        "cut_us": cut,
                                        "slow_share": share, "gap": gap, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
