"""Kernel commands: backends, check, sweep, compare (being written)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the kernel commands to ``app``."""
