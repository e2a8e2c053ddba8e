"""Typed errors a user can cause, and the exit codes of the ``mlabench`` command.

The CLI turns every :class:`MlabenchError` into one line on stderr and its ``exit_code``
(:class:`ExitCode`); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar


class ExitCode(IntEnum):
    """Exit codes of every ``mlabench`` command, mapped from errors in one place
    (:func:`mlabench.cli.app.main`)."""

    #: Done, and everything it checked passed.
    OK = 0
    #: It ran, but a check failed or a result is missing (check, serve-bench, serve-check; a filter
    #: or a diff that matches no recorded point, :class:`MissingResultError`).
    FAILED = 1
    #: A usage mistake (click's message) or an error the user can cause: one ``error:`` line either way.
    ERROR = 2
    #: The input is fine but this machine cannot run it: no GPU, a backend or a package missing here,
    #: a full disk (:class:`BackendUnavailableError`, :class:`GPURequiredError`,
    #: :class:`DependencyError`, :class:`DiskFullError`); one ``error:`` line.  Kept apart from 2
    #: so that a script can skip rather than fail.
    UNAVAILABLE = 3
    #: Stopped by Ctrl-C (128 + SIGINT), after saving what was measured.
    INTERRUPTED = 130


class MlabenchError(Exception):
    """Base class of every error a user can cause (bad input, missing hardware, bad config)."""

    exit_code: ClassVar[int] = ExitCode.ERROR


class ConfigError(MlabenchError):
    """A configuration file or flag is malformed or inconsistent (bad TOML, unknown key, bad value)."""


class FileAccessError(ConfigError):
    """A file or folder the user named that cannot be read or written: missing, a folder where a
    file belongs (or the reverse), not UTF-8 text, not valid JSON, no permission, disk full."""


class DiskFullError(FileAccessError):
    """A file that could not be written because the disk (or the user's quota) is full: nothing
    wrong with the input, so it exits 3 like a machine that cannot run it, and a resumed run goes
    on once space is freed (a fresh user's review: it exited 2, "bad input")."""

    exit_code: ClassVar[int] = ExitCode.UNAVAILABLE


class UnknownModelError(ConfigError):
    """A model preset name that is not under ``configs/models/``."""


class ShapeError(ConfigError):
    """An MLA decode shape that cannot exist (heads not divisible by TP, context <= 0, ...)."""


class UnknownBackendError(ConfigError):
    """A backend name that is not registered."""


class BackendUnavailableError(MlabenchError):
    """A registered backend that cannot run here (missing package, no GPU, wrong architecture); exits 3."""

    exit_code: ClassVar[int] = ExitCode.UNAVAILABLE


class GPURequiredError(MlabenchError):
    """A command that is only meaningful on a CUDA/ROCm GPU (e.g. graph capture), run without one; exits 3."""

    exit_code: ClassVar[int] = ExitCode.UNAVAILABLE


class UnsupportedShapeError(MlabenchError):
    """A backend that is available but does not support the shape or parameters asked for."""


class OutOfMemoryError(MlabenchError):
    """Inputs that would not fit in free device (or host) memory; raised before allocating."""


class ResultsError(MlabenchError):
    """A results folder that cannot be appended to (identity mismatch, corrupt file)."""


class MissingResultError(MlabenchError):
    """Recorded runs that hold no result for what was asked (a ``--batch`` or ``--qo-len`` filter
    matching no record, two runs with no point in common); exits 1 like a failed check."""

    exit_code: ClassVar[int] = ExitCode.FAILED


class WorkerError(MlabenchError):
    """A worker process that stopped with an error: exits as the worker did when that was bad input
    (2) or a machine that cannot run it (3), else 1 (the run stopped short: a result is missing)."""

    exit_code: ClassVar[int] = ExitCode.FAILED

    def __init__(self, message: str, worker_exit: int = ExitCode.FAILED):
        super().__init__(message)
        if worker_exit in (ExitCode.ERROR, ExitCode.UNAVAILABLE):
            self.exit_code = worker_exit


class DependencyError(MlabenchError):
    """A package a command needs that is missing or fails to import (the message says what to install);
    exits 3."""

    exit_code: ClassVar[int] = ExitCode.UNAVAILABLE


class ServerError(MlabenchError):
    """A vLLM server that failed to start, died, or is not reachable."""


class Interrupted(MlabenchError):
    """A run stopped by Ctrl-C after saving what it measured; exits 130 like a plain Ctrl-C."""

    exit_code: ClassVar[int] = ExitCode.INTERRUPTED
