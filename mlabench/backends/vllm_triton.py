"""vLLM's own Triton MLA decode kernel (``vllm-triton-mla``), the kernel behind ``--attention-backend
TRITON_MLA``, measured as vLLM calls it.

vLLM (``vllm/v1/attention/backends/mla/triton_mla.py``) calls
``vllm.v1.attention.ops.triton_decode_attention.decode_attention_fwd(q, kv, kv[..., :512], o, lse,
block_table, seq_lens, attn_logits, num_kv_splits, scale, page_size, k_scale=, v_scale=,
is_mla=True)`` with ``attn_logits`` an fp32 ``[B, H, num_kv_splits, 513]`` workspace and
``num_kv_splits`` chosen on the host from the step's longest context (vLLM's rule,
:func:`mlabench.policy.heuristics.vllm_triton_splits`; the default here).  In a server, decode
replays graphs captured at start-up, so the count is the one of the capture's length: time that
count with ``num_kv_splits=N`` to see what the server runs.

Available where vLLM is importable next to a CUDA GPU (the kernel is vLLM's; mlabench never
installs vLLM).  Used by ``mlabench serve-bench``'s prediction of TRITON_MLA's TPOT.
"""

from __future__ import annotations

from typing import Any

import torch

from mlabench.backends.base import Backend, PreparedCall, check_mla_dims
from mlabench.backends.registry import register
from mlabench.backends.shared import NUM_KV_SPLITS
from mlabench.extras import optional_import
from mlabench.inputs import MLADecodeInputs
from mlabench.shapes import MLADecodeShape

VLLM_TRITON_MODULE = "vllm.v1.attention.ops.triton_decode_attention"

@register
class VllmTritonMLABackend(Backend):
    """vLLM's split-KV Triton kernel for MLA decode (``decode_attention_fwd`` with ``is_mla``),
    one token per request, any page size that divides the cache; bf16/fp16 cache."""

    name = "vllm-triton-mla"
    family = "split-kv"
    gpu_kernel = True
    packages = {"vllm": ("vllm",)}
    summary = "vLLM's Triton MLA decode kernel (TRITON_MLA), num_kv_splits as vLLM passes it"
    params = (NUM_KV_SPLITS,)  # default: vLLM's rule on the longest context

    def available(self) -> tuple[bool, str]:
        if not torch.cuda.is_available():
            return False, "no GPU: vLLM's Triton MLA kernel runs on a CUDA or ROCm GPU"
        mod, why = optional_import(VLLM_TRITON_MODULE)
        return (True, "") if mod is not None else (False, why)

    def supports(self, shape: MLADecodeShape) -> tuple[bool, str]:
        ok, why = check_mla_dims(shape, "vLLM's Triton MLA kernel")
        if not ok:
            return ok, why
        if shape.qo_len != 1:
            return False, "vLLM's Triton MLA backend decodes one query token per request"
        if shape.q_dtype != shape.kv_dtype or shape.q_dtype not in ("bfloat16", "float16"):
            return False, f"q and kv must both be bf16 or fp16, got {shape.q_dtype} / {shape.kv_dtype}"
        return True, ""

    def prepare(self, inputs: MLADecodeInputs, params: dict[str, Any]) -> PreparedCall:
        mod, _ = optional_import(VLLM_TRITON_MODULE)
        s, splits = inputs.shape, int(params["num_kv_splits"])
        kv = inputs.kv_cache  # [pages, page_size, 1, 576], as vLLM passes it after unsqueeze(2)
        out = inputs.new_output()
        lse = torch.empty(s.batch, s.num_heads, dtype=inputs.q.dtype, device=inputs.device)
        logits = torch.empty(s.batch, s.num_heads, splits, 513, dtype=torch.float32, device=inputs.device)
        scale = torch.tensor(1.0, dtype=torch.float32, device=inputs.device)

        def fn() -> torch.Tensor:
            mod.decode_attention_fwd(inputs.q, kv, kv[..., :512], out, lse, inputs.block_table,
                                     inputs.cache_seqlens, logits, splits, s.scale, s.page_size,
                                     k_scale=scale, v_scale=scale, is_mla=True)
            return out

        return PreparedCall(fn=fn, out=out, effective_params={"num_kv_splits": splits},
                            workspace_bytes=logits.numel() * 4)
