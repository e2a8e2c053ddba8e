"""Balanced work list for the persistent MLA decode kernel, built on the device with torch ops.

All requests' tokens are laid end to end in one global token space of ``T = sum(L_i)`` tokens.
With ``G`` programs the chunk is ``C = ceil(T / G)`` rounded up to ``block_n`` (at least
``block_n``); program ``p`` owns global tokens ``[p*C, min((p+1)*C, T))``, which may span several
requests.  Each non-empty intersection of program ``p`` with request ``i`` is a segment whose fp32
partial goes to slot ``p + i``.  Slots are unique among non-empty segments: if ``(p, i)`` and
``(p', i')`` with ``p < p'`` shared a slot then ``i > i'``, yet program ``p'``'s tokens all follow
program ``p``'s while request ``i'``'s all precede request ``i``'s, a contradiction.  Hence at most
``G + B - 1`` slots.  Request ``i`` is merged from slots ``[first_prog(i) + i, last_prog(i) + i]``
where ``first_prog(i) = start_i // C`` and ``last_prog(i) = (end_i - 1) // C``; every program in
between intersects it, so every slot read was written.

The builder uses only device-side torch ops with fixed output sizes (no ``.item()``, no host sync),
so it can be captured in a CUDA graph together with the kernels and stays correct when lengths
change.  The idea of one balanced token partition over a persistent grid follows FlashMLA's
``get_mla_metadata`` and AITER's ``get_mla_metadata_v1``; the layout is ours.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class WorkList:
    """Device tensors describing the persistent grid's work (B requests, G programs).

    - ``cu_seqlens``: ``[B + 1]`` int32, exclusive prefix sum of the lengths (global token offsets);
      ``cu_seqlens[B] = T``.
    - ``chunk_tokens``: ``[1]`` int32, tokens per program ``C`` (a multiple of ``block_n``).
    - ``prog_first_req``: ``[G]`` int32, first request with tokens at or after ``p*C``
      (``B`` when program ``p`` has no work).
    - ``req_slot_lo`` / ``req_slot_hi``: ``[B]`` int32, partial slots ``[lo, hi)`` request ``i``
      merges (``lo == hi`` for an empty request).
    - ``num_programs``: ``G``; ``num_slots``: ``G + B - 1``, the partial slots to allocate.
    """

    cu_seqlens: torch.Tensor
    chunk_tokens: torch.Tensor
    prog_first_req: torch.Tensor
    req_slot_lo: torch.Tensor
    req_slot_hi: torch.Tensor
    num_programs: int
    num_slots: int

    @property
    def batch(self) -> int:
        return self.req_slot_lo.shape[0]


def build_work_list(cache_seqlens: torch.Tensor, num_programs: int, block_n: int) -> WorkList:
    """Cut ``cache_seqlens`` (``[B]`` int32/int64, each >= 0, on any device) over ``num_programs``.

    Returns a :class:`WorkList` on the same device.  Lengths of 0 are allowed (no segment, no slot).
    Raises ValueError when ``num_programs < 1`` or ``block_n < 1``.  Graph-capturable: device ops
    only, output sizes fixed by ``B`` and ``num_programs``.
    """
    if num_programs < 1 or block_n < 1:
        raise ValueError(f"num_programs and block_n must be >= 1, got {num_programs}, {block_n}")
    if cache_seqlens.dim() != 1 or cache_seqlens.numel() < 1:
        raise ValueError("cache_seqlens must be a non-empty [B] tensor")
    dev = cache_seqlens.device
    batch = cache_seqlens.shape[0]
    lens = cache_seqlens.to(torch.int64).clamp_min(0)
    ends = torch.cumsum(lens, 0)  # [B]
    cu = torch.cat([ends.new_zeros(1), ends])  # [B + 1]
    total = cu[-1:]  # [1], stays on the device
    chunk = (total + num_programs - 1) // num_programs
    chunk = ((chunk + block_n - 1) // block_n * block_n).clamp_min(block_n)  # [1]
    prog_start = torch.arange(num_programs, device=dev, dtype=torch.int64) * chunk
    prog_first_req = torch.searchsorted(ends, prog_start, right=True)  # first i with end_i > p*C
    starts = cu[:-1]
    first_prog = starts // chunk
    last_prog = (ends - 1).clamp_min(0) // chunk
    req = torch.arange(batch, device=dev, dtype=torch.int64)
    slot_lo = first_prog + req
    slot_hi = torch.where(lens > 0, last_prog + req + 1, slot_lo)
    i32 = torch.int32
    return WorkList(
        cu_seqlens=cu.to(i32), chunk_tokens=chunk.to(i32), prog_first_req=prog_first_req.to(i32),
        req_slot_lo=slot_lo.to(i32), req_slot_hi=slot_hi.to(i32),
        num_programs=num_programs, num_slots=num_programs + batch - 1,
    )


def rebuild_work_list(work: WorkList, cache_seqlens: torch.Tensor, block_n: int) -> None:
    """Rebuild ``work`` in place for new lengths ``cache_seqlens`` (``[B]``, same B and device).

    The tensors keep their storage, so a graph captured with ``work`` reads the new list: this is
    the per-step refresh of the persistent kernel.  Device ops only (no host sync); raises
    ValueError when the batch differs.
    """
    if cache_seqlens.shape != (work.batch,):
        raise ValueError(f"work list is for {work.batch} requests, got lengths {tuple(cache_seqlens.shape)}")
    new = build_work_list(cache_seqlens, work.num_programs, block_n)
    for name in ("cu_seqlens", "chunk_tokens", "prog_first_req", "req_slot_lo", "req_slot_hi"):
        getattr(work, name).copy_(getattr(new, name))


def segments(work: WorkList) -> list[tuple[int, int, int, int]]:
    """The segments the kernel will run, computed on the host (for tests and debugging).

    Returns ``(program, request, local_start, local_end)`` tuples with ``local_end > local_start``,
    walking each program exactly as the persistent kernel does.
    """
    cu = work.cu_seqlens.tolist()
    chunk = int(work.chunk_tokens.item())
    total = cu[-1]
    out = []
    for p, first in enumerate(work.prog_first_req.tolist()):
        pos, hi, i = p * chunk, min((p + 1) * chunk, total), first
        while pos < hi:
            seg_end = min(cu[i + 1], hi)
            if seg_end > pos:
                out.append((p, i, pos - cu[i], seg_end - cu[i]))
            pos = max(pos, seg_end)
            i += 1
    return out


def request_split_starts(work: WorkList) -> list[list[int]]:
    """Per request, the first token (request-local) of each of its segments, sorted: where the
    persistent kernel's partials of that request begin (host computation, for the correctness
    check's needle tokens)."""
    starts: list[set[int]] = [set() for _ in range(work.batch)]
    for _program, request, lo, _hi in segments(work):
        starts[request].add(lo)
    return [sorted(s) for s in starts]
