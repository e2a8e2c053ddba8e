"""Split-KV (flash-decoding) MLA decode in plain PyTorch: the algorithm, not a fast kernel.

Stage 1: each request's KV is cut into ``num_kv_splits`` contiguous splits of
``ceil(L / num_kv_splits)`` tokens (the last ones may be short or empty); each split yields a
partial output and its log-sum-exp.  Stage 2: partials merge with weights ``exp(lse_s - lse)``.
Empty splits carry ``lse = -inf`` and weight 0.  (Flash-decoding: Dao et al., 2023.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def split_starts(context_lens: Sequence[int], num_kv_splits: int, align: int = 1) -> list[list[int]]:
    """First token of each non-empty split, per request, when each request's ``L`` tokens are cut
    into splits of ``ceil(L / num_kv_splits)`` tokens rounded up to ``align`` (1 here; the Triton
    split-KV kernel rounds to 16).  Raises ValueError unless ``num_kv_splits`` and ``align`` >= 1."""
    if num_kv_splits < 1 or align < 1:
        raise ValueError(f"num_kv_splits and align must be >= 1, got {num_kv_splits}, {align}")
    out = []
    for n in context_lens:
        chunk = -(-(-(-int(n) // num_kv_splits)) // align) * align
        out.append(list(range(0, int(n), chunk)))
    return out


def splitkv_torch_elements(batch: int, heads: int, max_len: int, splits: int) -> int:
    """Largest intermediate this implementation builds, in elements (``B*H*L*S``)."""
    return batch * heads * max_len * min(splits, max_len)


def _own_pages(kv_cache: torch.Tensor, block_table: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """The pages of ``block_table`` ``[B, max_pages]`` gathered from ``kv_cache``, ``[B, max_pages,
    page, 1, 576]``: a request's own ``ceil(L / page)`` pages, as the kernels read them; its entries
    past those (a graph batch's padding) may point anywhere, past the cache included, so page 0 is
    gathered in their place (the caller masks every slot past ``L``)."""
    page, max_pages = kv_cache.shape[1], block_table.shape[1]
    owned = torch.arange(max_pages, device=block_table.device)[None, :] < (lens[:, None] + page - 1) // page
    return kv_cache[torch.where(owned, block_table.long(), 0)]


def mla_decode_splitkv_torch(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                             cache_seqlens: torch.Tensor, num_kv_splits: int, softmax_scale: float,
                             out: torch.Tensor | None = None, kv_lora_rank: int = 512,
                             qo_len: int = 1, causal: bool = True) -> torch.Tensor:
    """Decode ``q`` ``[B * qo_len, H, 576]`` against the paged cache with ``num_kv_splits`` splits.

    ``kv_cache`` ``[P, page, 1, 576]``, ``block_table`` ``[B, max_pages]`` int32,
    ``cache_seqlens`` ``[B]`` int32 (0 gives a zero row, as the Triton kernels write for a graph's
    padding request).  A request's splits cut its whole context; each
    of its ``qo_len`` query tokens sees the part its mask allows
    (:func:`mlabench.kernels.reference.visible_keys`), and one that sees none gets zeros.
    Returns ``out`` ``[B * qo_len, H, kv_lora_rank]`` in q's dtype.  Computes in float32.  Cache
    slots past a request's length are never read into the arithmetic (they may hold NaN), and
    block-table entries past its ``ceil(L / page)`` pages are never followed (they may point past
    the cache).  ``kv_lora_rank``: the latent width, the rest of the last dim being rope.
    Raises ValueError if ``num_kv_splits < 1``.
    """
    if num_kv_splits < 1:
        raise ValueError(f"num_kv_splits must be >= 1, got {num_kv_splits}")
    batch, heads = block_table.shape[0], q.shape[1]
    page = kv_cache.shape[1]
    max_pages = block_table.shape[1]
    lens = cache_seqlens.long()
    kv = _own_pages(kv_cache, block_table, lens).reshape(batch, max_pages * page, -1).float()  # [B, Lp, 576]
    pos = torch.arange(kv.shape[1], device=q.device)
    valid = pos[None, :] < lens[:, None]  # [B, Lp]
    # Gathered slots past a request's length (its last page's tail, what block-table padding points
    # at) may hold anything, NaN included: zero them, since a zero softmax weight times NaN is NaN.
    kv = torch.where(valid[..., None], kv, 0.0)
    # A request of length 0 (a captured graph's padding request) has no split to cut: at least 1
    # token a split keeps the division defined, and its row comes out zero, as the kernels' does.
    split_len = ((lens + num_kv_splits - 1) // num_kv_splits).clamp_min(1)  # [B]
    split_id = torch.where(valid, pos[None, :] // split_len[:, None], num_kv_splits)  # [B, Lp]
    # Rows are (query token, head) pairs, token-major: [B, qo_len * H, Lp].
    scores = torch.einsum("bhd,btd->bht", q.float().reshape(batch, qo_len * heads, -1), kv) * softmax_scale
    seen = lens[:, None] - qo_len + 1 + torch.arange(qo_len, device=q.device)[None, :] if causal \
        else lens[:, None].expand(batch, qo_len)  # [B, qo_len] keys each token sees
    visible = (pos[None, None, :] < seen[:, :, None]).repeat_interleave(heads, dim=1)  # [B, rows, Lp]
    scores = scores.masked_fill(~visible, float("-inf"))
    # Stage 1: per-split max, exp-sum and weighted V.
    onehot = torch.nn.functional.one_hot(split_id, num_kv_splits + 1)[..., :num_kv_splits].float()
    masked = scores[..., None] + torch.where(onehot > 0, 0.0, float("-inf"))[:, None]  # [B,H,Lp,S]
    m = masked.amax(dim=2)  # [B, H, S]
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(masked - m_safe[:, :, None, :])  # zero outside the split
    denom = p.sum(dim=2)  # [B, H, S]
    partial = torch.einsum("bhts,btd->bhsd", p, kv[..., :kv_lora_rank])
    partial = partial / denom.clamp_min(1e-30)[..., None]
    lse = torch.where(denom > 0, m_safe + torch.log(denom.clamp_min(1e-30)), float("-inf"))
    # Stage 2: merge.
    lse_max = lse.amax(dim=2, keepdim=True)
    lse_max = torch.where(torch.isfinite(lse_max), lse_max, 0.0)  # a row that sees no key: all -inf
    w = torch.exp(lse - lse_max)  # empty splits -> 0
    merged = (w[..., None] * partial).sum(dim=2) / w.sum(dim=2).clamp_min(1e-30)[..., None]
    if out is None:
        out = torch.empty((batch * qo_len, heads, kv_lora_rank), dtype=q.dtype, device=q.device)
    return out.copy_(merged.view(batch * qo_len, heads, kv_lora_rank))
