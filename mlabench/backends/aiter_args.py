"""Pure argument construction for the AITER backends: no AITER import, runs on the CPU.

- :func:`page1_kv_layout`: ``qo_indptr`` / ``kv_indptr`` / ``kv_indices`` / ``kv_last_page_lens`` that
  address a ``[P, page, 1, 576]`` cache viewed as ``[P * page, 1, 1, 576]`` (page size 1);
  :func:`page1_layout_for_steps`: the same, rewritten in place when the lengths change.
- :func:`parse_aiter_version`: ``"0.1.20.dev3+g1a2b3c"`` -> ``(0, 1, 20)``.
- :func:`aiter_gluon_effective_splits`: the split count AITER's Gluon MLA decode picks.
- :func:`persistent_max_batch` / :func:`aiter_asm_persistent`: the batch gate that makes
  ``aiter.mla.mla_decode_fwd`` leave its persistent kernel.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

#: AITER's Gluon MLA decode fills about this many workgroups (one MI350 wave); its split cap.
GLUON_MAX_SPLITS = 256
#: Tokens per Gluon bh16 tile (BLOCK_N) that bound the split count by ``min_kv_seq_len``.
GLUON_BLOCK_N = 64
#: First AITER release whose Gluon split count no longer depends on ``min_kv_seq_len`` (its
#: ``mla_gluon.py`` from v0.1.20 on fixes the count by batch and heads).
GLUON_FIXED_SPLITS_SINCE = (0, 1, 20)
#: Environment variable and default of AITER's persistent-kernel batch gate (``aiter/mla.py``).
PERSISTENT_MAX_BATCH_ENV = "AITER_MLA_DECODE_PERSISTENT_MAX_BATCH"
PERSISTENT_MAX_BATCH_DEFAULT = 32


@dataclass(frozen=True)
class Page1KVLayout:
    """Flattened (CSR) addressing of a paged cache viewed with page size 1. All int32, on one device.

    - ``qo_indptr``: ``[B + 1]``, ``0, 1, ..., B`` (one query token per request).
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


# ---- versions ------------------------------------------------------------------------------------
_VERSION_RE = re.compile(r"^\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")


def parse_aiter_version(text: str | None) -> tuple[int, int, int] | None:
    """Release part of an AITER version string, or None when there is none.

    ``"0.1.19"`` -> ``(0, 1, 19)``; ``"v0.1.20"`` -> ``(0, 1, 20)``; dev and local builds keep
    their release number: ``"0.1.20.dev12+g1a2b3c"`` -> ``(0, 1, 20)``,
    ``"0.1.19+rocm7.0.0"`` -> ``(0, 1, 19)``; ``"0.2"`` -> ``(0, 2, 0)``; ``"unknown"`` -> None.
    A setuptools-scm ``X.Y.Z.devN`` build sits between two releases: see
    :func:`aiter_version_is_exact`.
    """
    if not text:
        return None
    m = _VERSION_RE.match(str(text))
    if not m:
        return None
    return tuple(int(g) if g is not None else 0 for g in m.groups())  # type: ignore[return-value]


def aiter_version_is_exact(text: str | None) -> bool:
    """False for dev, pre-release or local builds (``.dev``, ``rc``, ``a``/``b``, ``+local``).

    setuptools-scm names a commit after tag ``v0.1.19`` ``0.1.20.devN``: its behaviour may be
    either release's, so results taken with it say so.
    """
    if parse_aiter_version(text) is None:
        return False
    rest = _VERSION_RE.sub("", str(text), count=1)
    return rest.strip() == ""


# ---- Gluon split count ---------------------------------------------------------------------------
def gluon_splits_bounded_by_min_kv(version: tuple[int, int, int] | None) -> bool:
    """True when AITER ``version`` bounds the Gluon split count by ``min_kv_seq_len`` (<= 0.1.19).

    An unknown version (None) is taken as the newer, fixed rule.
    """
    return version is not None and tuple(version) < GLUON_FIXED_SPLITS_SINCE


def aiter_gluon_effective_splits(version: tuple[int, int, int] | str | None, batch: int,
                                 qo_len: int, heads: int, min_kv_seq_len: int,
                                 bounded: bool | None = None) -> int:
    """KV splits AITER's Gluon MLA decode (``mla_gluon``) launches when left to choose.

    - AITER <= v0.1.19: ``max(1, min(256 // (B * qlen * ceil(H / 16)), cdiv(min_kv_seq_len, 64)))``
    - AITER >= v0.1.20: ``max(1, 256 // (B * qlen * ceil(H / 16)))``

    Source: AITER ``aiter/ops/triton/gluon/mla_gluon.py`` split heuristic of those releases.
    ``version`` is a tuple or a version string (see :func:`parse_aiter_version`);
    ``bounded`` overrides the version test (True: the ``min_kv_seq_len``-bounded rule).
    Raises ValueError for non-positive batch, qo_len or heads.
    """
    if batch < 1 or qo_len < 1 or heads < 1:
        raise ValueError(f"batch, qo_len and heads must be >= 1, got {batch}, {qo_len}, {heads}")
    if isinstance(version, str):
        version = parse_aiter_version(version)
    if bounded is None:
        bounded = gluon_splits_bounded_by_min_kv(version)
    head_tiles = -(-heads // 16)
    cap = GLUON_MAX_SPLITS // (batch * qo_len * head_tiles)
    if bounded:
        cap = min(cap, -(-max(int(min_kv_seq_len), 0) // GLUON_BLOCK_N))
    return max(1, cap)


def min_kv_seq_len_for_splits(num_kv_splits: int) -> int:
    """The ``min_kv_seq_len`` that makes AITER <= v0.1.19 Gluon pick ``num_kv_splits`` (below its cap).

    ``cdiv(n * 64, 64) == n``; the batch cap of :func:`aiter_gluon_effective_splits` still applies.
    """
    if num_kv_splits < 1:
        raise ValueError(f"num_kv_splits must be >= 1, got {num_kv_splits}")
    return num_kv_splits * GLUON_BLOCK_N


# ---- persistent ASM gate -------------------------------------------------------------------------
def persistent_max_batch(environ: Mapping[str, str] | None = None) -> int:
    """``AITER_MLA_DECODE_PERSISTENT_MAX_BATCH`` as AITER reads it (default 32; bad values -> 32).

    AITER caches the value the first time ``mla_decode_fwd`` runs in a process, so set it before.
    """
    import os

    env = os.environ if environ is None else environ
    raw = env.get(PERSISTENT_MAX_BATCH_ENV)
    if raw is None:
        return PERSISTENT_MAX_BATCH_DEFAULT
    try:
        return int(raw)
    except (TypeError, ValueError):
        return PERSISTENT_MAX_BATCH_DEFAULT


def aiter_asm_persistent(arch: str, q_dtype: str, kv_dtype: str, kernel_heads: int, qo_len: int,
                         batch: int, max_batch: int) -> bool:
    """Whether ``aiter.mla.mla_decode_fwd`` keeps the persistent kernel it was given metadata for.

    AITER (``aiter/mla.py``, ``_use_persistent_mla_decode``) swaps in the non-persistent split-KV
    kernel, silently, only on gfx950 with bf16 q and KV, 16 kernel heads, one query token, and
    ``batch >= max_batch``; ``max_batch <= 0`` disables the gate.  ``kernel_heads`` is the padded
    head count the kernel sees (12 -> 16).
    """
    profile = (arch == "gfx950" and q_dtype == "bfloat16" and kv_dtype == "bfloat16"
               and kernel_heads == 16 and qo_len == 1)
    if not profile or max_batch <= 0:
        return True
    return batch < max_batch
