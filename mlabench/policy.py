"""The split policy a kernel library can ship, and its three exports from one object.

A :class:`Policy` answers "which ``num_kv_splits`` (and launch parameters) for this batch size and
context length": per tuned batch size, a list of :class:`PolicyEntry` sorted by
``max_context_len``.  Lookup (the same rule in all three exports):

- batch: the largest tuned batch size <= the batch asked for (the smallest one if none is);
- context length L: the first entry with ``L <= max_context_len``; past the last entry, the last.

Exports: JSON with a versioned schema (:meth:`Policy.to_json` / :func:`load_policy`), a C++17 header
with a ``constexpr`` table and lookup (:func:`to_cpp_header`) and a standalone Python module
(:func:`to_python_module`).  See ``docs/tuning.md``.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mlabench.errors import ConfigError
from mlabench.files import read_json, write_text

POLICY_SCHEMA_VERSION = 1


class PolicyEntry(BaseModel):
    """One context bucket's choice: every tuned parameter (``num_kv_splits`` and launch params)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_context_len: int = Field(gt=0, description="Longest context length (tokens) this entry covers.")
    params: dict[str, int | str] = Field(description="Backend parameters to launch with.")


class BatchPolicy(BaseModel):
    """The entries of one tuned batch size, sorted by ``max_context_len``."""

    model_config = ConfigDict(extra="forbid")

    batch: int = Field(gt=0, description="Requests per decode step this table was tuned for.")
    entries: list[PolicyEntry] = Field(min_length=1, description="Sorted by max_context_len, no repeats.")

    @model_validator(mode="after")
    def _sorted(self) -> BatchPolicy:
        lens = [e.max_context_len for e in self.entries]
        if lens != sorted(set(lens)):
            raise ValueError(f"batch {self.batch}: max_context_len must increase strictly, got {lens}")
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

    def rows(self) -> list[tuple[int, list[tuple[int, dict[str, Any]]]]]:
        """Plain data for :func:`lookup_rows`: ``[(batch, [(max_context_len, params), ...]), ...]``."""
        return [(b.batch, [(e.max_context_len, dict(e.params)) for e in b.entries]) for b in self.batches]

    def lookup(self, batch: int, context_len: int) -> dict[str, Any]:
        """The parameters for ``batch`` requests of ``context_len`` tokens (module docstring rule).

        Raises ValueError for a batch or length < 1.
        """
        return lookup_rows(self.rows(), batch, context_len)

    def to_json(self) -> str:
        """The policy as indented JSON (``schema_version`` first), newline-terminated."""
        return self.model_dump_json(indent=2) + "\n"


def lookup_rows(rows, batch, context_len):
    """The policy lookup on plain data; its source is copied verbatim into the Python export.

    ``rows``: ``[(batch, [(max_context_len, params), ...]), ...]``, both levels sorted ascending.
    Returns the chosen ``params`` dict.  Raises ValueError for a batch or length < 1.
    """
    if batch < 1 or context_len < 1:
        raise ValueError(f"batch and context_len must be >= 1, got {batch}, {context_len}")
    entries = rows[0][1]
    for size, table in rows:
        if size <= batch:
            entries = table
    for max_len, params in entries:
        if context_len <= max_len:
            return params
    return entries[-1][1]


def merge_adjacent(entries: list[PolicyEntry]) -> list[PolicyEntry]:
    """Merge runs of adjacent entries with equal params into the run's last (largest) bucket.

    ``entries`` must be sorted by ``max_context_len``; the result covers the same lengths.
    """
    out: list[PolicyEntry] = []
    for entry in entries:
        if out and out[-1].params == entry.params:
            out[-1] = entry
        else:
            out.append(entry)
    return out


def load_policy(path: str | Path) -> Policy:
    """Read a policy JSON; :class:`ConfigError` with one line for a missing file or a bad schema."""
    p = Path(path)
    data = read_json(p, "policy")
    if isinstance(data, dict) and data.get("schema_version") not in (None, POLICY_SCHEMA_VERSION):
        raise ConfigError(f"{p}: policy schema_version {data.get('schema_version')} is not "
                          f"{POLICY_SCHEMA_VERSION} (written by another mlabench)")
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "policy"
        raise ConfigError(f"{p}: {where}: {err['msg']}") from None


def json_schema() -> dict[str, Any]:
    """The JSON schema of the policy file (``schema_version`` 1)."""
    return Policy.model_json_schema()


# ---- exports -------------------------------------------------------------------------------------
def _ident(name: str) -> str:
    ident = re.sub(r"\W", "_", name)
    return ident if not ident[0].isdigit() else f"_{ident}"


def _header_comment(policy: Policy, prefix: str) -> list[str]:
    s = policy.shape
    return [f"{prefix} MLA decode split policy generated by mlabench (schema {policy.schema_version}); do not edit.",
            f"{prefix} backend {policy.backend}, {s.get('num_heads')} heads"
            + (f", {s['qo_len']} query tokens{'' if s.get('causal', True) else ' (non-causal)'}"
               if s.get("qo_len", 1) != 1 else "") + f", page {s.get('page_size')}, "
            f"{s.get('kv_dtype')}, measured on {policy.device}.",
            f"{prefix} Lookup: the largest tuned batch <= batch (else the smallest); the first entry with "
            "context_len <= max_context_len (else the last)."]


def _cpp_value(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else str(int(value))


def to_cpp_header(policy: Policy, namespace: str = "mlabench_policy") -> str:
    """A C++17 header: ``struct Choice``, ``constexpr`` tables and ``constexpr lookup(batch, len)``.

    Integer params become ``int`` fields, string params ``const char*``; ``lookup`` returns a
    ``const Choice&`` (batch and length below 1 are treated as 1).
    """
    first = policy.batches[0].entries[0].params
    fields = [f"  {'const char*' if isinstance(first[n], str) else 'int'} {_ident(n)};" for n in policy.param_names]
    choices, batches, start = [], [], 0
    for b in policy.batches:
        for e in b.entries:
            vals = ", ".join(_cpp_value(e.params[n]) for n in policy.param_names)
            choices.append(f"    {{{e.max_context_len}, {vals}}},")
        batches.append(f"    {{{b.batch}, {start}, {start + len(b.entries)}}},")
        start += len(b.entries)
    lines = [*_header_comment(policy, "//"), "#pragma once", "#include <cstdint>", "",
             f"namespace {_ident(namespace)} {{", "", "struct Choice {", "  int64_t max_context_len;",
             *fields, "};", "", "struct BatchRange {", "  int batch;", "  int begin;", "  int end;", "};", "",
             "inline constexpr Choice kChoices[] = {", *choices, "};",
             "inline constexpr BatchRange kBatches[] = {", *batches, "};",
             f"inline constexpr int kNumBatches = {len(policy.batches)};", "",
             "constexpr const Choice& lookup(int64_t batch, int64_t context_len) {",
             "  int b = 0;",
             "  for (int i = 0; i < kNumBatches; ++i) {",
             "    if (kBatches[i].batch <= batch) b = i;",
             "  }",
             "  for (int i = kBatches[b].begin; i < kBatches[b].end; ++i) {",
             "    if (context_len <= kChoices[i].max_context_len) return kChoices[i];",
             "  }",
             "  return kChoices[kBatches[b].end - 1];",
             "}", "", f"}}  // namespace {_ident(namespace)}", ""]
    return "\n".join(lines)


def to_python_module(policy: Policy) -> str:
    """A standalone Python module: ``ROWS`` (the table), ``PARAM_NAMES`` and ``lookup(batch, len)``.

    The lookup is :func:`lookup_rows`'s own source, so the module and this package cannot disagree.
    """
    rows = json.dumps(policy.rows(), indent=1)
    source = inspect.getsource(lookup_rows)
    return "\n".join([*_header_comment(policy, "#"), '"""MLA decode split policy (generated by mlabench)."""',
                      "", f"PARAM_NAMES = {policy.param_names!r}", f"ROWS = {rows}", "", "",
                      source.rstrip(), "", "", "def lookup(batch, context_len):",
                      '    """The parameters for `batch` requests of `context_len` tokens."""',
                      "    return lookup_rows(ROWS, batch, context_len)", ""])


def write_exports(policy: Policy, folder: Path, stem: str = "policy") -> dict[str, Path]:
    """Write ``<stem>.json``, ``<stem>.h`` and ``<stem>.py`` into ``folder``; returns their paths."""
    paths = {"json": folder / f"{stem}.json", "cpp": folder / f"{stem}.h", "python": folder / f"{stem}.py"}
    for kind, text in (("json", policy.to_json()), ("cpp", to_cpp_header(policy)),
                       ("python", to_python_module(policy))):
        write_text(paths[kind], text, "policy file", atomic=True)
    return paths
