"""Head padding for kernels that work on 16-row head tiles, and slicing the output back.

Two layouts, as servers use them (vLLM ROCm AITER MLA backend, 12-head pull request):

- ``zero``: heads ``0..H-1`` then ``T-H`` zero heads.
- ``repeat``: heads tiled in order until ``T`` rows are filled: for 12 -> 16 that is heads 0-11
  then 0-3; for a divisor count (8 -> 16) it repeats the whole block (0-7, 0-7).

Attention heads are independent, so either layout returns the first ``H`` output rows unchanged.
:class:`HeadPadder` writes a layout into one preallocated buffer on every call (what a timed,
graph-captured decode call does); :func:`pad_heads` returns it once, as a new tensor.
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


class HeadPadder:
    """Copies q ``[B, H, D]`` into a preallocated contiguous ``[B, target_heads, D]`` buffer
    (same dtype and device) in the ``mode`` layout, allocating nothing per call.

    ``zero``: the padding rows are zeroed once here and never written again.  ``repeat``: row
    ``r`` receives head ``r % H``, done as ``ceil(target_heads / H)`` slice copies.  Each call
    reads ``q`` anew (it may have changed in place), so a captured CUDA/HIP graph stays right.
    Raises ValueError for an unknown ``mode`` or ``target_heads < H``.
    """

    def __init__(self, q: torch.Tensor, target_heads: int, mode: str = "zero") -> None:
        if mode not in HEAD_PADDINGS:
            raise ValueError(f"head padding must be one of {HEAD_PADDINGS}, got {mode!r}")
        batch, heads, dim = q.shape
        if target_heads < heads:
            raise ValueError(f"cannot pad {heads} heads down to {target_heads}")
        self.q = q
        self.buf = q.new_zeros((batch, target_heads, dim))
        self.copies = [(0, heads)]
        if mode == "repeat":
            self.copies = [(start, min(heads, target_heads - start))
                           for start in range(0, target_heads, heads)]

    def __call__(self) -> torch.Tensor:
        """The padded query ``[B, target_heads, D]`` (always the same buffer)."""
        for start, n in self.copies:
            self.buf[:, start:start + n].copy_(self.q[:, :n])
        return self.buf


def pad_heads(q: torch.Tensor, target_heads: int, mode: str = "zero") -> torch.Tensor:
    """Pad ``q`` ``[B, H, D]`` to a contiguous ``[B, target_heads, D]`` (same dtype and device).

    Raises ValueError for an unknown ``mode`` or ``target_heads < H``.  When ``H == target_heads``
    the input is returned as is (made contiguous).
    """
    if target_heads == q.shape[1] and mode in HEAD_PADDINGS:
        return q.contiguous()
    return HeadPadder(q, target_heads, mode)()


def slice_heads(out: torch.Tensor, num_heads: int) -> torch.Tensor:
    """First ``num_heads`` rows of a padded output ``[B, T, Dv]`` -> ``[B, num_heads, Dv]`` (a view)."""
    return out[:, :num_heads]
