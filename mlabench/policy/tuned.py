"""The split policy a kernel library can ship, and its three exports from one object.

A :class:`Policy` answers "which ``num_kv_splits`` (and launch parameters) for this batch size and
context length": per tuned batch size, a list of :class:`PolicyEntry` sorted by
``max_context_len``.  Lookup (the same rule in all three exports):

- batch: the largest tuned batch size <= the batch asked for (the smallest one if none is);
- context length L: the first entry with ``L <= max_context_len``; past the last entry, the last;
- the entry's parameters; an entry with ``tokens_per_split`` t scales the count with the length:
  ``num_kv_splits = clamp(ceil(L / t), 1, its num_kv_splits)`` (:func:`rule_splits`); an entry
  with ``tile_tokens`` g launches the fewest splits of whole g-token tiles that fit in its
  ``num_kv_splits`` n: ``k = ceil(L / (g n))`` tiles per split, ``ceil(L / (g k))`` splits
  (:func:`whole_tile_splits`).

Exports: JSON with a versioned schema (:meth:`Policy.to_json` / :func:`load_policy`, which also
reads version 1, written before ``tokens_per_split``, and version 2, before ``tile_tokens``), a
C++17 header with a ``constexpr`` table
and lookup (:func:`to_cpp_header`) and a standalone Python module (:func:`to_python_module`).
See ``docs/tuning.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer, model_validator

from mlabench.errors import ConfigError
from mlabench.files import file_error_line, key_path, read_json
from mlabench.policy.rules import MAX_KV_SPLITS, MAX_POLICY_ROWS, policy_too_long, rule_splits, whole_tile_splits

#: Version 2 added ``tokens_per_split`` to an entry, version 3 ``tile_tokens``; :func:`load_policy`
#: still reads versions 1 and 2 (neither field means a fixed count, as it always did).
POLICY_SCHEMA_VERSION = 3
READABLE_SCHEMA_VERSIONS = (1, 2, 3)


class PolicyEntry(BaseModel):
    """One context bucket's choice: every tuned parameter (``num_kv_splits`` and launch params),
    and optionally a split count that follows the length: ``tokens_per_split`` or ``tile_tokens``
    (not both)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_context_len: int = Field(gt=0, description="Longest context length (tokens) this entry covers.")
    params: dict[str, int | str] = Field(description="Backend parameters to launch with; with "
                                         "tokens_per_split or tile_tokens, num_kv_splits is the most splits.")
    tokens_per_split: int | None = Field(None, gt=0, description="None: num_kv_splits is the count. Set: "
                                         "num_kv_splits = clamp(ceil(L / tokens_per_split), 1, "
                                         "params.num_kv_splits) for a request of L tokens.")
    tile_tokens: int | None = Field(None, gt=0, description="None: num_kv_splits is the count. Set (g, "
                                    "with n = params.num_kv_splits): k = ceil(L / (g n)) tiles of g tokens "
                                    "per split, num_kv_splits = ceil(L / (g k)) for a request of L tokens.")

    @model_validator(mode="after")
    def _rule_needs_splits(self) -> PolicyEntry:
        if self.tokens_per_split is not None and self.tile_tokens is not None:
            raise ValueError("tokens_per_split and tile_tokens exclude each other")
        for name in ("tokens_per_split", "tile_tokens"):
            if getattr(self, name) is not None and not isinstance(self.params.get("num_kv_splits"), int):
                raise ValueError(f"{name} needs an integer num_kv_splits")
        splits = self.params.get("num_kv_splits")
        if splits is not None and (isinstance(splits, bool) or not isinstance(splits, int)
                                   or not 1 <= splits <= MAX_KV_SPLITS):
            raise ValueError(f"num_kv_splits must be an integer in 1..{MAX_KV_SPLITS}, got {splits!r}")
        return self

    @model_serializer(mode="wrap")
    def _omit_fixed(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        for name in ("tokens_per_split", "tile_tokens"):
            if data.get(name) is None:
                data.pop(name, None)
        return data

    def describe(self) -> str:
        """The entry's parameters as ``name=value`` words, a rule as ``num_kv_splits=min(ceil(L/t),n)``
        or ``num_kv_splits=tiles(L,g,n)`` (:func:`describe_choice`)."""
        return describe_choice(self.params, self.tokens_per_split, self.tile_tokens)

    def same_choice(self, other: PolicyEntry) -> bool:
        """Whether ``other`` launches the same at every length (its bucket aside)."""
        return (self.params, self.tokens_per_split, self.tile_tokens) == (
            other.params, other.tokens_per_split, other.tile_tokens)


#: How :func:`describe_choice` writes a whole-tile entry, for notes under tables.
TILES_NOTATION = ("tiles(L,g,n): the fewest splits of whole g-token tiles, at most n: k = ceil(L/(g*n)) "
                  "tiles per split, ceil(L/(g*k)) splits")


def describe_choice(params: dict[str, Any], tokens_per_split: int | None = None,
                    tile_tokens: int | None = None) -> str:
    """``params`` as ``name=value`` words (empty values, e.g. no ``split_policy`` file, left out);
    with ``tokens_per_split`` t, ``num_kv_splits`` reads ``min(ceil(L/t),n)``; with ``tile_tokens``
    g, ``tiles(L,g,n)`` (:data:`TILES_NOTATION`; for tables a person reads)."""
    def word(name: str, value: Any) -> str:
        if name == "num_kv_splits" and tile_tokens:
            return f"{name}=tiles(L,{tile_tokens},{value})"
        if name == "num_kv_splits" and tokens_per_split:
            return f"{name}=min(ceil(L/{tokens_per_split}),{value})"
        return f"{name}={value}"

    return " ".join(word(k, v) for k, v in params.items() if v != "")


class BatchPolicy(BaseModel):
    """The entries of one tuned batch size, sorted by ``max_context_len``."""

    model_config = ConfigDict(extra="forbid")

    batch: int = Field(gt=0, description="Requests per decode step this table was tuned for.")
    entries: list[PolicyEntry] = Field(min_length=1, description="Sorted by max_context_len, no repeats.")

    @model_validator(mode="after")
    def _sorted(self) -> BatchPolicy:
        lens = [e.max_context_len for e in self.entries]
        if lens != sorted(set(lens)):
            raise ValueError(f"max_context_len must increase strictly from entry to entry, got {lens}")
        return self


class Policy(BaseModel):
    """A split policy for one backend and one decode shape (heads, page size, dtypes), per batch."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = Field(POLICY_SCHEMA_VERSION, description="Version of this JSON layout.")
    backend: str = Field(description="Backend the policy was tuned for.")
    shape: dict[str, Any] = Field(description="num_heads, page_size, q_dtype, kv_dtype, kv_lora_rank, qk_rope_head_dim, softmax_scale; qo_len and causal for several query tokens.")
    device: str = Field(description="GPU (or CPU) model the measurements ran on.")
    versions: dict[str, str | None] = Field(default_factory=dict, description="Library versions of the measuring run.")
    param_names: list[str] = Field(description="Parameters every entry sets, in the backend's order.")
    batches: list[BatchPolicy] = Field(min_length=1, description="Sorted by batch, no repeats.")
    source: dict[str, Any] = Field(default_factory=dict, description="Run id, studies, noise tolerance, creation time.")

    @model_validator(mode="after")
    def _consistent(self) -> Policy:
        if self.schema_version != POLICY_SCHEMA_VERSION:
            raise ValueError(f"schema_version {self.schema_version} is not {POLICY_SCHEMA_VERSION}")
        sizes = [b.batch for b in self.batches]
        if sizes != sorted(set(sizes)):
            raise ValueError(f"batches must increase strictly, got {sizes}")
        for b in self.batches:
            for e in b.entries:
                if sorted(e.params) != sorted(self.param_names):
                    raise ValueError(f"batch {b.batch} entry {e.max_context_len}: params "
                                     f"{sorted(e.params)} differ from param_names {self.param_names}")
        return self

    def rows(self) -> list[tuple[int, list[tuple[int, dict[str, Any], int | None, int | None]]]]:
        """Plain data for :func:`lookup_rows`: ``[(batch, [(max_context_len, params,
        tokens_per_split, tile_tokens), ...]), ...]``."""
        return [(b.batch, [(e.max_context_len, dict(e.params), e.tokens_per_split, e.tile_tokens)
                           for e in b.entries]) for b in self.batches]

    def entry(self, batch: int, context_len: int) -> PolicyEntry:
        """The entry :meth:`lookup` takes its parameters from (the same batch and length rule)."""
        table = next((b for b in reversed(self.batches) if b.batch <= batch), self.batches[0]).entries
        return next((e for e in table if context_len <= e.max_context_len), table[-1])

    def lookup(self, batch: int, context_len: int) -> dict[str, Any]:
        """The parameters for ``batch`` requests of ``context_len`` tokens (module docstring rule).

        Raises ValueError for a batch or length < 1.
        """
        return lookup_rows(self.rows(), batch, context_len)

    def to_json(self) -> str:
        """The policy as indented JSON (``schema_version`` first), newline-terminated."""
        return self.model_dump_json(indent=2) + "\n"


def lookup_rows(rows, batch, context_len):
    """The policy lookup on plain data; its source (with :func:`rule_splits` and
    :func:`whole_tile_splits`) is copied verbatim into the Python export.

    ``rows``: ``[(batch, [(max_context_len, params, tokens_per_split, tile_tokens), ...]), ...]``,
    both levels sorted ascending.  Returns a new ``params`` dict, whose ``num_kv_splits`` is
    :func:`rule_splits` of it when ``tokens_per_split`` is set, :func:`whole_tile_splits` when
    ``tile_tokens`` is.  Raises ValueError for a batch or length < 1.
    """
    if batch < 1 or context_len < 1:
        raise ValueError(f"batch and context_len must be >= 1, got {batch}, {context_len}")
    entries = rows[0][1]
    for size, table in rows:
        if size <= batch:
            entries = table
    chosen = entries[-1]
    for entry in entries:
        if context_len <= entry[0]:
            chosen = entry
            break
    _max_len, params, tokens_per_split, tile_tokens = chosen
    params = dict(params)
    if tokens_per_split:
        params["num_kv_splits"] = rule_splits(context_len, tokens_per_split, params["num_kv_splits"])
    elif tile_tokens:
        params["num_kv_splits"] = whole_tile_splits(context_len, tile_tokens, params["num_kv_splits"])
    return params


def merge_adjacent(entries: list[PolicyEntry]) -> list[PolicyEntry]:
    """Merge runs of adjacent entries with equal params (and rule) into the run's
    last (largest) bucket.

    ``entries`` must be sorted by ``max_context_len``; the result covers the same lengths.
    """
    out: list[PolicyEntry] = []
    for entry in entries:
        if out and out[-1].same_choice(entry):
            out[-1] = entry
        else:
            out.append(entry)
    return out


def split_count_rows(entries: list[PolicyEntry]) -> list[tuple[int, int]]:
    """``(max_context_len, num_kv_splits)`` rows giving, under the same lookup rule (first row
    with ``L <= max_context_len``, else the last), the count :func:`lookup_rows` gives at every
    length: a tokens-per-split entry becomes one row per count it takes (at most its
    ``num_kv_splits`` rows; the last entry's rows go on until its count reaches that cap); a
    whole-tile entry one row per run of lengths with one count (:func:`whole_tile_rows`).  Past the
    last entry's ``max_context_len``, a last whole-tile entry's table keeps its count there (the
    rule changes at every tile boundary, forever, which no finite table holds); up to it, the
    rows give the lookup's count exactly.

    ``entries``: one batch size's, sorted.  For tables that hold only counts (e.g. the split-KV
    kernel's policy table in device memory).
    """
    rows: list[tuple[int, int]] = []
    prev = 0
    for i, e in enumerate(entries):
        cap, t = int(e.params["num_kv_splits"]), e.tokens_per_split
        if e.tile_tokens is not None:
            rows += whole_tile_rows(prev + 1, e.max_context_len, e.tile_tokens, cap)
        elif t is None:
            rows.append((e.max_context_len, cap))
        else:
            hi = e.max_context_len if i < len(entries) - 1 else max(e.max_context_len, (cap - 1) * t + 1)
            k = rule_splits(prev + 1, t, cap)
            while k < cap and k * t < hi:
                rows.append((k * t, k))
                k += 1
            rows.append((hi, rule_splits(hi, t, cap)))
        prev = e.max_context_len
    return [r for j, r in enumerate(rows) if j + 1 == len(rows) or rows[j + 1][1] != r[1]]


def whole_tile_rows(lo: int, hi: int, tile_tokens: int, max_splits: int) -> list[tuple[int, int]]:
    """``(last length, num_kv_splits)`` of each run of lengths ``lo..hi`` with one
    :func:`whole_tile_splits` count: a run ends where the tiles per split grow (a multiple of
    ``tile_tokens x max_splits``) or the splits fill up (a multiple of ``tile_tokens x tiles``)."""
    rows, length, g, n = [], lo, int(tile_tokens), max(1, int(max_splits))
    while length <= hi:
        tiles = -(-length // (g * n))
        splits = -(-length // (g * tiles))
        end = min(hi, splits * g * tiles, tiles * g * n)
        rows.append((end, splits))
        length = end + 1
    return rows


def load_policy(path: str | Path) -> Policy:
    """Read a policy JSON of schema version 3, or of version 1 or 2 (without the rules that came
    later; read as version 3); :class:`ConfigError` with one line for a missing file or a bad schema."""
    p = Path(path)
    data = read_json(p, "policy")
    if isinstance(data, dict) and data.get("schema_version") not in (None, *READABLE_SCHEMA_VERSIONS):
        raise ConfigError(f"{p}: policy schema_version {data.get('schema_version')} is not one of "
                          f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))} (written by another mlabench)")
    if isinstance(data, dict) and data.get("schema_version") in (1, 2):
        data = {**data, "schema_version": POLICY_SCHEMA_VERSION}  # they lack only later optional fields
    _refuse_long_tables(p, data)
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{p}: {file_error_line(exc, data, lambda path: policy_place(path, data))}") from None


def _refuse_long_tables(path: Path, data: Any) -> None:
    """ConfigError for a batch size of more than :data:`~mlabench.policy.rules.MAX_POLICY_ROWS`
    entries, counted before they are validated (2,000,000 entries would take minutes)."""
    batches = data.get("batches") if isinstance(data, dict) else None
    for batch in batches if isinstance(batches, list) else []:
        entries = batch.get("entries") if isinstance(batch, dict) else None
        if isinstance(entries, list) and len(entries) > MAX_POLICY_ROWS:
            raise ConfigError(f"{path}: batch {batch.get('batch')}: {policy_too_long('entries', len(entries))}")


def policy_place(path: list[str | int], data: Any) -> str:
    """Where ``path`` (keys and list positions) is in the policy file ``data``, in its terms:
    ``batch 1, entry 4 of 6 (max_context_len 16384), key params.num_kv_splits``."""
    words, rest = [], list(path)
    if rest[:1] == ["batches"] and len(rest) > 1:
        batch = data["batches"][rest[1]]
        size = batch.get("batch") if isinstance(batch, dict) else None
        words.append(f"batch {size}" if type(size) is int else f"batches[{rest[1]}]")
        rest = rest[2:]
        if rest[:1] == ["entries"] and len(rest) > 1:
            entry, count = batch["entries"][rest[1]], len(batch["entries"])
            length = entry.get("max_context_len") if isinstance(entry, dict) else None
            named = f" (max_context_len {length})" if type(length) is int else ""
            words.append(f"entry {rest[1] + 1} of {count}{named}")
            rest = rest[2:]
    if rest:
        words.append(f"key {key_path(rest)}")
    return ", ".join(words)


def json_schema() -> dict[str, Any]:
    """The JSON schema of the policy file (``schema_version`` 3)."""
    return Policy.model_json_schema()
