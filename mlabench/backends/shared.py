"""What several backends share: their common parameters (the split count, the split policy of the
Triton and Gluon backends, head padding), the packages Triton comes in, and the small helpers of
adapters around libraries (probing an optional module, timing untimed setup, reading a signature).

Imports nothing optional: every backend module imports this one on every CLI start.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

import torch

from mlabench.backends.base import ParamSpec
from mlabench.device import current_device
from mlabench.errors import BackendUnavailableError
from mlabench.extras import optional_import
from mlabench.kernels.padding import HEAD_PADDINGS
from mlabench.kernels.splitkv_torch import split_starts
from mlabench.policy.device_table import parse_split_policy
from mlabench.policy.heuristics import vllm_triton_splits
from mlabench.policy.rules import MAX_KV_SPLITS

T = TypeVar("T")

#: The split-count parameter of the split-KV backends (a library may narrow it, e.g. with
#: ``dataclasses.replace``).
NUM_KV_SPLITS = ParamSpec(
    "num_kv_splits", int, default=lambda s: vllm_triton_splits(s),
    help="KV splits per request (1-512); the split-KV (flash-decoding) grid's second axis",
    low=1, high=MAX_KV_SPLITS,
)


#: Distributions that ship Triton: upstream, and the builds torch's ROCm and CUDA wheels pull in.
TRITON_PACKAGES = {"triton": ("triton", "pytorch-triton-rocm", "pytorch-triton")}


@dataclass(frozen=True)
class SplitPolicySpec(ParamSpec):
    """:data:`SPLIT_POLICY` of the Triton and Gluon split-KV backends: validated by reading it, so
    that a bad mode or policy file is one ``error:`` line before anything is measured (sweep, check,
    graph-check, tune), not an error record per point
    (:func:`mlabench.policy.device_table.parse_split_policy`)."""

    def validate(self, value: Any) -> Any:
        text = str(super().validate(value))
        if text:
            parse_split_policy(text, current_device().num_sms)
        return text


SPLIT_POLICY = SplitPolicySpec(
    "split_policy", str, default="",
    help="where the split count comes from: empty = num_kv_splits for every request; "
         "'device[:POLICY.json]' = each request's own count looked up in a policy table in device "
         "memory (one captured graph keeps the right count at every length); "
         "'host[:POLICY.json]' = one count looked up on the host from the longest context at each "
         "refresh (a captured graph keeps the count of capture time). Without a file: vLLM's "
         "heuristic as a table. num_kv_splits is ignored in both policy modes",
)

#: How the padded backends lay q out in 16-row head tiles (:mod:`mlabench.kernels.padding`).
HEAD_PADDING = ParamSpec(
    "head_padding", str, default="zero", choices=HEAD_PADDINGS,
    help="how q is padded to 16-head tiles: zero heads, or the heads repeated in order "
         "(vLLM's layout)",
)


def require(name: str) -> ModuleType:
    """Import optional module ``name``; :class:`BackendUnavailableError` saying what to install."""
    mod, reason = optional_import(name)
    if mod is None:
        raise BackendUnavailableError(reason)
    return mod


def cuda_module(name: str, gpu: str) -> tuple[ModuleType | None, str]:
    """``(module, "")`` when torch is a CUDA build that sees a GPU and optional module ``name``
    imports; else ``(None, reason)``: ``"needs an NVIDIA Hopper GPU (<gpu>) with a CUDA build of
    torch"`` or what to install.  ``gpu`` names the GPU feature the backend needs (e.g. ``"FA3"``)."""
    if not torch.cuda.is_available() or torch.version.hip is not None:
        return None, f"needs an NVIDIA Hopper GPU ({gpu}) with a CUDA build of torch"
    return optional_import(name)


def timed_us(device: torch.device, step: Callable[[], T]) -> tuple[T, float]:
    """Run ``step()`` between two device synchronisations; returns ``(result, wall_us)``.

    For untimed setup (scheduling metadata, work lists) that ``PreparedCall.setup_us`` reports.
    """
    _sync(device)
    start = time.perf_counter()
    result = step()
    _sync(device)
    return result, (time.perf_counter() - start) * 1e6


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def accepts_kwarg(fn: Callable[..., Any], name: str) -> bool | None:
    """Whether callable ``fn`` takes a keyword ``name``: True/False, or None when uninspectable."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    if name in params:
        return True
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


#: Split lengths ``ceil(L / S)`` rounded up to each of these give the cuts a backend most likely
#: makes when it cannot say where its splits start: 1 (vLLM's Triton MLA decode), 16 (this project's
#: Triton split-KV kernel) and 64 (whole pages of 64 tokens, as gluon-splitkv cuts).
GENERIC_SPLIT_ALIGNS = (1, 16, 64)


def likely_split_starts(context_lens: Sequence[int], splits: int | Sequence[int] | None) -> list[list[int]]:
    """For a backend that cannot say where its library cuts the KV (AITER's kernels): per request,
    the first token of each split of ``splits`` (one count, or one per request) into ``ceil(L / S)``
    tokens rounded up to each of :data:`GENERIC_SPLIT_ALIGNS`, merged (a correctness check puts its
    needles at all of them); ``[[0], ...]`` (one split) when ``splits`` is None or 0."""
    if not splits:
        return [[0] for _ in context_lens]
    counts = list(splits) if isinstance(splits, (list, tuple)) else [splits] * len(context_lens)
    return [sorted(set().union(*(split_starts([n], max(1, int(c)), align)[0] for align in GENERIC_SPLIT_ALIGNS)))
            for n, c in zip(context_lens, counts)]
