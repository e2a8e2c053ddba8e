#!/usr/bin/env python
"""Where a point's run-to-run difference comes from (issue 13): placement, time, or the launch.

Two runs of the same sweep disagree by 1-2% at points whose own samples agree within 0.1-0.5%, so
the difference lives on a time scale longer than one point's measurement (about 20 ms of samples).
This script separates the candidates at the points that differed most on the H200:

- **placement**: each point's inputs are allocated ``--allocs`` times (each allocation its own
  cold-cache copies), all held at once;
- **time**: each allocation is measured ``--reps`` times, allocations taking turns, so a slow
  phase of the GPU falls on every allocation;
- **launch** (replay amortisation, run first unless ``--no-amortisation`` or ``--skip``): per-call
  time at 1K and 32K tokens with 64-512 calls per replay, with and without the device-side lead
  that hides a replay's launch (``TimingConfig.lead_us``);
- **capture or time** (``--blocks``): ``--blocks`` blocks of 10 samples from one captured graph
  against as many fresh captures (``--skip``: only this comparison).

A spread between allocations that repeats across repetitions is placement; a spread between
repetitions shared by every allocation is time::

    python3 scripts/gpu_noise_sources.py --out OUT/noise.json > OUT/noise.md

``--reallocate N`` measures each point instead on inputs made afresh N times (the same seed; each
set freed and the allocator's cache emptied before the next; with ``--spacer-mib M`` a block of a
random size up to M MiB is allocated and held first): whether a fresh allocation lands elsewhere.

``--point BACKEND:BATCH:CONTEXT[:PARAMS-JSON]`` (repeatable) measures those points instead of
:data:`POINTS`, each also in the capture-or-time comparison; ``--no-amortisation`` leaves the launch
comparison out.
Run in several processes one after the other, it also shows a state that lasts a whole process.

Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from mlabench.backends import get_backend  # noqa: E402
from mlabench.measure import ShapeBench  # noqa: E402
from mlabench.shapes import MLADecodeShape  # noqa: E402
from mlabench.steady import warm_up  # noqa: E402
from mlabench.timing import TimingConfig, time_calls  # noqa: E402

#: (backend, batch, context, params): the points two H200 runs disagreed on most (diff.json).
POINTS = [
    ("triton-splitkv", 16, 100000, {"num_kv_splits": 48}),
    ("triton-splitkv", 16, 8192, {"num_kv_splits": 16}),
    ("triton-persistent", 16, 32768, {"head_padding": "zero", "programs_per_sm": 1}),
    ("triton-splitkv", 1, 100000, {"num_kv_splits": 128}),
    ("flashmla", 1, 4096, {}),
]


def parse_point(text: str) -> tuple[str, int, int, dict]:
    """``BACKEND:BATCH:CONTEXT[:PARAMS-JSON]`` as a point of :data:`POINTS`."""
    backend, batch, context, *params = text.split(":", 3)
    return backend, int(batch), int(context), json.loads(params[0]) if params else {}


def spread_pct(values: list[float]) -> float:
    return 100 * (max(values) / min(values) - 1)


def noise_point(backend_name: str, batch: int, context: int, params: dict, allocs: int, reps: int,
                timing: TimingConfig) -> dict | None:
    """Medians (µs) of one point: ``allocs`` input allocations x ``reps`` repetitions, interleaved."""
    backend = get_backend(backend_name)
    ok, why = backend.available()
    if not ok:
        print(f"<!-- {backend_name}: {why} -->", flush=True)
        return None
    shape = MLADecodeShape.uniform(batch, context, 12, page_size=64)
    benches = [ShapeBench(shape, timing, seed=1000 * a) for a in range(allocs)]
    calls = [[backend.prepare(x, params).fn for x in b.inputs] for b in benches]
    medians = [[0.0] * reps for _ in range(allocs)]
    for r in range(reps):
        for a in range(allocs):
            medians[a][r] = time_calls(calls[a], timing, use_graph=True).median_us
    copies = len(benches[0].inputs)
    del calls, benches
    torch.cuda.empty_cache()
    alloc_means = [statistics.fmean(m) for m in medians]
    rep_means = [statistics.fmean(medians[a][r] for a in range(allocs)) for r in range(reps)]
    return {"backend": backend_name, "batch": batch, "context": context, "params": params,
            "copies": copies, "medians_us": medians,
            "between_allocs_pct": spread_pct(alloc_means), "between_reps_pct": spread_pct(rep_means),
            "within_alloc_pct": statistics.median(spread_pct(m) for m in medians),
            "all_pct": spread_pct([x for m in medians for x in m])}


def reallocation(backend_name: str, batch: int, context: int, params: dict, rounds: int, spacer_mib: int,
                 timing: TimingConfig) -> dict:
    """Medians (µs) of one point on inputs allocated afresh ``rounds`` times, with the first KV
    copy's address each time (see the module docstring)."""
    import random

    backend = get_backend(backend_name)
    shape = MLADecodeShape.uniform(batch, context, 12, page_size=64)
    rng = random.Random(0)
    medians, addresses = [], []
    for _ in range(rounds):
        spacer = torch.empty(rng.randrange(spacer_mib + 1) << 20, dtype=torch.uint8, device="cuda") if spacer_mib else None
        bench = ShapeBench(shape, timing, seed=0)
        fns = [backend.prepare(x, params).fn for x in bench.inputs]
        medians.append(time_calls(fns, timing, use_graph=True).median_us)
        addresses.append(hex(bench.inputs[0].kv_cache.data_ptr()))
        del fns, bench, spacer
        torch.cuda.empty_cache()
    return {"backend": backend_name, "batch": batch, "context": context, "params": params, "spacer_mib": spacer_mib,
            "medians_us": medians, "kv_addresses": addresses, "spread_pct": spread_pct(medians)}


def capture_or_time(backend_name: str, batch: int, context: int, params: dict, blocks: int,
                    block: int = 10) -> dict:
    """Is a point's state set when its graph is captured, or does it change in time?  ``blocks``
    consecutive blocks of ``block`` samples from one capture, against ``blocks`` fresh captures of
    ``block`` samples each (medians per block, µs)."""
    backend = get_backend(backend_name)
    shape = MLADecodeShape.uniform(batch, context, 12, page_size=64)
    bench = ShapeBench(shape, TimingConfig(eager=False))
    fns = [backend.prepare(x, params).fn for x in bench.inputs]
    one = TimingConfig(eager=False, warmup_iters=0, min_samples=blocks * block, max_samples=blocks * block,
                       budget_s=1e9)
    samples = time_calls(fns, one, use_graph=True).samples_us
    in_time = [statistics.median(samples[i:i + block]) for i in range(0, len(samples), block)]
    fresh = TimingConfig(eager=False, min_samples=block, max_samples=block, budget_s=1e9)
    captures = [time_calls(fns, fresh, use_graph=True).median_us for _ in range(blocks)]
    del bench, fns
    torch.cuda.empty_cache()
    return {"backend": backend_name, "batch": batch, "context": context, "params": params,
            "one_capture_blocks_us": in_time, "fresh_captures_us": captures,
            "one_capture_pct": spread_pct(in_time), "fresh_captures_pct": spread_pct(captures)}


def amortisation(contexts: list[tuple[int, int]], calls: list[int], rounds: int = 2) -> list[dict]:
    """Per-call µs against calls per replay, with the default lead and with none."""
    rows = []
    for context, splits in contexts:
        shape = MLADecodeShape.uniform(1, context, 12, page_size=64)
        bench = ShapeBench(shape, TimingConfig())
        fns = [get_backend("triton-splitkv").prepare(x, {"num_kv_splits": splits}).fn for x in bench.inputs]
        for lead in (TimingConfig().lead_us, 0.0):
            us: dict[int, list[float]] = {n: [] for n in calls}
            for rnd in range(rounds):
                for n in calls if rnd % 2 == 0 else calls[::-1]:
                    cfg = TimingConfig(eager=False, budget_s=1.0, min_replay_us=0, min_calls_per_replay=n, lead_us=lead)
                    us[n].append(time_calls(fns, cfg, use_graph=True).median_us)
            means = {n: statistics.fmean(v) for n, v in us.items()}
            rows.append({"context": context, "splits": splits, "copies": len(fns), "lead_us": lead,
                         "us": means, "spread_pct": spread_pct(list(means.values()))})
        del bench, fns
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--allocs", type=int, default=4, help="input allocations of each point, held at once")
    ap.add_argument("--reps", type=int, default=5, help="repetitions of each allocation, allocations taking turns")
    ap.add_argument("--blocks", type=int, default=15, help="blocks of 10 samples (one capture) and fresh captures")
    ap.add_argument("--skip", action="store_true", help="only the capture-or-time comparison")
    ap.add_argument("--point", action="append", type=parse_point, metavar="BACKEND:BATCH:CONTEXT[:PARAMS-JSON]",
                    help="measure this point instead of the built-in ones (repeatable)")
    ap.add_argument("--no-amortisation", action="store_true", help="leave the replay amortisation out")
    ap.add_argument("--reallocate", type=int, default=0, metavar="N", help="only: each point on N fresh allocations")
    ap.add_argument("--spacer-mib", type=int, default=0, metavar="M", help="with --reallocate: a random block first")
    ap.add_argument("--out", type=Path, help="Write every number here as JSON.")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: needs a GPU")
    print(f"warm-up: {warm_up(TimingConfig()).reason}\n", flush=True)
    timing = TimingConfig(eager=False)
    chosen = args.point or POINTS
    if args.reallocate:
        rows = [reallocation(*p, args.reallocate, args.spacer_mib, TimingConfig(eager=False)) for p in chosen]
        print("| backend | batch | context | params | spacer MiB | medians µs | KV addresses | spread % |\n"
              "|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['backend']} | {r['batch']} | {r['context']} | {r['params'] or '-'} | {r['spacer_mib']} | "
                  f"{', '.join(f'{x:.1f}' for x in r['medians_us'])} | {len(set(r['kv_addresses']))} distinct | "
                  f"{r['spread_pct']:.2f} |", flush=True)
        if args.out:
            args.out.write_text(json.dumps({"reallocation": rows}, indent=1))
        return
    amort = [] if args.skip or args.no_amortisation else amortisation([(1024, 32), (32768, 256)], [64, 128, 256, 512])
    print("| context | splits | copies | lead µs | 64 | 128 | 256 | 512 | spread % |\n|---|---|---|---|---|---|---|---|---|")
    for r in amort:
        print(f"| {r['context']} | {r['splits']} | {r['copies']} | {r['lead_us']:g} | "
              + " | ".join(f"{r['us'][n]:.3f}" for n in (64, 128, 256, 512)) + f" | {r['spread_pct']:.2f} |", flush=True)
    print(f"\n| backend | batch | context | params | between {args.allocs} allocations % | between {args.reps} "
          "repetitions % | within one allocation % | all % |\n|---|---|---|---|---|---|---|---|")
    points = []
    for backend, batch, context, params in [] if args.skip else chosen:
        p = noise_point(backend, batch, context, params, args.allocs, args.reps, timing)
        if p is None:
            continue
        points.append(p)
        print(f"| {backend} | {batch} | {context} | {params or '-'} | {p['between_allocs_pct']:.2f} | "
              f"{p['between_reps_pct']:.2f} | {p['within_alloc_pct']:.2f} | {p['all_pct']:.2f} |", flush=True)
    print("\n| backend | batch | context | params | blocks of one capture % | fresh captures % |\n|---|---|---|---|---|---|")
    kinds = []
    for backend, batch, context, params in args.point or POINTS[:4]:
        k = capture_or_time(backend, batch, context, params, args.blocks)
        kinds.append(k)
        print(f"| {backend} | {batch} | {context} | {params or '-'} | {k['one_capture_pct']:.2f} | "
              f"{k['fresh_captures_pct']:.2f} |", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"amortisation": amort, "points": points, "capture_or_time": kinds}, indent=1))


if __name__ == "__main__":
    main()
