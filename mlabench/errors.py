"""Typed errors a user can cause.

The CLI turns every :class:`MlabenchError` into one line on stderr and a non-zero exit; anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations


class MlabenchError(Exception):
    """Base class of every error a user can cause (bad input, missing hardware, bad config)."""


class ConfigError(MlabenchError):
    """A configuration file or flag is malformed or inconsistent (bad TOML, unknown key, bad value)."""


class UnknownModelError(ConfigError):
    """A model preset name that is not under ``configs/models/``."""


class ShapeError(ConfigError):
    """An MLA decode shape that cannot exist (heads not divisible by TP, context <= 0, ...)."""


class UnknownBackendError(ConfigError):
    """A backend name that is not registered."""


class BackendUnavailableError(MlabenchError):
    """A registered backend that cannot run here (missing package, no GPU, wrong architecture)."""


class UnsupportedShapeError(MlabenchError):
    """A backend that is available but does not support the shape or parameters asked for."""


class OutOfMemoryError(MlabenchError):
    """Inputs that would not fit in free device (or host) memory; raised before allocating."""


class ResultsError(MlabenchError):
    """A results folder that cannot be appended to (identity mismatch, corrupt file)."""


class ServerError(MlabenchError):
    """A vLLM server that failed to start, died, or is not reachable."""


class Interrupted(MlabenchError):
    """A run stopped by Ctrl-C after saving what it measured; exits 130 like a plain Ctrl-C."""

    exit_code = 130
