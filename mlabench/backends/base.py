"""The backend contract: every provider answers for itself; nothing else branches on its name.

A backend says whether it can run here (:meth:`Backend.available`), which shapes it takes
(:meth:`Backend.supports`), which parameters it has (:attr:`Backend.params`) and builds a
zero-argument callable for ``(inputs, params)`` (:meth:`Backend.prepare`).  Setup happens in
``prepare`` and is never timed; the timer only calls ``PreparedCall.fn``.

A server captures one decode graph per batch size and replays it every step with new lengths,
rebuilding the metadata the graph reads (work lists, a library's tile schedule) outside the graph
first.  ``PreparedCall.refresh`` is that per-step rebuild: after new lengths are written into
``inputs.cache_seqlens`` (in place) and ``refresh`` runs, ``fn`` (and, when ``graph_safe``, a graph
captured from it earlier) computes the new step.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch

from mlabench.errors import ConfigError
from mlabench.inputs import MLADecodeInputs
from mlabench.shapes import MLADecodeShape

#: ``"split-kv"`` (flash decoding, a split count to choose), ``"persistent"`` (a grid sized to the GPU
#: over a balanced work list, heads padded to a tile) or ``"reference"`` (the oracle).
Family = Literal["split-kv", "persistent", "reference"]

#: ``effective_params`` key a backend sets True when the split count each request runs is computed
#: on the device from the lengths the call reads, so that a captured graph follows new lengths; its
#: ``refresh`` then keeps ``effective_params["num_kv_splits"]`` at the counts of the current lengths.
SPLITS_ON_DEVICE = "splits_on_device"

#: Latent (kv_lora_rank) and decoupled RoPE widths every MLA decode kernel here is built for:
#: a 576-wide query and key, a 512-wide value and output.
MLA_DIMS = (512, 64)


def check_mla_dims(shape: MLADecodeShape, who: str) -> tuple[bool, str]:
    """``(True, "")`` when ``shape`` is kv_lora_rank 512 + rope 64, else ``(False, reason)``
    naming ``who`` (e.g. ``"FlashMLA decode"``)."""
    if (shape.kv_lora_rank, shape.qk_rope_head_dim) != MLA_DIMS:
        return False, (f"{who} is built for kv_lora_rank 512 + rope 64, got "
                       f"{shape.kv_lora_rank} + {shape.qk_rope_head_dim}")
    return True, ""


@dataclass(frozen=True)
class ParamSpec:
    """One parameter of a backend.

    ``kind`` is ``int`` or ``str``; ``choices`` lists the allowed strings; ``low``/``high`` bound
    integers (inclusive).  ``default`` may be a callable ``shape -> value``.  ``searched``: False
    for a kernel variant that ``tune`` keeps at its default unless its search space names it
    (a choice measured once, by a sweep, not per context bucket).  ``omit_default``: a
    parameter added after runs were recorded, left out of the resolved parameters at its default,
    so that those runs' records and point keys still pair with new ones (``diff``, the report,
    ``tune --export``); the call still reports the value it ran in its effective parameters.
    ``omitted_value``: for such a parameter whose default is not what the earlier runs ran (a
    default that changes with the shape), the value they ran: it is left out at that value
    instead of at the default, so an old record never pairs with a point that runs otherwise, and
    a point without the parameter runs that value.
    """

    name: str
    kind: type
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    low: int | None = None
    high: int | None = None
    omit_default: bool = False
    searched: bool = True
    omitted_value: Any = None

    def left_out(self, value: Any, shape: MLADecodeShape) -> bool:
        """Whether ``value`` stays out of a point's parameters: ``omit_default`` and the default,
        or ``omitted_value`` where one is set."""
        return self.omit_default and value == self._left_out_at(shape)

    def value_in(self, params: dict[str, Any], shape: MLADecodeShape) -> Any:
        """The value a point with resolved ``params`` runs: its own, else the one it was left out
        at (``omitted_value``, or the default)."""
        return params[self.name] if self.name in params else self._left_out_at(shape)

    def _left_out_at(self, shape: MLADecodeShape) -> Any:
        return self.omitted_value if self.omitted_value is not None else self.default_for(shape)

    def default_for(self, shape: MLADecodeShape) -> Any:
        return self.default(shape) if callable(self.default) else self.default

    def validate(self, value: Any) -> Any:
        """Coerce and check ``value``; raises :class:`ConfigError` with one clear line."""
        if self.kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                try:
                    value = int(str(value))
                except ValueError:
                    raise ConfigError(f"{self.name} must be an integer, got {value!r}") from None
            if self.low is not None and value < self.low:
                raise ConfigError(f"{self.name} must be >= {self.low}, got {value}")
            if self.high is not None and value > self.high:
                raise ConfigError(f"{self.name} must be <= {self.high}, got {value}")
            return value
        value = str(value)
        if self.choices and value not in self.choices:
            raise ConfigError(f"{self.name} must be one of {', '.join(self.choices)}, got {value!r}")
        return value


@dataclass
class PreparedCall:
    """A ready-to-time decode call.

    - ``fn``: runs the whole decode (every kernel, padding copies included) and returns the output
      ``[B, H, 512]``; it takes no arguments.  When ``graph_safe`` it neither synchronises with
      the host nor decides on device values; tensors it allocates through torch's caching
      allocator are allowed (graph capture serves them from the graph's private pool, and a
      replay reuses them), and a backend whose ``fn`` does so says ``allocates_per_call``.  It
      reads q and the cache anew on every call: the correctness check writes its input sets into
      them in place after ``prepare`` (:mod:`mlabench.checks.input_sets`).
    - ``out``: the buffer ``fn`` writes (already poisoned with NaN by ``prepare``).
    - ``effective_params``: what actually runs (e.g. the split count a library picked).
    - ``setup_us``: untimed setup steps and their wall time, µs, keyed ``<step>_us``
      (``metadata_us`` for a library's scheduling metadata, ``work_list_us`` for a work list).
    - ``workspace_bytes``: bytes of intermediate buffers (split partials) the call writes and reads.
    - ``refresh``: the untimed per-step rebuild, in place, of everything ``fn`` reads that was
      derived from the context lengths outside ``fn`` (a work list, a library's scheduling
      metadata, page-size-1 indices, a host-side split count), from the current
      ``inputs.cache_seqlens``; None when ``fn`` reads the lengths only on the device.  A server
      pays it once per step for all layers, not per layer.
    - ``graph_safe``: a CUDA/HIP graph captured from ``fn`` computes the right output after the
      lengths change in place and ``refresh`` runs (so ``fn`` may be captured and replayed).
    - ``split_starts``: per request, the first token of each piece of KV the call reduces
      separately (split, work-list segment), when the backend knows them; the correctness check
      puts needle tokens at their edges (:mod:`mlabench.checks.input_sets`).  None: not known.
    """

    fn: Callable[[], torch.Tensor]
    out: torch.Tensor
    effective_params: dict[str, Any] = field(default_factory=dict)
    setup_us: dict[str, float] = field(default_factory=dict)
    workspace_bytes: int = 0
    graph_safe: bool = True
    refresh: Callable[[], None] | None = None
    split_starts: list[list[int]] | None = None

    def refresh_for_new_lengths(self) -> None:
        """Run :attr:`refresh` (nothing to do when it is None)."""
        if self.refresh is not None:
            self.refresh()


class Backend(ABC):
    """Base class of every MLA decode backend; subclasses register with ``@register``."""

    name: ClassVar[str]
    summary: ClassVar[str]
    params: ClassVar[tuple[ParamSpec, ...]] = ()
    #: True for backends that are themselves the correctness oracle (not checked against it).
    is_reference: ClassVar[bool] = False
    family: ClassVar[Family]
    #: Packages whose versions the results depend on: manifest key -> distribution names, the
    #: first installed one counts (e.g. ``{"triton": ("triton", "pytorch-triton-rocm")}``).
    packages: ClassVar[dict[str, tuple[str, ...]]] = {}
    #: True for GPU kernels that run on the CPU only through an interpreter (tests, not timing):
    #: a default sweep on the CPU leaves them out.
    gpu_kernel: ClassVar[bool] = False

    @abstractmethod
    def available(self) -> tuple[bool, str]:
        """``(True, "")`` when it can run here, else ``(False, reason)`` naming what is missing."""

    def supports(self, shape: MLADecodeShape) -> tuple[bool, str]:
        """``(True, "")`` when ``shape`` can run, else ``(False, reason)``."""
        return True, ""

    def details(self) -> str:
        """What ``mlabench backends`` shows beyond availability (e.g. the installed library's
        version and the behaviour rules in force); empty by default."""
        return ""

    @abstractmethod
    def prepare(self, inputs: MLADecodeInputs, params: dict[str, Any]) -> PreparedCall:
        """Build the call for ``inputs`` with validated ``params`` (see :meth:`resolve_params`)."""

    # ---- occupancy (optional; the tuner's wave cap) ----------------------------------------------
    def resident_programs(self, shape: MLADecodeShape, params: dict[str, Any]) -> int | None:
        """How many programs (CTAs) of this kernel's main launch run at once on this device with
        ``params`` (programs per SM x SMs), or None when not known (the default: the tuner then
        does not cap ``num_kv_splits``)."""
        return None

    def split_programs(self, shape: MLADecodeShape, params: dict[str, Any]) -> int:
        """Programs one split of one request launches (its head tiles); 1 by default."""
        return 1

    def split_tile_tokens(self, shape: MLADecodeShape, params: dict[str, Any]) -> int | None:
        """Tokens of the tile a split is walked in, when a split's time steps with its whole tiles
        and its length is cut so that a split of ``k x tile`` tokens holds ``k`` tiles; None (the
        default) when not (e.g. splits of any token count).  Declaring it lets the tuner search the
        whole-tile rule (:func:`mlabench.policy.rules.whole_tile_splits`)."""
        return None

    # ---- parameters ------------------------------------------------------------------------------
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def resolve_params(self, shape: MLADecodeShape, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Fill defaults and validate (a parameter with ``omit_default`` at its default is left
        out); unknown names raise :class:`ConfigError`."""
        params = dict(params or {})
        unknown = sorted(set(params) - set(self.param_names()))
        if unknown:
            known = ", ".join(self.param_names()) or "none"
            raise ConfigError(f"{self.name}: unknown parameter {unknown[0]!r} (known: {known})")
        resolved = {p.name: p.validate(params[p.name]) if p.name in params else p.default_for(shape)
                    for p in self.params}
        return {p.name: resolved[p.name] for p in self.params if not p.left_out(resolved[p.name], shape)}


def param_grid(backend: Backend, shape: MLADecodeShape, axes: dict[str, list[Any]],
               all_choices: bool = False) -> list[dict[str, Any]]:
    """Parameter dicts for ``backend``: the product of the axes it has (others at their default).

    With ``all_choices`` a string parameter with no axis given takes every choice (used by
    ``check``).  Values are validated (:class:`ConfigError` on a bad one) and de-duplicated; a
    parameter with ``omit_default`` is left out at its default, as :meth:`Backend.resolve_params`
    leaves it.
    """
    lists = []
    for spec in backend.params:
        if spec.name in axes:
            lists.append([spec.validate(v) for v in axes[spec.name]])
        elif all_choices and spec.choices:
            lists.append(list(spec.choices))
        else:
            lists.append([spec.default_for(shape)])
    seen, out = set(), []
    for combo in itertools.product(*lists):
        params = {spec.name: value for spec, value in zip(backend.params, combo)
                  if not spec.left_out(value, shape)}
        marker = tuple(sorted(params.items(), key=lambda kv: kv[0]))
        if marker not in seen:
            seen.add(marker)
            out.append(params)
    return out
