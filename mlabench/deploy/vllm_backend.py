"""``gluon-splitkv`` as a vLLM MLA attention backend (vLLM 0.26 and later).

Imported only inside a vLLM process, by the name :mod:`mlabench.deploy.vllm_plugin` registers for
``--attention-backend CUSTOM``.  Prefill and everything else stay vLLM's (:class:`MLACommonImpl`);
this backend answers the decode half, ``forward_mqa``, with :class:`ServedDecode`:

- one token per request, captured in full CUDA graphs for uniform single-token decode batches
  (``AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE``);
- short extends (chunked-prefill remainders of 2-512 tokens beside decodes) taken as decode, as
  vLLM's FLASH_ATTN_MLA takes them (``QueryLenSupport.VARLEN``, ``reorder_batch_threshold`` 512):
  a step with one runs its decode rows with vLLM's FA3 kernel, eagerly (such steps hold a prefill,
  so they are never in a captured graph).  ``short_extends = "prefill"`` (plugin settings) sends
  them to vLLM's prefill path instead (threshold 1);
- KV cache pages of 64 tokens (one TMA tile each), bf16 or fp16, the cache's own dtype ("auto");
- NVIDIA Hopper (compute capability 9.0) only: the kernel uses TMA and wgmma.

The interface follows vLLM's own MLA backends (``vllm/v1/attention/backends/mla/``): a backend
class naming its builder and implementation, and an implementation whose ``forward_mqa(q,
kv_cache, attn_metadata, layer)`` returns ``(out [B, H, 512], lse or None)``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import ClassVar

import torch
from vllm.config import get_current_vllm_config
from vllm.logger import init_logger
from vllm.model_executor.layers.attention.mla_attention import (
    MLACommonBackend,
    MLACommonDecodeMetadata,
    MLACommonImpl,
    MLACommonMetadata,
    MLACommonMetadataBuilder,
    QueryLenSupport,
)
from vllm.v1.attention.backend import AttentionCGSupport, AttentionType

from mlabench.backends.vllm_fa3 import VLLM_FA_MODULE, fa3_mla_decode, fa3_reason
from mlabench.deploy.plugin_settings import (
    PLUGIN_PAGE_SIZE, SHORT_EXTEND_MAX_TOKENS, PluginConfigError, PluginSettings, describe_policy,
    load_plugin_policy, reorder_batch_threshold,
)
from mlabench.deploy.served_decode import ServedDecode
from mlabench.extras import optional_import

#: Under vLLM's "vllm" logger, whose handlers print to the server's log (a logger outside it, such
#: as this module's own name, has no handler there and drops INFO lines).
logger = init_logger("vllm.mlabench")

#: One :class:`ServedDecode` per process (every MLA layer of the model shares its tables and
#: workspace), made by the first layer's implementation.
_SERVED: dict[str, ServedDecode] = {}


@dataclass
class MlabenchDecodeMetadata(MLACommonDecodeMetadata):
    """vLLM's decode metadata plus what a step with short extends needs: ``query_start_loc``
    (``[B + 1]`` int32 on the device), ``max_query_len`` (host; 1 in a step of one-token decodes)
    and ``max_seq_len`` (host, the longest context)."""

    query_start_loc: torch.Tensor | None = None
    max_query_len: int = 1
    max_seq_len: int = 0


class MlabenchMLAMetadataBuilder(MLACommonMetadataBuilder[MLACommonMetadata]):
    """vLLM's common MLA metadata (block table, sequence lengths on the device, the step's longest
    length on the host); decode steps of one token per request run in full CUDA graphs.  Short
    extends (up to 512 tokens) are decode rows unless the plugin's ``short_extends`` is
    ``prefill`` (then the threshold is 1, every extend a prefill)."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    query_len_support: ClassVar[QueryLenSupport] = QueryLenSupport.VARLEN
    reorder_batch_threshold: int = SHORT_EXTEND_MAX_TOKENS

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device, *args, **kwargs) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device, *args, **kwargs)
        self.reorder_batch_threshold = reorder_batch_threshold(
            PluginSettings.resolve(vllm_config.additional_config))

    def _build_decode(self, **kwargs) -> MlabenchDecodeMetadata:
        """vLLM's decode metadata with the step's query starts and longest query (from the host
        copy of the starts: no device sync).  vLLM calls this with keywords only; their set
        differs between releases, so they pass through."""
        base = super()._build_decode(**kwargs)
        starts_cpu = kwargs["query_start_loc_cpu"]
        longest = int((starts_cpu[1:] - starts_cpu[:-1]).max()) if len(starts_cpu) > 1 else 1
        return MlabenchDecodeMetadata(
            **{f.name: getattr(base, f.name) for f in fields(base)},
            query_start_loc=kwargs["query_start_loc_device"], max_query_len=longest,
            max_seq_len=int(kwargs["max_seq_len"]))


class MlabenchMLABackend(MLACommonBackend):
    """mlabench's Hopper split-KV MLA decode kernel with a tuned split policy (``CUSTOM``)."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.bfloat16, torch.float16]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "bfloat16", "float16"]

    @staticmethod
    def get_name() -> str:
        """vLLM maps a backend to its enum member by this name: a registered third-party backend
        is ``CUSTOM``."""
        return "CUSTOM"

    @staticmethod
    def get_supported_kernel_block_sizes() -> list[int]:
        """Pages of 64 tokens only (one TMA tile per block-table entry)."""
        return [PLUGIN_PAGE_SIZE]

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False) -> tuple[int, ...]:
        """Each layer's cache ``[pages, 64, 576]`` contiguous (the kernel reads whole pages)."""
        return (1, 0, 2, 3) if include_num_layers_dimension else (0, 1, 2)

    @staticmethod
    def get_builder_cls() -> type[MlabenchMLAMetadataBuilder]:
        return MlabenchMLAMetadataBuilder

    @staticmethod
    def get_impl_cls() -> type[MlabenchMLAImpl]:
        return MlabenchMLAImpl

    @classmethod
    def supports_compute_capability(cls, capability) -> bool:
        """Hopper (9.0) only."""
        return (capability.major, capability.minor) == (9, 0)


class MlabenchMLAImpl(MLACommonImpl[MLACommonMetadata]):
    """vLLM's MLA implementation with mlabench's decode: ``forward_mqa`` runs ``gluon-splitkv``.

    Raises :class:`PluginConfigError` (one line) at start-up for features the kernel lacks
    (ALiBi, sliding window, logit soft cap, non-decoder attention), a page size other than 64, or
    a policy file for another backend, head count, page size or query length.
    """

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes: list[float] | None, sliding_window: int | None, kv_cache_dtype: str,
                 logits_soft_cap: float | None, attn_type: str,
                 kv_sharing_target_layer_name: str | None, **mla_args) -> None:
        super().__init__(num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window,
                         kv_cache_dtype, logits_soft_cap, attn_type, kv_sharing_target_layer_name,
                         **mla_args)
        if any([alibi_slopes, sliding_window, logits_soft_cap]):
            raise PluginConfigError("mlabench's MLA backend has no ALiBi, sliding window or logit soft cap")
        if attn_type != AttentionType.DECODER:
            raise PluginConfigError(f"mlabench's MLA backend runs decoder self-attention only, not {attn_type}")
        self._served = _served_decode(num_heads)
        self._fa = _short_extend_kernel()

    def forward_mqa(self, q, kv_c_and_k_pe_cache: torch.Tensor, attn_metadata: MLACommonMetadata,
                    layer) -> tuple[torch.Tensor, None]:
        """Decode attention of one layer: ``q`` ``[T, H, 576]`` (or its latent and RoPE halves),
        the layer's cache ``[pages, 64, 576]``; returns ``([T, H, 512], None)`` (no LSE: decode
        context parallelism is not supported).  ``T`` is the step's decode requests, or with
        short extends their tokens (then FA3 runs them: module docstring).  vLLM's halves (a
        transposed bmm-output view and a slice) go to either kernel as they are: concatenating them
        would add a kernel per layer to the captured step."""
        decode = attn_metadata.decode
        if decode.max_query_len > 1:
            out = fa3_mla_decode(self._fa, q, kv_c_and_k_pe_cache.unsqueeze(2), decode.block_table,
                                 decode.seq_lens, decode.query_start_loc, decode.max_query_len,
                                 decode.max_seq_len, self.scale, kv_lora_rank=self.kv_lora_rank)
            return out, None
        out = self._served(q, kv_c_and_k_pe_cache, decode.block_table, decode.seq_lens,
                           attn_metadata.max_seq_len, self.scale)
        return out, None


@functools.cache
def _short_extend_kernel():
    """vLLM's FlashAttention module when the plugin sends short extends to FA3 (None with
    ``short_extends = "prefill"``), looked up once per process (every layer's implementation asks);
    PluginConfigError in one line when FA3 is not there."""
    settings = PluginSettings.resolve(get_current_vllm_config().additional_config)
    if settings.short_extends != "fa3":
        return None
    fa, why = optional_import(VLLM_FA_MODULE)
    why = why or fa3_reason(fa)
    if why:
        raise PluginConfigError(f"mlabench's MLA backend runs short extends with vLLM's FA3 kernel ({why}): "
                                "set short_extends to prefill (MLABENCH_SHORT_EXTENDS=prefill)")
    return fa


def _served_decode(num_heads: int) -> ServedDecode:
    """The process's :class:`ServedDecode` (made once, with the start-up line in the log)."""
    device = torch.device("cuda", torch.cuda.current_device())
    key = f"{device}:{num_heads}"
    if key not in _SERVED:
        config = get_current_vllm_config()
        page_size = int(config.cache_config.block_size)
        if page_size != PLUGIN_PAGE_SIZE:
            raise PluginConfigError(f"mlabench's MLA backend reads pages of {PLUGIN_PAGE_SIZE} tokens, "
                                    f"this server's are {page_size} (--block-size {PLUGIN_PAGE_SIZE})")
        if getattr(config.parallel_config, "decode_context_parallel_size", 1) > 1:
            raise PluginConfigError("mlabench's MLA backend returns no LSE: decode context "
                                    "parallelism is not supported")
        settings = PluginSettings.resolve(config.additional_config)
        num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        policy = load_plugin_policy(settings, num_heads, page_size, num_sms)
        _SERVED[key] = ServedDecode(policy, settings.mode, num_heads,
                                    int(config.scheduler_config.max_num_seqs), device)
        logger.info("%s", describe_policy(settings, policy, num_heads))
    return _SERVED[key]
