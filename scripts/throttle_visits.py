#!/usr/bin/env python
"""Which slow visits the GPU reported as held down, from a visit run's ``visits.jsonl`` (issue 13).

Every visit records NVML's readings just before and after its timing (``gpu_state_before``,
``gpu_state``; :func:`mlabench.observers.gpu_state`): the SM clock, the clocks event reasons, the
cumulative power and thermal violation counters (ns the clocks were held down) and the energy
counter.  For every visit that was slow (more than ``--slow``, default 1.5%, slower than its
point's fastest visit: its excess) or held down, this prints the excess beside the violation time,
mean power and clocks over it; then how all the timed visits split between visits with and
without violation time.  The mean power is ``-`` where NVML's energy counter did not move over
the visit (it updates less often than a visit of tens of ms lasts)::

    python3 scripts/throttle_visits.py RUN [RUN ...] > throttle.md

No GPU needed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from pathlib import Path
from typing import Any


def visits(run: Path) -> list[dict[str, Any]]:
    """The timed visits of ``run`` in the order measured, each ``{key, label, visit, median_us,
    before, after}``."""
    path = run / "visits.jsonl"
    text = path.read_text() if path.exists() else gzip.decompress((run / "visits.jsonl.gz").read_bytes()).decode()
    out = []
    for line in text.splitlines():
        data = json.loads(line)
        rec = data["record"]
        if rec["status"] != "ok" or not rec.get("stats"):
            continue
        params = ",".join(f"{k}={v}" for k, v in sorted(rec["params"].items()) if v != "")
        out.append({"key": rec["key"], "visit": data["visit"], "median_us": rec["stats"]["median_us"],
                    "label": f"{rec['backend']} b{rec['batch']} {rec['context_len']} {params}",
                    "before": rec.get("gpu_state_before") or {}, "after": rec.get("gpu_state") or {}})
    return out


def delta(v: dict[str, Any], key: str, scale: float = 1.0) -> float | None:
    """``after[key] - before[key]`` times ``scale``; None when either is missing."""
    a, b = v["after"].get(key), v["before"].get(key)
    return None if a is None or b is None else (a - b) * scale


def mean_power_w(v: dict[str, Any]) -> float | None:
    """Energy used over the visit / its duration (both read with NVML's readings), W; None when
    unknown or when the energy counter did not move."""
    energy_mj, span_s = delta(v, "energy_mj"), delta(v, "at_s")
    return None if not energy_mj or not span_s else energy_mj / 1000.0 / span_s


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--slow", type=float, default=0.015, help="excess over the fastest visit counted slow")
    args = ap.parse_args()
    rows = []
    for run in args.runs:
        vs = visits(run)
        fastest: dict[str, float] = {}
        for v in vs:
            fastest[v["key"]] = min(fastest.get(v["key"], v["median_us"]), v["median_us"])
        for v in vs:
            v["excess"] = v["median_us"] / fastest[v["key"]] - 1
            v["power_ms"] = delta(v, "power_violation_ns", 1e-6)
            v["thermal_ms"] = delta(v, "thermal_violation_ns", 1e-6)
            v["held"] = (v["power_ms"] or 0) + (v["thermal_ms"] or 0) > 0
            v["run"] = run.name
            rows.append(v)
    print(f"# Slow visits and what NVML reported ({len(rows)} visits of {len(args.runs)} run(s))\n")
    print(f"| run | point | visit | median µs | excess % | power-held ms | thermal-held ms | mean W | "
          f"SM MHz before/after | reasons before/after |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for v in sorted(rows, key=lambda v: -v["excess"]):
        if v["excess"] < args.slow and not v["held"]:
            continue
        reasons = "/".join(hex(v[s].get("clocks_event_reasons", 0)) if "clocks_event_reasons" in v[s] else "-"
                           for s in ("before", "after"))
        clocks = f"{v['before'].get('sm_clock_mhz', '-')}/{v['after'].get('sm_clock_mhz', '-')}"
        print(f"| {v['run']} | {v['label']} | {v['visit']} | {v['median_us']:.2f} | {100 * v['excess']:.2f} | "
              f"{fmt(v['power_ms'])} | {fmt(v['thermal_ms'])} | {fmt(mean_power_w(v), '.0f')} | {clocks} | {reasons} |")
    known = [v for v in rows if v["power_ms"] is not None]
    print(f"\n{len(known)} of {len(rows)} visits read the violation counters.\n")
    print("| visits | n | slow (excess > {:.1f}%) | median excess % | worst excess % |".format(100 * args.slow))
    print("|---|---|---|---|---|")
    for name, group in (("held down (violation time > 0)", [v for v in known if v["held"]]),
                        ("not held down", [v for v in known if not v["held"]])):
        if group:
            ex = [v["excess"] for v in group]
            slow = sum(e > args.slow for e in ex)
            print(f"| {name} | {len(group)} | {slow} | {100 * statistics.median(ex):.2f} | {100 * max(ex):.2f} |")


if __name__ == "__main__":
    main()
