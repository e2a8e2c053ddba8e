"""fp32 reference MLA decode: the correctness oracle.

Gathers each request's pages through the block table, then computes plain softmax attention in
float32 (float64 when asked): ``softmax(q K^T * scale) V`` with K = all 576 latent columns and
V = the first ``kv_lora_rank`` columns (absorbed MLA, DeepSeek-V2 paper §2.1.2).  With several
query tokens per request the mask is exact: :func:`visible_keys` says how many cached tokens
each query token sees.
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


def visible_keys(seq_len: int, qo_len: int = 1, causal: bool = True) -> list[int]:
    """How many of a request's ``seq_len`` cached tokens each of its ``qo_len`` query tokens sees.

    Causal: token ``t`` sees ``seq_len - qo_len + t + 1`` (the prefix and block tokens ``0..t``;
    0 when that is negative, a context shorter than the block); non-causal: all ``seq_len``.
    """
    if not causal:
        return [seq_len] * qo_len
    return [max(0, seq_len - qo_len + t + 1) for t in range(qo_len)]


def mla_decode_reference(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                         cache_seqlens: torch.Tensor | list[int], softmax_scale: float,
                         kv_lora_rank: int = 512, dtype: torch.dtype = torch.float32,
                         qo_len: int = 1, causal: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference decode, one request at a time (ragged lengths allowed).

    Args:
        q: ``[B * qo_len, H, 576]`` any float dtype; row ``b * qo_len + t`` is query token ``t``
            of request ``b``.
        kv_cache: ``[num_pages, page_size, 1, 576]``.
        block_table: ``[B, max_pages]`` int32.
        cache_seqlens: ``[B]`` context lengths (tensor or list), each >= 1.
        softmax_scale: multiplier of ``q . k``.
        kv_lora_rank: V width (512).
        dtype: compute dtype (float32 or float64).
        qo_len, causal: query tokens per request and their mask (:func:`visible_keys`).

    Returns:
        ``(out, lse)``: ``out`` ``[B * qo_len, H, kv_lora_rank]`` in ``dtype``; ``lse``
        ``[B * qo_len, H]``, the natural-log log-sum-exp of the scaled scores.  A query token
        that sees no key gets a zero output and ``lse = -inf``.
    """
    lens = cache_seqlens.tolist() if isinstance(cache_seqlens, torch.Tensor) else list(cache_seqlens)
    rows, heads, _ = q.shape
    if rows != len(lens) * qo_len:
        raise ValueError(f"q has {rows} rows, {len(lens)} requests x qo_len {qo_len} expected")
    out = torch.zeros((rows, heads, kv_lora_rank), dtype=dtype, device=q.device)
    lse = torch.full((rows, heads), float("-inf"), dtype=dtype, device=q.device)
    for b, n in enumerate(lens):
        k = gather_kv(kv_cache, block_table, int(n), b).to(dtype)  # [L, 576]
        for t, seen in enumerate(visible_keys(int(n), qo_len, causal)):
            if seen == 0:
                continue
            scores = (q[b * qo_len + t].to(dtype) @ k[:seen].T) * softmax_scale  # [H, seen]
            lse[b * qo_len + t] = torch.logsumexp(scores, dim=-1)
            out[b * qo_len + t] = torch.softmax(scores, dim=-1) @ k[:seen, :kv_lora_rank]
    return out, lse
