"""What every figure shares: one colour per backend and per public heuristic, numbers as people read
them, axis labels.

Pure Python (no matplotlib), so data functions and reports use the same formatting.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Collection, Sequence
from typing import Any

# One colour per backend in every figure (matplotlib's tab10 hues; gluon-splitkv tab20b's indigo, dark
# beside triton-splitkv's blue and away from every heuristic's hue), fixed by name so that a figure
# with fewer backends keeps the same colours.
BACKEND_COLORS = {
    "gluon-splitkv": "#393b79",
    "triton-splitkv": "#1f77b4",
    "triton-persistent": "#ff7f0e",
    "flashmla": "#2ca02c",
    "aiter-asm": "#d62728",
    "aiter-gluon": "#9467bd",
    "torch-splitkv": "#8c564b",
    "reference": "#7f7f7f",
    "vllm-triton-mla": "#b8860b",
    "vllm-fa3-mla": "#dd8452",
    "vllm-flashmla": "#98df8a",
}
_SPARE_COLORS = ("#e377c2", "#bcbd22", "#17becf", "#7b4173", "#637939", "#843c39")
# Serve-bench variants are servers, not backends: a palette of their own, the baseline in grey.
BASELINE_COLOR = "#9e9e9e"
VARIANT_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")
FLOOR_COLOR = "#000000"
# The public split-count heuristics (mlabench/policy/heuristics.py) in the tuning figures: fixed by name, hues
# kept away from the backends' so a tuned backend's policy and every heuristic read apart.
HEURISTIC_COLORS = {
    "vllm-triton": "#e6ab02",
    "sglang": "#e7298a",
    "aiter-gluon-0.1.19": "#1b9e77",
    "aiter-gluon-0.1.20": "#66a61e",
    "rocm-buckets": "#a6761d",
}
_SPARE_HEURISTIC_COLORS = ("#666666", "#1a1a1a", "#b15928")


def heuristic_color(name: str) -> str:
    """The colour of the heuristic ``name`` in every figure (a stable spare colour for unknown names)."""
    if name in HEURISTIC_COLORS:
        return HEURISTIC_COLORS[name]
    return _SPARE_HEURISTIC_COLORS[zlib.crc32(name.encode()) % len(_SPARE_HEURISTIC_COLORS)]


def backend_color(backend: str) -> str:
    """The colour of ``backend`` in every figure (a stable spare colour for unknown names)."""
    if backend in BACKEND_COLORS:
        return BACKEND_COLORS[backend]
    return _SPARE_COLORS[zlib.crc32(backend.encode()) % len(_SPARE_COLORS)]


def variant_colors(variants: list[str], baseline: str) -> dict[str, str]:
    """Colours of serve-bench variants, in config order; the baseline grey."""
    others = iter(VARIANT_COLORS * (1 + len(variants) // len(VARIANT_COLORS)))
    return {v: BASELINE_COLOR if v == baseline else next(others) for v in variants}


def sig3(value: float | None) -> str:
    """A time to 3 significant digits without exponent: 7361.4 -> '7360', 14.73 -> '14.7'."""
    if value is None or not math.isfinite(value):
        return "—"
    if value == 0:
        return "0"
    decimals = 2 - math.floor(math.log10(abs(value)))
    rounded = round(value, decimals)
    if decimals > 0 and abs(rounded) >= 10 ** (3 - decimals):  # 9.996 rounds up to 10.0
        decimals -= 1
    return f"{rounded:.{max(decimals, 0)}f}"


def tick_text(value: float) -> str:
    """An axis tick as people write it: 50.0 -> '50', 0.5 -> '0.5', 5000 -> '5000'."""
    return f"{value:g}"


def tbps_text(value: float) -> str:
    """A bandwidth to 3 significant digits: '4.46 TB/s', and a CPU's '0.0037 TB/s' (not '0.00')."""
    return f"{value:.3g} TB/s"


def speedup_text(value: float | None) -> str:
    """A speedup to 2 decimals with a times sign: '1.34×'."""
    return "—" if value is None or not math.isfinite(value) else f"{value:.2f}×"


def ratio_text(value: float) -> str:
    """A ratio to the best (≥ 1) as a heat-map cell shows it: '1.00', '1.3', '131'."""
    if value < 1.995:
        return f"{value:.2f}"
    if value < 19.95:
        return f"{value:.1f}"
    return f"{value:.0f}"


def context_text(tokens: int) -> str:
    """A context length as people write it: 131072 -> '128K' (K = 1024), 100000 -> '100k'."""
    if tokens >= 1024 and tokens % 1024 == 0:
        return f"{tokens // 1024}K"
    if tokens >= 1000 and tokens % 1000 == 0:
        return f"{tokens // 1000}k"
    return str(tokens)


#: On a log axis, the least ratio between two context lengths whose labels both show, where the
#: axis's width is not known (the figures thin their ticks by the width drawn: draw._log_ticks).
MIN_LABEL_RATIO = 1.4


def context_labels(contexts: Sequence[int], log: bool = True, min_ratio: float = MIN_LABEL_RATIO) -> list[str]:
    """:func:`context_text` of each length (ascending), blank where a log axis puts it within
    ``min_ratio`` of a label shown; the longest length always keeps its label."""
    labels = [context_text(c) for c in contexts]
    return thin_labels(contexts, labels, min_ratio) if log else labels


def thin_labels(values: Sequence[float], labels: Sequence[str], min_ratio: float,
                prefer: Collection[float] = ()) -> list[str]:
    """``labels`` of ascending ``values`` on a log axis, blank where a value is within ``min_ratio``
    of the last value labelled.  Of two near values, one in ``prefer`` (a starred best split count)
    keeps its label over one that is not, and two in it share one ('128/132'); else the largest
    value keeps its own."""
    def rank(i: int) -> tuple[bool, bool]:
        return values[i] in prefer, i == len(values) - 1

    out, shown = list(labels), []
    for i, c in enumerate(values):
        last = shown[-1] if shown else None
        if last is not None and c < values[last] * min_ratio:
            if rank(i)[0] and rank(last)[0]:
                out[last], out[i] = f"{out[last]}/{out[i]}", ""
                continue
            if rank(i) <= rank(last):
                out[i] = ""
                continue
            out[shown.pop()] = ""  # it wins over its near neighbour
        shown.append(i)
    return out


CONTEXT_AXIS = "context length, tokens (K = 1024, k = 1000)"
DTYPE_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float8_e4m3fn": "fp8"}
TIMING_TEXT = {"graph": "{api} graph replay, cold cache", "eager": "eager launches, cold cache",
               "wall": "CPU wall clock"}
GRAPH_API = {"cuda": "CUDA", "rocm": "HIP"}


def run_model(config: dict[str, Any]) -> tuple[Any, Any]:
    """``(model, tp)`` of a run's recorded configuration for labels; ``tp`` None where the run gave
    its own ``heads`` beside the model (``sweep --model kimi-k3 --heads 12``: the model's latent
    widths and scale at heads that are not its local heads at any TP named), so no label claims
    "kimi-k3 at TP1" for them."""
    return config.get("model"), None if config.get("heads") else config.get("tp")


def model_text(model: Any, tp: Any, at: str = " at ") -> str:
    """``kimi-k3 at TP8`` (``at`` between model and TP); ``kimi-k3's dimensions`` without a TP
    (:func:`run_model`); "" without a model."""
    if not model:
        return ""
    return f"{model}{at}TP{tp}" if tp else f"{model}'s dimensions"


def timing_text(mode: str, device_kind: str | None) -> str:
    """How a run's times were taken, e.g. 'CUDA graph replay, cold cache' for ``graph`` on NVIDIA."""
    return TIMING_TEXT.get(mode, mode).replace("{api}", GRAPH_API.get(device_kind or "", "CUDA/HIP"))
