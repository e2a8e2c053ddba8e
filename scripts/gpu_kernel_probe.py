#!/usr/bin/env python
"""GPU probe of the project's Triton MLA decode kernels: correctness in bf16, then cold-L2 timings.

Run on one GPU (written for an H200: 132 SMs, 60 MiB L2), well under 5 minutes::

    python scripts/gpu_kernel_probe.py                 # full default sweep
    python scripts/gpu_kernel_probe.py --splitkv-variants "64,4,2;32,4,3" --budget-s 120

(a) Correctness: both kernels in bf16 against the fp32 reference at B=1 H=12 L=4096 page 64 and a
    ragged B=4 batch, for every launch variant; max abs error, pass at atol = rtol = 1e-2.
(b) Timing: CUDA graph replay over N input copies whose bytes exceed 2x L2 (cold L2), N calls
    captured in one graph, replays timed with CUDA events, time / N, median of ``--replays``.
    Floor = B * L * 576 * 2 bytes / 4.3 TB/s (about an H200's copy bandwidth).  Variants are
    ``block_n,num_warps,num_stages`` triples; a variant that fails to compile or run is recorded
    as an error row.  Results go to ``$OUT/kernel_probe.json`` when ``$OUT`` is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

import torch

from mlabench.inputs import make_inputs
from mlabench.kernels.padding import HeadPadder
from mlabench.kernels.persistent import (
    WORK_GRANULARITY_TOKENS, alloc_persistent_workspace, mla_decode_persistent,
)
from mlabench.kernels.reference import mla_decode_reference
from mlabench.kernels.splitkv import alloc_splitkv_workspace, mla_decode_splitkv
from mlabench.kernels.worklist import build_work_list
from mlabench.shapes import MLADecodeShape

COPY_TBPS = 4.3
HEADS = 12
DEVICE = "cuda"  # "cpu" with --cpu-smoke (TRITON_INTERPRET=1), to test this script without a GPU


REPORT: dict = {"env": {}, "args": {}, "checks": [], "timings": []}


def save_report() -> None:
    """Write :data:`REPORT` to ``$OUT/kernel_probe.json`` (after every block: a killed run keeps
    what it measured)."""
    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(os.path.join(out_dir, "kernel_probe.json"), "w") as fh:
            json.dump(REPORT, fh, indent=1, default=str)


def parse_variants(text: str) -> list[tuple[int, int, int]]:
    """``"64,4,2;32,4,3"`` -> ``[(64, 4, 2), (32, 4, 3)]`` (block_n, num_warps, num_stages)."""
    return [tuple(int(x) for x in part.split(",")) for part in text.split(";") if part.strip()]


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


class SplitKVCall:
    """One prepared split-KV call on one input copy (workspace shared between copies)."""

    def __init__(self, inp, splits, variant, ws):
        self.inp, self.splits, self.variant, self.ws = inp, splits, variant, ws
        self.out = inp.new_output()

    def __call__(self):
        bn, nw, ns = self.variant
        i = self.inp
        return mla_decode_splitkv(i.q, i.kv_cache, i.block_table, i.cache_seqlens, self.out,
                                  self.splits, i.shape.scale, partial_out=self.ws[0],
                                  partial_lse=self.ws[1], block_n=bn, num_warps=nw, num_stages=ns)


class PersistentCall:
    """One prepared persistent call on one input copy, pad and slice copies included (as the
    ``triton-persistent`` backend times them)."""

    def __init__(self, inp, num_programs, variant, ws, mode="zero"):
        s = inp.shape
        self.inp, self.g, self.variant, self.ws = inp, num_programs, variant, ws
        self.pad = HeadPadder(inp.q, 16, mode)
        self.out_pad = torch.empty((s.batch, 16, 512), dtype=inp.q.dtype, device=inp.device)
        self.out = inp.new_output()
        self.work = build_work_list(inp.cache_seqlens, num_programs, WORK_GRANULARITY_TOKENS)

    def __call__(self):
        bn, nw, ns = self.variant
        i = self.inp
        mla_decode_persistent(self.pad(), i.kv_cache, i.block_table, i.cache_seqlens, self.out_pad,
                              i.shape.scale, self.g, work=self.work, partial_out=self.ws[0],
                              partial_lse=self.ws[1], block_n=bn, num_warps=nw, num_stages=ns)
        return self.out.copy_(self.out_pad[:, :HEADS])


def check(call, inp, ref) -> dict:
    out = call().float()
    err = (out - ref).abs()
    ok = bool(torch.isfinite(out).all()) and bool((err <= 1e-2 + 1e-2 * ref.abs()).all())
    return {"max_abs_err": float(err.max()) if torch.isfinite(out).all() else float("nan"),
            "pass": ok}


def time_graph(calls, replays: int) -> tuple[float, list[float]]:
    """Median µs per call: ``calls`` captured in one graph, ``replays`` replays timed by events
    (eager wall-clock on the CPU smoke run)."""
    if DEVICE == "cpu":
        samples = []
        for _ in range(replays):
            t0 = time.perf_counter()
            for c in calls:
                c()
            samples.append((time.perf_counter() - t0) * 1e6 / len(calls))
        return statistics.median(samples), samples
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graph
    return statistics.median(samples), samples


def correctness(args, sk_variants, ps_variants, num_sms) -> list[dict]:
    rows = REPORT["checks"]
    cases = [("B=1 L=4096", (4096,)), ("B=4 ragged", (1, 1000, 4096, 777))]
    if DEVICE == "cpu":
        cases = [("B=1 L=300", (300,)), ("B=4 ragged", (1, 100, 200, 77))]
    for label, lens in cases:
        shape = MLADecodeShape.create(num_heads=HEADS, context_lens=lens, page_size=64)
        inp = make_inputs(shape, device=DEVICE, seed=7)
        ref, _ = mla_decode_reference(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens,
                                      shape.scale)
        for v in sk_variants:
            for splits in (1, 7, 64):
                row = {"kernel": "triton-splitkv", "case": label, "variant": v, "splits": splits}
                try:
                    ws = alloc_splitkv_workspace(shape.batch, HEADS, splits, DEVICE)
                    row |= check(SplitKVCall(inp, splits, v, ws), inp, ref)
                except Exception as exc:  # noqa: BLE001 - a failing variant is a row, not a crash
                    row |= {"pass": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
                rows.append(row)
        for v in ps_variants:
            for pps in args.programs_per_sm:
                g = pps * num_sms
                row = {"kernel": "triton-persistent", "case": label, "variant": v, "num_programs": g}
                try:
                    ws = alloc_persistent_workspace(g, shape.batch, 16, DEVICE)
                    row |= check(PersistentCall(inp, g, v, ws), inp, ref)
                except Exception as exc:  # noqa: BLE001
                    row |= {"pass": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
                rows.append(row)
        for r in rows[-(len(sk_variants) * 3 + len(ps_variants) * len(args.programs_per_sm)):]:
            print(f"check {r['kernel']:17s} {r['case']:10s} {str(r['variant']):12s} "
                  f"{'splits=' + str(r.get('splits')) if 'splits' in r else 'G=' + str(r.get('num_programs')):10s} "
                  f"err={r.get('max_abs_err', float('nan')):.2e} {'PASS' if r['pass'] else 'FAIL'} "
                  f"{r.get('error', '')}", flush=True)
        save_report()
    return rows


def timings(args, sk_variants, ps_variants, num_sms, l2_bytes, t_start) -> list[dict]:
    rows = REPORT["timings"]
    for batch in args.batches:
        for ctx in args.contexts:
            shape = MLADecodeShape.uniform(batch, ctx, HEADS, page_size=64)
            floor_us = batch * ctx * 576 * 2 / (COPY_TBPS * 1e12) * 1e6
            per_copy = shape.kv_cache_bytes + shape.q_bytes
            copies = max(2, -(-2 * l2_bytes // per_copy))
            if DEVICE == "cpu":
                copies = 2
            else:
                free = torch.cuda.mem_get_info()[0]
                copies = int(min(copies, max(1, 0.5 * free // per_copy)))
            inputs = [make_inputs(shape, device=DEVICE, seed=s) for s in range(copies)]
            jobs = [("triton-splitkv", v, {"splits": s}) for s in args.splits for v in sk_variants]
            jobs += [("triton-persistent", v, {"programs_per_sm": p})
                     for p in args.programs_per_sm for v in ps_variants]
            for kernel, v, extra in jobs:
                row = {"kernel": kernel, "batch": batch, "context": ctx, "variant": v,
                       "copies": copies, "floor_us": floor_us, **extra}
                if time.time() - t_start > args.budget_s:
                    rows.append(row | {"status": "skipped (time budget)"})
                    continue
                try:
                    if kernel == "triton-splitkv":
                        ws = alloc_splitkv_workspace(batch, HEADS, extra["splits"], DEVICE)
                        calls = [SplitKVCall(i, extra["splits"], v, ws) for i in inputs]
                    else:
                        g = extra["programs_per_sm"] * num_sms
                        ws = alloc_persistent_workspace(g, batch, 16, DEVICE)
                        calls = [PersistentCall(i, g, v, ws) for i in inputs]
                        row["num_programs"] = g
                    med, samples = time_graph(calls, args.replays)
                    row |= {"status": "ok", "us": med, "pct_of_floor": 100 * floor_us / med,
                            "samples_us": samples}
                except Exception as exc:  # noqa: BLE001
                    row |= {"status": f"error: {type(exc).__name__}: {exc}"[:300]}
                    if DEVICE == "cuda":
                        torch.cuda.synchronize()
                rows.append(row)
                if row["status"] == "ok":
                    knob = f"S={extra['splits']}" if "splits" in extra else f"pps={extra['programs_per_sm']}"
                    print(f"time {kernel:17s} B={batch:<3d} L={ctx:<7d} {knob:7s} {str(v):12s} "
                          f"{row['us']:9.1f} us {row['pct_of_floor']:5.1f}% of floor", flush=True)
                else:
                    print(f"time {kernel} B={batch} L={ctx} {extra} {v}: {row['status']}", flush=True)
            del inputs
            save_report()
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    return rows


def summary(rows: list[dict], checks: list[dict]) -> None:
    """Best variant per (kernel, B, L) among variants that passed every check, and the median
    % of floor of each split-KV variant."""
    bad = {(c["kernel"], tuple(c["variant"])) for c in checks if not c["pass"]}
    if bad:
        print(f"\nvariants excluded (failed a check): {sorted(bad)}")
    print("\n== best per kernel / batch / context (µs, % of floor, knob, block_n,warps,stages) ==")
    best: dict[tuple, dict] = {}
    for r in rows:
        if r.get("status") != "ok" or (r["kernel"], tuple(r["variant"])) in bad:
            continue
        key = (r["kernel"], r["batch"], r["context"])
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    for (kernel, b, ctx), r in sorted(best.items()):
        knob = f"S={r['splits']}" if "splits" in r else f"pps={r['programs_per_sm']}"
        print(f"{kernel:17s} B={b:<3d} L={ctx:<7d} {r['us']:9.1f} {r['pct_of_floor']:5.1f}%  "
              f"{knob:8s} {r['variant']}")
    print("\n== split-KV: best µs over variants, per split count ==")
    grid: dict[tuple, dict[int, float]] = {}
    for r in rows:
        if (r.get("status") == "ok" and r["kernel"] == "triton-splitkv"
                and ("triton-splitkv", tuple(r["variant"])) not in bad):
            cell = grid.setdefault((r["batch"], r["context"]), {})
            cell[r["splits"]] = min(cell.get(r["splits"], float("inf")), r["us"])
    all_splits = sorted({k for cell in grid.values() for k in cell})
    print("B    L       " + "".join(f"{'S=' + str(k):>10s}" for k in all_splits))
    for (b, ctx), cell in sorted(grid.items()):
        print(f"{b:<4d} {ctx:<7d} " + "".join(f"{cell.get(k, float('nan')):10.1f}" for k in all_splits))
    print("\n== split-KV variants: median over all (B, L, S) of % of floor ==")
    by_variant: dict[tuple, list[float]] = {}
    for r in rows:
        if r.get("status") == "ok" and r["kernel"] == "triton-splitkv":
            by_variant.setdefault(tuple(r["variant"]), []).append(r["pct_of_floor"])
    for v, vals in sorted(by_variant.items(), key=lambda kv: -statistics.median(kv[1])):
        print(f"{str(v):14s} {statistics.median(vals):5.1f}%  ({len(vals)} points)")


def smoke(args) -> int:
    """Exercise checks, timing loop, JSON and summary on the CPU with tiny shapes."""
    args.batches, args.contexts, args.splits, args.replays = [1, 2], [96], [3, 5], 1
    args.programs_per_sm = [1]
    sk, ps = parse_variants(args.splitkv_variants)[:2], parse_variants(args.persistent_variants)[:1]
    t0 = time.time()
    checks = correctness(args, sk, ps, 2)
    rows = timings(args, sk, ps, 2, 2**20, t0)
    summary(rows, checks)
    return 0 if all(c["pass"] for c in checks) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splitkv-variants", default="32,4,6;64,4,2;64,4,5;32,4,7;16,4,8;32,8,6",
                    help="block_n,num_warps,num_stages triples separated by ';'")
    ap.add_argument("--persistent-variants", default="32,4,6;64,4,5;16,4,8")
    ap.add_argument("--batches", type=ints, default=[1, 16])
    ap.add_argument("--contexts", type=ints, default=[4096, 32768, 131072])
    ap.add_argument("--splits", type=ints, default=[16, 32, 64, 132, 264])
    ap.add_argument("--programs-per-sm", type=ints, default=[1, 2])
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=230.0,
                    help="stop timing new points after this many seconds (rows marked skipped)")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="tiny CPU run of this script's logic (needs TRITON_INTERPRET=1)")
    args = ap.parse_args(argv)
    global DEVICE
    if args.cpu_smoke:
        DEVICE = "cpu"
        return smoke(args)
    if not torch.cuda.is_available():
        print("no GPU visible: this probe needs CUDA/ROCm", file=sys.stderr)
        return 2
    import triton

    t_start = time.time()
    props = torch.cuda.get_device_properties(0)
    num_sms = props.multi_processor_count
    l2_bytes = int(getattr(props, "L2_cache_size", 0) or 60 * 2**20)
    env = {"gpu": props.name, "num_sms": num_sms, "l2_bytes": l2_bytes, "torch": torch.__version__,
           "triton": triton.__version__, "copy_tbps_assumed": COPY_TBPS}
    print(json.dumps(env), flush=True)
    REPORT["env"], REPORT["args"] = env, vars(args)
    sk_variants = parse_variants(args.splitkv_variants)
    ps_variants = parse_variants(args.persistent_variants)
    checks = [] if args.skip_check else correctness(args, sk_variants, ps_variants, num_sms)
    print(f"checks done in {time.time() - t_start:.0f} s", flush=True)
    rows = REPORT["timings"]
    try:
        timings(args, sk_variants, ps_variants, num_sms, l2_bytes, t_start)
    except Exception:  # noqa: BLE001 - keep what was measured
        traceback.print_exc()
    finally:
        save_report()
    summary(rows, checks)
    failed = [c for c in checks if not c["pass"]]
    print(f"\n{len(checks) - len(failed)}/{len(checks)} checks passed; "
          f"{sum(r.get('status') == 'ok' for r in rows)}/{len(rows)} timings ok; "
          f"{time.time() - t_start:.0f} s total")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
