"""``$VAR`` and ``~`` in serve configs: :func:`expand`, with renamed variables read by either name.

Pure standard library, so that every serving module (config, lifecycle, bench) expands the same way.
"""

from __future__ import annotations

import os
import re

from mlabench.errors import ConfigError

_UNEXPANDED = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")
#: Environment variables renamed, old name -> new name: a config or recorded run may name either,
#: and either being set serves both (the old one with a line from :func:`renamed_env_notes`).
RENAMED_ENV = {"MLABENCH_TINY_MODEL_DIR": "MLABENCH_TINY_PROXY_DIR"}
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def _environment() -> dict[str, str]:
    """``os.environ`` with each pair of :data:`RENAMED_ENV` names set to the one of them that is set
    (the new name's value where both are)."""
    env = dict(os.environ)
    for old, new in RENAMED_ENV.items():
        value = env.get(new, env.get(old))
        if value is not None:
            env[old] = env[new] = value
    return env


def renamed_env_notes() -> list[str]:
    """One line per old name of :data:`RENAMED_ENV` that is set while its new name is not."""
    return [f"{old} is the old name of {new}: set {new} instead (the old name will stop working)"
            for old, new in RENAMED_ENV.items() if old in os.environ and new not in os.environ]


def expand(text: str) -> str:
    """Expand ``~`` and ``$VAR`` (a renamed variable by either name, :data:`RENAMED_ENV`); raises
    :class:`ConfigError` when a variable is not set."""
    env = _environment()
    out = os.path.expanduser(_VAR.sub(lambda m: env.get(m.group(1) or m.group(2), m.group(0)), text))
    left = _UNEXPANDED.search(out)
    if left:
        raise ConfigError(f"environment variable {left.group(0)} in {text!r} is not set")
    return out
