"""``mlabench serve-bench`` and ``mlabench serve-check`` (filled in by the serving work)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the serving commands to ``app``."""
