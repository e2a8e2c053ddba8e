"""Nsight Compute profile of the multi-token stage 1 beside FlashMLA (issue 34 item 1): where a
page's time goes at 8 query tokens, batch 16, 32K.

``multi_token=1`` with ``rows_as_m=2`` takes 2.23 µs a page there on an H200 and FlashMLA 1.88
(results/h200/deploy/mt-rows/; the tensor-core floor of a 64-row tile is 1.49).  Whether the page
ring's two slots starve the products (a slot is refilled only after its page's output product)
or the products themselves are slow decides the next structure; this script measures instead of
guessing: each case is prepared as a sweep prepares it, compiled and warmed, then one call runs
between ``cudaProfilerStart``/``Stop`` under ``ncu --profile-from-start off`` with the sections
below and the warp stall reasons (:data:`METRICS`), and the chosen metrics of every kernel are
printed as one markdown table.

    python3 scripts/h200_mt_profile.py --out OUTDIR [--case NAME ...]

OUTDIR gets ``<case>.ncu-rep`` (open it in Nsight Compute), ``<case>.csv`` (every metric) and
``profile.md`` (the table).  The cases (:data:`CASES`): ``mt1-ram2`` (4 splits, the fastest
measured) and the same with its products alone (``-products``: no page copied after the ring's
first ones) and its copies alone (``-copies``: no product), ``mt1`` (rows as N), ``qo1`` (one
token, 8 splits: the cache stream at full occupancy) and ``flashmla``.  If ``-products`` takes
about what ``mt1-ram2`` takes, the products and the softmax set the pace; if ``-copies`` does,
the two-slot ring's copies do.  Nsight Compute locks the clocks (the SM near its base clock,
printed per kernel): compare the cases with each other, not with sweeps at full clock.  NVIDIA
Hopper with ``ncu`` on the PATH; ``--run NAME`` is the profiled process.
"""

from __future__ import annotations

import argparse
import collections
import csv
import io
import shutil
import subprocess
import sys
from pathlib import Path

_MT1_RAM2 = {"num_kv_splits": 4, "multi_token": 1, "rows_as_m": 2}
#: name -> (backend, qo_len, params, KernelVariant.isolate): batch 16, 32768 tokens each, causal.
#: The two ``isolate`` cases time one side of the pipeline alone (their output is wrong).
CASES = {
    "mt1-ram2": ("gluon-splitkv", 8, _MT1_RAM2, ""),
    "mt1-ram2-products": ("gluon-splitkv", 8, _MT1_RAM2, "products"),
    "mt1-ram2-copies": ("gluon-splitkv", 8, _MT1_RAM2, "copies"),
    "mt1": ("gluon-splitkv", 8, {"num_kv_splits": 4, "multi_token": 1}, ""),
    "qo1": ("gluon-splitkv", 1, {"num_kv_splits": 8}, ""),
    "flashmla": ("flashmla", 8, {}, ""),
}
BATCH, CONTEXT = 16, 32768
SECTIONS = ["SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis", "WarpStateStats",
            "SchedulerStats", "LaunchStats", "Occupancy"]
#: Warp stall reasons, as cycles a warp spends in each between two issued instructions (the
#: ratios the WarpStateStats section's chart draws), asked for by name so that the details page
#: lists them.
STALLS = ["long_scoreboard", "barrier", "wait", "math_pipe_throttle", "mio_throttle",
          "short_scoreboard", "sleeping", "membar"]
METRICS = ["smsp__average_warps_active_per_issue_active.ratio"] + [
    f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio" for s in STALLS]
#: (label, substring of ncu's metric name, case-insensitive): the first metric that matches.
COLUMNS = [
    ("time", "duration"),
    ("SM GHz", "sm frequency"),  # ncu locks the clocks (an H100's SM at ~1.4 GHz): compare cases
    ("SM busy %", "sm busy"),
    ("DRAM tput %", "dram throughput"),
    ("L2 hit %", "l2 hit rate"),
    ("cycles / issue", "warps_active_per_issue_active"),
    *[(s.replace("_", " "), f"stalled_{s}_per") for s in STALLS],
    ("registers", "registers per thread"),
    ("shared KB", "dynamic shared memory per block"),
]


def run_case(name: str) -> None:
    """The profiled process: prepare ``name``, warm it (compiles), then one call in the profiled
    range.  Raises KeyError for an unknown case."""
    import dataclasses

    import torch

    from mlabench.backends import get_backend
    from mlabench.backends import gluon
    from mlabench.inputs import make_inputs
    from mlabench.shapes import MLADecodeShape

    backend_name, qo_len, params, isolate = CASES[name]
    if isolate:  # no backend parameter reaches it: the variant the backend builds, amended
        variant_of = gluon._kernel_variant
        gluon._kernel_variant = lambda *a: dataclasses.replace(variant_of(*a), isolate=isolate)
    shape = MLADecodeShape.create(num_heads=12, context_lens=(CONTEXT,) * BATCH, page_size=64,
                                  qo_len=qo_len, causal=True)
    backend = get_backend(backend_name)
    call = backend.prepare(make_inputs(shape, seed=0, poison=False),
                           backend.resolve_params(shape, params))
    for _ in range(3):
        call.fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call.fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def metric_rows(csv_text: str) -> dict[str, dict[str, str]]:
    """ncu's ``--page details --csv`` as ``{kernel name: {metric name: "value unit"}}``."""
    kernels: dict[str, dict[str, str]] = {}
    for row in csv.DictReader(io.StringIO(csv_text)):
        name = row.get("Kernel Name", "?")[:40] + f" #{row.get('ID', '')}"
        unit = row.get("Metric Unit", "")
        kernels.setdefault(name, {})[row.get("Metric Name", "")] = f"{row.get('Metric Value', '')} {unit}".strip()
    return kernels


def pick(metrics: dict[str, str], needle: str) -> str:
    """The value of the first metric whose name contains ``needle`` (case-insensitive), else —."""
    for key, value in metrics.items():
        if needle in key.lower():
            return value
    return "—"


def ncu_csv(rep: Path, name: str, options: list[str], page: list[str]) -> tuple[str, int]:
    """Case ``name`` profiled by ncu with ``options`` into ``rep.ncu-rep``, then that report's
    ``page`` (e.g. ``["--page", "details"]``) as CSV: ``(text, ncu's exit code)``, the text empty
    where the profile failed."""
    cmd = ["ncu", "--profile-from-start", "off", "--target-processes", "all", "-f", "-o", str(rep)]
    done = subprocess.run(cmd + options + [sys.executable, __file__, "--run", name])
    if done.returncode:
        return "", done.returncode
    return subprocess.run(["ncu", "--import", f"{rep}.ncu-rep", *page, "--csv"], capture_output=True,
                          text=True).stdout, 0


def profile(out: Path, names: list[str]) -> str:
    """Profile each case into ``out`` and return the markdown table."""
    lines = ["| case | kernel | " + " | ".join(label for label, _ in COLUMNS) + " |",
             "|---" * (len(COLUMNS) + 2) + "|"]
    for name in names:
        options = [arg for section in SECTIONS for arg in ("--section", section)]
        text, code = ncu_csv(out / name, name, options + ["--metrics", ",".join(METRICS)],
                             ["--page", "details"])
        if not text:
            lines.append(f"| {name} | ncu failed (exit code {code}) |" + " |" * len(COLUMNS))
            continue
        (out / f"{name}.csv").write_text(text)
        for kernel, metrics in metric_rows(text).items():
            lines.append(f"| {name} | {kernel} | " + " | ".join(pick(metrics, n) for _, n in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


#: the stage-1 kernel of each backend, for the source-level profile (ncu's ``-k regex:``)
STAGE1_KERNEL = {"gluon-splitkv": "stage1", "flashmla": "splitkv_mla"}
SAMPLES = "Warp Stall Sampling (All Samples)"


def loop_summary(sass_csv: str, top: int = 8) -> str:
    """ncu's source page (``--page source --csv --print-source sass``) summed by each instruction's
    warp-level execution count: the instructions of one partition's loop share it (the softmax
    warpgroup's page loop runs CTAs x 4 warps x pages times, the output warps' twice that), so
    each group is where those warps spend their samples.  Markdown: the ``top`` groups by
    samples, their two main stall reasons ("other": samples ncu names no reason for, as an
    HGMMA waiting to issue) and their most sampled instruction."""
    rows = list(csv.reader(io.StringIO(sass_csv)))
    header = next((r for r in rows if SAMPLES in r), None)
    if header is None:
        return "no source counters in the report\n"
    ix = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    groups: dict[int, dict] = {}
    for r in rows[rows.index(header) + 1:]:
        if len(r) < len(header) or not r[ix["Instructions Executed"]].isdigit():
            continue
        n, src = int(r[ix[SAMPLES]] or 0), r[ix["Source"]].strip()
        g = groups.setdefault(int(r[ix["Instructions Executed"]]),
                              {"n": 0, "count": 0, "why": collections.Counter(), "top": (0, "")})
        g["n"] += n
        g["count"] += 1
        named = {h[6:]: int(r[ix[h]] or 0) for h in reasons}
        g["why"].update({**named, "other": n - sum(named.values())})
        g["top"] = max(g["top"], (n, src))
    total = sum(g["n"] for g in groups.values()) or 1
    lines = ["| executions | instructions | samples % | main stalls | most sampled instruction |",
             "|---|---|---|---|---|"]
    for execs, g in sorted(groups.items(), key=lambda kv: -kv[1]["n"])[:top]:
        why = ", ".join(f"{k} {100 * v / max(g['n'], 1):.0f}%" for k, v in g["why"].most_common(2) if v > 0)
        lines.append(f"| {execs} | {g['count']} | {100 * g['n'] / total:.1f} | {why} | "
                     f"`{g['top'][1][:60]}` ({100 * g['top'][0] / total:.1f}%) |")
    return "\n".join(lines) + "\n"


def source_profile(out: Path, names: list[str]) -> str:
    """Each case's stage 1 with ncu's source counters (warp stall samples per SASS instruction)
    into ``out/<case>-sass.csv``; returns the :func:`loop_summary` of each as markdown."""
    parts = []
    for name in names:
        options = ["-k", f"regex:{STAGE1_KERNEL[CASES[name][0]]}", "--section", "SourceCounters",
                   "--section", "WarpStateStats"]
        text, code = ncu_csv(out / f"{name}-source", name, options,
                             ["--page", "source", "--print-source", "sass"])
        (out / f"{name}-sass.csv").write_text(text)
        parts.append(f"**{name}**\n\n" + (loop_summary(text) if text else f"ncu failed (exit code {code})\n"))
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for the reports, CSVs and profile.md")
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="cases (default: all)")
    parser.add_argument("--source", action="store_true",
                        help="instead: stage 1's warp stall samples per SASS instruction, summed by "
                             "loop (source.md, <case>-sass.csv)")
    parser.add_argument("--run", choices=sorted(CASES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        run_case(args.run)
        return
    if args.out is None:
        parser.error("--out is required")
    if shutil.which("ncu") is None:
        parser.error("ncu (Nsight Compute) is not on the PATH (on the device image: /usr/local/cuda/bin)")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.source:
        table = source_profile(args.out, args.case or list(CASES))
        (args.out / "source.md").write_text(table)
    else:
        table = profile(args.out, args.case or list(CASES))
        (args.out / "profile.md").write_text(table)
    print(table, end="")


if __name__ == "__main__":
    main()
