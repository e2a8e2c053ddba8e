"""Drawing functions: each takes the data of one figure (:mod:`mlabench.report.figures.data`) and returns a
matplotlib ``Figure``.

matplotlib is imported here only, lazily (through :mod:`mlabench.extras`), and without pyplot: every
figure is a ``matplotlib.figure.Figure`` drawn by the Agg canvas, so nothing needs a display.
Legends sit outside the axes (constrained layout, ``outside`` locations) so they never cover data.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from mlabench.errors import MlabenchError
from mlabench.report.figures import style
from mlabench.report.figures.data import Heatmap, LatencyData, Speedup, SplitCurve, floor_text

PANEL_W, PANEL_H = 5.6, 3.9
#: Line styles and markers that tell apart curves of one colour (one backend's in several runs).
LINESTYLES = ("-", (0, (5, 2)), ":", "-.")
MARKERS = ("o", "s", "^", "v")


def _mpl() -> SimpleNamespace:
    """matplotlib's figure, ticker, colors, patches, textpath and transforms modules and its colormaps, imported on first
    use; :class:`MlabenchError` naming what to install when matplotlib is missing."""
    from mlabench.extras import optional_import

    names = ("matplotlib", "matplotlib.figure", "matplotlib.ticker", "matplotlib.colors", "matplotlib.patches",
             "matplotlib.textpath", "matplotlib.transforms")
    mods = [optional_import(name) for name in names]
    missing = [why for mod, why in mods if mod is None]
    if missing:
        raise MlabenchError(f"figures need matplotlib: {missing[0]}")
    top, figure, ticker, colors, patches, textpath, transforms = (mod for mod, _ in mods)
    return SimpleNamespace(figure=figure, ticker=ticker, colors=colors, patches=patches, textpath=textpath,
                           transforms=transforms, colormaps=top.colormaps)


def png_bytes(fig: Any) -> bytes:
    """``fig`` as a PNG of at most 256 colours (a third of the size of matplotlib's RGBA PNG, the same
    to the eye for line, bar and heat-map figures)."""
    from mlabench.extras import optional_import

    raw = io.BytesIO()
    fig.savefig(raw, format="png", dpi=100)
    image_mod, _why = optional_import("PIL.Image")
    if image_mod is None:  # Pillow comes with matplotlib; keep the plain PNG without it
        return raw.getvalue()
    small = io.BytesIO()
    image = image_mod.open(io.BytesIO(raw.getvalue())).convert("RGB")
    image.quantize(colors=256, method=image_mod.Quantize.MEDIANCUT).save(small, format="png", optimize=True)
    return small.getvalue()


def _panels(n: int, title: str, where: str, width: float = PANEL_W, height: float = PANEL_H,
            sharey: bool = False, widths: Sequence[float] | None = None) -> tuple[Any, list[Any]]:
    """A figure of ``n`` panels in a row, ``width`` inches each (or ``widths``, one per panel)."""
    widths = list(widths or [width] * n)
    # the title wraps as its subtitle does: one panel is narrower than most titles
    lines = [*_wrap(title, sum(widths)), *_wrap(where, sum(widths))]
    # each line past the title's first two gets its own height, so the panels keep theirs
    fig = _mpl().figure.Figure(figsize=(sum(widths), height + 0.2 * max(len(lines) - 2, 0)), layout="constrained",
                               dpi=100)
    axes = fig.subplots(1, n, squeeze=False, sharey=sharey, width_ratios=widths)[0]
    fig.suptitle("\n".join(lines), fontsize=11)
    return fig, list(axes)


def _wrap(text: str, width_in: float) -> list[str]:
    """``text`` in lines that fit ``width_in`` inches at the title's 11 points (11.5 characters
    an inch, the width of an average line of DejaVu Sans there)."""
    return textwrap.wrap(text, width=int(width_in * 11.5), break_on_hyphens=False) or [""]


#: The least distance, in points along the axis, between two 45°-rotated tick labels that both
#: show (their lines are then 10 points apart, more than a 10-point label is tall).
TICK_GAP_PT = 14.0


def _log_ticks(ax: Any, values: Sequence[float], texts: Sequence[str], prefer: Sequence[float] = (),
               **params: Any) -> None:
    """Ticks at ``values`` (ascending) on ``ax``'s log x axis, labelled ``texts`` and rotated 45°
    (``params``: more of ``tick_params``).  A label within :data:`TICK_GAP_PT` of the last one shown,
    at the axes' width when drawn (after layout), is left blank; a value in ``prefer`` (where a star
    sits), else the largest value, keeps its own (:func:`style.thin_labels`)."""
    values, texts = list(values), list(texts)

    def label(value: float, _pos: Any) -> str:
        lo, hi = ax.get_xlim()
        width_pt = ax.bbox.width * 72 / ax.figure.dpi
        ratio = (hi / lo) ** (TICK_GAP_PT / max(width_pt, 1.0)) if 0 < lo < hi else 1.0
        return style.thin_labels(values, texts, ratio, prefer)[values.index(value)] if value in values else ""

    ax.set_xticks(values)
    ax.xaxis.set_major_formatter(_mpl().ticker.FuncFormatter(label))
    ax.tick_params(axis="x", labelrotation=45, **params)


def _context_x(ax: Any, contexts: Sequence[int], log: bool = True) -> None:
    if log:
        ax.set_xscale("log")
        ax.xaxis.set_minor_locator(_mpl().ticker.NullLocator())
        _log_ticks(ax, contexts, [style.context_text(c) for c in contexts])
    else:
        ax.set_xticks(list(contexts), style.context_labels(list(contexts), log))
    ax.set_xlabel(style.CONTEXT_AXIS)


def _log_y(ax: Any, label: str) -> None:
    ticker = _mpl().ticker
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _pos: style.tick_text(v)))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_ylabel(label)


def _dedup_legend(fig: Any, axes: list[Any], last: str | tuple[str, ...] | None = None, by_label: bool = False,
                  **kw: Any) -> None:
    """One legend for all panels, outside them, in the order drawn (``by_label``: sorted by label);
    the entries whose labels start with ``last`` (one prefix or several, in that order) go last: a
    curve drawn only in a later panel stays among the curves (a fresh user's review: one stood
    after "hollow: noisy point", apart from its backend's other runs)."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    if by_label:
        seen = dict(sorted(seen.items()))
    for prefix in (last,) if isinstance(last, str) else last or ():
        for label in [label for label in seen if label.startswith(prefix)]:
            seen[label] = seen.pop(label)
    if seen:
        labels = list(seen)
        if "ncol" in kw:  # fewer columns than asked where they do not fit; the lines added get their height
            labels = [_fit_label(label, fig.get_figwidth()) for label in labels]
            ncol = _legend_columns(labels, fig.get_figwidth(), kw["ncol"])
            more_rows = _legend_lines(labels, ncol) - math.ceil(len(labels) / kw["ncol"])
            fig.set_figheight(fig.get_figheight() + 0.19 * max(more_rows, 0))
            kw["ncol"] = ncol
        fig.legend(list(seen.values()), labels, frameon=False, fontsize=9, **kw)


def _text_pt(text: str, fontsize: float = 9) -> float:
    """The width in points of ``text``'s widest line in the default font (``TextPath``)."""
    text_path = _mpl().textpath.TextPath
    return max(text_path((0, 0), line, size=fontsize).get_extents().width for line in text.split("\n"))


def _fit_label(label: str, width_in: float, fontsize: float = 9) -> str:
    """``label`` wrapped at spaces into lines that fit, beside its handle, a legend ``width_in``
    inches wide (a label wider than the figure ran off both of its edges)."""
    room = 0.97 * width_in * 72 - 2.8 * fontsize
    chars = len(label)
    while _text_pt(text := "\n".join(textwrap.wrap(label, chars, break_on_hyphens=False)), fontsize) > room:
        if chars <= 12:
            break
        chars = max(12, min(chars - 1, int(chars * room / _text_pt(text, fontsize))))
    return text


def _legend_column_spans(n: int, ncol: int) -> list[tuple[int, int]]:
    """``(first, end)`` of each column of a legend of ``n`` entries in ``ncol`` columns, as
    matplotlib fills them (``Legend._init_legend_box``): top to bottom, the first ``n % ncol``
    columns one entry longer (4 entries in 3 columns: 2, 1, 1, not 2 and 2)."""
    rows, longer = divmod(n, ncol)
    sizes = [k for k in [rows + 1] * longer + [rows] * (ncol - longer) if k]
    firsts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [(first, first + k) for first, k in zip(firsts, sizes)]


def _legend_lines(labels: Sequence[str], ncol: int) -> int:
    """The lines of text of a legend of ``labels`` in ``ncol`` columns (its tallest column)."""
    return max(sum(label.count("\n") + 1 for label in labels[a:b]) for a, b in _legend_column_spans(len(labels), ncol))


def _legend_columns(labels: Sequence[str], width_in: float, most: int, fontsize: float = 9) -> int:
    """The most columns, at most ``most``, in which a legend of ``labels`` fits ``width_in`` inches.

    Matplotlib fills a legend's columns top to bottom (:func:`_legend_column_spans`); a column is as wide as its widest entry: the
    handle (2 font sizes), the pad after it (0.8) and the label's widest line, measured with the
    default font (``TextPath``); columns are 2 font sizes apart (matplotlib's default
    ``handlelength``, ``handletextpad`` and ``columnspacing``).  1 when even one column is too wide.
    """
    entry_pt = [2.8 * fontsize + _text_pt(label, fontsize) for label in labels]
    for ncol in range(min(most, len(labels)), 1, -1):
        columns = [max(entry_pt[a:b]) for a, b in _legend_column_spans(len(labels), ncol)]
        if (sum(columns) + 2 * fontsize * (len(columns) - 1)) / 72 <= 0.97 * width_in:
            return ncol
    return 1


def latency(data: LatencyData, title: str, where: str, metric: str = "us") -> Any:
    """Figure (a) (``metric="us"``, log-log with the floor) or (b) (``"pct"``, % of the floor).

    A backend has one colour in every figure; curves of several runs differ by line style and marker."""
    batches = sorted(data.curves)
    fig, axes = _panels(len(batches), title, where, sharey=metric == "pct")
    runs = {run: k for k, run in enumerate(sorted({c.run for cs in data.curves.values() for c in cs}))}
    noisy = False
    for ax, batch in zip(axes, batches):
        contexts = sorted({p.context_len for c in data.curves[batch] for p in c.points})
        for curve in data.curves[batch]:
            xs = [p.context_len for p in curve.points]
            ys = [p.median_us if metric == "us" else p.pct_of_floor for p in curve.points]
            color, k = style.backend_color(curve.backend), runs[curve.run]
            marker = MARKERS[k % len(MARKERS)]
            ax.plot(xs, ys, marker=marker, linestyle=LINESTYLES[k % len(LINESTYLES)], color=color,
                    label=curve.label, markersize=4)
            hollow = [(x, y) for x, y, p in zip(xs, ys, curve.points) if p.noisy]
            if hollow:
                noisy = True
                ax.plot(*zip(*hollow), marker, color="white", markeredgecolor=color, markersize=4)
        kind = f"{data.floor_bandwidth} bandwidth"
        if metric == "us":
            floor = data.floor_us.get(batch, [])
            if floor:
                ax.plot(*zip(*floor), "--", color=style.FLOOR_COLOR, linewidth=1.2,
                        label=f"floor: bytes / {floor_text(data)}")
            _log_y(ax, "µs per decode call (median, log scale)" if ax is axes[0] else "")  # one unit: one label
        else:
            ax.axhline(100, linestyle="--", color=style.FLOOR_COLOR, linewidth=1.2,
                       label=f"100% = floor (bytes / {floor_text(data)})")
            if ax is axes[0]:
                ax.set_ylabel(f"% of floor ({kind})")
            ax.set_ylim(0, max(110, ax.get_ylim()[1]))
        _context_x(ax, contexts)
        ax.set_title(f"batch {batch}", fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
    if noisy:
        axes[0].plot([], [], "o", color="white", markeredgecolor="grey", label="hollow: noisy point")
    _dedup_legend(fig, axes, last=("floor: ", "100% = floor", "hollow: "), by_label=True, loc="outside lower center",
                  ncol=5)
    return fig


def _one_split_title(batch: int, splits: Sequence[int]) -> str:
    """A panel's title: ``batch 16``, and where that batch ran one split count, which one."""
    return f"batch {batch}" + (f" (only num_kv_splits = {splits[0]} ran)" if len(splits) == 1 else "")


def split_sweep(curves: dict[int, list[SplitCurve]], title: str, where: str) -> Any:
    """Figure (c): time vs ``num_kv_splits`` per context (one line each), the best starred.  Each
    panel's x axis has its batch's own split counts; a batch that ran one count draws its points
    over it, unstarred (no other count to beat), and its title says so."""
    mpl = _mpl()
    batches = sorted(curves)
    fig, axes = _panels(len(batches), title, where, width=5.2)
    cmap = mpl.colormaps["viridis"]
    contexts = sorted({c.context_len for cs in curves.values() for c in cs})
    shade = {ctx: cmap(i / max(1, len(contexts) - 1) * 0.9) for i, ctx in enumerate(contexts)}
    starred = False
    for ax, batch in zip(axes, batches):
        splits = curves[batch][0].splits
        for c in curves[batch]:
            pts = [(s, us) for s, us in zip(c.splits, c.median_us) if us is not None]
            ax.plot(*zip(*pts), "-o", color=shade[c.context_len], markersize=3 if len(splits) > 1 else 6,
                    label=style.context_text(c.context_len))
            if c.best_splits is not None and len(splits) > 1:
                starred = True
                ax.plot([c.best_splits], [c.best_us], "*", color=shade[c.context_len], markersize=13,
                        markeredgecolor="black", markeredgewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_locator(mpl.ticker.NullLocator())
        best = [c.best_splits for c in curves[batch] if c.best_splits is not None]
        _log_ticks(ax, splits, [str(s) for s in splits], best, labelsize=8)
        if len(splits) == 1:  # the one count in the middle, not at an edge of an axis of nothing
            ax.set_xlim(splits[0] / 2, splits[0] * 2)
        ax.set_xlabel("num_kv_splits (log scale)")
        _log_y(ax, "µs per decode call (median, log scale)")
        ax.set_title(_one_split_title(batch, splits), fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
    if starred:
        axes[-1].plot([], [], "*", color="white", markeredgecolor="black", markersize=11, label="best split count")
    _dedup_legend(fig, axes, loc="outside right center", title="context")
    return fig


def _heat_cells(ax: Any, m: Heatmap, norm: Any) -> None:
    """``m``'s cell texts and each row's best boxed; a panel of one split count has no ratio to
    show (each is 1), so its cells give the µs instead, unboxed."""
    patches = _mpl().patches
    one = len(m.splits) == 1
    for i, row in enumerate(m.ratio):
        for j, v in enumerate(row):
            dark = v is not None and norm(v) > 0.55
            mark = style.ratio_text(v) if v is not None else "✗" if m.measured[i][j] else "–"
            if one and v is not None:
                mark = f"{style.sig3(m.best_us[i])} µs"
            ax.text(j, i, mark, ha="center", va="center", fontsize=6.5, color="white" if dark else "black")
        if m.best_column[i] is not None and not one:
            ax.add_patch(patches.Rectangle((m.best_column[i] - 0.5, i - 0.5), 1, 1, fill=False,
                                           edgecolor="black", linewidth=1.6))


def split_heatmap(maps: dict[int, Heatmap], title: str, where: str) -> Any:
    """Figure (c), heat map: context x split count, coloured by µs / the context's best (log).  Each
    panel's columns are its batch's own split counts; a batch that ran one count gets a narrow
    panel whose cells give the µs (:func:`_heat_cells`) and whose title says so."""
    mpl = _mpl()
    batches = sorted(maps)
    widths = [6.4 if len(maps[b].splits) > 1 else 3.2 for b in batches]
    fig, axes = _panels(len(batches), title, where, height=4.3, widths=widths)
    worst = max((v for m in maps.values() for row in m.ratio for v in row if v is not None), default=2.0)
    norm = mpl.colors.LogNorm(vmin=1.0, vmax=max(worst, 1.01))
    cmap = mpl.colormaps["YlOrRd"].with_extremes(bad="#d9d9d9")
    image = None
    for ax, batch in zip(axes, batches):
        m = maps[batch]
        grid = [[v if v is not None else float("nan") for v in row] for row in m.ratio]
        image = ax.imshow(grid, aspect="auto", cmap=cmap, norm=norm, origin="lower")
        _heat_cells(ax, m, norm)
        ax.set_xticks(range(len(m.splits)), [str(s) for s in m.splits], fontsize=8)
        ax.set_yticks(range(len(m.contexts)), [style.context_text(c) for c in m.contexts], fontsize=8)
        ax.set_xlabel("num_kv_splits")
        ax.set_ylabel("context length, tokens")
        ax.set_title(_one_split_title(batch, m.splits), fontsize=10)
    cbar = fig.colorbar(image, ax=axes, shrink=0.9)
    cbar.set_label("µs / best µs at that context (log scale)")
    cbar.ax.yaxis.set_major_locator(mpl.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    cbar.ax.yaxis.set_major_formatter(mpl.ticker.FuncFormatter(lambda v, _pos: style.tick_text(v)))
    cbar.ax.yaxis.set_minor_formatter(mpl.ticker.NullFormatter())
    return fig


def speedups(points: Sequence[Speedup], title: str, where: str) -> Any:
    """Figure (d): bars of best split-KV µs / persistent µs per context, per batch; 1.0 marked."""
    batches = sorted({p.batch for p in points})
    pairs = list(dict.fromkeys((p.persistent, p.split_kv) for p in points))
    several_split_kv = len({s for _, s in pairs}) > 1
    fig, axes = _panels(len(batches), title, where, width=6.0, sharey=True)
    width = 0.8 / len(pairs)
    top = max(p.speedup for p in points)
    for ax, batch in zip(axes, batches):
        mine = [p for p in points if p.batch == batch]
        contexts = sorted({p.context_len for p in mine})
        for k, (pers, skv) in enumerate(pairs):
            at = {p.context_len: p for p in mine if (p.persistent, p.split_kv) == (pers, skv)}
            xs = [i + (k - (len(pairs) - 1) / 2) * width for i, c in enumerate(contexts) if c in at]
            ys = [at[c].speedup for c in contexts if c in at]
            label = f"{pers} vs {skv}"
            hatched = several_split_kv and k % 2
            bars = ax.bar(xs, ys, width * 0.92, color=style.backend_color(pers), label=label,
                          hatch="//" if hatched else None)
            # on hatching, white text on the hatch's black lines is hard to read: dark text on a white patch
            ax.bar_label(bars, [f"{y:.2f}" for y in ys], label_type="center", fontsize=7.5, rotation=90,
                         color="black" if hatched else "white", fontweight="bold",
                         bbox=dict(boxstyle="round,pad=0.2", facecolor="white", edgecolor="none") if hatched else None)
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="1.0 = equal")
        ax.set_xticks(range(len(contexts)), [style.context_text(c) for c in contexts])
        ax.set_xlabel(style.CONTEXT_AXIS)
        if ax is axes[0]:
            ax.set_ylabel("speedup: best split-KV µs / persistent µs (×)")
        ax.set_ylim(0, top * 1.22)
        ax.set_title(f"batch {batch} (above 1.0: the padded persistent kernel wins)", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    _dedup_legend(fig, axes, last="1.0 = equal", loc="outside lower center", ncol=4)
    return fig

