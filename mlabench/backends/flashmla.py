"""FlashMLA dense decode on Hopper (``flashmla``): the NVIDIA padded persistent kernel.

Works with the two packages that ship FlashMLA's SM90 dense decode under the module name
``flash_mla`` (read from their wheels and sources):

- ``sgl-flash-mla`` (1.0.0): dense decode only on the legacy side, reached with ``use_legacy=True``
  on ``flash_mla_with_kvcache``; ``get_mla_metadata()`` returns an empty ``FlashMLASchedMeta`` and
  ``get_mla_decoding_metadata(seqlens, s_q*h_q//h_kv, h_kv, use_legacy=True)`` hoists the
  scheduler, returning ``(tile_scheduler_metadata [num_sm_parts, 8] int32, num_splits [B+1] int32)``.
- FlashMLA built from source before its 2026-09-30 release: ``get_mla_metadata(seqlens,
  s_q*h_q//h_kv, h_kv)`` returns those two tensors, and ``flash_mla_with_kvcache`` takes them.

The PyPI ``flash-mla`` package is a 6 kB stub with neither function; :func:`flashmla_api` says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from mlabench.backends.base import Backend, PreparedCall
from mlabench.backends.flashmla_limits import FLASHMLA_PAGE_SIZE, flashmla_supports, flashmla_workspace_bytes
from mlabench.backends.registry import register
from mlabench.backends.shared import accepts_kwarg, require, timed_us
from mlabench.errors import BackendUnavailableError
from mlabench.extras import optional_import, package_version
from mlabench.inputs import MLADecodeInputs
from mlabench.shapes import MLADecodeShape

API_LEGACY_FLAG = "use_legacy"  # sgl-flash-mla: dense decode behind use_legacy=True
API_TENSOR_METADATA = "tensor-metadata"  # FlashMLA source builds before 2026-09-30
API_STUB = "stub"
#: Distributions that install the ``flash_mla`` module, in the order their versions are read.
FLASHMLA_PACKAGES = {"flash_mla": ("sgl-flash-mla", "flash-mla", "flash_mla")}


def flashmla_api(mod: ModuleType | Any) -> str:
    """Which FlashMLA Python surface ``mod`` (the imported ``flash_mla``) offers.

    Returns :data:`API_LEGACY_FLAG` when ``flash_mla_with_kvcache`` takes ``use_legacy``
    (sgl-flash-mla), :data:`API_TENSOR_METADATA` when it does not, and :data:`API_STUB` when
    ``get_mla_metadata`` or ``flash_mla_with_kvcache`` is missing (the PyPI ``flash-mla`` stub).
    """
    fwd = getattr(mod, "flash_mla_with_kvcache", None)
    meta = getattr(mod, "get_mla_metadata", None)
    if not callable(fwd) or not callable(meta):
        return API_STUB
    return API_LEGACY_FLAG if accepts_kwarg(fwd, API_LEGACY_FLAG) is True else API_TENSOR_METADATA


def flashmla_query(q: torch.Tensor, qo_len: int = 1) -> torch.Tensor:
    """``[B * s_q, H, 576]`` -> ``[B, s_q, H, 576]`` with ``s_q = qo_len`` (a view, same dtype);
    ValueError for another rank or a row count that is not a multiple of ``qo_len``."""
    if q.dim() != 3 or q.shape[0] % qo_len:
        raise ValueError(f"q must be [B*qo_len, H, D] with qo_len {qo_len}, got {tuple(q.shape)}")
    return q.view(q.shape[0] // qo_len, qo_len, *q.shape[1:])


def metadata_args(cache_seqlens: torch.Tensor, num_heads: int, qo_len: int = 1,
                  num_kv_heads: int = 1) -> tuple[torch.Tensor, int, int]:
    """Positional arguments of FlashMLA's decode scheduler: ``(seqlens int32 [B], s_q*h_q//h_kv, h_kv)``."""
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    return cache_seqlens.to(torch.int32), qo_len * num_heads // num_kv_heads, num_kv_heads


def split_stats(tile_scheduler_metadata: torch.Tensor | None,
                num_splits: torch.Tensor | None) -> dict[str, Any]:
    """What the scheduler chose: ``num_sm_parts`` (rows of the metadata) and the splits.

    ``num_splits`` is FlashMLA's ``[B + 1]`` int32 prefix sum of splits per request, so request
    ``b`` has ``num_splits[b+1] - num_splits[b]`` splits.  Missing tensors give an empty dict.
    """
    stats: dict[str, Any] = {}
    if tile_scheduler_metadata is not None:
        stats["num_sm_parts"] = int(tile_scheduler_metadata.shape[0])
    if num_splits is not None and num_splits.numel() > 1:
        per_request = (num_splits[1:] - num_splits[:-1]).cpu()
        stats["num_splits_total"] = int(per_request.sum())
        stats["num_splits_max"] = int(per_request.max())
        stats["num_splits_min"] = int(per_request.min())
    return stats


#: Tokens per KV block of FlashMLA's SM90 dense decode: a partition starts at a block boundary.
FLASHMLA_BLOCK_TOKENS = 64


def flashmla_split_starts(tile_scheduler_metadata: torch.Tensor | None, batch: int) -> list[list[int]] | None:
    """Per request, the first token of each piece FlashMLA's scheduler gave a partition.

    Row ``p`` of ``tile_scheduler_metadata`` (``[num_sm_parts, 8]`` int32) starts at token
    ``begin_seqlen`` (field 1) of request ``begin_idx`` (field 0) and ends in request ``end_idx``
    (field 2); the requests after ``begin_idx`` up to ``end_idx`` start at 0 in it.  The kernel
    starts at KV block ``begin_seqlen // 64`` (FlashMLA ``flash_fwd_mla_kernel.h``).  Rows with
    ``begin_idx >= batch`` are idle partitions.  None when there is no metadata.
    """
    if tile_scheduler_metadata is None:
        return None
    starts: list[set[int]] = [{0} for _ in range(batch)]
    for begin_idx, begin_seqlen, end_idx, *_ in tile_scheduler_metadata.cpu().tolist():
        if begin_idx >= batch:
            continue
        starts[begin_idx].add(begin_seqlen // FLASHMLA_BLOCK_TOKENS * FLASHMLA_BLOCK_TOKENS)
        for b in range(begin_idx + 1, min(end_idx, batch - 1) + 1):
            starts[b].add(0)
    return [sorted(x) for x in starts]


@register
class FlashMLABackend(Backend):
    """FlashMLA's SM90 dense MLA decode (``flash_mla.flash_mla_with_kvcache``).

    ``prepare`` runs the scheduler (``get_mla_decoding_metadata`` / ``get_mla_metadata``) once,
    untimed, reporting its wall time as ``setup_us["metadata_us"]``, as servers do per step outside
    the attention call; ``refresh`` runs it again into the same tensors (:func:`schedule`).
    ``fn`` runs only ``flash_mla_with_kvcache`` on ``q`` viewed as ``[B, s_q, H, 576]``
    (``s_q = qo_len``, FlashMLA's own multi-token form, ``causal`` the shape's mask) and the cache
    ``[num_pages, 64, 1, 576]``; FlashMLA takes no output buffer and returns a new
    ``[B, s_q, H, 512]`` tensor, so ``fn`` copies it into the poisoned ``out`` (one extra small
    copy kernel inside the timed call, about ``B * s_q * H * 1 KiB``).
    Where the scheduler cannot be hoisted, one decode call in ``prepare`` fills it and
    ``metadata_us`` includes that call (``effective_params["metadata"]`` says so).
    Unread cache slots: FlashMLA reads whole 64-token blocks, but zero-fills the rows of a
    request's last block past its length and reads block-table entries only below
    ``ceil(L / 64)``, so the NaN the check puts there never reaches its products.  Its split
    starts come from the scheduler metadata (:func:`flashmla_split_starts`).
    """

    name = "flashmla"
    family = "persistent"
    gpu_kernel = True
    packages = FLASHMLA_PACKAGES
    summary = "FlashMLA dense decode (NVIDIA Hopper SM90, page size 64; sgl-flash-mla or source build)"

    def available(self) -> tuple[bool, str]:
        if not torch.cuda.is_available() or torch.version.hip is not None:
            return False, "needs an NVIDIA Hopper GPU (SM90) with a CUDA build of torch"
        cap = torch.cuda.get_device_capability()
        if tuple(cap) != (9, 0):
            return False, f"needs an NVIDIA Hopper GPU (SM90); found sm_{cap[0]}{cap[1]}"
        mod, reason = optional_import("flash_mla")
        if mod is None:
            return False, reason
        api = flashmla_api(mod)
        if api == API_STUB:
            return False, ("flash_mla is importable but has no get_mla_metadata/"
                           "flash_mla_with_kvcache (the PyPI flash-mla stub?): pip install sgl-flash-mla")
        has_legacy = getattr(mod, "has_legacy", None)
        if api == API_LEGACY_FLAG and callable(has_legacy) and not has_legacy():
            return False, "flash_mla was built without its legacy (SM90 dense decode) kernels"
        return True, ""

    def supports(self, shape: MLADecodeShape) -> tuple[bool, str]:
        return flashmla_supports(shape, "FlashMLA")

    def prepare(self, inputs: MLADecodeInputs, params: dict[str, Any]) -> PreparedCall:
        mod = require("flash_mla")
        api = flashmla_api(mod)
        if api == API_STUB:
            raise BackendUnavailableError("flash_mla has no flash_mla_with_kvcache (stub package)")
        s = inputs.shape
        q4 = flashmla_query(inputs.q, s.qo_len)
        seqlens, rows_per_kv_head, kv_heads = metadata_args(inputs.cache_seqlens, s.num_heads, s.qo_len)
        block_table = inputs.block_table.to(torch.int32)
        extra = {API_LEGACY_FLAG: True} if api == API_LEGACY_FLAG else {}
        out = inputs.new_output()
        causal = s.causal and s.qo_len > 1  # one token: the call it always was

        def decode(sched: Any, splits: Any) -> torch.Tensor:
            o, _lse = mod.flash_mla_with_kvcache(q4, inputs.kv_cache, block_table, seqlens,
                                                 s.v_head_dim, sched, splits,
                                                 softmax_scale=s.scale, causal=causal, **extra)
            return o

        def sync_seqlens() -> None:  # only a copy when cache_seqlens is not int32 already
            if seqlens is not inputs.cache_seqlens:
                seqlens.copy_(inputs.cache_seqlens)

        plan = schedule(mod, api, inputs.device, (seqlens, rows_per_kv_head, kv_heads), decode,
                        sync_seqlens)
        out3 = out.view(s.batch, s.qo_len, s.num_heads, s.v_head_dim)

        def fn() -> torch.Tensor:
            out3.copy_(decode(plan.sched, plan.splits_arg))
            return out

        stats = split_stats(plan.tile_md, plan.num_splits)
        effective = {"api": api, "metadata": plan.note, "page_size": FLASHMLA_PAGE_SIZE,
                     "flash_mla_version": package_version(FLASHMLA_PACKAGES["flash_mla"])
                     or getattr(mod, "__version__", None), **stats}
        workspace = flashmla_workspace_bytes(s.batch, s.num_heads, stats.get("num_sm_parts", 0),
                                             s.qo_len, s.v_head_dim)
        return PreparedCall(fn=fn, out=out, effective_params=effective,
                            setup_us={"metadata_us": plan.metadata_us}, workspace_bytes=workspace,
                            refresh=plan.refresh, graph_safe=plan.graph_safe,
                            split_starts=flashmla_split_starts(plan.tile_md, s.batch))


@dataclass
class Schedule:
    """FlashMLA's scheduling metadata for one prepared call and how to rebuild it per step.

    ``sched`` and ``splits_arg`` are what ``flash_mla_with_kvcache`` takes (tensors, or a
    ``FlashMLASchedMeta`` and None); ``tile_md`` ``[num_sm_parts, 8]`` and ``num_splits``
    ``[B + 1]`` int32 are the tensors the kernel reads; ``refresh`` rebuilds them for the current
    lengths (in place when ``graph_safe``).
    """

    sched: Any
    splits_arg: Any
    tile_md: torch.Tensor | None
    num_splits: torch.Tensor | None
    metadata_us: float
    note: str
    refresh: Callable[[], None]
    graph_safe: bool = True


def schedule(mod: Any, api: str, device: torch.device, args: tuple[torch.Tensor, int, int],
             decode: Callable[[Any, Any], torch.Tensor], sync_seqlens: Callable[[], None]) -> Schedule:
    """Run FlashMLA's scheduler once (timed, untimed for the kernel) and build its refresh.

    ``args`` are :func:`metadata_args`; ``decode(sched, splits)`` runs one decode call.  Where the
    scheduler can be hoisted (``get_mla_metadata`` returning tensors, or sgl-flash-mla's
    ``get_mla_decoding_metadata``) ``refresh`` runs it again and copies the result into the same
    tensors, which a captured graph reads.  Where it cannot, the first decode call fills a
    ``FlashMLASchedMeta``; ``refresh`` empties it and fills it again with one eager decode call, new
    tensors a captured graph does not see, so the call is not ``graph_safe``.
    """
    def copy_into(compute: Callable[[], tuple], tile_md: torch.Tensor,
                  num_splits: torch.Tensor) -> Callable[[], None]:
        def refresh() -> None:
            sync_seqlens()
            new_tile, new_splits = compute()[:2]
            tile_md.copy_(new_tile)
            num_splits.copy_(new_splits)
        return refresh

    hoisted = "hoisted scheduler"
    if api == API_TENSOR_METADATA:
        compute = lambda: tuple(mod.get_mla_metadata(*args))  # noqa: E731
        result, metadata_us = timed_us(device, compute)
        if isinstance(result[0], torch.Tensor):  # FlashMLA before its FlashMLASchedMeta API
            tile_md, num_splits = result[0], result[1]
            return Schedule(tile_md, num_splits, tile_md, num_splits, metadata_us, hoisted,
                            copy_into(compute, tile_md, num_splits))
        sched = result[0]
    else:
        sched = mod.get_mla_metadata()[0]  # an empty FlashMLASchedMeta
        hoist = getattr(mod, "get_mla_decoding_metadata", None)
        if callable(hoist):
            compute = lambda: tuple(hoist(*args, use_legacy=True))  # noqa: E731
            (tile_md, num_splits), metadata_us = timed_us(device, compute)
            sched.tile_scheduler_metadata, sched.num_splits = tile_md, num_splits
            return Schedule(sched, None, tile_md, num_splits, metadata_us, hoisted,
                            copy_into(compute, tile_md, num_splits))

    def refill() -> None:  # no way to hoist the scheduler: the first call fills the FlashMLASchedMeta
        sync_seqlens()
        sched.tile_scheduler_metadata = sched.num_splits = None
        if hasattr(sched, "have_initialized"):
            sched.have_initialized = False
        decode(sched, None)

    _, metadata_us = timed_us(device, refill)
    return Schedule(sched, None, getattr(sched, "tile_scheduler_metadata", None),
                    getattr(sched, "num_splits", None), metadata_us,
                    "filled by a first decode call (metadata_us includes it)", refill,
                    graph_safe=False)
