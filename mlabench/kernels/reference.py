"""fp32 reference MLA decode: the correctness oracle.

Gathers each request's pages through the block table, then computes plain softmax attention in
float32 (float64 when asked): ``softmax(q K^T * scale) V`` with K = all 576 latent columns and
V = the first ``kv_lora_rank`` columns (absorbed MLA, DeepSeek-V2 paper §2.1.2).
"""

from __future__ import annotations

import torch


def gather_kv(kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int,
              request: int) -> torch.Tensor:
    """Latent rows of one request: ``[seq_len, 576]`` in the cache's dtype.

    ``kv_cache`` is ``[num_pages, page_size, 1, 576]``; ``block_table`` ``[B, max_pages]`` int32.
    """
    page_size = kv_cache.shape[1]
    n_pages = -(-seq_len // page_size)
    pages = block_table[request, :n_pages].long()
    rows = kv_cache[pages].reshape(n_pages * page_size, kv_cache.shape[-1])
    return rows[:seq_len]


def mla_decode_reference(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                         cache_seqlens: torch.Tensor | list[int], softmax_scale: float,
                         kv_lora_rank: int = 512,
                         dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference decode, one request at a time (ragged lengths allowed).

    Args:
        q: ``[B, H, 576]`` any float dtype.
        kv_cache: ``[num_pages, page_size, 1, 576]``.
        block_table: ``[B, max_pages]`` int32.
        cache_seqlens: ``[B]`` context lengths (tensor or list), each >= 1.
        softmax_scale: multiplier of ``q . k``.
        kv_lora_rank: V width (512).
        dtype: compute dtype (float32 or float64).

    Returns:
        ``(out, lse)``: ``out`` ``[B, H, kv_lora_rank]`` in ``dtype``; ``lse`` ``[B, H]``, the
        natural-log log-sum-exp of the scaled scores.
    """
    lens = cache_seqlens.tolist() if isinstance(cache_seqlens, torch.Tensor) else list(cache_seqlens)
    batch, heads, _ = q.shape
    out = torch.empty((batch, heads, kv_lora_rank), dtype=dtype, device=q.device)
    lse = torch.empty((batch, heads), dtype=dtype, device=q.device)
    for b, n in enumerate(lens):
        k = gather_kv(kv_cache, block_table, int(n), b).to(dtype)  # [L, 576]
        scores = (q[b].to(dtype) @ k.T) * softmax_scale  # [H, L]
        lse[b] = torch.logsumexp(scores, dim=-1)
        out[b] = torch.softmax(scores, dim=-1) @ k[:, :kv_lora_rank]
    return out, lse
