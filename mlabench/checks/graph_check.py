"""``mlabench graph-check``: does a captured decode graph stay right, and fast, at every length?

A server captures one decode graph per batch size at start-up, with small or dummy lengths, and
replays it every step after writing the step's lengths and rebuilding the metadata the graph reads
(``PreparedCall.refresh``).  Whatever the call chose on the host at capture time (a split count
passed as a kernel argument, a grid size) stays frozen in the graph.  For each subject (a backend
and its parameters) and batch size this module:

1. prepares the call with every request at ``capture_len`` tokens and captures it;
2. per context length L: writes L into ``cache_seqlens``, runs ``refresh``, replays once on a
   NaN-poisoned output and checks it against the fp32 reference, then times replays;
3. compares with the same backend tuned for L: prepared knowing L (as an eager server launching
   per step would) and, where it has ``num_kv_splits`` and can be steered to it, the fastest of
   the candidate counts (else its own choice at L).  The search runs before the capture; the
   row's two times are then taken side by side: the graph and the chosen call, prepared again at L
   and captured, timed in turn (:meth:`~mlabench.checks.graph_bench.GraphBench.side_by_side`), the
   same way (graph replay, device events, the stopping rule of :mod:`mlabench.measure.timing`), so
   only the choice differs.

A row is flagged when the captured graph is wrong after refresh or slower than the tuned call by
more than ``tolerance`` (a split count or schedule frozen at capture).  A subject whose
``split_policy`` names no file gets the policy of the tuned counts this run measured (per batch
size, ``(L, best count)`` rows), written to ``policy_path``: the table ``tune`` would export from
the same measurements.

Graph capture needs a CUDA/HIP GPU (:class:`GraphEngine`); :class:`EagerEngine` replays by calling
the functions again, so host-side choices are *not* frozen: it exists to test the orchestration on
the CPU and is not offered by the command (both in :mod:`mlabench.checks.graph_engines`, imported
here for callers of this module).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlabench.backends import get_backend
from mlabench.backends.base import SPLITS_ON_DEVICE
from mlabench.checks.graph_bench import SPLITS_PARAM, GraphBench, Tuned
from mlabench.checks.graph_engines import EagerEngine, GraphEngine, replay_us
from mlabench.device import current_device
from mlabench.errors import BackendUnavailableError, ConfigError, ShapeError, UnsupportedShapeError
from mlabench.files import write_text
from mlabench.measure.timing import TimingConfig
from mlabench.policy.device_table import POLICY_MODES, SplitPolicy
from mlabench.shapes import MAX_QO_LEN, SUPPORTED_DTYPES, MLADecodeShape

DEFAULT_CONTEXTS = (4096, 16384, 32768, 65536, 100000, 131072)
DEFAULT_SPLITS = (1, 2, 4, 8, 16, 32, 64, 128)
DEFAULT_TOLERANCE = 0.05


@dataclass(frozen=True)
class Subject:
    """A backend and its parameters to capture.  ``policy_mode`` (``"host"`` / ``"device"``) asks
    for ``split_policy = "<mode>:<policy file>"``, the file filled in by :func:`run_graph_check`."""

    backend: str
    params: dict[str, Any] = field(default_factory=dict)
    policy_mode: str | None = None

    @property
    def label(self) -> str:
        extra = [f"{k}={v}" for k, v in sorted(self.params.items())]
        extra += [f"split_policy={self.policy_mode}"] if self.policy_mode else []
        return f"{self.backend} {' '.join(extra)}".strip()


#: The parameter through which a backend takes a split policy (its modes: :data:`POLICY_MODES`).
POLICY_PARAM = "split_policy"


def subjects_for(backends: Sequence[str], policy_modes: Sequence[str],
                 params: dict[str, Any] | None = None) -> list[Subject]:
    """One subject per backend, or per policy mode for a backend that takes :data:`POLICY_PARAM`;
    each with the values of ``params`` (one value per name, already validated) its backend takes.

    Raises :class:`UnknownBackendError` for an unregistered name and :class:`ConfigError` for a
    mode other than ``host`` / ``device``.
    """
    bad = sorted(set(policy_modes) - set(POLICY_MODES))
    if bad:
        raise ConfigError(f"--split-policy takes host or device, got {bad[0]!r}")
    out: list[Subject] = []
    for name in dict.fromkeys(backends):
        takes = get_backend(name).param_names()
        own = {k: v for k, v in (params or {}).items() if k in takes}
        if POLICY_PARAM in takes and policy_modes:
            out += [Subject(name, dict(own), policy_mode=m) for m in dict.fromkeys(policy_modes)]
        else:
            out.append(Subject(name, own))
    return out


@dataclass
class GraphCheckConfig:
    """What to capture and where to replay it.  Every request of a step has the same length."""

    num_heads: int = 12
    batches: tuple[int, ...] = (1,)
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    page_size: int = 64
    dtype: str = "bfloat16"
    capture_len: int = 1
    qo_len: int = 1
    causal: bool = True
    splits: tuple[int, ...] = DEFAULT_SPLITS
    tolerance: float = DEFAULT_TOLERANCE
    timing: TimingConfig = field(default_factory=lambda: TimingConfig(budget_s=0.5))
    seed: int = 0

    def validate(self) -> None:
        """ConfigError for empty lists, lengths or batch sizes < 1, a ``qo_len`` outside 1-8
        (:data:`~mlabench.shapes.MAX_QO_LEN`), a negative tolerance, a dtype not in
        :data:`~mlabench.shapes.SUPPORTED_DTYPES`, or a causal block captured at fewer tokens than
        it holds; :class:`~mlabench.errors.ShapeError` for heads, a length or a batch out of the
        range a decode step may have (:meth:`~mlabench.shapes.MLADecodeShape.uniform`)."""
        if not self.batches or not self.contexts or not self.splits:
            raise ConfigError("graph-check needs batch sizes, context lengths and split counts")
        if min(self.batches) < 1 or min(self.contexts) < 1 or self.capture_len < 1 or min(self.splits) < 1:
            raise ConfigError("batch sizes, context lengths, --capture-len and split counts must be >= 1")
        if not 1 <= self.qo_len <= MAX_QO_LEN:
            raise ConfigError(f"--qo-len takes 1-{MAX_QO_LEN} query tokens per request, got {self.qo_len}")
        if self.tolerance < 0:
            raise ConfigError(f"tolerance must be >= 0, got {self.tolerance}")
        if self.dtype not in SUPPORTED_DTYPES:
            raise ConfigError(f"--dtype must be one of {', '.join(SUPPORTED_DTYPES)}, got {self.dtype!r}")
        if self.causal and self.capture_len < self.qo_len:
            raise ConfigError(f"--capture-len {self.capture_len} is shorter than a causal block of "
                              f"--qo-len {self.qo_len} (its own tokens are in the cache)")
        for flag, length in (("", max(self.contexts)), ("--capture-len: ", self.capture_len)):
            try:  # heads, lengths and batch in range, as sweep checks them
                MLADecodeShape.uniform(max(self.batches), length, self.num_heads, page_size=self.page_size,
                                       q_dtype=self.dtype, kv_dtype=self.dtype, qo_len=self.qo_len,
                                       causal=self.causal)
            except ShapeError as exc:
                raise ShapeError(f"{flag}{exc}") from None


@dataclass
class GraphCheckRow:
    """One (subject, batch, context): the captured graph against the call tuned for that context."""

    subject: str
    backend: str
    batch: int
    context_len: int
    capture_len: int
    graph_us: float | None = None
    tuned_us: float | None = None
    tuned_splits: int | None = None
    captured_splits: Any = None
    refresh_us: float | None = None
    correct: bool | None = None
    max_abs_err: float | None = None
    flagged: bool = False
    note: str = ""

    @property
    def slowdown(self) -> float | None:
        """``graph_us / tuned_us - 1`` (0.05 = 5% slower), None when either is missing."""
        if self.graph_us is None or not self.tuned_us:
            return None
        return self.graph_us / self.tuned_us - 1


@dataclass
class GraphCheckResult:
    rows: list[GraphCheckRow]
    policy: SplitPolicy | None = None
    copies: dict[int, int] = field(default_factory=dict)
    device: str | None = None


# ---- the run -------------------------------------------------------------------------------------
def run_graph_check(cfg: GraphCheckConfig, subjects: Sequence[Subject], engine: Any = None,
                    policy: SplitPolicy | None = None, policy_path: Path | None = None,
                    progress: Callable[[str], None] | None = None) -> GraphCheckResult:
    """Capture every subject at ``cfg.capture_len`` and replay it at every context (module doc).

    ``policy`` (a split policy given by the user) is written to ``policy_path`` for subjects with a
    ``policy_mode``; without it the tuned counts measured here are.  ``engine`` defaults to
    :class:`GraphEngine`.  Raises :class:`ConfigError` for a bad configuration, an unknown
    backend or a policy subject without ``policy_path``, :class:`GPURequiredError` without a GPU,
    :class:`BackendUnavailableError` for a backend that cannot run here and
    :class:`UnsupportedShapeError` for one that does not take the shape.
    """
    cfg.validate()
    engine = engine or GraphEngine()
    if any(s.policy_mode for s in subjects) and policy_path is None:
        raise ConfigError("a split_policy subject needs a file for the policy (policy_path)")
    for s in subjects:
        ok, why = get_backend(s.backend).available()
        if not ok:
            raise BackendUnavailableError(f"{s.backend}: {why}")
    say = progress or (lambda _msg: None)
    result = GraphCheckResult(rows=[], policy=policy, device=current_device().name)
    tuned_tables: dict[int, list[tuple[int, int]]] = {}
    for batch in cfg.batches:
        bench = GraphBench(cfg, batch, engine)
        for s in subjects:
            ok, why = get_backend(s.backend).supports(bench.shape)
            if not ok:
                raise UnsupportedShapeError(f"{s.backend}: {why}")
        result.copies[batch] = len(bench.inputs)
        tuned = {key: {L: bench.tuned(key[0], dict(key[1]), L, say) for L in cfg.contexts}
                 for key in dict.fromkeys(map(baseline_key, subjects))}
        policy_subjects = [s for s in subjects if s.policy_mode]
        if policy_subjects and policy is None:
            source = tuned[baseline_key(policy_subjects[0])]
            tuned_tables[batch] = [(L, source[L].splits or 1) for L in cfg.contexts]
            result.policy = SplitPolicy.create(tuned_tables, source="tuned by this graph-check run")
        if policy_subjects:
            write_text(policy_path, result.policy.to_json(), "split policy")
        for s in subjects:
            say(f"capture {s.label} B={batch} at L={cfg.capture_len}")
            result.rows += captured_rows(bench, s, policy_path, tuned[baseline_key(s)])
    return result


def baseline_key(s: Subject) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """``(backend, params)`` of the call ``s`` is compared with: the backend's defaults where it has
    :data:`SPLITS_PARAM` (the count is then searched), else the subject's own parameters."""
    if SPLITS_PARAM in get_backend(s.backend).param_names():
        return s.backend, ()
    return s.backend, tuple(sorted(s.params.items()))


def captured_rows(bench: GraphBench, s: Subject, policy_path: Path | None,
                  tuned: dict[int, Tuned]) -> list[GraphCheckRow]:
    """The rows of subject ``s`` at one batch size: captured at ``capture_len``, then per length
    refreshed, replayed on a NaN-poisoned output and checked, and timed side by side with the
    tuned call of that length (``tuned``: its ``(µs, count)`` from the search; the row keeps the
    count and the side-by-side µs, :meth:`GraphBench.side_by_side`)."""
    cfg = bench.cfg
    params = dict(s.params)
    if s.policy_mode:
        params[POLICY_PARAM] = f"{s.policy_mode}:{policy_path}"
    base = dict(subject=s.label, backend=s.backend, batch=bench.batch, capture_len=cfg.capture_len)
    calls, replay, why = bench.capture(s.backend, params)
    if why:
        return [GraphCheckRow(context_len=L, tuned_us=tuned[L].us, tuned_splits=tuned[L].splits,
                              flagged=True, note=why, **base) for L in cfg.contexts]
    eff = calls[0].effective_params
    frozen = copy.copy(eff.get(SPLITS_PARAM))
    rows = []
    for length in cfg.contexts:
        bench.set_lengths(length)
        t0 = time.perf_counter()
        for c in calls:
            c.refresh_for_new_lengths()
        bench.engine.sync()
        refresh_us = (time.perf_counter() - t0) * 1e6 / len(calls)
        calls[0].out.fill_(float("nan"))
        replay()
        correct, err = bench.correct(calls[0])
        tuned_us, tuned_splits, tuned_params = tuned[length]
        if tuned_params is None:
            graph_us = replay_us(replay, len(calls), cfg.timing)
        else:
            graph_us, tuned_us = bench.side_by_side(replay, len(calls), s.backend, tuned_params, length)
        row = GraphCheckRow(context_len=length, graph_us=graph_us, tuned_us=tuned_us, tuned_splits=tuned_splits,
                            captured_splits=splits_in_graph(frozen, eff), refresh_us=refresh_us,
                            correct=correct, max_abs_err=err, **base)
        rows.append(assess(row, cfg.tolerance))
    return rows


def splits_in_graph(frozen: Any, effective: dict[str, Any]) -> Any:
    """The split count a captured call runs after refresh: ``"per request"`` for a device policy,
    the counts it reports now where they are computed on the device (:data:`SPLITS_ON_DEVICE`),
    else ``frozen``, its count at capture."""
    if effective.get(POLICY_PARAM) == "device":
        return "per request"
    return effective.get(SPLITS_PARAM) if effective.get(SPLITS_ON_DEVICE) else frozen


def assess(row: GraphCheckRow, tolerance: float) -> GraphCheckRow:
    """Flag ``row`` (in place, returned) when wrong after refresh or more than ``tolerance`` slower
    than the tuned call, with a short note saying which (and, when the graph holds another split
    count than the tuned one, that the count was frozen at capture)."""
    slow = row.slowdown
    if row.correct is False:
        row.flagged, row.note = True, "wrong after refresh (stale metadata)"
    elif slow is not None and slow > tolerance:
        frozen = (isinstance(row.captured_splits, int) and isinstance(row.tuned_splits, int)
                  and row.captured_splits != row.tuned_splits)
        row.flagged = True
        row.note = f"{100 * slow:.0f}% slower than tuned"
        row.note += "; split count frozen at capture" if frozen else ""
    return row
