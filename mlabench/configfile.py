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
    """Folder holding ``models/``, ``sweeps/`` and ``serve/``: ``$MLABENCH_CONFIGS`` or the repo's ``configs/``."""
    env = os.environ.get("MLABENCH_CONFIGS")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "configs"


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
