"""vLLM's FlashMLA decode (``vllm-flashmla``), the kernel behind ``--attention-backend FLASHMLA``,
measured as vLLM calls it.

vLLM 0.26 runs its own FlashMLA build (``vllm._flashmla_C``, wrapped by
``vllm/v1/attention/ops/flashmla.py``), not the ``flash_mla`` package the ``flashmla`` backend
times.  Read from ``vllm/v1/attention/backends/mla/flashmla.py``, bf16/fp16 cache (the fp8 branch
is not modelled):

- Per step, outside the captured graph (``FlashMLAMetadataBuilder._build_decode``):
  ``get_mla_metadata(seq_lens, max_query_len * H, 1)``, which in this FlashMLA only returns an
  empty ``FlashMLASchedMeta`` (no device work).
- Per step, inside the graph: the step's first ``flash_mla_with_kvcache`` call (layer 0) finds
  that ``FlashMLASchedMeta`` uninitialised, and its ``dense_decode_fwd`` computes the tile schedule
  on the device before the attention; every later layer of the step reads that schedule (one
  metadata object serves all layers).  ``prepare`` runs that first call untimed
  (``setup_us["metadata_us"]``: the schedule plus one decode); ``refresh`` runs it again for new
  lengths into a fresh ``FlashMLASchedMeta`` and copies its tensors into the ones ``fn`` (and a
  graph captured from it) reads, which is what a replay of vLLM's graph recomputes in layer 0.
  The prediction's non-attention time therefore carries the once-a-step schedule kernel.
- Per layer, inside the graph (``FlashMLAImpl.forward_mqa``), what ``fn`` times: ``torch.cat`` of
  the query's latent and RoPE halves into a new ``[T, H, 576]`` tensor (one copy kernel),
  ``reshape_query_for_spec_decode`` (a view ``[B, s_q, H, 576]``, ``s_q = qo_len``), then
  ``flash_mla_with_kvcache(q, k_cache [pages, 64, 1, 576], block_table, seq_lens, 512,
  sched_meta, softmax_scale, causal=True, is_fp8_kvcache=False)`` with its split-combine kernel.
  The halves are views of ``inputs.q`` (vLLM's are the up-projection's transposed output and a
  slice of the projected q: the same bytes read and written, other strides).  vLLM lets FlashMLA
  allocate the output; ``fn`` passes ``out`` instead (no kernel either way, no copy added).

Available where ``vllm.v1.attention.ops.flashmla`` imports and says FlashMLA dense decode is
supported (NVIDIA Hopper); mlabench never installs vLLM.  Used by ``mlabench serve-bench``'s
prediction of FLASHMLA's decode step.
"""

from __future__ import annotations

from typing import Any

import torch

from mlabench.backends.base import Backend, PreparedCall
from mlabench.backends.flashmla_limits import FLASHMLA_PAGE_SIZE, flashmla_supports, flashmla_workspace_bytes
from mlabench.backends.registry import register
from mlabench.backends.shared import cuda_module, timed_us
from mlabench.extras import optional_import
from mlabench.inputs import MLADecodeInputs
from mlabench.shapes import MLADecodeShape

VLLM_FLASHMLA_MODULE = "vllm.v1.attention.ops.flashmla"


def vllm_flashmla_query(q: torch.Tensor, kv_lora_rank: int, batch: int) -> torch.Tensor:
    """What ``forward_mqa`` hands FlashMLA: ``torch.cat`` of ``q [T, H, 576]``'s latent and RoPE
    halves (a new contiguous tensor, one copy kernel) viewed as ``[batch, T // batch, H, 576]``
    (``reshape_query_for_spec_decode``); ValueError when ``T`` is not a multiple of ``batch``."""
    if q.dim() != 3 or q.shape[0] % batch:
        raise ValueError(f"q must be [B*qo_len, H, D] with B={batch}, got {tuple(q.shape)}")
    whole = torch.cat((q[..., :kv_lora_rank], q[..., kv_lora_rank:]), dim=-1)
    return whole.view(batch, q.shape[0] // batch, *q.shape[1:])


@register
class VllmFlashMLABackend(Backend):
    """vLLM's FlashMLA dense decode (``flash_mla_with_kvcache`` of ``vllm._flashmla_C``) with the
    query concatenation vLLM runs per layer; ``qo_len`` tokens per request (causal), bf16/fp16,
    page size 64, the cache ``[pages, 64, 1, 576]``."""

    name = "vllm-flashmla"
    family = "persistent"
    gpu_kernel = True
    packages = {"vllm": ("vllm",)}
    summary = "vLLM's FlashMLA decode (FLASHMLA), called as vLLM calls it"

    def available(self) -> tuple[bool, str]:
        mod, why = cuda_module(VLLM_FLASHMLA_MODULE, "SM90")
        if mod is None:
            return False, why
        supported = getattr(mod, "is_flashmla_dense_supported", None)
        if not callable(supported):
            return False, f"{VLLM_FLASHMLA_MODULE} has no is_flashmla_dense_supported (not vLLM 0.26?)"
        ok, reason = supported()
        if not ok:
            return False, f"vLLM's FlashMLA dense decode is not supported here: {reason or 'no reason given'}"
        return True, ""

    def supports(self, shape: MLADecodeShape) -> tuple[bool, str]:
        ok, why = flashmla_supports(shape, "vLLM's FlashMLA")  # the same kernel family's limits
        if ok and not shape.causal and shape.qo_len > 1:
            return False, "vLLM's FLASHMLA decode is causal over a request's query tokens"
        return ok, why

    def prepare(self, inputs: MLADecodeInputs, params: dict[str, Any]) -> PreparedCall:
        mod, _ = optional_import(VLLM_FLASHMLA_MODULE)
        s = inputs.shape
        batch = len(s.context_lens)
        kv = inputs.kv_cache  # [pages, 64, 1, 576]: the head axis vLLM adds with unsqueeze(-2)
        out = inputs.new_output()
        out4 = out.view(batch, s.qo_len, s.num_heads, s.v_head_dim)

        def new_schedule() -> Any:  # what _build_decode does once a step: an empty FlashMLASchedMeta
            return mod.get_mla_metadata(inputs.cache_seqlens, s.qo_len * s.num_heads, 1,
                                        is_fp8_kvcache=False)[0]

        def decode(sched: Any) -> torch.Tensor:
            mod.flash_mla_with_kvcache(
                q=vllm_flashmla_query(inputs.q, s.kv_lora_rank, batch), k_cache=kv,
                block_table=inputs.block_table, cache_seqlens=inputs.cache_seqlens,
                head_dim_v=s.v_head_dim, tile_scheduler_metadata=sched, softmax_scale=s.scale,
                causal=True, is_fp8_kvcache=False, out=out4)
            return out

        def first_call() -> Any:  # the step's first layer: the schedule on the device, then a decode
            fresh = new_schedule()
            decode(fresh)
            return fresh

        sched, metadata_us = timed_us(inputs.device, first_call)

        def refresh() -> None:  # a graph replay recomputes it in layer 0; here into the same tensors
            fresh = first_call()
            sched.tile_scheduler_metadata.copy_(fresh.tile_scheduler_metadata)
            sched.num_splits.copy_(fresh.num_splits)

        sm_parts = int(sched.tile_scheduler_metadata.shape[0])
        effective = {"metadata": "the step's first call computes it on the device",
                     "page_size": FLASHMLA_PAGE_SIZE, "num_sm_parts": sm_parts,
                     "allocates_per_call": True}
        return PreparedCall(fn=lambda: decode(sched), out=out, effective_params=effective,
                            setup_us={"metadata_us": metadata_us}, refresh=refresh,
                            workspace_bytes=flashmla_workspace_bytes(batch, s.num_heads, sm_parts,
                                                                     s.qo_len, s.v_head_dim))
