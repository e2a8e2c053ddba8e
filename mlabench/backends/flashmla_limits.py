"""What FlashMLA's SM90 dense decode takes, shared by the two backends that run it: ``flashmla``
(the ``flash_mla`` package) and ``vllm-flashmla`` (vLLM's own build of the same kernel family).

A module of its own so that a backend reaches these limits without importing the other backend.
"""

from __future__ import annotations

from mlabench.backends.base import check_mla_dims
from mlabench.kernels.workspace import split_workspace_bytes
from mlabench.shapes import MLADecodeShape

FLASHMLA_PAGE_SIZE = 64
FLASHMLA_DTYPES = ("bfloat16", "float16")
#: Query rows (``qo_len x`` query heads) per KV head one FlashMLA decode call takes.
FLASHMLA_MAX_ROWS = 128


def flashmla_supports(shape: MLADecodeShape, who: str = "FlashMLA") -> tuple[bool, str]:
    """``(True, "")`` when FlashMLA's dense decode takes ``shape``: page size 64, bf16 or fp16 q and
    KV of one dtype, kv_lora_rank 512 + rope 64, at most 128 query rows; else ``(False, reason)``
    naming ``who`` (e.g. ``"FlashMLA needs page size 64, got 16"``)."""
    if shape.page_size != FLASHMLA_PAGE_SIZE:
        return False, f"{who} needs page size {FLASHMLA_PAGE_SIZE}, got {shape.page_size}"
    if shape.q_dtype not in FLASHMLA_DTYPES or shape.kv_dtype != shape.q_dtype:
        got = f"{shape.q_dtype}/{shape.kv_dtype}"
        return False, f"{who} needs bf16 or fp16 q and KV of one dtype (got {got})"
    ok, why = check_mla_dims(shape, f"{who} decode")
    rows = shape.num_heads * shape.qo_len
    if ok and rows > FLASHMLA_MAX_ROWS:
        return False, f"{who} decode takes at most {FLASHMLA_MAX_ROWS} query rows per KV head, got {rows}"
    return ok, why


def flashmla_workspace_bytes(batch: int, num_heads: int, num_sm_parts: int, qo_len: int = 1,
                             head_dim_v: int = 512) -> int:
    """fp32 split partials FlashMLA writes and reads: ``(B + num_sm_parts)`` rows of ``[H, s_q, Dv]``
    output plus one lse each (FlashMLA ``flash_api.cpp`` sizes ``out_accum``/``softmax_lse_accum``
    so; an estimate, it is allocated inside the call)."""
    return split_workspace_bytes((batch + num_sm_parts) * num_heads * qo_len, head_dim_v)
