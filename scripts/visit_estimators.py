#!/usr/bin/env python
"""How repeatable each way of combining a point's visits is, on recorded visit runs (issue 13).

Reads the ``visits.jsonl`` (or ``.gz``) of two or more sweeps of the same configuration, each point
timed in several visits, and for every pair of runs and every estimator (the sweep's pooled median,
the mean, median or minimum of the visits' medians, the mean of every graph's median (runs with several graphs per visit), the pooled 25th percentile, the first visit
alone, i.e. one visit) prints the share of the points of 20 µs or more within 1% and 2%, and the
worst difference::

    python3 scripts/visit_estimators.py RUN RUN [RUN ...] > estimators.md

No GPU needed.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import statistics
from collections.abc import Callable
from pathlib import Path

Visits = list[tuple[int, float, list[float], list[float]]]


def load(run: Path) -> dict[str, Visits]:
    """``{point key: [(visit, median µs, samples µs, each graph's median µs)]}`` of the timed visits of
    ``run`` (a visit from one graph has its median as its one graph median)."""
    path = run / "visits.jsonl"
    lines = path.read_text().splitlines() if path.exists() else gzip.decompress((run / "visits.jsonl.gz").read_bytes()).decode().splitlines()
    out: dict[str, Visits] = {}
    for line in lines:
        data = json.loads(line)
        rec = data["record"]
        if rec["status"] == "ok" and rec.get("stats"):
            stats = rec["stats"]
            out.setdefault(rec["key"], []).append((data["visit"], stats["median_us"], stats["samples_us"],
                                                   stats.get("capture_medians_us") or [stats["median_us"]]))
    return out


def _pooled(v: Visits) -> list[float]:
    return sorted(x for _, _, samples, _ in v for x in samples)


ESTIMATORS: dict[str, Callable[[Visits], float]] = {
    "pooled median (the sweep's)": lambda v: statistics.median(_pooled(v)),
    "mean of visit medians": lambda v: statistics.fmean(m for _, m, _, _ in v),
    "mean of graph medians": lambda v: statistics.fmean(g for *_, gs in v for g in gs),
    "median of visit medians": lambda v: statistics.median(m for _, m, _, _ in v),
    "min of visit medians": lambda v: min(m for _, m, _, _ in v),
    "pooled 25th percentile": lambda v: _pooled(v)[len(_pooled(v)) // 4],
    "first visit alone (one visit)": lambda v: next(m for i, m, _, _ in v if i == 1),
}


def compare(a: dict[str, Visits], b: dict[str, Visits], f: Callable[[Visits], float], min_us: float = 20.0,
            visits: int = 0) -> tuple[float, float, float]:
    """Share within 1%, share within 2% and the worst |B/A - 1| over the points both runs timed in
    at least ``visits`` visits whose A estimate is at least ``min_us``."""
    diffs = []
    for key, va in a.items():
        vb = b.get(key)
        if vb is None or len(va) < visits or len(vb) < visits:
            continue
        ea, eb = f(va), f(vb)
        if ea >= min_us:
            diffs.append(abs(eb / ea - 1))
    return (sum(d <= 0.01 for d in diffs) / len(diffs), sum(d <= 0.02 for d in diffs) / len(diffs), max(diffs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    args = ap.parse_args()
    if len(args.runs) < 2:
        raise SystemExit("error: give two run folders or more")
    runs = [load(r) for r in args.runs]
    most = max(len(v) for r in runs for v in r.values())
    fewest = min(len(v) for r in runs for v in r.values())  # the planned visits; more where they disagreed
    pairs = list(itertools.combinations(range(len(runs)), 2))
    print("Runs: " + ", ".join(f"{i + 1} = `{r}`" for i, r in enumerate(args.runs)) + "\n")
    print("| estimator | " + " | ".join(f"runs {i + 1}/{j + 1}" for i, j in pairs) + " |")
    print("|---|" + "---|" * len(pairs))
    several_graphs = any(len(gs) > 1 for r in runs for v in r.values() for *_, gs in v)
    for name, f in ESTIMATORS.items():
        if name == "mean of graph medians" and not several_graphs:
            continue  # the mean of visit medians when every visit replayed one graph
        cells = [compare(runs[i], runs[j], f, visits=fewest) for i, j in pairs]
        print(f"| {name} | " + " | ".join(f"{100 * w1:.1f}% / {100 * w2:.1f}% / {100 * worst:.2f}%"
                                          for w1, w2, worst in cells) + " |")
    further = f" (up to {most} where a point's visits disagreed)" if most > fewest else ""
    print(f"\nEach cell: points of 20 µs or more within 1% / within 2% / the worst difference, over the points "
          f"timed in {fewest} visits or more in both runs{further}.")


if __name__ == "__main__":
    main()
