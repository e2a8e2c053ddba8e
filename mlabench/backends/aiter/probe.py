"""The installed AITER, as the AITER adapters see it: version, signatures, rules in force.

:func:`probe_aiter` imports AITER (lazily, through :mod:`mlabench.extras`), compares each function
the adapters call with the manifest (``inspect.signature``: names, order, what the adapters pass)
and decides every behaviour rule from what the installed AITER is, not from its version string:
its Gluon module's source (comments removed), its attributes, the git blob id of its gfx950 ASM
kernel file.  The version (distribution ``amd-aiter``, else ``aiter._version``) only decides a rule
that cannot be detected, and names the range the build claims.  The result is cached per process.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlabench.backends.aiter.manifest import (
    Call, Manifest, Range, RuleVariant, git_blob_id, load_manifest, parse_version, source_matches, strip_comments,
)
from mlabench.extras import optional_import, package_version

#: Calls each adapter needs; "gate" calls are needed only under the batch-gate rule.
ASM_CALLS = ("metadata_info", "metadata", "decode", "get_gfx", "get_cu_num")
GATE_CALLS = ("gate", "gate_max_batch")
#: Where calls live when no range names them (a build outside every range).
_MODULES = {"metadata_info": ("aiter", "get_mla_metadata_info_v1"),
            "metadata": ("aiter", "get_mla_metadata_v1"),
            "decode": ("aiter.mla", "mla_decode_fwd"),
            "get_gfx": ("aiter.jit.utils.chip_info", "get_gfx"),
            "get_cu_num": ("aiter.jit.utils.chip_info", "get_cu_num"),
            "gate": ("aiter.mla", "_use_persistent_mla_decode"),
            "gate_max_batch": ("aiter.mla", "_persistent_mla_decode_max_batch")}


@dataclass(frozen=True)
class RuleInForce:
    """One rule: the manifest variant in force (None: undetermined) and how it was decided."""

    variant: str | None
    how: str


@dataclass
class AiterInstall:
    """What :func:`probe_aiter` found.

    - ``version`` / ``version_from``: the version text and where it came from ("none" if absent).
    - ``version_range``: the manifest range that version falls in (None: none does).
    - ``behaves_like``: the newest range whose rules all equal the ones in force.
    - ``rules``: rule kind -> :class:`RuleInForce`.
    - ``functions``: logical call -> the installed callable (absent when missing).
    - ``gluon_api``: ``"mla_gluon"`` / ``"mla_decode_gluon"`` or None.
    - ``problems``: ``"asm"`` / ``"gluon"`` -> reasons that backend cannot run (empty: it can).
    - ``notes``: differences that do not stop a backend (signature drift in unused parameters).
    - ``rule_notes``: rule kind -> where the version range and the installed AITER disagree.
    - ``param_names``: logical call -> the installed function's parameter names.
    - ``missing_kernels``: GPU architecture -> the kernel file a rule is read from (the manifest's
      ``asm_blob`` rules, e.g. ``gfx950/mla/..._v3_ps.co``) that this AITER does not install: its
      ASM path cannot run there, and the version range does not decide that rule.
    - ``rule_guesses``: rule kind -> why its variant is a guess: taken from the version range of a
      development build (``.dev``, pre-release or local version) whose installed AITER did not show
      it (source unreadable, or no known variant in it); what it decides is recorded as unknown.
    """

    version: str | None
    version_from: str
    version_range: str | None
    behaves_like: str | None = None
    rules: dict[str, RuleInForce] = field(default_factory=dict)
    functions: dict[str, Any] = field(default_factory=dict)
    gluon_api: str | None = None
    problems: dict[str, list[str]] = field(default_factory=lambda: {"asm": [], "gluon": []})
    notes: list[str] = field(default_factory=list)
    rule_notes: dict[str, str] = field(default_factory=dict)
    param_names: dict[str, tuple[str, ...]] = field(default_factory=dict)
    missing_kernels: dict[str, str] = field(default_factory=dict)
    rule_guesses: dict[str, str] = field(default_factory=dict)

    def rule(self, kind: str) -> str | None:
        r = self.rules.get(kind)
        return r.variant if r else None

    def rule_variants(self) -> dict[str, str | None]:
        return {k: r.variant for k, r in self.rules.items()}

    def describe(self, kinds: tuple[str, ...] | None = None) -> str:
        """One line for ``mlabench backends``: version, range, the rules ``kinds`` in force and how
        each was decided, then any disagreement or signature drift."""
        facts = [self.version_from]
        if self.version_range:
            facts.append(f"range {self.version_range}")
        if self.behaves_like:
            facts.append(f"behaves like {self.behaves_like}")
        wanted = [k for k in self.rules if kinds is None or k in kinds]
        shown = ", ".join(f"{k}={self.rules[k].variant or '?'} ({self.rules[k].how})" for k in wanted)
        extra = [self.rule_notes[k] for k in wanted if k in self.rule_notes] + self.notes
        return "; ".join([f"AITER {self.version or 'version unknown'} ({', '.join(facts)}): {shown}",
                          *extra])


_CACHE: dict[str, AiterInstall] = {}


def probe_aiter(manifest: Manifest | None = None) -> AiterInstall | None:
    """The installed AITER (cached), or None when ``aiter`` does not import."""
    if "probe" in _CACHE:
        return _CACHE["probe"]
    aiter, _ = optional_import("aiter")
    if aiter is None:
        return None
    _CACHE["probe"] = result = _probe(manifest or load_manifest())
    return result


def installed_version() -> tuple[str | None, str]:
    """``(version text, where from)``: distribution ``amd-aiter``/``aiter``, else ``aiter._version``."""
    text = package_version(("amd-aiter", "aiter"))
    if text:
        return text, "distribution record"
    mod, _ = optional_import("aiter._version")
    text = getattr(mod, "__version__", None) if mod is not None else None
    return (str(text), "aiter._version") if text else (None, "no distribution record or aiter._version")


def _probe(m: Manifest) -> AiterInstall:
    text, where = installed_version()
    rng = m.range_for(parse_version(text))
    found = AiterInstall(version=text, version_from=where, version_range=rng.name if rng else None)
    for call in ASM_CALLS + GATE_CALLS:
        _resolve_call(m, found, call)
    gluon_module = _resolve_gluon(m, found)
    _detect_rules(m, rng, found, gluon_module)
    if found.rule("asm_gate") != "batch_gate":
        found.problems["asm"] = [p for p in found.problems["asm"] if not p.startswith(GATE_CALLS)]
    found.behaves_like = next((r.name for r in reversed(m.ranges) if _same(m, r, found)), None)
    return found


def _same(m: Manifest, rng: Range, found: AiterInstall) -> bool:
    """Whether ``found`` has ``rng``'s rules and, where readable, its signatures."""
    if rng.rules != found.rule_variants():
        return False
    return all(m.signatures[sig].param_names == found.param_names.get(call, m.signatures[sig].param_names)
               for call, sig in rng.functions.items())


def _resolve_call(m: Manifest, found: AiterInstall, call: str) -> None:
    module, name = _MODULES[call]
    mod, reason = optional_import(module)
    fn = getattr(mod, name, None) if mod is not None else None
    if fn is None:
        why = f" ({reason})" if reason else ""
        found.problems["asm"].append(f"{call}: {module}.{name} not found{why}")
        return
    found.functions[call] = fn
    _check_signature(m, found, "asm", call, fn, f"{module}.{name}")


def _resolve_gluon(m: Manifest, found: AiterInstall) -> Any:
    reasons = []
    for sig in m.gluon_signatures():
        mod, reason = optional_import(sig.module)
        fn = getattr(mod, sig.name, None) if mod is not None else None
        if callable(fn):
            found.functions["gluon"], found.gluon_api = fn, sig.name
            _check_signature(m, found, "gluon", "gluon", fn, f"{sig.module}.{sig.name}")
            return mod
        reasons.append(reason or f"{sig.module} has no {sig.name}")
    found.problems["gluon"].append("AITER Gluon MLA decode not found: " + "; ".join(reasons))
    return None


def signature_problems(fn: Any, call: Call, label: str) -> list[str]:
    """What stops the adapter calling ``fn`` as ``call`` says: each difference in one phrase.

    Positional parameters must carry the names the adapter means, in order; keywords must exist
    (or ``**kwargs``); no parameter without a default may be left unpassed.  An uninspectable
    callable yields no problems (it is called as the manifest says).
    """
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []
    kinds = inspect.Parameter
    positional = [p for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
    names = {p.name for p in params}
    var_kw = any(p.kind is kinds.VAR_KEYWORD for p in params)
    out = []
    for i, want in enumerate(call.positional):
        got = positional[i].name if i < len(positional) else None
        if got != want:
            out.append(f"{label}: positional parameter {i + 1} is {got!r}, the adapter passes {want!r}")
    out += [f"{label}: no parameter {kw!r}" for kw in call.keywords if kw not in names and not var_kw]
    passed = set(call.positional) | set(call.keywords)
    out += [f"{label}: requires {p.name!r}, which the adapter does not pass" for p in params
            if p.default is kinds.empty and p.name not in passed
            and p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)]
    return out


def _check_signature(m: Manifest, found: AiterInstall, backend: str, call: str, fn: Any,
                     label: str) -> None:
    found.problems[backend] += [f"{call}: {p}" for p in signature_problems(fn, m.calls[call], label)]
    try:
        names = tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return
    found.param_names[call] = names
    known = {sig_id: s.param_names for sig_id, s in m.signatures.items()
             if s.name == label.rsplit(".", 1)[-1]}
    if known and names not in known.values():
        sig_id, closest = min(known.items(), key=lambda kv: len(set(kv[1]) ^ set(names)))
        extra = [n for n in names if n not in closest]
        missing = [n for n in closest if n not in names]
        found.notes.append(f"{label} matches no manifest signature (closest {sig_id}: "
                           f"added {extra or 'none'}, missing {missing or 'none'})")


# ---- rules ----------------------------------------------------------------------------------------
def _detect_rules(m: Manifest, rng: Range | None, found: AiterInstall, gluon_module: Any) -> None:
    code = _module_code(gluon_module)
    asm_dir = _asm_dir()
    for kind, variants in m.rules.items():
        hits = [name for name, v in variants.items() if _shows(v, code, asm_dir)]
        fallback = rng.rules[kind] if rng else None
        missing = _missing_kernel(variants, asm_dir)
        if missing:  # a development build without the file: its version cannot vouch for the kernel
            found.missing_kernels[missing.split("/")[0]] = str(asm_dir / missing if asm_dir else missing)
            found.rules[kind] = RuleInForce(None, f"undetermined: kernel file {missing} not installed")
        elif len(hits) == 1:
            found.rules[kind] = RuleInForce(hits[0], _how(variants[hits[0]]))
            if fallback and fallback != hits[0]:
                found.rule_notes[kind] = (f"{kind}: version {found.version} (range {rng.name}) says "
                                          f"{fallback}, the installed AITER shows {hits[0]}: used")
        elif fallback:
            found.rules[kind] = RuleInForce(fallback, f"version {found.version}, range {rng.name}")
            version = parse_version(found.version)
            if version is not None and (version.is_devrelease or version.is_prerelease or version.local):
                seen = "its source could not be read" if code is None else "no known variant shows in it"
                found.rule_guesses[kind] = (f"{kind} unknown: AITER {found.version} is a development build and "
                                            f"{seen}; its tag's rule ({fallback}) may not be the code it runs")
        else:
            why = "several variants match" if hits else "no variant recognised"
            found.rules[kind] = RuleInForce(None, f"undetermined: {why}, version unknown")
    if found.gluon_api and found.rule("gluon_bh16_splits") is None:
        found.problems["gluon"].append("cannot tell the installed Gluon split rule: "
                                       + found.rules["gluon_bh16_splits"].how)


def _how(v: RuleVariant) -> str:
    return {"source": "installed source", "attribute": "installed attribute",
            "asm_blob": "installed kernel file"}[v.detect]


def _shows(v: RuleVariant, code: str | None, asm_dir: Path | None) -> bool:
    if v.detect == "source":
        return code is not None and source_matches(v, code)
    if v.detect == "attribute":
        module, name = (v.attribute or ":").split(":")
        mod, _ = optional_import(module)
        return mod is not None and (getattr(mod, name, None) is not None) == v.present
    if asm_dir is None or v.file is None:
        return False
    try:
        return git_blob_id((asm_dir / v.file).read_bytes()) in v.blobs
    except OSError:
        return False


def _missing_kernel(variants: dict[str, RuleVariant], asm_dir: Path | None) -> str | None:
    """The kernel file (relative to ``AITER_ASM_DIR``) the ``asm_blob`` ``variants`` are read from
    when it is not installed (or ``AITER_ASM_DIR`` is unknown), else None."""
    files = {v.file for v in variants.values() if v.detect == "asm_blob" and v.file}
    return next((f for f in sorted(files) if asm_dir is None or not (asm_dir / f).is_file()), None)


def _module_code(module: Any) -> str | None:
    if module is None:
        return None
    try:
        return strip_comments(inspect.getsource(module))
    except (OSError, TypeError):
        return None


def _asm_dir() -> Path | None:
    mod, _ = optional_import("aiter.jit.core")
    path = getattr(mod, "AITER_ASM_DIR", None) if mod is not None else None
    return Path(path) if path else None
