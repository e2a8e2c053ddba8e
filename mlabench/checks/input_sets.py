"""Verification input sets: what a backend's output is checked on, beyond random inputs.

With random inputs the softmax is nearly flat, so losing one token of 32K moves the output by less
than rounding.  Each set here changes a few rows of one poisoned input set in place (``q``, some
cache rows), computes its own fp32 reference, and puts the rows back afterwards:

- ``random``: the inputs as drawn (:func:`mlabench.inputs.make_inputs`).
- ``needles``: "needle" tokens whose score is far above the rest, at the first and last token of
  each of the backend's splits, at the first and last token of pages (every page while few, else
  an even spread), and at the last valid token of each request.  Needle ``i`` of a request belongs
  to head ``i % H``: its key is built so that its scaled score for that head is
  ``lse + log(NEEDLE_SHARE / (1 - NEEDLE_SHARE)) - log(n)`` (``lse``: the head's log-sum-exp on the
  random inputs, ``n``: the head's needles), so the head's needles together carry about
  ``NEEDLE_SHARE`` of its softmax weight, in equal parts.  Their value rows are distinct random
  vectors, so a needle dropped or counted twice moves that head's output along its own direction,
  by its share of the weight: far more than rounding, and recognisable (:func:`find_missing`).
- ``peaky``: one needle per head carrying ``PEAK_SHARE`` of the weight (the softmax is one-hot).
- ``flat``: q scaled by ``FLAT_Q_SCALE``: scores within about 0.01 of each other, the output is
  the mean of the values (a dropped or repeated range of tokens shows at once).

With several query tokens per request (``qo_len`` T > 1) a needle belongs to a (query token, head)
row: the needles of a request are dealt out to the heads in turn and, across rounds of heads, to
the query tokens that see the needle's position (a causal block's earlier tokens do not see its
later ones), so that each row's needles stay within what it sees.  With one token the needles are
those it always had.

The key of a needle for head ``h`` (with query ``q = [q_nope, q_pe]``): its latent part is the
original random row with its component along ``q_nope`` removed (so the value stays random and
distinct, and contributes 0 to the score), and its RoPE part is ``s / scale * q_pe / |q_pe|^2`` plus
the original RoPE row with its ``q_pe`` component removed, which makes the score exactly ``s``.

Where the splits are: as the backend reports them (``PreparedCall.split_starts``; a backend that
cannot know them reports the likely cuts: :func:`mlabench.backends.shared.likely_split_starts`).  Needles are
placed per point, not at every boundary any split count could use: those cover most multiples of
16 tokens at long context, thousands of needles per head, each then carrying too little weight to
be missed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from mlabench.inputs import MLADecodeInputs
from mlabench.kernels.reference import mla_decode_reference, visible_keys

#: Softmax weight all needles of one head carry together (the rest: the random tokens).
NEEDLE_SHARE = 0.9
#: Softmax weight of the one needle of a head in the peaky set.
PEAK_SHARE = 0.99
#: q multiplier of the flat set: random scores shrink from O(1) to O(0.01).
FLAT_Q_SCALE = 0.01
#: Page-edge needles per head beyond those at split boundaries (pages are then spread evenly).
PAGE_EDGE_NEEDLES_PER_HEAD = 8


@dataclass(frozen=True)
class Needle:
    """A needle token: ``request``'s ``token``, high-scoring for ``head`` of query token ``query``
    (None: the one query token of a plain decode step); ``where`` says why it is there
    (``"first token of split 2/8, last token of page 5"``)."""

    request: int
    head: int
    token: int
    where: str
    query: int | None = None

    def describe(self) -> str:
        who = f"head {self.head}" if self.query is None else f"query token {self.query} head {self.head}"
        return f"request {self.request} token {self.token} ({self.where}) for {who}"

    def row(self, qo_len: int) -> int:
        """The needle's row of q, the output and the lse: ``request * qo_len + query``."""
        return self.request * qo_len + (self.query or 0)


@dataclass
class VerificationCase:
    """One input set, as changes to a poisoned input set and the fp32 reference they give.

    ``rows`` ``[N]`` index the cache viewed as ``[pages * page_size, 576]``; ``values`` ``[N, 576]``
    are written there (cache dtype); ``q`` replaces the query when not None.  ``needles[i]`` is
    ``rows[i]``'s needle and ``scores[i]`` its scaled score for its head.  ``reference``
    ``[B * qo_len, H, 512]`` and ``lse`` ``[B * qo_len, H]`` (fp32) are filled by
    :func:`with_reference`, with ``qo_len`` the shape's query tokens per request.
    """

    name: str
    q: torch.Tensor | None = None
    rows: torch.Tensor | None = None
    values: torch.Tensor | None = None
    needles: list[Needle] = field(default_factory=list)
    scores: torch.Tensor | None = None
    reference: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    qo_len: int = 1

    @contextmanager
    def applied(self, inputs: MLADecodeInputs) -> Iterator[MLADecodeInputs]:
        """Write this set into ``inputs`` in place, yield them, and put the old values back."""
        flat = inputs.kv_cache.view(-1, inputs.kv_cache.shape[-1])
        old_q = inputs.q.clone() if self.q is not None else None
        old_rows = flat[self.rows].clone() if self.rows is not None else None
        try:
            if self.q is not None:
                inputs.q.copy_(self.q)
            if self.rows is not None:
                flat[self.rows] = self.values
            yield inputs
        finally:
            if old_q is not None:
                inputs.q.copy_(old_q)
            if old_rows is not None:
                flat[self.rows] = old_rows


def with_reference(case: VerificationCase, inputs: MLADecodeInputs) -> VerificationCase:
    """Fill ``case.reference`` and ``case.lse``: the fp32 reference of ``inputs`` with ``case``
    applied (``inputs`` are left as they were)."""
    s = inputs.shape
    with case.applied(inputs):
        case.reference, case.lse = mla_decode_reference(
            inputs.q, inputs.kv_cache, inputs.block_table, list(s.context_lens), s.scale, s.kv_lora_rank,
            qo_len=s.qo_len, causal=s.causal)
    case.qo_len = s.qo_len
    return case


def split_starts_for(context_lens: Sequence[int], reported: list[list[int]] | None) -> list[list[int]]:
    """First token of each split, per request, as the backend reported it
    (:attr:`~mlabench.backends.base.PreparedCall.split_starts`: kept within each request's
    ``context_lens`` and starting at 0); ``[[0], ...]`` (one split each) when it reported none."""
    if reported is None:
        return [[0] for _ in context_lens]
    return [sorted({t for t in starts if 0 <= t < n} | {0}) for starts, n in zip(reported, context_lens)]


def needle_positions(length: int, page_size: int, starts: Sequence[int], num_heads: int) -> dict[int, str]:
    """``{token: why}`` of one request of ``length`` tokens whose splits start at ``starts``."""
    where: dict[int, list[str]] = {}
    bounds = [*starts, length]
    for i, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        if hi > lo:
            where.setdefault(lo, []).append(f"first token of split {i + 1}/{len(starts)}")
            where.setdefault(hi - 1, []).append(f"last token of split {i + 1}/{len(starts)}")
    pages = -(-length // page_size)
    budget = max(1, PAGE_EDGE_NEEDLES_PER_HEAD * num_heads // 2)
    step = max(1, -(-pages // budget))
    for p in sorted(set(range(0, pages, step)) | {pages - 1}):
        where.setdefault(p * page_size, []).append(f"first token of page {p}")
        last = min(length, (p + 1) * page_size) - 1
        where.setdefault(last, []).append(f"last token of page {p}")
    where.setdefault(length - 1, []).append("last valid token")
    return {t: ", ".join(why) for t, why in sorted(where.items())}


def needle_rows(inputs: MLADecodeInputs, needles: Sequence[Needle],
                scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cache rows and new key rows ``([N], [N, 576])`` giving each needle its scaled score
    ``scores[i]`` for its head (see the module docstring)."""
    s = inputs.shape
    page = s.page_size
    lora = s.kv_lora_rank
    req = torch.tensor([n.request for n in needles], device=inputs.device)
    tok = torch.tensor([n.token for n in needles], device=inputs.device)
    head = torch.tensor([n.head for n in needles], device=inputs.device)
    q_row = torch.tensor([n.row(s.qo_len) for n in needles], device=inputs.device)
    rows = inputs.block_table[req, tok // page].long() * page + tok % page
    k = inputs.kv_cache.view(-1, inputs.kv_cache.shape[-1])[rows].double()
    q = inputs.q[q_row, head].double()
    q_nope, q_pe = q[:, :lora], q[:, lora:]
    nope = k[:, :lora] - _along(k[:, :lora], q_nope)
    pe = k[:, lora:] - _along(k[:, lora:], q_pe)
    pe = pe + (scores.double() / s.scale)[:, None] * q_pe / q_pe.pow(2).sum(1, keepdim=True)
    return rows, torch.cat([nope, pe], dim=1).to(inputs.kv_cache.dtype)


def _along(x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Component of each row of ``x`` along the matching row of ``d``."""
    return (x * d).sum(1, keepdim=True) / d.pow(2).sum(1, keepdim=True) * d


def needle_case(name: str, inputs: MLADecodeInputs, lse: torch.Tensor, needles: list[Needle],
                share: float) -> VerificationCase:
    """The case of ``needles`` on ``inputs`` (random, with log-sum-exp ``lse`` ``[B * qo_len, H]``),
    each (query token, head) row's needles carrying ``share`` of its weight together."""
    qo_len = inputs.shape.qo_len
    per_row: dict[tuple[int, int], int] = {}
    for n in needles:
        per_row[n.row(qo_len), n.head] = per_row.get((n.row(qo_len), n.head), 0) + 1
    odds = math.log(share / (1.0 - share))
    scores = torch.tensor([float(lse[n.row(qo_len), n.head]) + odds - math.log(per_row[n.row(qo_len), n.head])
                           for n in needles], device=inputs.device)
    rows, values = needle_rows(inputs, needles, scores)
    return with_reference(VerificationCase(name, rows=rows, values=values, needles=needles, scores=scores),
                          inputs)


def needles_for(inputs: MLADecodeInputs, starts: list[list[int]]) -> list[Needle]:
    """The needles of the ``needles`` set: per request, its positions (:func:`needle_positions`)
    dealt out to the heads in turn, and each round of heads to the next query token that sees the
    position (one query token: the heads only, as always)."""
    s = inputs.shape
    out = []
    for b, (length, request_starts) in enumerate(zip(s.context_lens, starts)):
        where = needle_positions(length, s.page_size, request_starts, s.num_heads)
        seen = visible_keys(length, s.qo_len, s.causal)
        for i, (t, why) in enumerate(where.items()):
            see = [q for q in range(s.qo_len) if t < seen[q]]
            query = None if s.qo_len == 1 else see[(i // s.num_heads) % len(see)]
            out.append(Needle(b, i % s.num_heads, t, why, query))
    return out


def peak_needles(inputs: MLADecodeInputs, seed: int = 0) -> list[Needle]:
    """One needle per (request, head) at distinct random tokens (heads beyond a request's length
    get none); with several query tokens, head ``h``'s belongs to query token ``h % qo_len`` and
    lies where that token sees."""
    s = inputs.shape
    gen = torch.Generator().manual_seed(seed)
    out = []
    for b, length in enumerate(s.context_lens):
        tokens = torch.randperm(length, generator=gen).tolist()
        if s.qo_len == 1:
            out += [Needle(b, h, t, "the one dominant token") for h, t in enumerate(tokens[:s.num_heads])]
            continue
        seen = visible_keys(length, s.qo_len, s.causal)
        for h in range(s.num_heads):
            query = h % s.qo_len
            token = next((t for t in tokens if t < seen[query]), None)
            if token is not None:
                tokens.remove(token)
                out.append(Needle(b, h, token, "the one dominant token", query))
    return out


def flat_case(inputs: MLADecodeInputs) -> VerificationCase:
    """The ``flat`` set: q scaled by :data:`FLAT_Q_SCALE`."""
    return with_reference(VerificationCase("flat", q=inputs.q * FLAT_Q_SCALE), inputs)


def find_missing(out: torch.Tensor, case: VerificationCase, rows: int = 3, limit: int = 3) -> str:
    """Which needles of ``case`` the output ``[B * qo_len, H, 512]`` lacks or counts twice, as one
    line.

    In each of the ``rows`` (query row, head) rows with the largest error, the error is fitted by
    least squares as a sum of ``c_j (v_j - ref)`` over that head's needles ``j`` (``v_j`` the value
    row): a needle of softmax weight ``p_j`` that is dropped gives ``c_j = -p_j / (1 - p_j)``, one
    counted twice ``c_j = p_j / (1 + p_j)``.  Needles with ``c_j < -p_j / 2`` are named missing,
    with ``c_j > p_j / 4`` counted twice; when most of a head's needles (of 4 or more) go one way,
    the head is named instead (a scale or merge error moves them all).  At most ``limit``
    entries.  Returns ``""`` when no needle explains the error, the set has none, or the output is
    not finite.
    """
    if not case.needles or case.reference is None or not bool(torch.isfinite(out).all()):
        return ""
    ref = case.reference.double()
    err = out.double().to(ref.device) - ref
    heads = err.shape[1]
    worst = err.pow(2).sum(-1).flatten().topk(min(rows, err.shape[0] * heads)).indices.tolist()
    found: list[str] = []
    for b, h in (divmod(i, heads) for i in worst):  # b: the query row, request * qo_len + token
        mine = [i for i, n in enumerate(case.needles) if (n.row(case.qo_len), n.head) == (b, h)]
        if not mine:
            continue
        values = case.values[mine, :ref.shape[-1]].double().to(ref.device)
        coef = torch.linalg.lstsq((values - ref[b, h]).T, err[b, h, :, None]).solution[:, 0]
        shares = (case.scores[mine].double().to(ref.device) - float(case.lse[b, h])).exp()
        ratio = [c / p for c, p in zip(coef.tolist(), shares.tolist())]
        lost = [case.needles[i] for i, r in zip(mine, ratio) if r < -0.5]
        extra = [case.needles[i] for i, r in zip(mine, ratio) if r > 0.25]
        for group, how in ((lost, "less"), (extra, "more")):
            if len(mine) >= 4 and len(group) > len(mine) / 2:  # most needles: not a token lost
                who = f"request {b}" if case.qo_len == 1 else \
                    f"request {b // case.qo_len} query token {b % case.qo_len}"
                found.append(f"{who} head {h}: {len(group)} of {len(mine)} needles weigh {how} "
                             "than they should (a scale or merge error?)")
                continue
            found += [f"{n.describe()} {'missing' if how == 'less' else 'counted twice'}" for n in group]
    more = f" (+{len(found) - limit} more)" if len(found) > limit else ""
    return "; ".join(found[:limit]) + more


def make_case(name: str, inputs: MLADecodeInputs, random: VerificationCase,
              split_starts: list[list[int]], seed: int = 0) -> VerificationCase:
    """The case of input set ``name`` (one of :data:`mlabench.checks.verdict.INPUT_SETS`) on ``inputs``,
    whose ``random`` case (reference and lse) is known; ``split_starts`` per request place the
    ``needles`` set (:func:`split_starts_for`).  Raises ValueError for an unknown name."""
    if name == "random":
        return random
    if name == "flat":
        return flat_case(inputs)
    if name == "peaky":
        return needle_case(name, inputs, random.lse, peak_needles(inputs, seed), PEAK_SHARE)
    if name == "needles":
        return needle_case(name, inputs, random.lse, needles_for(inputs, split_starts), NEEDLE_SHARE)
    raise ValueError(f"unknown input set {name!r}")
