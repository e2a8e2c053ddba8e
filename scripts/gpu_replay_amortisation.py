#!/usr/bin/env python
"""Per-call time against the number of calls one graph replay holds (issue 13, item 5).

A sample is one graph replay of calls cycling the cold-cache input copies, its time divided by the
calls; the replay's launch is spread over them.  This measures triton-splitkv at batch 1, 12 heads,
page 64, at each context with the split count given, holding a fixed number of calls per replay
(64 to 512), one pass over the copies (the rule before item 5) and the default rule (at least
``min_replay_us`` of work), in two rounds (forward, then backward, so a slow drift shows as a
difference between rounds).  Per-call time should be flat within 1% from 64 to 512 calls::

    python3 scripts/gpu_replay_amortisation.py --out OUT/amortisation.json

On a machine without a GPU it runs as a smoke test (wall clock, one pass: nothing to amortise).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlabench.backends import get_backend  # noqa: E402
from mlabench.measure import ShapeBench  # noqa: E402
from mlabench.shapes import MLADecodeShape  # noqa: E402
from mlabench.steady import warm_up  # noqa: E402
from mlabench.timing import TimingConfig  # noqa: E402


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def settings(calls: list[int]) -> list[tuple[str, TimingConfig]]:
    """(label, timing) of each replay length measured: one pass, the default rule, fixed counts."""
    base = dict(eager=False, budget_s=1.0)
    return ([("one pass", TimingConfig(min_replay_us=0, **base)), ("default", TimingConfig(**base))]
            + [(f"{n} calls", TimingConfig(min_replay_us=0, min_calls_per_replay=n, **base)) for n in calls])


def measure_context(context: int, splits: int, calls: list[int], backend: str, page_size: int) -> dict:
    """Every replay length at one context, two rounds; per length the calls held and µs per call."""
    shape = MLADecodeShape.uniform(1, context, 12, page_size=page_size)
    bench = ShapeBench(shape, TimingConfig())
    rows: dict[str, dict] = {}
    plan = settings(calls)
    for round_plan in (plan, plan[::-1]):
        for label, timing in round_plan:
            bench.timing = timing
            rec = bench.run(get_backend(backend), {"num_kv_splits": splits}, copy_bw_tbps=None, run_id="amortisation")
            if rec.stats is None:
                raise SystemExit(f"{backend} at {context}: {rec.status} {rec.message}")
            row = rows.setdefault(label, {"calls": rec.stats.calls_per_sample, "us": []})
            row["us"].append(rec.stats.median_us)
    for row in rows.values():
        row["mean_us"] = statistics.fmean(row["us"])
    fixed = [rows[f"{n} calls"]["mean_us"] for n in calls]
    return {"context": context, "splits": splits, "copies": len(bench.inputs), "rows": rows,
            "spread_fixed": max(fixed) / min(fixed) - 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="1024,32768,131072")
    ap.add_argument("--splits", default="32,256,256", help="num_kv_splits per context (the H200's best)")
    ap.add_argument("--calls", default="64,128,256,512")
    ap.add_argument("--backend", default="triton-splitkv")
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--out", type=Path, help="Write every number here as JSON.")
    args = ap.parse_args()
    calls = ints(args.calls)
    steady = warm_up(TimingConfig())
    print(f"warm-up: {steady.reason}", flush=True)
    results = [measure_context(c, s, calls, args.backend, args.page_size)
               for c, s in zip(ints(args.contexts), ints(args.splits), strict=True)]
    labels = [label for label, _ in settings(calls)]
    print("\n| context | splits | copies | " + " | ".join(labels) + f" | spread {calls[0]}-{calls[-1]} |")
    print("|---" * (len(labels) + 4) + "|")
    for r in results:
        cells = [f"{r['rows'][k]['mean_us']:.2f} ({r['rows'][k]['calls']})" for k in labels]
        print(f"| {r['context']} | {r['splits']} | {r['copies']} | " + " | ".join(cells)
              + f" | {100 * r['spread_fixed']:.2f}% |")
    worst = max(r["spread_fixed"] for r in results)
    longest = f"{calls[-1]} calls"
    default = max(abs(r["rows"]["default"]["mean_us"] / r["rows"][longest]["mean_us"] - 1) for r in results)
    print(f"\nµs per call (calls per replay), mean of two rounds; {args.backend}, batch 1, 12 heads, page "
          f"{args.page_size}.\nper-call time from {calls[0]} to {calls[-1]} calls flat within 1%: "
          f"{'yes' if worst <= 0.01 else 'NO'} (worst spread {100 * worst:.2f}%); the sweep's default replay "
          f"length within {100 * default:.2f}% of {longest}")
    if args.out:
        args.out.write_text(json.dumps({"warmup": steady.model_dump(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
