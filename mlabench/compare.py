"""``mlabench compare`` over recorded runs: which records it reads and how backends pair up.

Reads run folders through :func:`mlabench.results.records_of`, never through the sweep runner; the
table itself is :func:`mlabench.tables.compare_table`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from mlabench.backends import backend_names, get_backend
from mlabench.results import Record, records_of


def recorded_records(runs: Iterable[Path], batch: Sequence[int] | None = None,
                     context_lens: Sequence[int] | None = None,
                     backends: Sequence[str] | None = None) -> list[Record]:
    """The records of ``runs`` (run folders, or folders holding runs), kept when their batch is in
    ``batch``, their longest context length in ``context_lens`` and their backend in ``backends``
    (each filter off when None or empty).

    Raises :class:`UnknownBackendError` for a backend name that is not registered (before reading
    anything), and :class:`ResultsError` for a folder without runs or runs from different devices.
    """
    for name in backends or []:
        get_backend(name)
    return [r for r in records_of(runs)
            if (not batch or r.batch in batch) and (not context_lens or r.context_len in context_lens)
            and (not backends or r.backend in backends)]


def backend_families() -> dict[str, str]:
    """``{backend name: family}`` of every registered backend (``persistent``, ``split-kv``, ...),
    which :func:`mlabench.tables.compare_table` uses to pair padded persistent kernels with
    split-KV ones."""
    return {name: get_backend(name).family for name in backend_names()}
