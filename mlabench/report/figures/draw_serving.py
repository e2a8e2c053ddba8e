"""Figure (e), serve-bench TPOT: :func:`serving` draws :class:`~mlabench.report.figures.data.ServingData`.

A run of one input length is one panel, concurrencies side by side, a bar per variant.  A run of
several is a grid, a row per concurrency and a column per input length, each panel on its own
linear axis from 0: TPOT at concurrency 1 (a few ms) and at 16 with long prompts (hundreds) differ
50x, which one axis would flatten.  Every bar is labelled with its TPOT and its speedup over the
baseline (where the baseline has a TPOT at that point); a variant that does not run a length (its own ``bench.random_input_len``) says "not
run" there, one without a result says its status.
"""

from __future__ import annotations

from typing import Any

from mlabench.report.figures import style
from mlabench.report.figures.data import ServingData, TpotBar
from mlabench.report.figures.draw import _dedup_legend, _mpl, _panels, _wrap

#: Inches per panel of the grid, and per bar within a panel.
GRID_PANEL_H, GRID_BAR_W, GRID_MIN_W = 2.7, 0.8, 2.8
NOT_RUN_COLOR, FAILED_COLOR = "#6b6b6b", "#b00020"
PREDICTED_LABEL = "predicted from the kernel sweeps given"


def _bar_text(data: ServingData, bar: TpotBar) -> str:
    """``6.31 ms`` over ``1.29×`` (``baseline`` for the baseline; no speedup line where the baseline
    has no TPOT at that point: its own bar says "not run" or its status), and the status when not ok."""
    speed = "\nbaseline" if bar.variant == data.baseline else "" if _baseline_absent(data, bar) else \
        "\n" + style.speedup_text(bar.speedup)
    predicted = "" if bar.predicted_ms is None else f"\npred {style.sig3(bar.predicted_ms)}"
    return f"{style.sig3(bar.tpot_ms)} ms{speed}{predicted}" + ("" if bar.status == "ok" else f"\n{bar.status}")


def _baseline_absent(data: ServingData, bar: TpotBar) -> bool:
    """True when the baseline has no TPOT where ``bar`` stands (not run there, or no result)."""
    return data.bar(data.baseline, bar.concurrency, bar.input_len).tpot_ms is None


def _top(bars: list[TpotBar]) -> float:
    """The highest TPOT, measured or predicted, of ``bars`` (ms; 1.0 when none has one)."""
    return max((t for b in bars for t in (b.tpot_ms, b.predicted_ms) if t), default=1.0)


def _draw_bar(ax: Any, data: ServingData, bar: TpotBar, x: float, width: float, color: str, top: float,
              label: str | None = None, fontsize: float = 8) -> None:
    """One bar at ``x`` with its text above it (``top``: the panel's highest TPOT, ms); "not run" in
    grey or the status in red, standing at the axis, where it has no TPOT."""
    if bar.tpot_ms is None:
        text, color = ("not run", NOT_RUN_COLOR) if not bar.planned else (bar.status, FAILED_COLOR)
        if not data.input_lens:  # one panel, several bars a group, no tick under each: name the variant
            ax.text(x, top * 0.02, f"{bar.variant}: {text}", rotation=90, ha="center", va="bottom",
                    fontsize=fontsize, color=color)
        else:  # a panel per point, a tick under each bar: the words stand in the bar's place
            ax.text(x, top * 0.04, text, ha="center", va="bottom", fontsize=fontsize + 0.5, color=color,
                    bbox=dict(boxstyle="round,pad=0.3", facecolor="none", edgecolor=color, linestyle="--"))
        return
    ax.bar([x], [bar.tpot_ms], width * 0.92, color=color, label=label, hatch=None if bar.status == "ok" else "xx")
    if bar.predicted_ms is not None:
        ax.hlines(bar.predicted_ms, x - width * 0.5, x + width * 0.5, colors="black", linestyles=(0, (3, 1.5)),
                  linewidth=1.6, label=PREDICTED_LABEL)
    ax.text(x, max(bar.tpot_ms, bar.predicted_ms or 0) + top * 0.02, _bar_text(data, bar), ha="center", va="bottom",
            fontsize=fontsize)


def serving(data: ServingData, title: str, where: str) -> Any:
    """Figure (e): TPOT bars per (input length,) concurrency and variant, each labelled with its
    TPOT and speedup (module docstring for the two layouts)."""
    if data.input_lens:
        return _grid(data, title, where)
    fig, (ax,) = _panels(1, title, where, width=max(6.0, 1.6 * len(data.concurrencies) * len(data.variants)),
                         height=4.4)
    colors = style.variant_colors(data.variants, data.baseline)
    width = 0.8 / len(data.variants)
    top = _top(data.bars)
    for k, variant in enumerate(data.variants):
        label = variant + (" (baseline)" if variant == data.baseline else "")
        for i, conc in enumerate(data.concurrencies):
            x = i + (k - (len(data.variants) - 1) / 2) * width
            _draw_bar(ax, data, data.bar(variant, conc), x, width, colors[variant], top, label)
    ax.set_xticks(range(len(data.concurrencies)), [f"concurrency {c}" for c in data.concurrencies])
    ax.set_xlim(-0.5, len(data.concurrencies) - 0.5)
    ax.set_ylabel(f"TPOT, {data.stat} over requests, ms")
    ax.set_ylim(0, top * 1.3)
    ax.grid(True, axis="y", alpha=0.3)
    _dedup_legend(fig, [ax], last=PREDICTED_LABEL, loc="outside right center", title="variant")
    _footer(fig, fig.get_figwidth(), data.no_dash_note)
    return fig


def _grid(data: ServingData, title: str, where: str) -> Any:
    """A panel per (concurrency, input length): rows concurrencies, columns input lengths, the
    variants' bars named under each panel, each panel's axis its own."""
    rows, cols = data.concurrencies, data.input_lens
    panel_w = max(GRID_MIN_W, GRID_BAR_W * len(data.variants) + 0.9)
    lines = [*_wrap(title, panel_w * len(cols)), *_wrap(where, panel_w * len(cols))]
    height = GRID_PANEL_H * len(rows) + 0.2 * len(lines) + 0.5
    fig = _mpl().figure.Figure(figsize=(panel_w * len(cols), height), layout="constrained", dpi=100)
    grid = fig.subplots(len(rows), len(cols), squeeze=False)
    fig.suptitle("\n".join(lines), fontsize=11)
    colors = style.variant_colors(data.variants, data.baseline)
    for r, conc in enumerate(rows):
        for c, n in enumerate(cols):
            ax = grid[r][c]
            bars = [data.bar(v, conc, n) for v in data.variants]
            top = _top(bars)
            for k, bar in enumerate(bars):
                _draw_bar(ax, data, bar, k, 0.8, colors[bar.variant], top, fontsize=7.5)
            names = [v + ("\n(baseline)" if v == data.baseline else "") for v in data.variants]
            ax.set_xticks(range(len(data.variants)), names, fontsize=8)
            ax.set_xlim(-0.6, len(data.variants) - 0.4)
            ax.set_ylim(0, top * 1.38)
            ax.tick_params(axis="y", labelsize=8)
            ax.set_title(f"{n} input tokens, concurrency {conc}", fontsize=9)
            if c == 0:
                ax.set_ylabel(f"{data.stat} TPOT, ms", fontsize=9)
            ax.grid(True, axis="y", alpha=0.3)
    predicted = any(b.predicted_ms is not None for b in data.bars)
    _footer(fig, panel_w * len(cols), "each panel has its own TPOT axis, from 0" + (
        " · black dashes: TPOT predicted from the kernel sweeps given (non-attention time from "
        f"{data.predicted_reference}, {data.prediction_source})" if predicted else ""), data.no_dash_note)
    return fig


def _footer(fig: Any, width_in: float, *texts: str) -> None:
    """``texts`` (each non-empty one from a new line) under the panels, wrapped to the figure's
    ``width_in`` inches at the footer's 8.5 points (a long CONFIG path ran off both edges)."""
    lines = [line for text in texts if text for line in _wrap(text, width_in * 11 / 8.5)]
    if lines:
        fig.supxlabel("\n".join(lines), fontsize=8.5, color="#404040")
