"""Where a tuning run's studies live: a journal file in the run folder, or a database shared by
machines; opening either safely, a lock across every process that uses it, and dead-worker recovery.

- :func:`open_storage`: the journal (checked first, :func:`check_journal`) or an ``RDBStorage``
  with Optuna's heartbeat, so a trial whose worker died anywhere is failed and retried once
  (``RetryHeartbeatStaleTrialCallback``).  Any number of machines may open an empty PostgreSQL
  database at the same moment: Optuna's table creation runs under a PostgreSQL advisory lock, and
  a creation that still collides (another database) is retried.
- :func:`storage_lock`: one lock for every process on the storage (a PostgreSQL advisory lock, else
  a file lock in the run folder, which serves the processes of one machine), taken to seed a study
  once, to pick the next study and to claim a measurement.
"""

from __future__ import annotations

import fcntl
import gzip
import json
import os
import re
import sys
import time
import warnings
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mlabench.errors import ConfigError, DependencyError, ResultsError
from mlabench.extras import require
from mlabench.run_files import ARCHIVED_JOURNAL_FILE, JOURNAL_FILE, STUDIES_LOCK_FILE

#: Seconds without a heartbeat after which a RUNNING trial of a database storage counts as dead
#: (its worker killed, its machine gone); its heartbeat beats every quarter of it.  The
#: environment variable of that name overrides it (the tests use a few seconds).
GRACE_ENV = "MLABENCH_TUNE_GRACE_S"
GRACE_PERIOD_S = 60
#: One key for every advisory lock of mlabench in a PostgreSQL database (any 64-bit integer).
ADVISORY_LOCK_KEY = 0x6D6C6162656E6368
CREATE_ATTEMPTS = 6


def optuna_module() -> Any:
    """The optuna package, with its per-trial INFO logging turned down to warnings."""
    optuna = require("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for manifests and messages)."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def load_studies(names: list[str], storage: Any, where: str) -> list[Any]:
    """The Optuna studies ``names`` of ``storage`` (from :func:`open_storage`), in order.  Raises
    :class:`ResultsError` when ``storage`` lacks one, naming ``where`` it was read (an empty or
    cut-short journal, a database the run did not write; Optuna's own error there was a
    ``KeyError`` traceback: a fresh user's review)."""
    optuna = optuna_module()
    held = set(optuna.get_all_study_names(storage))
    missing = [name for name in names if name not in held]
    if missing:  # none at all: tune --resume refuses it too (an empty journal beside records)
        then = ("; restore it, or start a new run" if len(missing) == len(names) else
                ", and tune --resume measures the missing studies again")
        raise ResultsError(f"{where} holds {len(names) - len(missing)} of the run's {len(names)} studies (first "
                           f"missing: {missing[0]!r}; empty or cut short?): their trials cannot be read{then}")
    return [optuna.load_study(study_name=name, storage=storage) for name in names]


def journal_copy(run_dir: Path, into: Path) -> Path:
    """The folder to open a run's journal from for reading: ``into``, holding a copy of the run's
    ``study.journal`` (or the plain text of its archived ``study.journal.gz``: Optuna reads only a
    plain file), checked by :func:`check_journal`.  Reading a copy leaves the run's own file as it
    is: a torn last line may be a write of a run still going, so only that run (or its ``--resume``)
    may cut it.  Raises :class:`ResultsError` when the run has no journal (nothing was tuned there),
    the archive is not gzip, or the journal is corrupt."""
    plain, archived = run_dir / JOURNAL_FILE, run_dir / ARCHIVED_JOURNAL_FILE
    if not plain.exists() and not archived.exists():
        raise ResultsError(f"{run_dir}: no {JOURNAL_FILE} (or {ARCHIVED_JOURNAL_FILE}): not a tuning run with a journal")
    try:
        data = plain.read_bytes() if plain.exists() else gzip.decompress(archived.read_bytes())
    except (OSError, EOFError, zlib.error) as exc:
        raise ResultsError(f"{archived}: not a readable gzip file ({exc})") from None
    (into / JOURNAL_FILE).write_bytes(data)
    check_journal(into / JOURNAL_FILE, original=plain if plain.exists() else archived)
    return into


def check_journal(path: Path, original: Path | None = None) -> int:
    """Check an Optuna journal before anything reads or appends to it: every line a JSON object.

    A torn last line (no newline, or not JSON: a crash mid-write) is cut off, the file truncated to
    the end of the line before it, with a notice on stderr (the trial it recorded is measured again when the run resumes);
    returns the bytes cut (0: the file was whole).  ``original``: ``path`` is a reading copy of this
    file (:func:`journal_copy`), which messages name and which is left as it is.  Raises
    :class:`ResultsError` naming the first bad line elsewhere (nothing is written to such a file).
    """
    shown = original or path
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    good_end, bad = 0, None
    for number, line in enumerate(lines, start=1):
        try:
            if not isinstance(json.loads(line.decode("utf-8")), dict):
                raise ValueError("not a JSON object")
        except ValueError:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            bad = number
            break
        good_end += len(line) + 1
    if bad is not None and (bad < len(lines) or tail):
        raise ResultsError(f"{shown}: line {bad} is not a journal record (a corrupt file; nothing was "
                           f"written to it): restore it from a copy, or start a new run")
    cut = len(data) - good_end
    if cut:
        with open(path, "r+b") as fh:
            fh.truncate(good_end)
        what = ("is cut off; the trial it recorded is measured again when the run resumes" if original is None else
                "is left out of this reading (the file is left as it is: a run still writing it, or its --resume, "
                "completes or cuts it)")
        print(f"notice: {shown}: its last line was torn ({cut} bytes, a write cut short) and {what}",
              file=sys.stderr, flush=True)
    return cut


def journal_lost(run_dir: Path) -> str:
    """Why the study journal of the tuning run ``run_dir`` cannot continue its trials, for
    ``tune --resume``'s refusal: "no" where neither it nor its gzipped copy is there, "an empty"
    where it is empty beside recorded trials; "" otherwise (a gzipped copy is refused by
    :func:`open_storage`, saying to gunzip it; an empty journal and no records, a run stopped
    before its studies were made, resumes)."""
    from mlabench.records.store import ResultStore

    journal = run_dir / JOURNAL_FILE
    if not journal.exists():
        return "" if (run_dir / ARCHIVED_JOURNAL_FILE).exists() else "no"
    return "an empty" if not journal.stat().st_size and ResultStore(run_dir).records() else ""


def grace_period_s() -> int:
    """Seconds without a heartbeat before a database trial counts as dead (:data:`GRACE_PERIOD_S`,
    or the :data:`GRACE_ENV` environment variable). Raises :class:`ConfigError` for a bad value."""
    text = os.environ.get(GRACE_ENV)
    if text is None:
        return GRACE_PERIOD_S
    if not text.isdigit() or int(text) < 2:
        raise ConfigError(f"{GRACE_ENV} takes whole seconds >= 2, got {text!r}")
    return int(text)


def open_storage(url: str | None, run_dir: Path) -> Any:
    """An Optuna storage: ``run_dir/study.journal`` (a ``JournalStorage``, checked first by
    :func:`check_journal`) when ``url`` is None, else ``RDBStorage(url)`` with heartbeats every
    quarter of :func:`grace_period_s`, so a trial of a worker that died anywhere is failed and
    retried once by the other workers (:func:`fail_stale`).  Raises :class:`ConfigError` for a URL
    Optuna cannot open or an archived journal, :class:`DependencyError` (exit 3) for a URL whose
    database driver is not installed, :class:`ResultsError` for a corrupt journal."""
    optuna = optuna_module()
    if url is None:
        from optuna.storages.journal import JournalFileBackend

        archived = run_dir / ARCHIVED_JOURNAL_FILE
        if archived.exists() and not (run_dir / JOURNAL_FILE).exists():
            raise ConfigError(f"{archived}: an archived run's journal is read-only here (tune "
                              f"--export reads it); gunzip it to add trials")
        if (run_dir / JOURNAL_FILE).exists():
            check_journal(run_dir / JOURNAL_FILE)
        return optuna.storages.JournalStorage(JournalFileBackend(str(run_dir / JOURNAL_FILE)))
    grace = grace_period_s()
    for attempt in range(CREATE_ATTEMPTS):
        try:
            with _creation_lock(url), warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeats
                retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1)
                return optuna.storages.RDBStorage(url, heartbeat_interval=max(1, grace // 4), grace_period=grace,
                                                  heartbeat_stale_trial_callback=retry, engine_kwargs=_engine_kwargs(url))
        except ImportError as exc:  # the URL's database driver is not installed here: exit 3, not 2
            missing = getattr(exc.__cause__, "name", None) or getattr(exc, "name", None) or "its driver"
            raise DependencyError(f"--storage {redact_url(url)}: the database driver {missing} is not installed "
                                  f"(pip install it; PostgreSQL: pip install psycopg2-binary)") from None
        except Exception as exc:  # noqa: BLE001 - SQLAlchemy/driver errors have no common base here
            if _collided(exc) and attempt + 1 < CREATE_ATTEMPTS:
                time.sleep(0.2 * 2 ** attempt)  # another machine created the tables meanwhile
                continue
            line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"--storage {redact_url(url)}: cannot open ({line})") from None
    raise AssertionError("unreachable")


def _engine_kwargs(url: str) -> dict[str, Any]:
    """SQLAlchemy engine options: for SQLite, wait up to ``2 x`` :func:`grace_period_s` (at least
    30 s) for the database's write lock rather than the driver's 5 s.  A worker stopped while it
    held that lock (a stall: SIGSTOP, swapping) made the other worker's stale-trial cleanup fail
    with "database is locked" and end the run; now it waits for the stall to pass."""
    if not url.startswith("sqlite"):
        return {}
    return {"connect_args": {"timeout": max(30, 2 * grace_period_s())}}


def _collided(exc: BaseException) -> bool:
    """Whether ``exc`` is two processes creating the same tables at once (a unique violation)."""
    text = f"{type(exc).__name__} {exc}"
    return any(word in text for word in ("UniqueViolation", "IntegrityError", "already exists", "Duplicate"))


@contextmanager
def _creation_lock(url: str) -> Iterator[None]:
    """The advisory lock held while Optuna creates its tables in a PostgreSQL database (nothing for
    another database: :func:`open_storage` retries a collision there)."""
    if not url.startswith("postgres"):
        yield
        return
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as conn, advisory_lock(conn):
            yield
    finally:
        engine.dispose()


@contextmanager
def advisory_lock(conn: Any) -> Iterator[None]:
    """Hold PostgreSQL's session advisory lock :data:`ADVISORY_LOCK_KEY` on the SQLAlchemy
    connection ``conn`` for the ``with`` block (every machine's processes take the same key)."""
    import sqlalchemy

    conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": ADVISORY_LOCK_KEY})
    try:
        yield
    finally:
        conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": ADVISORY_LOCK_KEY})


@contextmanager
def storage_lock(storage: Any, run_dir: Path) -> Iterator[None]:
    """Hold the one lock of every process using ``storage``: a PostgreSQL advisory lock for a
    PostgreSQL ``RDBStorage`` (every machine), else an exclusive file lock on
    ``run_dir/.studies.lock`` (the processes of this machine)."""
    engine = getattr(storage, "engine", None)
    if engine is not None and engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            with advisory_lock(conn):
                yield
            conn.commit()
        return
    with open(run_dir / STUDIES_LOCK_FILE, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def has_heartbeat(storage: Any) -> bool:
    """Whether ``storage`` finds dead workers by Optuna's heartbeat (a database storage)."""
    interval = getattr(storage, "get_heartbeat_interval", None)  # Optuna's BaseHeartbeat
    return interval is not None and interval() is not None


def fail_stale(study: Any) -> None:
    """Fail the RUNNING trials of ``study`` whose heartbeat stopped more than the grace period ago
    (their worker died on any machine) and enqueue each one's retry (Optuna's
    ``fail_stale_trials``; nothing for a storage without heartbeats)."""
    optuna = optuna_module()
    if has_heartbeat(study._storage):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
