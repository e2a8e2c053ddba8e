"""How ``graph-check`` captures and replays a decode call: :class:`GraphEngine` captures CUDA/HIP
graphs; :class:`EagerEngine`, the CPU stand-in its tests use, calls the functions again, so host-side
choices are not frozen there; :func:`replay_us` times a replay."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from mlabench.device import current_device
from mlabench.errors import GPURequiredError
from mlabench.measure.timing import TimingConfig, capture_graph, time_calls


class GraphEngine:
    """Captures CUDA/HIP graphs.  Raises :class:`GPURequiredError` without a GPU."""

    def __init__(self) -> None:
        if not current_device().is_gpu:
            raise GPURequiredError("graph-check needs a CUDA or ROCm GPU (it captures graphs); "
                                   "none found here")

    def capture(self, fns: Sequence[Callable[[], object]]) -> Callable[[], None]:
        return capture_graph(fns).replay  # the bound method keeps the graph alive

    def sync(self) -> None:
        torch.cuda.synchronize()


class EagerEngine:
    """CPU stand-in for tests: a "replay" calls the functions again, so nothing is frozen."""

    def capture(self, fns: Sequence[Callable[[], object]]) -> Callable[[], None]:
        fns = list(fns)
        return lambda: [fn() for fn in fns] and None

    def sync(self) -> None:
        pass


def replay_us(replay: Callable[[], None], calls: int, cfg: TimingConfig) -> float:
    """Median µs per decode call of ``replay`` (``calls`` calls per replay) under the stopping rule
    of ``cfg``: device events on a GPU, wall clock on the CPU (:func:`mlabench.measure.timing.time_calls`)."""
    return time_calls([replay], cfg, use_graph=False).median_us / calls
