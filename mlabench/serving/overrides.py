"""``serve-bench``'s ``--set KEY=VALUE`` overrides of a serving config, and ``--concurrency`` /
``--repeats`` written as the same strings, applied to the parsed TOML before it is validated."""

from __future__ import annotations

import json
import tomllib
from typing import Any

from mlabench.errors import ConfigError


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` strings (value parsed as TOML, else kept as a string)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not KEY=VALUE (e.g. bench.num_prompts=8)")
        key, raw = item.split("=", 1)
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a table")
        node[parts[-1]] = value
    return data


def bench_overrides(sets: list[str], concurrencies: list[int] | None = None,
                    repeats: int | None = None) -> list[str]:
    """``--set`` strings, then ``--concurrency`` / ``--repeats`` as the same ``key=value`` strings
    (they replace the config's ``concurrencies`` and ``repeats``)."""
    out = list(sets)
    if concurrencies:
        out.append(f"concurrencies={json.dumps(concurrencies)}")
    if repeats is not None:
        out.append(f"repeats={repeats}")
    return out
