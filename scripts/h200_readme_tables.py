"""The README's H200 table, rebuilt from committed records (no GPU needed).

    python3 scripts/h200_readme_tables.py [--run RUN] [--context L,L,...]

``--run`` (default: results/h200/hopper-kernel/run-72fb349/run, Kimi K3 at TP8 on an H200): per batch
and context, the floor (bytes / the run's measured read bandwidth), then the fastest correct
configuration of gluon-splitkv, triton-splitkv and FlashMLA with its % of the floor, as the records
hold them, and gluon-splitkv's time over FlashMLA's.

Numbers are rendered by mlabench's own tables (one number format per column), so the README shows
them as the tool prints them.  tests/core/test_docs.py checks that README.md holds this output.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's mlabench, installed or not

from mlabench.records.record import Record  # noqa: E402
from mlabench.records.store import records_of  # noqa: E402
from mlabench.sweep.summary import best_ok  # noqa: E402
from mlabench.tables.render import to_markdown  # noqa: E402
from mlabench.tables.table import ColumnStyle, Table  # noqa: E402

RUN = REPO / "results/h200/hopper-kernel/run-72fb349/run"
CONTEXTS = (4096, 32768, 131072)
BACKENDS = ("gluon-splitkv", "triton-splitkv", "flashmla")


def _best(records: Sequence[Record], backend: str, batch: int, context: int) -> Record | None:
    """The fastest correct record of ``backend`` at (batch, context)."""
    return best_ok(r for r in records if r.backend == backend and r.batch == batch and r.context_len == context)


def headline_table(records: Sequence[Record], contexts: Sequence[int]) -> Table:
    """gluon-splitkv against triton-splitkv and FlashMLA: µs per call and % of the read floor."""
    styles = {c: ColumnStyle(header="% floor") for c in ("gluon %", "triton %", "flashmla %")}
    t = Table("", ["batch", "context", "floor µs", "gluon-splitkv µs", "gluon %", "triton-splitkv µs", "triton %",
                   "FlashMLA µs", "flashmla %", "gluon / FlashMLA"], styles=styles)
    for batch in sorted({r.batch for r in records}):
        for ctx in contexts:
            g, s, f = (_best(records, b, batch, ctx) for b in BACKENDS)
            us = [r.stats.median_us if r else None for r in (g, s, f)]
            t.add_row([batch, ctx, g.floor_us if g else None, us[0], g and g.pct_of_floor, us[1],
                       s and s.pct_of_floor, us[2], f and f.pct_of_floor,
                       us[0] / us[2] if g and f else None])
    return t


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, default=RUN, help="a run folder with gluon-splitkv and flashmla records")
    ap.add_argument("--context", default=",".join(map(str, CONTEXTS)), help="context lengths shown")
    args = ap.parse_args(argv)
    records = records_of([args.run])
    bad = [r for r in records if r.status != "ok"]
    print(to_markdown(headline_table(records, [int(c) for c in args.context.split(",")])))
    print(f"{len(records)} records read, {len(bad)} not ok; read bandwidth {records[0].read_bandwidth_tbps:.2f} TB/s")


if __name__ == "__main__":
    main()
