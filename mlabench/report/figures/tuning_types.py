"""The numbers of the tuning figures, as types: a study and its choice, its trials and history, a
policy's split counts as steps, a rule's regret on held-out lengths (:mod:`.tuning_data` computes them
from runs; :mod:`.draw_tuning` draws them).  Plain data, importing nothing of the tuner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Study:
    """One study's bucket ``(lo, hi]`` (tokens) at one batch size, measured at ``length`` tokens
    (of a study measured at several lengths, the one shown: :func:`~mlabench.report.figures.tuning_data.studies_of`)."""

    batch: int
    lo: int
    hi: int
    length: int

    @property
    def bucket(self) -> str:
        """``1-1024``: the context lengths the study covers."""
        return f"{self.lo + 1}-{self.hi}"


@dataclass
class StudyChoice:
    """What one study measured and chose (µs per call; None where nothing correct was measured).

    ``speedup`` = best heuristic µs / chosen µs (above 1: the tuned choice is faster).
    """

    study: Study
    configs: int
    ok: int
    chosen: dict[str, Any] | None
    chosen_us: float | None
    fastest: dict[str, Any] | None
    fastest_us: float | None
    best_heuristic: str | None = None
    heuristic: dict[str, Any] | None = None
    heuristic_us: float | None = None

    @property
    def speedup(self) -> float | None:
        """Best heuristic's µs / the chosen configuration's µs."""
        return self.heuristic_us / self.chosen_us if self.heuristic_us and self.chosen_us else None


@dataclass
class Trial:
    """One configuration measured by a study, in the order measured (``order`` from 1).

    ``median_us`` None: not correct or failed (``status`` says which; the study pruned it).
    ``heuristics``: the public heuristics whose choice this configuration is.
    """

    order: int
    params: dict[str, Any]
    median_us: float | None
    status: str
    best_so_far_us: float | None
    heuristics: list[str] = field(default_factory=list)
    chosen: bool = False


@dataclass
class StudyHistory:
    """A study's optimisation history; ``chosen_us`` is the policy's choice (None without a policy)."""

    study: Study
    trials: list[Trial]
    chosen: dict[str, Any] | None = None
    chosen_us: float | None = None
    chosen_rule: str | None = None


@dataclass
class SplitSteps:
    """A split-count rule as a step function: ``splits[i]`` tokens from ``lengths[i]`` to the next length."""

    name: str
    lengths: list[int]
    splits: list[int]


@dataclass
class PolicySteps:
    """One batch size of figure (f), first part: the policy and each heuristic against the context
    length, the tuned buckets' upper edges, each study's fastest split count at its measured length,
    and the fastest of the split ladder at each held-out length of a validation of this policy."""

    batch: int
    policy: SplitSteps
    heuristics: list[SplitSteps]
    edges: list[int]
    fastest: list[tuple[int, int]]
    held_out_best: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class RegretCurve:
    """One rule's regret over the held-out lengths of one batch size: ``100 * (µs / best µs - 1)``
    (None where it failed), with the split count it ran and its worst and geometric-mean regret."""

    name: str
    lengths: list[int]
    regret_pct: list[float | None]
    splits: list[int | None]
    worst_pct: float | None
    geomean_pct: float | None


@dataclass
class RegretPanel:
    """Figure (f), regret part, one batch size: the policy's curve and each heuristic's."""

    batch: int
    policy: RegretCurve
    heuristics: list[RegretCurve]
    edges: list[int]


def same_as_policy(panels: list[RegretPanel]) -> dict[str, tuple[int, int]]:
    """Per heuristic, at how many held-out points of all ``panels`` its regret is the policy's (the
    same time: its point lies on the policy's), and at how many both have one."""
    out: dict[str, tuple[int, int]] = {}
    for p in panels:
        for h in p.heuristics:
            pairs = [(a, b) for a, b in zip(p.policy.regret_pct, h.regret_pct) if a is not None and b is not None]
            same, total = out.get(h.name, (0, 0))
            out[h.name] = (same + sum(math.isclose(a, b, abs_tol=1e-9) for a, b in pairs), total + len(pairs))
    return out

