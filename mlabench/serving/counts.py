"""Counts given per concurrency: ``[bench] num_prompts`` and ``num_warmups`` take one number or a
table keyed by concurrency (``{ 1 = 3, 16 = 16 }``).  The table's shape check and its text in
words, shared by both fields of :class:`mlabench.serving.config.BenchParams`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def count_table(value: Any, name: str, what: str, example: str) -> Any:
    """``value`` of the count field ``name`` (e.g. ``num_prompts``) checked for shape: None or an
    int passes as it is, a table keyed by concurrency comes back with int keys (TOML and JSON keys
    are strings: ``{"16": 16}`` becomes ``{16: 16}``).  Raises ValueError naming ``what`` is
    counted (``prompt``) and an ``example`` table for anything else (a bool, a key that is not an
    integer, a count that is not an int); the range of the counts is checked after this."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, dict):
        try:
            table = {int(k): n for k, n in value.items()}
        except (TypeError, ValueError):
            raise ValueError(f"the keys of a {name} table are concurrencies (integers), not "
                             f"{[str(k) for k in value]}") from None
        if all(isinstance(n, int) and not isinstance(n, bool) for n in table.values()):
            return table
    raise ValueError(f"must be a {what} count or a table of them keyed by concurrency "
                     f"(e.g. {example}), not {value!r}")


def unrun_count_keys(bench: dict[str, Any], runs: list[int], where: str, why: str,
                     declared: Iterable[int] = ()) -> None:
    """Raise ValueError when the ``num_prompts`` or ``num_warmups`` table in ``bench`` (validated
    bench fields: ``[bench]``'s, or those a variant overrides) is keyed by a concurrency outside
    ``runs``, the concurrencies it applies to, and outside ``declared``, those the config file
    names (``serve-bench -c 16`` runs a subset of them: their keys are then unused, not typos);
    the message says ``bench.<field>``, then ``where`` (`` (variant 'b')``) and ``why`` those keys
    are not run.  A table that leaves out a concurrency run passes (``num_warmups`` then gives 1;
    ``num_prompts`` is checked for that elsewhere)."""
    for name in ("num_prompts", "num_warmups"):
        table = bench.get(name)
        extra = sorted(set(table) - set(runs) - set(declared)) if isinstance(table, dict) else []
        if extra:
            raise ValueError(f"bench.{name}{where} has concurrencies {extra} that {why} (concurrencies "
                             f"run: {runs}): key it by those only")


def counts_text(counts: dict[int, int | None], noun: str = "") -> str:
    """A count per concurrency in words: ``3`` + ``noun`` when every concurrency gets the same,
    else ``3<noun> at c=1, 16 at c=16`` (concurrencies in the order given; ``noun`` e.g.
    ``" warm-up"``, on the first count only)."""
    values = list(counts.values())
    if len(set(values)) <= 1:
        return f"{values[0] if values else ''}{noun}"
    return ", ".join(f"{n}{noun if i == 0 else ''} at c={c}" for i, (c, n) in enumerate(counts.items()))
