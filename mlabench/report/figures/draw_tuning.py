"""Drawing functions of the tuning figures (f) and the graph-check figure (g): each takes the data of
one figure (:mod:`mlabench.report.figures.tuning_data`, :mod:`mlabench.report.figures.graph_check_data`) and returns a matplotlib
``Figure``, drawn as :mod:`mlabench.report.figures.draw` draws (no pyplot, legends outside the axes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from mlabench.report.figures import style
from mlabench.report.figures.draw import LINESTYLES, MARKERS, _context_x, _dedup_legend, _mpl, _panels, _wrap
from mlabench.report.figures.graph_check_data import GraphCheckData, label_below
from mlabench.report.figures.tuning_types import PolicySteps, RegretPanel, StudyHistory, same_as_policy

EDGE_COLOR = "#c8c8c8"
#: Above this slowdown (%) the graph-check axis is linear to 10% and logarithmic beyond (issue 35:
#: a linear axis to 7000% drew the 3-30% points, the ones to look at, as one line at 0).
SLOWDOWN_LOG_ABOVE_PCT = 100.0
#: Its ticks, percent: 2% apart to 10% (the flag threshold is a few %), then 1-2-5.
SLOWDOWN_TICKS_PCT = (0, 2, 4, 6, 8, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 20_000, 50_000)
#: Regret ticks, percent.
#: Regret ticks: 2% apart to 10%, 1-2-5 to 1000%, then decades (a failed-looking count, or a CPU's noise)
REGRET_TICKS_PCT = (0, 2, 4, 6, 8, 10, 20, 50, 100, 200, 500, 1000, 10_000, 100_000, 1_000_000)


def _edges(ax: Any, edges: Sequence[int]) -> None:
    """Faint vertical lines at the tuned buckets' upper edges."""
    for i, edge in enumerate(edges):
        ax.axvline(edge, color=EDGE_COLOR, linewidth=0.8, zorder=0,
                   label="context bucket edge" if i == 0 else None)


#: Points between the lines of two heuristics, so that lines which coincide (each other's, the
#: policy's) show side by side instead of one over the other.
DODGE_PT = 1.5


def _dodged(ax: Any, k: int, n: int) -> Any:
    """``ax``'s data transform moved up ``(k - (n - 1) / 2) * DODGE_PT`` points: the place of the
    ``k``-th of ``n`` lines that may coincide, the middle one where it is."""
    return _mpl().transforms.offset_copy(ax.transData, fig=ax.figure, y=(k - (n - 1) / 2) * DODGE_PT,
                                         units="points")


def _split_axis(ax: Any, top: int) -> None:
    ticker = _mpl().ticker
    ax.set_yscale("log", base=2)
    ticks = [1 << k for k in range(0, max(1, math.ceil(math.log2(max(top, 2)))) + 1)]
    ax.set_yticks(ticks, [str(t) for t in ticks])
    ax.yaxis.set_minor_locator(ticker.NullLocator())
    ax.set_ylim(0.8, ticks[-1] * 1.25)


def policy_steps(panels: Sequence[PolicySteps], backend: str, title: str, where: str) -> Any:
    """Figure (f), first part: num_kv_splits vs context length, the policy against the heuristics."""
    fig, axes = _panels(len(panels), title, where, width=6.2, height=4.4, sharey=True)
    top = max(max(s.splits) for p in panels for s in [p.policy, *p.heuristics])
    for ax, p in zip(axes, panels):
        _edges(ax, p.edges)
        ax.step(p.policy.lengths, p.policy.splits, where="post", color=style.backend_color(backend),
                linewidth=6, alpha=0.5, label=f"tuned policy ({backend})", zorder=2)
        for k, h in enumerate(p.heuristics):  # over the policy, each a hair from the next: coinciding ones show
            ax.step(h.lengths, h.splits, where="post", color=style.heuristic_color(h.name), linewidth=1.3,
                    linestyle=(0, (4, 2)), label=h.name, zorder=3, transform=_dodged(ax, k, len(p.heuristics)))
        if p.held_out_best:
            ax.plot(*zip(*p.held_out_best), "o", color="black", markersize=3.2, zorder=4,
                    label="fastest split count measured at a held-out length (validation ladder)")
        if p.fastest:
            ax.plot(*zip(*p.fastest), "D", color="white", markeredgecolor="black", markersize=6, zorder=5,
                    label="fastest trial of each bucket's study (at its measured length)")
        _context_x(ax, [p.policy.lengths[0], *p.edges])
        _split_axis(ax, top)
        if ax is axes[0]:
            ax.set_ylabel("num_kv_splits (log scale)")
        ax.set_title(f"batch {p.batch}", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    _dedup_legend(fig, axes, loc="outside lower center", ncol=3)
    return fig


#: The optimisation history's y axis ends at this multiple of the study's best time; slower trials
#: are drawn as triangles on the top edge (the tuner explores split counts 10-100x slower).
HISTORY_TOP = 3.0


def _history_y(ax: Any, h: StudyHistory) -> float | None:
    """Clip the y axis to [best / 1.08, HISTORY_TOP x best] (log), raised to show the chosen trial
    when the tie rule chose one slower than that (noisy measurements: issue 25), with ticks people
    read; returns the top."""
    ticker = _mpl().ticker
    best = min((t.median_us for t in h.trials if t.median_us is not None), default=None)
    if best is None:
        return None
    chosen = max((t.median_us for t in h.trials if t.chosen and t.median_us is not None), default=best)
    top = max(best * HISTORY_TOP, chosen * 1.25)
    ax.set_yscale("log")
    ax.set_ylim(best / 1.08, top)
    ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _pos: style.tick_text(float(f"{v:.3g}"))))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    return top


def _history_panel(ax: Any, h: StudyHistory, color: str) -> None:
    top = _history_y(ax, h)
    above = [t for t in h.trials if t.median_us is not None and top is not None and t.median_us > top]
    for t in above:
        ax.plot([t.order], [0.97], "^", color=style.heuristic_color(t.heuristics[0]) if t.heuristics else color,
                markersize=5, transform=ax.get_xaxis_transform(), clip_on=False)
    if above:
        ax.plot([], [], "^", color="#555555", markersize=5,
                label=f"trial slower than {HISTORY_TOP:g}x the study's best (off the scale, coloured as its kind)")
    ok = [t for t in h.trials if t.median_us is not None]
    plain = [(t.order, t.median_us) for t in ok if not t.heuristics]
    if plain:
        ax.plot(*zip(*plain), "o", color=color, alpha=0.55, markersize=3.5, label="trial (a configuration measured)")
    for t in ok:
        if t.heuristics:
            ax.plot([t.order], [t.median_us], "s", color=style.heuristic_color(t.heuristics[0]),
                    markeredgecolor="black", markeredgewidth=0.6, markersize=6,
                    label=f"trial of a public heuristic: {t.heuristics[0]}")
    failed = [t.order for t in h.trials if t.median_us is None]
    if failed:
        ax.plot(failed, [0.90] * len(failed), "x", color="#b00020", transform=ax.get_xaxis_transform(),
                label="trial not correct or failed (pruned)")
    best = [(t.order, t.best_so_far_us) for t in h.trials if t.best_so_far_us is not None]
    if best:
        ax.step(*zip(*best), where="post", color="black", linewidth=1.2, label="best so far")
    chosen = next((t for t in h.trials if t.chosen and t.median_us is not None), None)
    if chosen is not None:
        ax.plot([chosen.order], [chosen.median_us], "*", color="#ffd700", markeredgecolor="black",
                markersize=13, zorder=5, label="the policy's choice (fewest splits within the noise of the best)")


def _history_title(h: StudyHistory) -> str:
    s = h.study
    bucket = f"≤ {style.context_text(s.hi)}" if s.lo == 0 else f"{style.context_text(s.lo)}-{style.context_text(s.hi)}"
    chosen = ""
    if h.chosen is not None and h.chosen_us is not None:
        splits = h.chosen.get("num_kv_splits")
        rule = f"{h.chosen_rule.removeprefix('num_kv_splits=')} = " if h.chosen_rule else ""
        chosen = (f"\nchose {rule}{splits} split{'s' * (splits != 1)}, {style.sig3(h.chosen_us)} µs"
                  if splits is not None else "")
    return f"{bucket} (at {s.length}){chosen}"


def tuning_history(histories: Sequence[StudyHistory], backend: str, title: str, where: str) -> Any:
    """Figure (f), second part: one panel per bucket of one batch size, trials in order, best so far."""
    n = len(histories)
    cols = min(4, n)
    rows = math.ceil(n / cols)
    fig = _mpl().figure.Figure(figsize=(3.6 * cols, 2.7 * rows + 1.6), layout="constrained", dpi=100)
    grid = fig.subplots(rows, cols, squeeze=False)
    fig.suptitle("\n".join([*_wrap(title, 3.6 * cols), *_wrap(where, 3.6 * cols)]), fontsize=11)
    axes = [ax for row in grid for ax in row]
    for i, (ax, h) in enumerate(zip(axes, histories)):
        _history_panel(ax, h, style.backend_color(backend))
        if i % cols == 0:
            ax.set_ylabel("µs per call (median, log scale)")
        ax.set_title(_history_title(h), fontsize=8.5)
        ax.tick_params(labelsize=8)
        ax.xaxis.set_major_locator(_mpl().ticker.MaxNLocator(integer=True))  # trials are counted
        ax.grid(True, which="major", alpha=0.3)
        if i >= n - cols:
            ax.set_xlabel("trial, in the order measured")
    for ax in axes[n:]:
        ax.set_visible(False)
    _dedup_legend(fig, axes[:n], loc="outside lower center", ncol=3)
    return fig


def _regret_axis(ax: Any, top_pct: float, ticks_pct: Sequence[float] = REGRET_TICKS_PCT) -> None:
    """Regret in %: linear up to 10% (where a good policy lives), logarithmic above (the heuristics
    reach several hundred %); ticks from ``ticks_pct`` up to ``top_pct``."""
    ticker = _mpl().ticker
    ax.set_yscale("symlog", linthresh=10, linscale=1.2)
    ticks = [t for t in ticks_pct if t <= max(top_pct, 10) * 1.05]
    ax.set_yticks(ticks, [f"{t:g}%" for t in ticks])
    ax.yaxis.set_minor_locator(ticker.NullLocator())
    ax.set_ylim(-0.5, max(top_pct * 1.25, 12))


def regret(panels: Sequence[RegretPanel], backend: str, title: str, where: str) -> Any:
    """Figure (f), third part: regret vs held-out context length, the policy and every heuristic."""
    fig, axes = _panels(len(panels), title, where, width=6.2, height=4.4, sharey=True)
    top = max((v for p in panels for c in [p.policy, *p.heuristics] for v in c.regret_pct if v is not None),
              default=10.0)
    same = same_as_policy(list(panels))
    for ax, p in zip(axes, panels):
        _edges(ax, p.edges)
        pts = [(x, v) for x, v in zip(p.policy.lengths, p.policy.regret_pct) if v is not None]
        if pts:  # a broad band under the heuristics: one that ran the same time stays visible on it
            ax.plot(*zip(*pts), "-o", color=style.backend_color(backend), linewidth=6, alpha=0.5, markersize=5,
                    label=f"tuned policy ({backend})", zorder=2)
        for k, c in enumerate(p.heuristics):
            pts = [(x, v) for x, v in zip(c.lengths, c.regret_pct) if v is not None]
            on, of = same.get(c.name, (0, 0))
            if pts:
                ax.plot(*zip(*pts), "-o", color=style.heuristic_color(c.name), linewidth=1.1, markersize=2.8,
                        label=c.name + (f" (= the policy at {on} of {of} points)" if on else ""), zorder=3,
                        transform=_dodged(ax, k, len(p.heuristics)))
        _context_x(ax, [e for e in p.edges if 0.9 * min(p.policy.lengths) <= e <= 1.1 * max(p.policy.lengths)]
                   or p.policy.lengths)
        _regret_axis(ax, top)
        if ax is axes[0]:
            ax.set_ylabel("regret: time / best time - 1\n(linear to 10%, log scale above)")
        worst, geo = p.policy.worst_pct, p.policy.geomean_pct
        summary = (f"policy worst {worst:.1f}%, geomean {geo:.2f}%" if worst is not None and geo is not None
                   else "policy failed at some length")
        ax.set_title(f"batch {p.batch}: {summary}", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    _dedup_legend(fig, axes, last="context bucket edge", loc="outside lower center", ncol=4)
    return fig


def graph_check(data: GraphCheckData, title: str, where: str) -> Any:
    """Figure (g): slowdown (%) of the captured graph vs the call tuned per context, per batch size."""
    batches = sorted(data.curves)
    fig, axes = _panels(len(batches), title, where, width=6.2, height=4.4, sharey=True)
    for ax, batch in zip(axes, batches):
        ax.axhline(0, color="#888888", linewidth=0.8)
        if data.tolerance_pct is not None:
            ax.axhline(data.tolerance_pct, color="#b00020", linestyle="--", linewidth=1,
                       label=f"flag threshold: {data.tolerance_pct:g}% slower than tuned")
        seen: dict[str, int] = {}
        under = label_below(data.curves[batch])
        for c in data.curves[batch]:
            k = seen[c.backend] = seen.get(c.backend, -1) + 1
            pts = [(x, y) for x, y in zip(c.contexts, c.slowdown_pct) if y is not None]
            if not pts:
                continue
            ax.plot(*zip(*pts), marker=MARKERS[k % 4], linestyle=LINESTYLES[k % 4], markersize=4.5,
                    color=style.backend_color(c.backend), label=c.subject)
            for x, y, flagged in zip(c.contexts, c.slowdown_pct, c.flagged):
                if flagged and y is not None:
                    below = (c.subject, x) in under
                    ax.annotate(f"{y:+.0f}%", (x, y), textcoords="offset points", xytext=(0, -7 if below else 6),
                                ha="center", va="top" if below else "baseline", fontsize=7.5, color="#b00020")
            wrong = [(x, y if y is not None else 0) for x, y, ok in zip(c.contexts, c.slowdown_pct, c.correct)
                     if ok is False]
            if wrong:
                ax.plot(*zip(*wrong), "X", color="#b00020", markersize=9, label="wrong after refresh")
        contexts = sorted({x for c in data.curves[batch] for x in c.contexts})
        _context_x(ax, contexts)
        ax.set_title(f"batch {batch}", fontsize=10)
        ax.grid(True, alpha=0.3)
    values = [y for cs in data.curves.values() for c in cs for y in c.slowdown_pct if y is not None]
    top = max([*values, data.tolerance_pct or 0, 5])
    if top > SLOWDOWN_LOG_ABOVE_PCT:  # a linear axis to thousands of % flattens every small slowdown to 0
        _regret_axis(axes[0], top, SLOWDOWN_TICKS_PCT)
        axes[0].set_ylim(min(-2.0, min(values, default=0) * 1.3), top * 2)  # room for the top labels
        axes[0].set_ylabel("slowdown: graph µs / tuned µs - 1 (%)\n(linear to 10%, log scale above)")
    else:
        axes[0].set_ylim(top=top * 1.15 + 2)
        axes[0].set_ylabel("slowdown: graph µs / tuned µs - 1 (%)")
    _dedup_legend(fig, axes, loc="outside lower center", ncol=3)
    return fig
