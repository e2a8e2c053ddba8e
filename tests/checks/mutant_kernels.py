"""A split-KV MLA decode in PyTorch that can be broken on purpose: the mutants the verdict must catch.

:func:`splitkv_decode` computes what the project's Triton split-KV kernel computes on a GPU: fp32
scores from the input dtype, per-split softmax with the weights rounded to the cache dtype before
the value product, an fp32 log-sum-exp merge, the output rounded to q's dtype.  A :class:`Fault`
switches on one error at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mlabench.backends.base import Backend, PreparedCall
from mlabench.backends.shared import NUM_KV_SPLITS, likely_split_starts
from mlabench.inputs import MLADecodeInputs
from mlabench.kernels.reference import gather_kv


@dataclass(frozen=True)
class Fault:
    """One deliberate error (all off: a correct kernel).

    - ``scale``: softmax scale multiplied by this.
    - ``average_merge``: splits merged by a plain mean of their partials instead of by log-sum-exp.
    - ``drop_page``: this logical page of every request is skipped (None: none).
    - ``drop_tail_fraction``: the last fraction of every request's tokens is skipped.
    - ``drop_split_firsts`` / ``drop_last_token``: the first token of every split after the first,
      or the last valid token of each request, is skipped (off-by-one errors).
    - ``double_split_lasts``: the last token of every split but the last is counted twice.
    """

    scale: float = 1.0
    average_merge: bool = False
    drop_page: int | None = None
    drop_tail_fraction: float = 0.0
    drop_split_firsts: bool = False
    drop_last_token: bool = False
    double_split_lasts: bool = False


def split_bounds(length: int, splits: int, align: int = 16) -> list[tuple[int, int]]:
    """Non-empty ``[lo, hi)`` token ranges: ``ceil(L / S)`` rounded up to ``align``, as the
    project's Triton split-KV kernel cuts them."""
    chunk = -(-(-(-length // splits)) // align) * align
    return [(lo, min(lo + chunk, length)) for lo in range(0, length, chunk)]


def token_weights(length: int, page_size: int, bounds: list[tuple[int, int]], fault: Fault) -> torch.Tensor:
    """How many times each token counts: 1, 0 (dropped) or 2 (doubled), ``[L]`` fp32."""
    w = torch.ones(length)
    if fault.drop_page is not None:
        w[fault.drop_page * page_size:(fault.drop_page + 1) * page_size] = 0
    if fault.drop_tail_fraction:
        w[length - int(length * fault.drop_tail_fraction):] = 0
    if fault.drop_split_firsts:
        w[[lo for lo, _ in bounds[1:]]] = 0
    if fault.drop_last_token:
        w[length - 1] = 0
    if fault.double_split_lasts:
        w[[hi - 1 for _, hi in bounds[:-1]]] = 2
    return w


def splitkv_decode(inputs: MLADecodeInputs, splits: int, fault: Fault = Fault()) -> torch.Tensor:
    """``[B, H, 512]`` in q's dtype: split-KV decode of ``inputs`` with ``splits`` splits and
    ``fault`` applied (gathering only each request's own tokens, as the real kernels do)."""
    s = inputs.shape
    out = torch.empty(s.batch, s.num_heads, s.v_head_dim, dtype=inputs.q.dtype, device=inputs.q.device)
    for b, length in enumerate(s.context_lens):
        k = gather_kv(inputs.kv_cache, inputs.block_table, length, b).float()  # [L, 576]
        bounds = split_bounds(length, splits)
        counts = token_weights(length, s.page_size, bounds, fault).to(k.device)
        scores = inputs.q[b].float() @ k.T * (s.scale * fault.scale)  # [H, L]
        partials, lses = [], []
        for lo, hi in bounds:
            sc = scores[:, lo:hi]
            m = sc.max(dim=1, keepdim=True).values
            p = torch.exp(sc - m) * counts[lo:hi]
            p_low = p.to(inputs.kv_cache.dtype).float()  # weights rounded before the value product
            partials.append(p_low @ k[lo:hi, :s.v_head_dim] / p.sum(1, keepdim=True).clamp_min(1e-30))
            lses.append(m[:, 0] + torch.log(p.sum(1).clamp_min(1e-30)))
        part, lse = torch.stack(partials), torch.stack(lses)  # [S, H, 512], [S, H]
        if fault.average_merge:
            merged = part.mean(0)
        else:
            w = torch.softmax(lse, dim=0)
            merged = (w[..., None] * part).sum(0)
        out[b] = merged.to(inputs.q.dtype)
    return out


class MutantBackend(Backend):
    """:func:`splitkv_decode` with ``fault`` as a backend (not registered): like a backend that
    cannot know where its library cuts, it reports the likely cuts of num_kv_splits
    (:func:`~mlabench.backends.shared.likely_split_starts`), where the check places its needles."""

    name = "mutant-splitkv"
    summary = "split-KV in PyTorch with one deliberate fault"
    family = "split-kv"
    params = (NUM_KV_SPLITS,)

    def __init__(self, fault: Fault = Fault()) -> None:
        self.fault = fault

    def available(self) -> tuple[bool, str]:
        return True, ""

    def prepare(self, inputs: MLADecodeInputs, params: dict[str, Any]) -> PreparedCall:
        splits = int(params["num_kv_splits"])
        out = inputs.new_output()
        return PreparedCall(fn=lambda: out.copy_(splitkv_decode(inputs, splits, self.fault)), out=out,
                            effective_params={"num_kv_splits": splits},
                            split_starts=likely_split_starts(inputs.shape.context_lens, splits))
