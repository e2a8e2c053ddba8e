"""What both AITER backends share: the package they depend on, whether this is a ROCm machine, the
installed AITER (or why not) and the rules in force, the bf16 MLA check, and their base class
:class:`AiterBackend`.

Apart from :mod:`.asm_backend` so that ``aiter-gluon`` builds on it without importing the ASM
backend (and its registration); neither registers anything here.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from mlabench.backends.aiter.manifest import load_manifest
from mlabench.backends.aiter.probe import AiterInstall, probe_aiter
from mlabench.backends.base import Backend, check_mla_dims
from mlabench.errors import BackendUnavailableError
from mlabench.extras import optional_import
from mlabench.shapes import MLADecodeShape

#: Distributions that install the ``aiter`` module (ROCm images and source builds name it either way).
AITER_PACKAGES = {"aiter": ("amd-aiter", "aiter")}


def rocm_reason(archs: tuple[str, ...]) -> str:
    """Why this is no ROCm machine with a GPU (empty when it is one)."""
    want = "/".join(archs)
    if torch.version.hip is None:
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only"
        return f"needs ROCm (AMD GPU, {want}); this torch is a {build} build"
    if not torch.cuda.is_available():
        return f"needs ROCm (AMD GPU, {want}); torch sees no GPU"
    return ""


def installed_aiter(backend: str) -> tuple[AiterInstall | None, str]:
    """``(install, "")`` when AITER imports and ``backend`` ("asm"/"gluon") can call it, else
    ``(install or None, reason)``: the import failure, or every way the installed AITER differs
    from what the adapter calls (signatures, undetectable rules)."""
    found = probe_aiter()
    if found is None:
        return None, optional_import("aiter")[1]
    if found.problems[backend]:
        who = f"AITER {found.version or '(version unknown)'}"
        return found, f"{who} differs from the manifest: " + "; ".join(found.problems[backend])
    return found, ""


def rules_in_force() -> dict[str, str | None]:
    """Rule kind -> variant of the installed AITER; without AITER, the newest manifest range's."""
    found = probe_aiter()
    return found.rule_variants() if found is not None else dict(load_manifest().ranges[-1].rules)


def require_aiter(backend: str) -> AiterInstall:
    """The installed AITER for ``backend``; :class:`BackendUnavailableError` with the reason."""
    found, reason = installed_aiter(backend)
    if found is None or reason:
        raise BackendUnavailableError(reason)
    return found


def bf16_mla(shape: MLADecodeShape) -> tuple[bool, str]:
    """bf16 q and KV, kv_lora_rank 512 + rope 64: what these adapters run."""
    if shape.q_dtype != "bfloat16" or shape.kv_dtype != "bfloat16":
        return False, f"AITER MLA decode here runs bf16 q and KV only (got {shape.q_dtype}/{shape.kv_dtype})"
    return check_mla_dims(shape, "AITER's MLA decode")


def install_details(kinds: tuple[str, ...]) -> str:
    """The AITER line of ``mlabench backends``: version, range, the rules ``kinds`` in force."""
    found = probe_aiter()
    return found.describe(kinds) if found is not None else ""


class AiterBackend(Backend):
    """What the AITER backends share: the package they depend on, and the listing line naming the
    installed AITER and the rules (``rule_kinds``) they follow."""

    gpu_kernel = True
    packages = AITER_PACKAGES
    rule_kinds: ClassVar[tuple[str, ...]] = ()

    def details(self) -> str:
        return install_details(self.rule_kinds)
