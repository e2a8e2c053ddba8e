"""A graph-check result as the table ``mlabench graph-check`` prints (and ``--save`` writes, which
``report`` reads back)."""

from __future__ import annotations

from mlabench.checks.graph_check import GraphCheckConfig, GraphCheckResult
from mlabench.tables.table import ColumnStyle, Table


def graph_check_table(result: GraphCheckResult, cfg: GraphCheckConfig) -> Table:
    """One row per (subject, batch, context): captured-graph µs, tuned µs and count, the count the
    graph froze, slowdown, refresh µs per step, correctness and the flag."""
    qo = "" if cfg.qo_len == 1 else f", {cfg.qo_len} query tokens{'' if cfg.causal else ' (non-causal)'}"
    t = Table(f"graph-check: captured with {cfg.capture_len} token(s) per request{qo}, replayed after "
              "refresh, against the call tuned for each length",
              ["subject", "batch", "context", "graph_us", "tuned_us", "tuned_splits",
               "captured_splits", "slowdown_pct", "refresh_us", "correct", "flagged", "note", "device"],
              group_by="subject")
    t.styles.update({
        "graph_us": ColumnStyle(header="graph µs", justify="right"),
        "tuned_us": ColumnStyle(header="tuned µs", justify="right"),
        "tuned_splits": ColumnStyle(header="tuned splits", justify="right"),
        "captured_splits": ColumnStyle(header="splits in graph", justify="right"),
        "slowdown_pct": ColumnStyle(header="slower %", justify="right", text=signed_pct),
        "refresh_us": ColumnStyle(header="refresh µs/step", justify="right"),
        "device": ColumnStyle(show="machine"),  # people read it in a note
    })
    for r in result.rows:
        slow = r.slowdown
        t.add_row([r.subject, r.batch, r.context_len, r.graph_us, r.tuned_us, r.tuned_splits,
                   r.captured_splits, None if slow is None else 100 * slow, r.refresh_us, r.correct,
                   r.flagged, r.note, result.device], style="red" if r.flagged else None)
    flagged = sorted({r.subject for r in result.rows if r.flagged})
    t.notes.append(f"flagged (wrong, or > {100 * cfg.tolerance:g}% slower than tuned): "
                   + (", ".join(flagged) if flagged else "none"))
    t.notes.append("tuned: the same backend prepared knowing the length (the fastest correct count of "
                   f"{', '.join(map(str, cfg.splits))} where it has num_kv_splits and can be steered to "
                   "it, else its own choice), timed like the graph (graph replay, device events), so "
                   "only the choice differs")
    copies = ", ".join(f"B={b}: {n}" for b, n in result.copies.items())
    t.notes.append(f"heads={cfg.num_heads} page={cfg.page_size} {cfg.dtype}; every request of a step "
                   f"at the context length; input copies rotated ({copies}); refresh µs: wall clock "
                   "per step, outside the graph, paid once per step for all layers")
    if result.device:
        t.notes.append(f"device: {result.device}")
    if result.policy is not None:
        tables = result.policy.tables.items()
        t.notes.append(f"split policy ({result.policy.source}), context <= tokens: splits: " + "; ".join(
            f"B={b}: " + ", ".join(f"<={n}:{c}" for n, c in rows) for b, rows in tables))
    return t


def signed_pct(value: float | None) -> str:
    """A percentage with its sign and one decimal, ``0.0`` for what rounds to zero (not ``-0.0``),
    and an em dash for None."""
    if value is None:
        return "—"
    text = f"{value:+.1f}"
    return "0.0" if text in ("+0.0", "-0.0") else text
