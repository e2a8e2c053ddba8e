"""The AITER API manifest (``backends/aiter/manifest.toml``): what the AITER adapters may find installed.

The manifest is data written from reading ROCm/aiter: for each version range the adapters support,
the functions they call (module, name, parameters in order), and which variant of each behaviour
rule that range has (the Gluon split rule, the persistent-kernel batch gate, known crashes), each
with the file and commit it was read at.  This module loads and validates it and holds the pure
helpers that apply it: version parsing and range lookup (PEP 440, via ``packaging``), comment
stripping and marker matching for source-based rule detection, and git blob ids for kernel files.
It never imports AITER.
"""

from __future__ import annotations

import hashlib
import io
import re
import tokenize
from functools import lru_cache
from pathlib import Path
from typing import Literal

from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mlabench.errors import ConfigError
from mlabench.files import read_toml, validation_line

MANIFEST_PATH = Path(__file__).with_name("manifest.toml")
#: Rule kinds every range must name a variant of.
RULE_KINDS = ("gluon_bh16_splits", "gluon_bh16_max_heads", "gluon_bh64", "gluon_over_2gib",
              "gluon_qo_len", "asm_gate", "asm_kv_offsets")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Call(_Strict):
    """How an adapter calls one AITER function: leading positional parameters, then keywords."""

    positional: tuple[str, ...] = Field(description="Parameters passed by position, in order.")
    keywords: tuple[str, ...] = Field(description="Parameters passed by name.")


class Param(_Strict):
    """One declared parameter: its name and, when it has one, its default as AITER writes it."""

    name: str
    default: str | None = None

    @classmethod
    def parse(cls, text: str) -> Param:
        name, sep, default = text.partition("=")
        return cls(name=name.strip(), default=default.strip() if sep else None)


class Signature(_Strict):
    """An AITER function as declared at some commit (``params`` as ``name`` or ``name=default``)."""

    module: str = Field(description="Module the adapters import it from.")
    name: str = Field(description="Attribute name in that module.")
    file: str = Field(description="Source file in the AITER repository.")
    params: tuple[str, ...] = Field(description="Declared parameters, in order.")
    source: str = Field(description="file:line @ commit where it was read.")

    @property
    def parsed(self) -> tuple[Param, ...]:
        return tuple(Param.parse(p) for p in self.params)

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parsed)


class RuleVariant(_Strict):
    """One variant of a behaviour rule and how to recognise it in an installed AITER."""

    summary: str
    detect: Literal["source", "attribute", "asm_blob"]
    markers: tuple[str, ...] = Field((), description="source: regexes that must all match.")
    absent: tuple[str, ...] = Field((), description="source: regexes that must not match.")
    attribute: str | None = Field(None, description="attribute: 'module:name'.")
    present: bool | None = Field(None, description="attribute: whether it must exist.")
    file: str | None = Field(None, description="asm_blob: kernel file under AITER_ASM_DIR.")
    blobs: tuple[str, ...] = Field((), description="asm_blob: git blob ids of that file.")
    evidence: str = Field("", description="source: the AITER lines the markers are written from.")
    source: str = Field(description="Where in AITER the variant was read.")


class Range(_Strict):
    """A version range: the signatures it declares and the rule variant of each kind it has."""

    name: str
    since: str = Field(description="First version in the range (PEP 440, inclusive).")
    before: str = Field(description="First version after the range; empty = open.")
    read: tuple[str, ...] = Field(description="Tags and commits read for this range.")
    functions: dict[str, str] = Field(description="Logical call name -> signature id.")
    rules: dict[str, str] = Field(description="Rule kind -> variant name.")

    def contains(self, version: Version) -> bool:
        """Whether ``version`` lies in ``[since, before)`` (development builds included)."""
        if version < Version(self.since):
            return False
        return not self.before or version < Version(self.before)


class Manifest(_Strict):
    """The whole manifest; cross-references are checked when it is built."""

    schema_version: int
    repository: str
    read_up_to: str
    calls: dict[str, Call]
    signatures: dict[str, Signature]
    rules: dict[str, dict[str, RuleVariant]]
    ranges: tuple[Range, ...]

    @model_validator(mode="after")
    def _cross_references(self) -> Manifest:
        if set(self.rules) != set(RULE_KINDS):
            raise ValueError(f"rules must name exactly {', '.join(RULE_KINDS)}")
        for r in self.ranges:
            for bound in (r.since, r.before):
                if bound:
                    Version(bound)  # InvalidVersion is reported by load_manifest
            for call, sig in r.functions.items():
                if call not in self.calls or sig not in self.signatures:
                    raise ValueError(f"range {r.name}: {call} = {sig!r} names no call or signature")
            if set(r.rules) != set(RULE_KINDS):
                raise ValueError(f"range {r.name}: rules must name exactly {', '.join(RULE_KINDS)}")
            for kind, variant in r.rules.items():
                if variant not in self.rules[kind]:
                    raise ValueError(f"range {r.name}: {kind} has no variant {variant!r}")
        for a, b in zip(self.ranges, self.ranges[1:]):
            if a.before != b.since:
                raise ValueError(f"ranges {a.name} and {b.name} do not meet ({a.before} != {b.since})")
        return self

    def range_for(self, version: Version | None) -> Range | None:
        """The range holding ``version``; None for no version or one outside every range."""
        if version is None:
            return None
        return next((r for r in self.ranges if r.contains(version)), None)

    def range_named(self, name: str) -> Range:
        return next(r for r in self.ranges if r.name == name)

    def signature(self, rng: Range, call: str) -> Signature | None:
        """The signature ``rng`` declares for logical ``call``, or None where it has none."""
        sig = rng.functions.get(call)
        return self.signatures[sig] if sig else None

    def gluon_signatures(self) -> list[Signature]:
        """Every Gluon entry point the manifest knows, newest range first, without repeats."""
        out: list[Signature] = []
        for r in reversed(self.ranges):
            sig = self.signatures[r.functions["gluon"]]
            if sig not in out:
                out.append(sig)
        return out


def load_manifest(path: str | Path | None = None) -> Manifest:
    """Read and validate a manifest (default: the one shipped with mlabench, read once).

    Raises :class:`ConfigError` with one line when the file is missing, malformed or inconsistent.
    """
    if path is None:
        return _shipped()
    return _parse(Path(path))


@lru_cache(maxsize=1)
def _shipped() -> Manifest:
    return _parse(MANIFEST_PATH)


def _parse(path: Path) -> Manifest:
    data = read_toml(path, "AITER manifest")
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {validation_line(exc)}") from None
    except InvalidVersion as exc:
        raise ConfigError(f"{path}: {exc}") from None


# ---- versions -------------------------------------------------------------------------------------
def parse_version(text: str | None) -> Version | None:
    """PEP 440 version of an AITER build, or None when absent or unparseable.

    ``"0.1.19.post3.dev12+gabc"`` is ``0.1.19.post3.dev12`` (local part kept): a development build
    after tag ``v0.1.19.post2``, sorting before ``0.1.20``.
    """
    if not text:
        return None
    try:
        return Version(str(text).strip())
    except InvalidVersion:
        return None


# ---- source markers and kernel blobs --------------------------------------------------------------
def strip_comments(source: str) -> str:
    """``source`` without ``#`` comments (strings and code kept); the text itself if it won't tokenize."""
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
                  if t.type != tokenize.COMMENT]
        return tokenize.untokenize(tokens)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return re.sub(r"#[^\n]*", "", source)


def source_matches(variant: RuleVariant, code: str) -> bool:
    """Whether comment-free ``code`` shows ``variant``: every marker found, no ``absent`` one."""
    return (all(re.search(m, code) for m in variant.markers)
            and not any(re.search(a, code) for a in variant.absent))


def git_blob_id(data: bytes) -> str:
    """The id git gives a file with contents ``data`` (``git hash-object``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
