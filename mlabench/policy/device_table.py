"""Split policies: which ``num_kv_splits`` a request of a given context length gets, per batch size.

A :class:`SplitPolicy` holds, per tuned batch size, a list of ``(max_context_len, num_kv_splits)``
rows sorted by ``max_context_len``.  Lookup (the rule of the ``tune`` command's policy exports):

- batch: the rows of the largest tuned batch size <= the batch asked for (the smallest if none is);
- context length L: the first row with ``L <= max_context_len``; past the last row, the last row.

:func:`load_split_policy` reads two JSON layouts:

- the ``tune`` command's policy file (:func:`mlabench.policy.tuned.load_policy`; its other tuned
  parameters are ignored here, and an entry whose count follows the length, ``tokens_per_split``
  or ``tile_tokens``, becomes one row per run of lengths with one count,
  :func:`mlabench.policy.tuned.split_count_rows`);
- a minimal one written by hand or by ``graph-check``: ``{"num_kv_splits": {"<batch>":
  [[max_context_len, splits], ...]}}``, or a bare list ``[[max_context_len, splits], ...]`` that
  applies to every batch size.

:meth:`SplitPolicy.device_table` lays one batch size's rows out as the int32 table the split-KV
kernel looks each request up in (:mod:`mlabench.kernels.splitkv`), so that one captured CUDA graph
picks the right count at every length; a run of rows that one tokens-per-split rule reproduces
becomes one row there (:func:`rule_rows`; :func:`table_splits` is the kernels' lookup on the host).
:func:`heuristic_policy` writes vLLM's Triton MLA heuristic as such a table.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mlabench.errors import ConfigError
from mlabench.files import read_json
from mlabench.policy.rules import MAX_KV_SPLITS, MAX_POLICY_ROWS, policy_too_long

#: The largest ``max_context_len`` an int32 table row can hold; the padding rows of
#: :meth:`SplitPolicy.device_table` use it so that every length finds a row.
INT32_MAX = 2**31 - 1

Rows = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class SplitPolicy:
    """``num_kv_splits`` per (batch size, context bucket).

    ``tables`` maps a tuned batch size to its rows ``((max_context_len, num_kv_splits), ...)``,
    strictly increasing in ``max_context_len``; ``source`` says where it came from (a path or
    ``"vllm heuristic"``).  Build it with :meth:`create` (which validates) or a loader.
    """

    tables: dict[int, Rows]
    source: str = ""

    @classmethod
    def create(cls, tables: dict[int, Iterable[Sequence[int]]], source: str = "") -> SplitPolicy:
        """Validate and build.  Raises :class:`ConfigError` for no batch sizes, a batch size < 1, an
        empty table, one of more than :data:`~mlabench.policy.rules.MAX_POLICY_ROWS` rows (counted
        before any is read), lengths that do not increase strictly, or a split count outside 1..512."""
        if not tables:
            raise ConfigError(f"{source or 'split policy'}: no batch sizes")
        clean: dict[int, Rows] = {}
        for batch, rows in sorted(tables.items()):
            where = f"{source or 'split policy'}: batch {batch}"
            if int(batch) < 1:
                raise ConfigError(f"{where}: batch sizes must be >= 1")
            if isinstance(rows, Sized) and len(rows) > MAX_POLICY_ROWS:
                raise ConfigError(f"{where}: {policy_too_long('rows', len(rows))}")
            try:
                pairs = tuple((int(n), int(s)) for n, s in rows)
            except (TypeError, ValueError):
                raise ConfigError(f"{where}: rows must be [max_context_len, num_kv_splits] "
                                  "pairs of integers") from None
            lens = [n for n, _ in pairs]
            if not pairs:
                raise ConfigError(f"{where}: no rows (give at least one [max_context_len, num_kv_splits] pair)")
            if lens != sorted(set(lens)) or lens[0] < 1:
                raise ConfigError(f"{where}: max_context_len must be >= 1 and increase strictly, "
                                  f"got {lens}")
            if any(not 1 <= s <= MAX_KV_SPLITS for _, s in pairs):
                raise ConfigError(f"{where}: num_kv_splits must be in 1..{MAX_KV_SPLITS}")
            clean[int(batch)] = pairs
        return cls(clean, source)

    def rows_for(self, batch: int) -> Rows:
        """The rows of the largest tuned batch size <= ``batch`` (the smallest when none is)."""
        sizes = sorted(self.tables)
        chosen = sizes[0]
        for size in sizes:
            if size <= batch:
                chosen = size
        return self.tables[chosen]

    def lookup(self, batch: int, context_len: int) -> int:
        """``num_kv_splits`` for a request of ``context_len`` tokens in a batch of ``batch``."""
        rows = self.rows_for(batch)
        for max_len, splits in rows:
            if context_len <= max_len:
                return splits
        return rows[-1][1]

    def max_splits(self, batch: int) -> int:
        """The most splits any request of a ``batch``-request step can get."""
        return max(s for _, s in self.rows_for(batch))

    def device_table(self, batch: int, device: torch.device | str) -> torch.Tensor:
        """The rows of ``batch`` as an int32 ``[R, 2]`` tensor on ``device``, ``R`` a power of two.

        Rows are ``(max_context_len, num_kv_splits)``, each run of rows one tokens-per-split rule
        reproduces written as one row ``(max_context_len, -tokens_per_split)`` (:func:`rule_rows`);
        padding rows repeat the last count (never a rule) with ``max_context_len = 2**31 - 1``.  The
        kernels' rule (:func:`table_splits`: first row with ``L <= max_context_len``, else the last
        row; a negative count -t is ``ceil(L / t)``; then clamped to ``[1, cap]``) gives what
        :meth:`lookup` gives at every length, for any ``cap >= max_splits(batch)``.  Why: every
        program loads the whole table, and on an H200 the rule policy's 512-row table at batch 1
        ran 1.0-1.7 µs a call slower than a 12-row one choosing the same counts (at 1K, 4K and 8K
        tokens: ``results/h200/deploy/qo1-k3/rule/graph_check_device.md``).
        """
        rows = rule_rows(self.rows_for(batch))
        size = 1 << (len(rows) - 1).bit_length()
        rows += [(INT32_MAX, rows[-1][1])] * (size - len(rows))
        return torch.tensor(rows, dtype=torch.int32, device=device)

    def to_json(self) -> str:
        """The minimal JSON layout (``{"num_kv_splits": {"<batch>": [[max_len, splits], ...]}}``)."""
        body = {str(b): [list(r) for r in rows] for b, rows in self.tables.items()}
        return json.dumps({"num_kv_splits": body}, indent=1) + "\n"


def rule_rows(rows: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """``rows`` with each run of two or more consecutive rows that one rule ``ceil(L / t)`` gives
    exactly at every length of (from the row before's ``max_context_len + 1``, or 1) written as one
    row ``(the run's last max_context_len, -t)``; ``t`` is the step between a run's first two
    lengths, whose counts differ by one.  The last row stays a count: past it the lookup keeps
    that count, where a rule would keep growing."""
    out, i, last = [], 0, len(rows) - 1
    while i < last:
        end, t = _rule_run(rows, i, last)
        out.append((rows[end][0], -t) if end > i else tuple(rows[i]))
        i = end + 1
    return out + [tuple(r) for r in rows[i:]]


def _rule_run(rows: Sequence[tuple[int, int]], i: int, last: int) -> tuple[int, int]:
    """``(end, t)``: the last row before ``last`` of the run from row ``i`` that ``ceil(L / t)``
    gives exactly (``end == i``: no run)."""
    if i + 1 >= last or rows[i + 1][1] != rows[i][1] + 1:
        return i, 0
    t, end = rows[i + 1][0] - rows[i][0], i - 1
    while end + 1 < last:
        lo = rows[end][0] + 1 if end >= 0 else 1
        max_len, count = rows[end + 1]
        if not -(-lo // t) == count == -(-max_len // t):
            break
        end += 1
    return max(end, i), t


def table_splits(table: torch.Tensor, context_lens: torch.Tensor, cap: int) -> torch.Tensor:
    """The split count the kernels' lookup (:func:`mlabench.kernels.common.policy_splits`,
    :func:`mlabench.kernels.gluon_blocks.lookup_splits`) reads from a :meth:`SplitPolicy.device_table`
    for each of ``context_lens`` (int64, any shape) with ``cap`` as the call's ``num_kv_splits``:
    the first row with ``L <= max_context_len``, else the last; a negative count -t gives
    ``ceil(L / t)``; clamped to ``[1, cap]``.  On the host, for tests."""
    table = table.to("cpu", torch.int64)
    first = torch.searchsorted(table[:, 0].contiguous(), context_lens, side="left")
    chosen = table[:, 1][first.clamp(max=table.shape[0] - 1)]
    per_split = (-chosen).clamp(min=1)
    chosen = torch.where(chosen < 0, -(-context_lens // per_split), chosen)
    return chosen.clamp(1, cap)


def heuristic_policy(num_sms: int = 132, max_splits: int = MAX_KV_SPLITS) -> SplitPolicy:
    """vLLM's Triton MLA heuristic ``min(next_pow2(L // 512), 2 * num_SMs)`` (at least 1) as rows.

    The count ``2**k`` is chosen for ``L // 512`` in ``(2**(k-1), 2**k]``, i.e. up to
    ``L = 512 * (2**k + 1) - 1`` tokens; the same for every batch size (the heuristic ignores it).
    Source: vLLM ``triton_mla.py``; :func:`mlabench.policy.heuristics.vllm_triton_splits` is the
    same rule on the longest context of a batch.
    """
    cap = max(1, min(2 * num_sms, max_splits))
    rows, k = [], 0
    while (1 << k) < cap:
        rows.append((512 * ((1 << k) + 1) - 1, 1 << k))
        k += 1
    rows.append((INT32_MAX, cap))
    return SplitPolicy.create({1: rows}, source="vllm heuristic")


def load_split_policy(path: str | Path) -> SplitPolicy:
    """Read a split policy JSON (either layout of the module docstring).

    Raises :class:`ConfigError` with one line for a missing file, malformed JSON or a bad layout.
    """
    p = Path(path)
    data = read_json(p, "split policy")
    return SplitPolicy.create(_tables_of(data, p), source=str(p))


def _tables_of(data: Any, path: Path) -> dict[int, Any]:
    """``{batch: rows}`` from either JSON layout; ConfigError naming ``path`` otherwise."""
    if isinstance(data, list):
        return {1: data}
    if isinstance(data, dict) and isinstance(data.get("num_kv_splits"), dict):
        try:
            return {int(b): rows for b, rows in data["num_kv_splits"].items()}
        except ValueError:
            raise ConfigError(f"{path}: num_kv_splits keys must be batch sizes") from None
    if isinstance(data, dict) and "batches" in data:  # the tune command's policy
        from mlabench.policy.tuned import load_policy, split_count_rows

        policy = load_policy(path)  # its schema and one-line errors
        if "num_kv_splits" not in policy.param_names:
            raise ConfigError(f"{path}: a tune policy without num_kv_splits (tuned for "
                              f"{policy.backend}, parameters {', '.join(policy.param_names)})")
        return {b.batch: split_count_rows(b.entries) for b in policy.batches}
    raise ConfigError(f"{path}: expected {{\"num_kv_splits\": {{batch: [[max_len, splits], ...]}}}}, "
                      "a list of [max_len, splits], or a tune policy file")


#: The two policy modes of a backend's ``split_policy`` parameter (:data:`mlabench.backends.shared.SPLIT_POLICY`):
#: ``host`` (one count chosen on the host, frozen by a graph capture) and ``device`` (each request's
#: count looked up in device memory).
POLICY_MODES = ("host", "device")


def parse_split_policy(text: str, num_sms: int) -> tuple[str, SplitPolicy | None]:
    """``(mode, policy)`` of a ``split_policy`` parameter value (:data:`mlabench.backends.shared.SPLIT_POLICY`): ``("fixed", None)`` for ``""``, else
    ``("host" | "device", policy)`` read from the file after the colon, or vLLM's heuristic for
    ``num_sms`` SMs when there is none.  Raises :class:`ConfigError` for another mode or a bad file."""
    if not text:
        return "fixed", None
    mode, _, path = text.partition(":")
    if mode not in POLICY_MODES:
        raise ConfigError(f"split_policy must be empty, 'host[:FILE]' or 'device[:FILE]', got {text!r}")
    return mode, load_split_policy(path) if path else heuristic_policy(num_sms)
