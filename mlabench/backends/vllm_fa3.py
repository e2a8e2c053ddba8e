"""vLLM's FlashAttention-3 MLA decode (``vllm-fa3-mla``), the kernel behind ``--attention-backend
FLASH_ATTN_MLA``, measured as vLLM calls it.

vLLM 0.26 (``vllm/v1/attention/backends/mla/flashattn_mla.py``) splits the 576-wide query into its
512 latent columns and 64 RoPE columns and calls its FlashAttention build
(``vllm.vllm_flash_attn.flash_attn_varlen_func``) with the RoPE parts as ``q``/``k`` and the latent
parts as ``q_v``/``v``: ``q=q_pe [T, H, 64], k=k_pe_cache [pages, 64, 1, 64], v=kv_c_cache [pages,
64, 1, 512], q_v=q_nope [T, H, 512]``, ``cu_seqlens_q``, ``seqused_k`` (the context lengths on the
device), the block table, ``causal=True``, ``fa_version=3``, and the ahead-of-time scheduler
metadata of ``get_scheduler_metadata`` (built once per step, outside the captured graph, with
``num_splits`` capped at ``flash_attn_max_num_splits_for_cuda_graph``, 32 by default, when decode
runs in full CUDA graphs).  ``prepare`` builds that metadata untimed (``setup_us["metadata_us"]``)
and ``refresh`` rebuilds it in place for new lengths; ``fn`` is the attention call alone,
writing the output buffer it is given.

Available where vLLM's FlashAttention build is importable with FA3 supported (NVIDIA Hopper);
mlabench never installs vLLM.  Used by ``mlabench serve-bench``'s prediction of FLASH_ATTN_MLA's
decode step.
"""

from __future__ import annotations

from typing import Any

import torch

from mlabench.backends.base import Backend, ParamSpec, PreparedCall, check_mla_dims
from mlabench.backends.registry import register
from mlabench.backends.shared import cuda_module, timed_us
from mlabench.extras import optional_import
from mlabench.inputs import MLADecodeInputs
from mlabench.shapes import MLADecodeShape

VLLM_FA_MODULE = "vllm.vllm_flash_attn"
#: vLLM's ``attention_config.flash_attn_max_num_splits_for_cuda_graph`` (vLLM 0.26 default): the
#: most KV splits FA3 may choose when decode runs in full CUDA graphs.
VLLM_FA3_GRAPH_MAX_SPLITS = 32

MAX_NUM_SPLITS = ParamSpec(
    "max_num_splits", int, default=VLLM_FA3_GRAPH_MAX_SPLITS,
    help="the most KV splits FA3's scheduler may choose (vLLM: 32 in full CUDA graphs, 0 = FA3's "
         "own choice, uncapped, when decode runs eagerly)",
    low=0, high=256,
)


def fa3_query_parts(q: torch.Tensor, kv_lora_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``q [T, H, 576]`` -> ``(q_nope [T, H, 512], q_pe [T, H, 64])``, views (FA3 reads any row
    stride with unit column stride, as vLLM passes them after its own split)."""
    return q[..., :kv_lora_rank], q[..., kv_lora_rank:]


def fa3_reason(fa) -> str:
    """Empty when vLLM's FlashAttention module ``fa`` (``vllm.vllm_flash_attn``) runs FA3 on this
    GPU, else why not (its own ``fa_version_unsupported_reason`` where it gives one)."""
    supported = getattr(fa, "is_fa_version_supported", None)
    if callable(supported) and supported(3):
        return ""
    reason = getattr(fa, "fa_version_unsupported_reason", lambda _v: None)(3)
    return f"vLLM's FlashAttention build has no FA3 here{f': {reason}' if reason else ''}"


def fa3_mla_decode(fa, q: torch.Tensor | tuple[torch.Tensor, torch.Tensor], kv_cache: torch.Tensor,
                   block_table: torch.Tensor, seq_lens: torch.Tensor, cu_seqlens_q: torch.Tensor, max_query_len: int,
                   max_seq_len: int, softmax_scale: float, *, out: torch.Tensor | None = None,
                   scheduler_metadata: torch.Tensor | None = None, num_splits: int = 0,
                   kv_lora_rank: int = 512) -> torch.Tensor:
    """Absorbed MLA attention of ``T`` query tokens over a paged latent cache with FA3, as vLLM's
    FLASH_ATTN_MLA decode calls it (module docstring): any query length per request (varlen),
    causal with each request's queries at the end of its keys.

    Args:
        fa: vLLM's FlashAttention module (``vllm.vllm_flash_attn``).
        q: ``[T, H, 576]`` bf16/fp16, latent then RoPE columns; request ``b``'s tokens are rows
            ``cu_seqlens_q[b]:cu_seqlens_q[b+1]``.  Or its halves ``(q_nope [T, H, 512], q_pe [T,
            H, 64])`` as vLLM hands them over (any row strides, unit column stride), passed on
            as they are, as vLLM's FLASH_ATTN_MLA passes them.
        kv_cache: ``[pages, page_size, 1, 576]``, q's dtype.
        block_table: ``[B, max_pages]`` int32.  seq_lens: ``[B]`` int32 keys per request (its
            new tokens included), on the device.  cu_seqlens_q: ``[B + 1]`` int32, on the device.
        max_query_len / max_seq_len: the longest query and key lengths (host integers, >= 1).
        out: ``[T, H, 512]`` to write (None: FA3 allocates it).
        scheduler_metadata, num_splits: FA3's ahead-of-time schedule and split cap (None, 0:
            FA3 schedules inside the call, uncapped).
        kv_lora_rank: the latent columns of q and the cache (512 in DeepSeek-V3 and Kimi K3).

    Returns ``[T, H, 512]`` in q's dtype (``out`` when given).
    """
    q_nope, q_pe = q if isinstance(q, tuple) else fa3_query_parts(q, kv_lora_rank)
    o = fa.flash_attn_varlen_func(
        q=q_pe, k=kv_cache[..., kv_lora_rank:], v=kv_cache[..., :kv_lora_rank], q_v=q_nope,
        max_seqlen_q=max(int(max_query_len), 1), cu_seqlens_q=cu_seqlens_q,
        max_seqlen_k=int(max_seq_len), seqused_k=seq_lens, block_table=block_table,
        softmax_scale=softmax_scale, causal=True, fa_version=3,
        scheduler_metadata=scheduler_metadata, num_splits=num_splits, out=out)
    return o if out is None or o is out else out.copy_(o)  # FA writes into ``out`` when given


@register
class VllmFA3MLABackend(Backend):
    """vLLM's FlashAttention-3 MLA decode (``flash_attn_varlen_func`` with ``q_v``), ``qo_len``
    query tokens per request (causal), bf16/fp16, the cache ``[pages, page_size, 1, 576]``."""

    name = "vllm-fa3-mla"
    family = "split-kv"
    gpu_kernel = True
    packages = {"vllm": ("vllm",)}
    summary = "vLLM's FlashAttention-3 MLA decode (FLASH_ATTN_MLA), scheduled as vLLM schedules it"
    params = (MAX_NUM_SPLITS,)

    def available(self) -> tuple[bool, str]:
        mod, why = cuda_module(VLLM_FA_MODULE, "FA3")
        why = why or fa3_reason(mod)
        return not why, why

    def supports(self, shape: MLADecodeShape) -> tuple[bool, str]:
        ok, why = check_mla_dims(shape, "vLLM's FA3 MLA decode")
        if not ok:
            return ok, why
        if shape.q_dtype != shape.kv_dtype or shape.q_dtype not in ("bfloat16", "float16"):
            return False, f"q and kv must both be bf16 or fp16, got {shape.q_dtype} / {shape.kv_dtype}"
        if not shape.causal and shape.qo_len > 1:
            return False, "vLLM's FA3 MLA decode is causal over a request's query tokens"
        return True, ""

    def prepare(self, inputs: MLADecodeInputs, params: dict[str, Any]) -> PreparedCall:
        fa, _ = optional_import(VLLM_FA_MODULE)
        s, splits = inputs.shape, int(params["max_num_splits"])
        dev, batch = inputs.device, len(s.context_lens)
        kv = inputs.kv_cache  # [pages, page_size, 1, 576]: the head axis vLLM adds with unsqueeze
        cu_q = torch.arange(0, batch + 1, dtype=torch.int32, device=dev) * s.qo_len
        max_k = max(s.context_lens)
        out = inputs.new_output()

        def schedule() -> torch.Tensor:
            return fa.get_scheduler_metadata(
                batch_size=batch, max_seqlen_q=s.qo_len, max_seqlen_k=max_k, num_heads_q=s.num_heads,
                num_heads_kv=1, headdim=s.qk_rope_head_dim, cache_seqlens=inputs.cache_seqlens,
                qkv_dtype=inputs.q.dtype, headdim_v=s.kv_lora_rank, page_size=s.page_size,
                cu_seqlens_q=cu_q, causal=True, num_splits=splits)

        meta, metadata_us = timed_us(dev, schedule)

        def refresh() -> None:  # vLLM rebuilds it every step into one persistent buffer
            meta.copy_(schedule())

        def fn() -> torch.Tensor:
            return fa3_mla_decode(fa, inputs.q, kv, inputs.block_table, inputs.cache_seqlens, cu_q,
                                  s.qo_len, max_k, s.scale, out=out, scheduler_metadata=meta,
                                  num_splits=splits, kv_lora_rank=s.kv_lora_rank)

        return PreparedCall(fn=fn, out=out, effective_params={"max_num_splits": splits},
                            setup_us={"metadata_us": metadata_us}, refresh=refresh)
