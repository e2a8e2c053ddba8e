"""The README's two H200 example tables, rebuilt from committed records (no GPU needed).

    python3 scripts/h200_readme_tables.py [--sweep RUN] [--hopper DIR] [--context L,L,...]

1. ``--sweep`` (default: the first of the two kimi-k3-tp8 sweeps in results/h200/repeatability/runs/):
   per batch and context, the floor (bytes / the run's read bandwidth), triton-splitkv at 1 split
   and at its fastest correct split count, the fastest correct triton-persistent configuration and
   FlashMLA, each with its % of the floor, as the records hold them.
2. ``--hopper`` (default: results/h200/hopper-kernel/, another run on a freshly started H200): the fastest
   correct configuration of gluon-splitkv, triton-splitkv and FlashMLA, the floor and % of the
   floor against that run's read bandwidth (``read_tbps`` of its env.json: its records' own
   ``floor_us`` divides by the copy bandwidth), and gluon-splitkv / FlashMLA time.

Numbers are rendered by mlabench's own tables (one number format per column), so the README shows
them as the tool prints them.  tests/core/test_docs.py checks that README.md holds this output.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's mlabench, installed or not

from mlabench.records.record import Record  # noqa: E402
from mlabench.records.store import read_jsonl, records_of  # noqa: E402
from mlabench.sweep.summary import best_ok  # noqa: E402
from mlabench.tables.render import to_markdown  # noqa: E402
from mlabench.tables.table import ColumnStyle, Table  # noqa: E402

SWEEP_RUN = REPO / "results/h200/repeatability/runs/kimi-k3-tp8-20261130-161237-527"
HOPPER_DIR = REPO / "results/h200/hopper-kernel"
CONTEXTS = (4096, 32768, 100000, 131072)


def _best(records: Sequence[Record], backend: str, batch: int, context: int, **params) -> Record | None:
    """The fastest correct record of ``backend`` at (batch, context) whose params include ``params``."""
    return best_ok(r for r in records if r.backend == backend and r.batch == batch and r.context_len == context
                   and all(r.params.get(k) == v for k, v in params.items()))


def _us(r: Record | None) -> float | None:
    return r.stats.median_us if r else None


def sweep_table(records: Sequence[Record], contexts: Sequence[int]) -> Table:
    """Table 1: split count, padding and FlashMLA per (batch, context) of one sweep run."""
    pct = {c: ColumnStyle(header="% floor") for c in ("best %", "persistent %", "flashmla %")}
    t = Table("", ["batch", "context", "floor µs", "1 split µs", "best splits", "best split µs", "best %",
                   "padded persistent µs", "persistent %", "FlashMLA µs", "flashmla %"], styles=pct)
    for batch in sorted({r.batch for r in records}):
        for ctx in contexts:
            one, best = (_best(records, "triton-splitkv", batch, ctx, num_kv_splits=1),
                         _best(records, "triton-splitkv", batch, ctx))
            pers, fmla = _best(records, "triton-persistent", batch, ctx), _best(records, "flashmla", batch, ctx)
            t.add_row([batch, ctx, best.floor_us if best else None, _us(one),
                       best.params.get("num_kv_splits") if best else None, _us(best), best and best.pct_of_floor,
                       _us(pers), pers and pers.pct_of_floor, _us(fmla), fmla and fmla.pct_of_floor])
    return t


def hopper_table(records: Sequence[Record], read_tbps: float, contexts: Sequence[int]) -> Table:
    """Table 2: gluon-splitkv against triton-splitkv and FlashMLA, % of the run's read floor."""
    def pct(r: Record | None) -> float | None:
        return 100 * r.bytes_moved / (read_tbps * 1e6) / r.stats.median_us if r else None

    styles = {c: ColumnStyle(header="% floor") for c in ("gluon %", "triton %", "flashmla %")}
    t = Table("", ["batch", "context", "floor µs", "gluon-splitkv µs", "gluon %", "splits", "pdl",
                   "triton-splitkv µs", "triton %", "FlashMLA µs", "flashmla %", "gluon / FlashMLA"],
              styles=styles)
    for batch in sorted({r.batch for r in records}):
        for ctx in contexts:
            g, s, f = (_best(records, b, batch, ctx) for b in ("gluon-splitkv", "triton-splitkv", "flashmla"))
            floor = g.bytes_moved / (read_tbps * 1e6) if g else None
            t.add_row([batch, ctx, floor, _us(g), pct(g), g and g.params.get("num_kv_splits"),
                       g and g.params.get("pdl"), _us(s), pct(s), _us(f), pct(f),
                       _us(g) / _us(f) if g and f else None])
    return t


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", type=Path, default=SWEEP_RUN, help="a kimi-k3-tp8 sweep run folder")
    ap.add_argument("--hopper", type=Path, default=HOPPER_DIR, help="the hopper-kernel folder")
    ap.add_argument("--context", default=",".join(map(str, CONTEXTS)), help="context lengths shown")
    args = ap.parse_args(argv)
    contexts = [int(c) for c in args.context.split(",")]
    sweep = records_of([args.sweep])
    hopper = read_jsonl(args.hopper / "records.jsonl", Record, "record")
    read_tbps = json.loads((args.hopper / "env.json").read_text())["read_tbps"]
    bad = [r for r in [*sweep, *hopper] if r.status != "ok"]
    print(to_markdown(sweep_table(sweep, contexts)))
    print(to_markdown(hopper_table(hopper, read_tbps, contexts)))
    print(f"{len(sweep)} + {len(hopper)} records read, {len(bad)} not ok; "
          f"sweep read bandwidth {sweep[0].read_bandwidth_tbps:.2f} TB/s, hopper-kernel {read_tbps:.2f} TB/s")


if __name__ == "__main__":
    main()
