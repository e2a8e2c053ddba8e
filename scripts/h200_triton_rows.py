#!/usr/bin/env python
"""Row tiles of the portable Triton kernels on one GPU (issue 23 item 3), one command::

    python3 scripts/h200_triton_rows.py --out OUT

runs ``mlabench sweep --config kimi-k3-tp8-triton-rows`` (Kimi K3 at TP8: 12 heads, bf16, page 64;
batch 1 and 16; contexts 4K / 32K / 100K; qo_len 1, 2, 4, 8, causal; ``triton-splitkv`` with
``num_kv_splits`` 8-256 and ``triton-persistent`` with 1 or 2 programs per SM, each with
``rows_per_tile`` 16 and auto), so every point gets the project's own correctness check (fp32
reference, NaN-poisoned unread slots, every input set) and timing (CUDA-graph replay over input
copies that exceed twice the L2, visits spread over the run).  About 2-3 minutes on an H200, the
Triton compiles of the 16-, 32- and 64-row kernels included.

Then, per backend, row tile, batch and context, the best passing configuration's µs at each
qo_len, the ratio to the same row's qo_len 1, and qo_len 1 against the committed H200 run
(``results/h200/qo-len/``: 16-row tiles, the kernel that qo_len 1 still compiles), and the
issue's targets: at batch 16 from 32K, qo_len 4 at most 1.5x qo_len 1; qo_len 1 within 2% of the
committed time.  The table is printed last and written to ``OUT/summary.md``; the sweep's own
output goes to ``OUT/sweep.md`` and ``OUT/sweep.log``, its run folder (results.jsonl, results.csv,
manifest.json) under ``OUT``.

``--from RUN`` only summarises a run folder already there (also the committed one, whose
records have no ``rows_per_tile``: they count as 16-row tiles).  ``--config`` runs another sweep
config (e.g. a smaller one on the CPU to try this script).
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mlabench.records.store import holds_run  # noqa: E402  (a run folder: results plain or gzipped)

CONFIG = "kimi-k3-tp8-triton-rows"
#: The committed multi-token run on an H200 (Triton 3.6, 16-row tiles only).
COMMITTED_RUN = REPO / "results/h200/qo-len/kimi-k3-tp8-mtp-20261130-181848-687"
BACKENDS = ("triton-splitkv", "triton-persistent")
#: Issue 23's targets for the Triton kernels.
TARGET_RATIO, TARGET_QO_LEN, TARGET_BATCH, TARGET_FROM_CONTEXT = 1.5, 4, 16, 32768
QO1_TOLERANCE = 0.02


def run_sweep(out: Path, config: str) -> Path:
    """Run the sweep into ``out``; returns its run folder.  Exits when the sweep fails."""
    out.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in out.iterdir()}
    cmd = [sys.executable, "-m", "mlabench", "sweep", "--config", config, "--results-dir", str(out),
           "--markdown"]
    start = time.monotonic()
    print(f"[{time.strftime('%H:%M:%S')}] {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    with open(out / "sweep.md", "w") as md, open(out / "sweep.log", "w") as log:
        code = subprocess.run(cmd, stdout=md, stderr=log, cwd=REPO).returncode
    print(f"[{time.strftime('%H:%M:%S')}] sweep exit code {code} after {time.monotonic() - start:.0f} s",
          file=sys.stderr, flush=True)
    runs = sorted(p for p in out.iterdir() if p.is_dir() and p.name not in before
                  and (p / "results.jsonl").exists())
    if code != 0 or not runs:
        sys.exit(f"sweep failed (exit code {code}): see {out / 'sweep.log'}")
    return runs[-1]


def best_points(run: Path) -> tuple[dict, dict]:
    """``(best, failed)`` of a run folder's records of :data:`BACKENDS`: ``best[(backend, tile,
    batch, context, qo_len)] = (median µs, params)`` over the configurations that passed the
    check, and ``failed[key]`` the number that ran and failed it.  ``tile`` is the
    ``rows_per_tile`` asked for (``"16"`` when the record has none: runs before row tiles)."""
    best, failed = {}, {}
    plain = run / "results.jsonl"  # an archived run keeps it gzipped
    text = (plain.read_text() if plain.exists()
            else gzip.decompress((run / "results.jsonl.gz").read_bytes()).decode())
    for line in text.splitlines():
        rec = json.loads(line)
        if rec.get("backend") not in BACKENDS or rec.get("status") in ("unsupported", "unavailable"):
            continue
        tile = str(rec["params"].get("rows_per_tile", "16"))
        key = (rec["backend"], tile, rec["batch"], rec["context_len"], rec["qo_len"])
        verdict = rec.get("verdict") or {}
        us = (rec.get("stats") or {}).get("median_us")
        if rec.get("status") != "ok" or not verdict.get("passed") or us is None:
            failed[key] = failed.get(key, 0) + 1
            continue
        if key not in best or us < best[key][0]:
            best[key] = (us, rec["params"])
    return best, failed


def short_params(params: dict) -> str:
    """The parameter that varies within a backend: ``S=16`` or ``prog/SM=2``."""
    if "num_kv_splits" in params:
        return f"S={params['num_kv_splits']}"
    return f"prog/SM={params.get('programs_per_sm')}"


def summary(run: Path, committed: Path | None) -> tuple[str, list[str]]:
    """The markdown table of ``run`` and the target lines."""
    best, failed = best_points(run)
    base = best_points(committed)[0] if committed and holds_run(committed) else {}  # plain or gzipped
    qo_lens = sorted({k[4] for k in best} | {k[4] for k in failed})
    rows = sorted({k[:4] for k in best} | {k[:4] for k in failed},
                  key=lambda k: (BACKENDS.index(k[0]), k[1] != "16", k[2], k[3]))
    head = ["backend", "rows/tile", "batch", "context"] + [f"qo {q} µs" for q in qo_lens]
    head += [f"qo {q} / qo 1" for q in qo_lens if q > 1] + ["qo 1 vs committed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    targets = []
    for backend, tile, batch, ctx in rows:
        cells = [backend, tile, str(batch), str(ctx)]
        one = best.get((backend, tile, batch, ctx, 1))
        for q in qo_lens:
            key = (backend, tile, batch, ctx, q)
            fails = f" ({failed[key]} failed)" if key in failed else ""
            cells.append(f"{best[key][0]:.1f} {short_params(best[key][1])}{fails}" if key in best
                         else f"none passed{fails}")
        for q in qo_lens:
            if q > 1:
                key = (backend, tile, batch, ctx, q)
                cells.append(f"{best[key][0] / one[0]:.2f}x" if key in best and one else "")
        committed_one = base.get((backend, "16", batch, ctx, 1))
        cells.append(f"{one[0] / committed_one[0] - 1:+.1%} ({committed_one[0]:.1f})"
                     if one and committed_one else "")
        lines.append("| " + " | ".join(cells) + " |")
        four = best.get((backend, tile, batch, ctx, TARGET_QO_LEN))
        if tile == "auto" and batch == TARGET_BATCH and ctx >= TARGET_FROM_CONTEXT and one and four:
            ratio = four[0] / one[0]
            targets.append(f"{backend} B={batch} L={ctx}: qo_len {TARGET_QO_LEN} / qo_len 1 = "
                           f"{ratio:.2f}x (target <= {TARGET_RATIO}x): "
                           f"{'met' if ratio <= TARGET_RATIO else 'NOT met'}")
        if tile == "auto" and one and committed_one:
            change = one[0] / committed_one[0] - 1
            if change > QO1_TOLERANCE:
                targets.append(f"{backend} B={batch} L={ctx}: qo_len 1 {change:+.1%} against the "
                               f"committed {committed_one[0]:.1f} µs (target within {QO1_TOLERANCE:.0%})")
    return "\n".join(lines), targets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="folder for the sweep's run folder and the summary")
    ap.add_argument("--from", dest="from_run", type=Path, help="summarise this run folder, run nothing")
    ap.add_argument("--config", default=CONFIG, help=f"sweep config (default {CONFIG})")
    args = ap.parse_args()
    if args.from_run is None and args.out is None:
        ap.error("give --out (run the sweep) or --from RUN (summarise a run)")
    start = time.monotonic()
    run = args.from_run or run_sweep(args.out, args.config)
    table, targets = summary(run, COMMITTED_RUN)
    text = (f"Run: {run}\n\nBest passing configuration per point, µs per call (graph replay, cold "
            f"L2); ratios to the same row's qo_len 1; qo_len 1 against {COMMITTED_RUN.relative_to(REPO)} "
            f"(16-row tiles, another Triton version possibly).\n\n{table}\n\n"
            + "\n".join(f"- {t}" for t in targets or ["no target point in this run"]) + "\n")
    if args.out is not None:
        (args.out / "summary.md").write_text(text)
    print(f"[{time.strftime('%H:%M:%S')}] wall time {time.monotonic() - start:.0f} s", file=sys.stderr)
    print(text)


if __name__ == "__main__":
    main()
