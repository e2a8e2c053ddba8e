"""Finer context buckets for a device split policy: a geometric grid of edges between the given ones.

A policy read from device memory (``split_policy=device:FILE``) runs one count per run of lengths
of its table, and the table may hold thousands of rows
(:data:`~mlabench.policy.rules.MAX_POLICY_ROWS`), so nothing forces one configuration over a
factor-4 bucket.  On an H200 (``results/h200/deploy/qo1/``, gluon-splitkv, batch 1) the best count
measured at the six lengths of the bucket 1025-4096 (0.4 octave apart) was 16, 22, 28, 23, 54 and
64 splits: the chosen ``min(ceil(L/49), 54)`` was 10.4% slower than the best at 1783 tokens and
held-out lengths lost up to 10.7%.  :func:`fine_edges` cuts such a bucket into sub-buckets of at
most ``2 ** (1 / k)`` in length, each a study of its own (``tune --edges-per-octave K``,
docs/tuning.md).
"""

from __future__ import annotations

import math

#: A sub-bucket may be this much (a fraction of its share of an octave) wider than ``2 ** (1 / k)``
#: before it is cut again: edges are whole tokens, so a grid's rounded edges stay a grid when
#: refined a second time (a resumed or exported run refines its recorded edges again).
ROUNDING_SLACK = 0.05


def fine_edges(edges: list[int], per_octave: int | None) -> list[int]:
    """``edges`` (increasing upper edges of context buckets, tokens) with, between each two
    neighbours ``lo < hi``, ``n - 1`` more edges ``round(lo * (hi / lo) ** (i / n))``, ``n =
    ceil(k * log2(hi / lo))`` for ``k = per_octave``: every new bucket spans at most a factor
    ``2 ** (1 / k)`` (about, after rounding to whole tokens).  The given edges stay; the first
    bucket ``(0, edges[0]]`` is not cut.  ``per_octave`` None (or ``edges`` of one) gives ``edges``
    unchanged; refining the result again with the same ``k`` changes nothing.

    E.g. ``fine_edges([1024, 4096], 2)`` is ``[1024, 1448, 2048, 2896, 4096]``.  Raises
    ValueError for ``per_octave`` < 1.
    """
    if per_octave is None:
        return list(edges)
    if per_octave < 1:
        raise ValueError(f"per_octave must be >= 1, got {per_octave}")
    out = list(edges[:1])
    for lo, hi in zip(edges, edges[1:]):
        n = max(1, math.ceil(per_octave * math.log2(hi / lo) - ROUNDING_SLACK))
        inner = (round(lo * (hi / lo) ** (i / n)) for i in range(1, n))
        out += sorted({e for e in inner if lo < e < hi}) + [hi]
    return out
