"""Where the shipped configuration lives, and reading configuration files with one-line errors
(TOML files, pydantic validation)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from mlabench.errors import ConfigError
from mlabench.files import read_text


def configs_dir() -> Path:
    """Folder holding ``models/``, ``sweeps/`` and ``serve/``: ``$MLABENCH_CONFIGS``; else, running
    from a checkout, its top-level ``configs/`` (where people edit them); else the copy an
    installed wheel carries in ``mlabench/_configs/`` (``setup.py`` puts it there)."""
    env = os.environ.get("MLABENCH_CONFIGS")
    if env:
        return Path(env)
    package = Path(__file__).resolve().parent
    checkout = package.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / "configs").is_dir():
        return checkout / "configs"
    return package / "_configs"


def config_file(name_or_path: str | Path, kind: str, what: str) -> Path:
    """The config file ``name_or_path`` names: a path to a file, or a bare name (no folder, no
    suffix) of ``configs/<kind>/<name>.toml`` (``kind``: ``models``, ``sweeps`` or ``serve``).

    Raises :class:`ConfigError` for a path that does not exist, or a bare name that is neither a
    file here nor a shipped config, listing the shipped ones.
    """
    path = Path(name_or_path)
    if path.exists():
        return path
    known = ", ".join(sorted(p.stem for p in (configs_dir() / kind).glob("*.toml"))) or "none"
    if path.suffix or len(path.parts) != 1:
        raise ConfigError(f"{what} not found: {path} does not exist (known: {known})")
    shipped = configs_dir() / kind / f"{path}.toml"
    if not shipped.is_file():
        raise ConfigError(f"{what} not found: {path} is neither a file nor a shipped {what} (known: {known})")
    return shipped


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """Parse the TOML file ``path``; :class:`ConfigError` names ``what`` when it is missing,
    unreadable, not text (:class:`~mlabench.errors.FileAccessError`) or malformed."""
    p = Path(path)
    text = read_text(p, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: malformed TOML ({exc})") from None


def validation_line(exc: ValidationError) -> str:
    """The first pydantic error as ``field.path: message`` on one line."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()))
    msg = err.get("msg", str(exc)).removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg
