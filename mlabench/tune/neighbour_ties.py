"""Ties settled by the neighbouring buckets: among the configurations a study cannot tell apart, the
one a neighbouring bucket chose.

A study's tie rule (:func:`mlabench.tune.choice.choose`) takes the fewest splits among the
configurations within the noise of the best.  Two counts that launch the same page splits at every
length a study measured are such a tie, however they differ between those lengths: on an H200
(``results/h200/deploy/qo1-k3``, batch 16) 7 and 8 splits ran the same at 1291 and 1625 tokens (21
and 26 pages, 3 and 4 pages a split either way), the tie rule took 7, and at the held-out 1475
tokens (24 pages: 6 splits of 4 at a count of 7, 8 splits of 3 at 8) 8 was 4.8% faster; both
neighbouring buckets had chosen 8.  So, bucket by bucket in length order, a choice that neither
neighbour shares is replaced by a neighbour's choice when that one is among the study's ties: the
data cannot tell them apart in this bucket, the neighbour's lengths measured it best, and the two
policy rows merge (a shorter table for a device policy to search).  A choice already shared with a
neighbour stays, so no policy gains a row.

Where the tie hid a real difference it costs: that run's batch 1 took its neighbours' 64 splits over
48 at 8193-10321 tokens, 4.9% slower than 48 at the held-out 9162 (its per-bucket policy: 5 of 27
held-out lengths within 3%, was 6; worst 12.7%, was 12.9%), against batch 16's 27 of 27, was 24.
"""

from __future__ import annotations

import dataclasses

from mlabench.tune.choice import BucketChoice, TiedEntry


def _adopted(choice: BucketChoice, tied: TiedEntry, side: str) -> BucketChoice:
    taken = (f"the choice of the bucket {side} was among them and was taken (their policy rows merge), its "
             f"µs {tied.us / choice.best_us:.3f}x the best-scoring's")
    note = (f"{choice.tie}; then {taken}" if choice.tie else
            f"{len(choice.tied)} configurations tied within ±{100 * choice.tie_tolerance:.3g}% of the "
            f"best-scoring; {taken}")
    return dataclasses.replace(choice, chosen=tied.entry.params, tokens_per_split=tied.entry.tokens_per_split,
                               tile_tokens=tied.entry.tile_tokens, chosen_us=tied.us, chosen_worst=tied.worst,
                               tie=note)


def _settle(out: list[BucketChoice], order: list[int]) -> bool:
    """One pass up in length over the buckets ``order`` (indices into ``out``, one batch size);
    True when a bucket switched."""
    switched = False
    for k, i in enumerate(order):
        near = {side: out[order[j]].entry() for side, j in (("below", k - 1), ("above", k + 1))
                if 0 <= j < len(order)}
        own = out[i].entry()
        if any(own.same_choice(e) for e in near.values()):  # the rule by which adjacent rows merge
            continue
        for tied in out[i].tied:
            side = next((s for s, e in near.items() if e.same_choice(tied.entry)), None)
            if side is not None:
                out[i], switched = _adopted(out[i], tied, side), True
                break
    return switched


def adopt_neighbour_ties(choices: list[BucketChoice]) -> list[BucketChoice]:
    """``choices`` (any order, several batch sizes) with each bucket whose choice neither
    neighbouring bucket of its batch size shares, and whose ties (``BucketChoice.tied``) hold a
    neighbour's choice, switched to the first of its ties, in the tie rule's order, that a
    neighbour chose; its ``tie`` note says so.  Passes go up in length until none switches: a
    switched bucket shares a row with a neighbour, which then never switches away from it, so
    each bucket switches at most once.  Returns a new list in the same order."""
    out = list(choices)
    for batch in sorted({c.batch for c in out}):
        order = sorted((i for i, c in enumerate(out) if c.batch == batch), key=lambda i: out[i].max_context_len)
        while _settle(out, order):
            pass
    return out
