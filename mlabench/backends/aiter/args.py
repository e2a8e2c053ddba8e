"""Pure argument construction for the AITER backends: no AITER import, runs on the CPU.

:func:`page1_kv_layout` builds the ``qo_indptr`` / ``kv_indptr`` / ``kv_indices`` /
``kv_last_page_lens`` that address a ``[P, page, 1, 576]`` cache viewed as ``[P * page, 1, 1, 576]``
(page size 1, :func:`page1_cache_view`); :func:`page1_layout_for_steps` the same, rewritten in place
when the lengths change.  What AITER then does with a shape (split counts, the persistent-kernel
gate, refusals) is in :mod:`mlabench.backends.aiter.rules`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Page1KVLayout:
    """Flattened (CSR) addressing of a paged cache viewed with page size 1. All int32, on one device.

    - ``qo_indptr``: ``[B + 1]``, ``0, T, ..., B * T`` (``T = qo_len`` query tokens per request).
    - ``kv_indptr``: ``[B + 1]``, cumulative context lengths (tokens).
    - ``kv_indices``: ``[sum(L)]``, row of each token in the ``[P * page, ...]`` view.
    - ``kv_last_page_lens``: ``[B]``, all ones (every page holds one token).
    """

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_lens: torch.Tensor

    @property
    def total_tokens(self) -> int:
        """Tokens of all requests (``kv_indptr[-1]``; ``kv_indices`` may hold more rows)."""
        return int(self.kv_indptr[-1])


def page1_kv_layout(block_table: torch.Tensor, context_lens: Sequence[int], page_size: int,
                    qo_len: int = 1) -> Page1KVLayout:
    """Page-size-1 CSR addressing for a ``[P, page_size, 1, D]`` cache and its block table.

    Token ``t`` of request ``b`` lives in page ``block_table[b, t // page_size]`` at slot
    ``t % page_size``, i.e. in row ``block_table[b, t // page_size] * page_size + t % page_size``
    of the cache viewed as ``[P * page_size, 1, 1, D]``.  That view is exact (the cache is
    contiguous), so every page size runs through AITER's page-size-1 kernels.

    Args:
        block_table: ``[B, max_pages]`` int32 (any device; outputs land on the same device).
        context_lens: ``B`` context lengths, tokens, each >= 1.
        page_size: tokens per page of the original cache (>= 1).
        qo_len: query tokens per request (``qo_indptr`` step).

    Raises:
        ValueError: lengths that do not match the block table, or a request needing more pages
            than its block-table row holds.
    """
    lens = [int(n) for n in context_lens]
    batch = len(lens)
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"block_table {tuple(block_table.shape)} does not match {batch} requests")
    if page_size < 1 or min(lens, default=1) < 1:
        raise ValueError("page_size and every context length must be >= 1")
    need = max(-(-n // page_size) for n in lens)
    if need > block_table.shape[1]:
        raise ValueError(f"a request needs {need} pages, block_table rows hold {block_table.shape[1]}")
    dev = block_table.device
    lens_t = torch.tensor(lens, dtype=torch.int64, device=dev)
    kv_indptr = torch.zeros(batch + 1, dtype=torch.int64, device=dev)
    kv_indptr[1:] = torch.cumsum(lens_t, 0)
    request = torch.repeat_interleave(torch.arange(batch, device=dev), lens_t)
    position = torch.arange(int(kv_indptr[-1]), device=dev) - kv_indptr[request]
    pages = block_table.long()[request, position // page_size]
    kv_indices = pages * page_size + position % page_size
    return Page1KVLayout(
        qo_indptr=torch.arange(0, (batch + 1) * qo_len, qo_len, dtype=torch.int32, device=dev),
        kv_indptr=kv_indptr.to(torch.int32),
        kv_indices=kv_indices.to(torch.int32),
        kv_last_page_lens=torch.ones(batch, dtype=torch.int32, device=dev),
    )


def page1_layout_for_steps(block_table: torch.Tensor, context_lens: Sequence[int], page_size: int,
                           qo_len: int = 1) -> tuple[Page1KVLayout, Callable[[Sequence[int]], None]]:
    """A :func:`page1_kv_layout` whose ``kv_indices`` has room for every token the block table
    addresses (``B * max_pages * page_size``), and ``refill(lens)``, which rewrites ``kv_indptr``
    and the first ``sum(lens)`` indices in place for new lengths (the per-step refresh of a
    captured AITER call; rows past ``sum(lens)`` are not read).  Raises the ValueError of
    :func:`page1_kv_layout` for lengths the block table cannot hold.
    """
    capacity = block_table.shape[0] * block_table.shape[1] * page_size
    exact = page1_kv_layout(block_table, context_lens, page_size, qo_len)
    layout = Page1KVLayout(exact.qo_indptr, exact.kv_indptr,
                           torch.zeros(capacity, dtype=torch.int32, device=block_table.device),
                           exact.kv_last_page_lens)

    def refill(lens: Sequence[int]) -> None:
        new = page1_kv_layout(block_table, lens, page_size, qo_len)
        layout.kv_indptr.copy_(new.kv_indptr)
        layout.kv_indices[:new.kv_indices.numel()].copy_(new.kv_indices)

    refill(context_lens)
    return layout, refill


def page1_cache_view(kv_cache: torch.Tensor) -> torch.Tensor:
    """``[P, page, 1, D]`` -> ``[P * page, 1, 1, D]`` (a view; raises RuntimeError if not viewable)."""
    return kv_cache.view(-1, 1, 1, kv_cache.shape[-1])
