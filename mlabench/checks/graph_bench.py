"""graph-check's measurements of one batch size (:class:`GraphBench`): its inputs, the search of
the split counts at each length (the tuned side), the capture of a subject, and the two sides of a
row timed side by side (:meth:`GraphBench.side_by_side`)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from mlabench.backends import get_backend
from mlabench.backends.base import PreparedCall
from mlabench.checks.graph_engines import replay_us
from mlabench.checks.verdict import compare_outputs
from mlabench.device import current_device, free_memory_bytes
from mlabench.errors import UnsupportedShapeError
from mlabench.inputs import input_bytes, make_inputs
from mlabench.kernels.reference import mla_decode_reference
from mlabench.measure.timing import cold_cache_copies
from mlabench.shapes import MLADecodeShape

#: The split-count parameter a tuned baseline searches, where a backend has it.
SPLITS_PARAM = "num_kv_splits"
#: Turns of each side in :meth:`GraphBench.side_by_side` (the median of each is kept).
SIDE_BY_SIDE_ROUNDS = 3


class Tuned(NamedTuple):
    """The call a length's search chose: its µs (search time), the split count it ran (None where
    the backend reports none) and the parameters it was prepared with."""

    us: float | None
    splits: Any
    params: dict[str, Any] | None


class GraphBench:
    """graph-check's inputs of one batch size and its measurements (:mod:`mlabench.checks.graph_check`).

    The inputs are ``max(1, min(want, fit))`` copies (:func:`~mlabench.inputs.make_inputs`, seeds
    ``cfg.seed + i``), every request of one step at the same length, sized for the longest context;
    ``want`` copies pass the GPU's L2 cache twice at the shortest context
    (:func:`~mlabench.measure.timing.cold_cache_copies`), ``fit`` fill 80% of free memory with one
    set left for scratch.  Every time is µs per decode call of a graph replay of one call per copy
    (:func:`~mlabench.checks.graph_engines.replay_us`)."""

    def __init__(self, cfg: Any, batch: int, engine: Any):
        self.cfg, self.batch, self.engine = cfg, batch, engine
        kw = dict(num_heads=cfg.num_heads, page_size=cfg.page_size, q_dtype=cfg.dtype, kv_dtype=cfg.dtype,
                  qo_len=cfg.qo_len, causal=cfg.causal)
        self.shape = MLADecodeShape.create(context_lens=(max(cfg.contexts),) * batch, **kw)
        read = MLADecodeShape.create(context_lens=(min(cfg.contexts),) * batch, **kw)
        dev = current_device()
        want = cold_cache_copies(read.min_bytes_moved, dev, cfg.timing)  # cold at the shortest L
        fit = int(0.8 * free_memory_bytes(dev)) // input_bytes(self.shape) - 1  # 1 set for scratch
        self.inputs = [make_inputs(self.shape, seed=cfg.seed + i) for i in range(max(1, min(want, fit)))]
        self._refs: dict[int, torch.Tensor] = {}

    def set_lengths(self, length: int) -> None:
        for x in self.inputs:
            x.cache_seqlens.fill_(length)

    def reference(self, length: int) -> torch.Tensor:
        if length not in self._refs:
            x = self.inputs[0]
            self._refs[length], _ = mla_decode_reference(
                x.q, x.kv_cache, x.block_table, [length] * self.batch, self.shape.scale,
                qo_len=self.shape.qo_len, causal=self.shape.causal)
        return self._refs[length]

    def prepare(self, backend: str, params: dict[str, Any]) -> list[PreparedCall]:
        b = get_backend(backend)
        resolved = b.resolve_params(self.shape, params)
        return [b.prepare(x, resolved) for x in self.inputs]

    def time_calls(self, calls: list[PreparedCall]) -> float | None:
        """Per-call µs of ``calls`` captured together; None when they cannot be captured."""
        try:
            replay = self.engine.capture([c.fn for c in calls])
        except RuntimeError:
            self.engine.sync()
            return None
        return replay_us(replay, len(calls), self.cfg.timing)

    def tuned(self, backend: str, params: dict[str, Any], length: int, say: Callable[[str], None]) -> Tuned:
        """The call of ``backend`` with ``params`` prepared at ``length``: the fastest correct
        candidate count where it has :data:`SPLITS_PARAM` and can be steered to one here; else its
        own choice prepared at ``length`` (the count it reports, None where it reports none), so a
        backend whose count cannot be steered is compared with itself knowing the length; all None
        when no candidate is correct."""
        self.set_lengths(length)
        say(f"tune {backend} B={self.batch} L={length}")
        counts = list(self.cfg.splits) if SPLITS_PARAM in get_backend(backend).param_names() else []
        best, steered = Tuned(float("inf"), None, None), False
        for count in counts:
            try:
                steer = {**params, SPLITS_PARAM: count}
                calls = self.prepare(backend, steer)
            except UnsupportedShapeError:
                continue  # a count it cannot take here (e.g. AITER >= v0.1.20 chooses its own)
            steered = True
            best = self._faster(best, calls, Tuned(None, count, steer))
        if not steered:
            try:
                calls = self.prepare(backend, params)
            except UnsupportedShapeError:
                return Tuned(None, None, None)
            best = self._faster(best, calls, Tuned(None, calls[0].effective_params.get(SPLITS_PARAM), params))
        return best if best.us < float("inf") else Tuned(None, None, None)

    def _faster(self, best: Tuned, calls: list[PreparedCall], candidate: Tuned) -> Tuned:
        """``candidate`` with its µs when ``calls`` are timed faster than ``best`` and correct, else ``best``."""
        us = self.time_calls(calls)
        if us is not None and us < best.us and self.correct(calls[0])[0]:
            return candidate._replace(us=us)
        return best

    def correct(self, call: PreparedCall) -> tuple[bool, float | None]:
        """Replay-free check of copy 0's output after the last run (it ran in ``time_calls``)."""
        self.engine.sync()
        v = compare_outputs(call.out, self.reference(int(self.inputs[0].cache_seqlens[0])))
        return v.passed, v.max_abs_err

    def capture(self, backend: str, params: dict[str, Any]) -> tuple[list[PreparedCall], Any, str]:
        """``(calls, replay, "")`` of ``backend`` prepared and captured at the capture length, or
        ``(calls, None, why)`` when it is refused there, not graph-safe or fails to capture."""
        self.set_lengths(self.cfg.capture_len)
        try:
            calls = self.prepare(backend, params)
        except UnsupportedShapeError as exc:
            return [], None, f"refused at the capture length: {exc}"
        if not calls[0].graph_safe:
            return calls, None, "not graph-safe: cannot be captured"
        try:
            return calls, self.engine.capture([c.fn for c in calls]), ""
        except RuntimeError as exc:
            self.engine.sync()
            first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            return calls, None, f"capture failed: {first}"

    def side_by_side(self, replay: Callable[[], None], calls: int, backend: str, params: dict[str, Any],
                     length: int) -> tuple[float, float | None]:
        """``(graph µs, tuned µs)`` at ``length``: ``replay`` (``calls`` calls a replay, already
        refreshed for ``length``) and ``backend`` with ``params`` prepared at ``length`` and captured,
        timed in turn :data:`SIDE_BY_SIDE_ROUNDS` times each, the median of each side; the tuned
        side is None where it is refused at ``length`` or cannot be captured.  Timed side by side,
        both run in the same state of the GPU and its memory (the search of the counts ran before the
        capture, over many allocations; the graph's lengths differ per run)."""
        self.set_lengths(length)
        try:
            tuned_calls = self.prepare(backend, params)
            tuned_replay = self.engine.capture([c.fn for c in tuned_calls])
        except (UnsupportedShapeError, RuntimeError):
            self.engine.sync()
            return replay_us(replay, calls, self.cfg.timing), None
        graph, tuned = [], []
        for _ in range(SIDE_BY_SIDE_ROUNDS):
            graph.append(replay_us(replay, calls, self.cfg.timing))
            tuned.append(replay_us(tuned_replay, len(tuned_calls), self.cfg.timing))
        return statistics.median(graph), statistics.median(tuned)
