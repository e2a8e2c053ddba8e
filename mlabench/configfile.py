"""Where the shipped configuration lives, and reading configuration files with one-line errors
(TOML files, pydantic validation)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from mlabench.errors import ConfigError


def configs_dir() -> Path:
    """Folder holding ``models/``, ``sweeps/`` and ``serve/``: ``$MLABENCH_CONFIGS`` or the repo's ``configs/``."""
    env = os.environ.get("MLABENCH_CONFIGS")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "configs"


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """Parse the TOML file ``path``; :class:`ConfigError` names ``what`` when it is missing or malformed."""
    p = Path(path)
    try:
        return tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {p}") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} is a folder, not a file: {p}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: malformed TOML ({exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a text file") from None


def validation_line(exc: ValidationError) -> str:
    """The first pydantic error as ``field.path: message`` on one line."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()))
    msg = err.get("msg", str(exc)).removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg
