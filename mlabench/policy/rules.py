"""The split-count rules a policy entry can hold, and the one cap on a split count.

A policy entry gives a fixed ``num_kv_splits``, or a rule in the context length L: one split per
``tokens_per_split`` tokens (:func:`rule_splits`), or the fewest splits of whole tiles
(:func:`whole_tile_splits`), each at most the entry's ``num_kv_splits``.
"""

from __future__ import annotations

#: The most KV splits of one request any backend here launches and any policy may choose: the one
#: cap (the split-KV backends' ``num_kv_splits`` range, a policy table's counts).
MAX_KV_SPLITS = 512

#: The most rows (context buckets) of one batch size's split policy table, or entries of a tuned
#: policy's batch size.  The split-KV kernels hold a batch size's whole table in registers
#: (``split_policy=device``; Gluon: every warp the whole table): a 2,000,000-row table failed to
#: compile after 90 s (past Triton's largest tensor, 2**20 elements).  The committed whole-tile
#: policies, the longest, have 677-700 rows; 4096 leaves room and still compiles.
MAX_POLICY_ROWS = 4096


def policy_too_long(what: str, count: int) -> str:
    """The one-line refusal of a policy table of ``count`` rows or entries (``what``) over
    :data:`MAX_POLICY_ROWS`."""
    return (f"{count} {what}, more than the {MAX_POLICY_ROWS} a split policy table may hold (the split-KV "
            "kernels hold a batch size's whole table in registers): merge neighbouring buckets")


def rule_splits(context_len: int, tokens_per_split: int, max_splits: int) -> int:
    """``clamp(ceil(context_len / tokens_per_split), 1, max_splits)``: the split count of a
    tokens-per-split entry for a request of ``context_len`` tokens (the count grows with the
    length, one split per ``tokens_per_split`` tokens, up to ``max_splits``)."""
    return max(1, min(int(max_splits), -(-int(context_len) // int(tokens_per_split))))


def whole_tile_splits(context_len: int, tile_tokens: int, max_splits: int) -> int:
    """The whole-tile rule: the fewest splits of whole ``tile_tokens``-token tiles, at most
    ``max_splits`` of them, for a request of ``context_len`` tokens (< 1 counts as 1).

    ``k = ceil(L / (g n))`` tiles per split is the fewest that fit in ``n`` splits; ``ceil(L / (g
    k))`` is then the fewest splits that carry ``k`` tiles each (so at most ``n``).  E.g. g = 32,
    n = 132: 1026 tokens -> 33 splits of 1 tile, 15898 -> 125 splits of 4 tiles, 24242 -> 127
    of 6.  Why: a split's time steps with its tiles (a kernel walks a split tile by tile), and
    on an H200 the fastest count at batch 1 below 32K was the one giving the fewest 32-token
    tiles per split within about one program per SM (15898 tokens: 128 splits of 4 tiles beat 249
    of 2 by 12% and a fixed 112, 5 tiles, by 11%); the best tiles per split change inside a
    context bucket, which neither a fixed count nor ``clamp(ceil(L / t), 1, n)`` follows (see
    docs/tuning.md, "On the H200").  A kernel that rounds a split's length up to a multiple of
    the tile (or of a divisor of it, as ``triton-splitkv``'s 16 tokens) then gives every split at
    most ``k`` tiles.
    """
    length, per_split = max(1, int(context_len)), int(tile_tokens) * max(1, int(max_splits))
    tiles = -(-length // per_split)
    return -(-length // (int(tile_tokens) * tiles))
