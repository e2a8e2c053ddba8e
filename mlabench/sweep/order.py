"""The order in which a sweep measures its points (``--order``).

- ``grid``: shape by shape (heads, batch, context as configured), and within a shape backend by
  backend, parameters in grid order.
- ``shuffled``: every point in a seeded random order, shapes mixed.  A slow phase of the GPU lands
  on random points; each shape's inputs are kept while memory allows (the runner's cache).
- ``interleaved`` (the default): shape by shape, and within a shape each backend's points spread
  evenly over the shape's turn (position ``(i + 1/2) / n`` for the ``i``-th of a backend's ``n``
  points, ties broken at random) with its parameters in a seeded random order.

Why ``interleaved`` is the default: the comparisons people and the tuner make (the best split count
of a bucket, one backend against another at one shape) are between points of one shape, so those
points are measured within seconds of each other, and a slow phase inside that span falls on every
backend and on both ends of the split ladder instead of on the backend or the split counts that
come first; each shape's inputs are built once.  ``shuffled`` spreads a slow phase over the whole
sweep instead, at the price of comparing points of one shape measured minutes apart.

The seed is part of the recorded sweep configuration, so a resumed run keeps its order.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from typing import Literal, Protocol, TypeVar

Order = Literal["grid", "shuffled", "interleaved"]
ORDERS: tuple[str, ...] = ("grid", "shuffled", "interleaved")
DEFAULT_ORDER: Order = "interleaved"


class _HasShapeAndBackend(Protocol):
    @property
    def shape(self) -> Hashable: ...

    @property
    def backend(self) -> str: ...


P = TypeVar("P", bound=_HasShapeAndBackend)


def order_points(points: Sequence[P], order: Order, seed: int) -> list[P]:
    """``points`` (in grid order) in the measuring order ``order``; the same seed gives the same order.

    Raises ValueError for an unknown order.
    """
    if order == "grid":
        return list(points)
    rng = random.Random(seed)
    if order == "shuffled":
        out = list(points)
        rng.shuffle(out)
        return out
    if order != "interleaved":
        raise ValueError(f"unknown order {order!r} (choose from {', '.join(ORDERS)})")
    by_shape: dict[Hashable, list[P]] = {}
    for p in points:
        by_shape.setdefault(p.shape, []).append(p)
    return [p for group in by_shape.values() for p in _interleave(group, rng)]


def _interleave(points: list[P], rng: random.Random) -> list[P]:
    """Each backend's points (shuffled) spread evenly over the list, backends taking turns."""
    by_backend: dict[str, list[P]] = {}
    for p in points:
        by_backend.setdefault(p.backend, []).append(p)
    placed: list[tuple[float, float, P]] = []
    for group in by_backend.values():
        rng.shuffle(group)
        placed += [((i + 0.5) / len(group), rng.random(), p) for i, p in enumerate(group)]
    placed.sort(key=lambda t: (t[0], t[1]))
    return [p for _, _, p in placed]
