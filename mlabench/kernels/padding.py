"""Head padding for kernels that work on 16-row head tiles, and slicing the output back.

Two layouts, as servers use them (vLLM ROCm AITER MLA backend, 12-head pull request):

- ``zero``: heads ``0..H-1`` then ``T-H`` zero heads.
- ``repeat``: heads tiled in order until ``T`` rows are filled: for 12 -> 16 that is heads 0-11
  then 0-3; for a divisor count (8 -> 16) it repeats the whole block (0-7, 0-7).

Attention heads are independent, so either layout returns the first ``H`` output rows unchanged.
"""

from __future__ import annotations

import torch

HEAD_PADDINGS = ("zero", "repeat")
HEAD_TILE = 16


def padded_heads(num_heads: int, tile: int = HEAD_TILE) -> int:
    """Smallest multiple of ``tile`` that holds ``num_heads`` (12 -> 16, 16 -> 16, 96 -> 96)."""
    if num_heads <= 0:
        raise ValueError(f"num_heads must be > 0, got {num_heads}")
    return -(-num_heads // tile) * tile


def pad_heads(q: torch.Tensor, target_heads: int, mode: str = "zero") -> torch.Tensor:
    """Pad ``q`` ``[B, H, D]`` to a contiguous ``[B, target_heads, D]`` (same dtype and device).

    Raises ValueError for an unknown ``mode`` or ``target_heads < H``.  When ``H == target_heads``
    the input is returned as is (made contiguous).
    """
    if mode not in HEAD_PADDINGS:
        raise ValueError(f"head padding must be one of {HEAD_PADDINGS}, got {mode!r}")
    batch, heads, dim = q.shape
    if target_heads < heads:
        raise ValueError(f"cannot pad {heads} heads down to {target_heads}")
    if target_heads == heads:
        return q.contiguous()
    if mode == "zero":
        out = q.new_zeros((batch, target_heads, dim))
        out[:, :heads] = q
        return out
    index = torch.arange(target_heads, device=q.device) % heads
    return q.index_select(1, index).contiguous()


def slice_heads(out: torch.Tensor, num_heads: int) -> torch.Tensor:
    """First ``num_heads`` rows of a padded output ``[B, T, Dv]`` -> ``[B, num_heads, Dv]`` (a view)."""
    return out[:, :num_heads]
