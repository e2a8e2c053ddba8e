"""The name of every file and folder a run folder (``results/<run-id>/``) holds, defined once.

Every writer and reader of a run folder (the record store, sweeps' visits and sentinel, tuning's
journal, locks and workers, validation, policy exports, serve-bench and its table, reports) takes
its names from here; ``tests/core/test_run_file_names.py`` checks that no other module spells
one (or a name made from one of :data:`RUN_FILE_PATTERNS`) as a string literal.  This module sits at the bottom of the import-linter layers (beside
:mod:`mlabench.files`) because writers below :mod:`mlabench.records` (:mod:`mlabench.serving`,
:mod:`mlabench.policy`) name run files too; it imports nothing.

Committed runs keep their raw JSONL and journal files gzipped: ``<name>`` + :data:`GZIP_SUFFIX`.
"""

from __future__ import annotations

from pathlib import Path

#: Appended to a raw file's name when a committed run keeps it gzipped (read as it is, never appended to).
GZIP_SUFFIX = ".gz"
#: Any raw JSONL file of a run kept gzipped (a glob in a run folder: results, sentinel, visits).
ARCHIVED_JSONL_GLOB = "*.jsonl" + GZIP_SUFFIX

# ---- every run ----------------------------------------------------------------------------------
#: The run's identity and configuration (a :class:`~mlabench.records.record.Manifest`, or the
#: serve-bench manifest); its ``kind`` says what run it is.
MANIFEST_FILE = "manifest.json"
#: One record per line (kernel :class:`~mlabench.records.record.Record`, or serve-bench
#: :class:`~mlabench.serving.results.BenchResult`), appended and fsync'ed.
RESULTS_FILE = "results.jsonl"
ARCHIVED_RESULTS_FILE = RESULTS_FILE + GZIP_SUFFIX
#: The records flattened to CSV (regenerated from :data:`RESULTS_FILE`, never appended).
RESULTS_CSV_FILE = "results.csv"

# ---- sweeps -------------------------------------------------------------------------------------
#: The sentinel point's re-measurements (:mod:`mlabench.sweep.sentinel`).
SENTINEL_FILE = "sentinel.jsonl"
#: Each visit of a point, before its pooled record (:mod:`mlabench.sweep.visits`).
VISITS_FILE = "visits.jsonl"

# ---- tuning and validation ----------------------------------------------------------------------
#: Optuna's journal of the studies (:mod:`mlabench.tune.storage`).
JOURNAL_FILE = "study.journal"
ARCHIVED_JOURNAL_FILE = JOURNAL_FILE + GZIP_SUFFIX
#: Lock file serialising study creation between processes.
STUDIES_LOCK_FILE = ".studies.lock"
#: Lock file serialising appends of the trial workers to :data:`RESULTS_FILE`.
APPEND_LOCK_FILE = ".append.lock"
#: Folder of the trial workers' claims on points.
CLAIMS_FOLDER = ".claims"
#: Folder of the trial workers' logs and their payload.
WORKERS_FOLDER = "workers"
WORKER_PAYLOAD_FILE = "worker-payload.json"
#: One trial worker's log in :data:`WORKERS_FOLDER` (:func:`worker_log_file`).
WORKER_LOG_PATTERN = "worker-*.log"
#: A validation run's points (:class:`~mlabench.tune.validation.PointResult` list) and their tables.
VALIDATION_FILE = "validation.json"
VALIDATION_TABLE_FILE = "validation.md"
#: The exported policy: its stem, and the JSON, C++ header and Python module written from it
#: (:func:`mlabench.policy.exports.write_exports`).
POLICY_STEM = "policy"
POLICY_FILE = POLICY_STEM + ".json"
POLICY_HEADER_FILE = POLICY_STEM + ".h"
POLICY_MODULE_FILE = POLICY_STEM + ".py"
#: The exported policy's files by format (the keys :func:`mlabench.policy.exports.write_exports` returns).
POLICY_FILES = {"json": POLICY_FILE, "cpp": POLICY_HEADER_FILE, "python": POLICY_MODULE_FILE}

# ---- serve-bench and serve-check ----------------------------------------------------------------
#: Every ``vllm bench serve`` command line run, one a line.
COMMANDS_FILE = "commands.txt"
#: The TPOT table of a serve-bench run, as markdown and as JSON.
TABLE_FILE = "table.md"
TABLE_JSON_FILE = "table.json"
#: A serve-check's report.
CHECK_FILE = "check.json"
#: The log of a server serve-bench launched for one variant (:func:`server_log_file`).
SERVER_LOG_PATTERN = "server-*.log"
#: One ``vllm bench serve`` run of a serve-bench run: its JSON result and its log, named by
#: :func:`bench_point_stem` (``<variant>[-i<input len>]-c<concurrency>-r<repeat>``).
BENCH_RESULT_SUFFIX = ".json"
BENCH_LOG_SUFFIX = ".log"
#: The result files of :func:`bench_point_stem` in a run folder (a rerun's ``-2`` and a set-aside
#: ``.unrecorded`` one included), as a glob.
BENCH_RESULT_GLOB = "*-c*-r*" + BENCH_RESULT_SUFFIX
#: Put after the stem of a result file (and its log) that serve-bench found with no record and set
#: aside before running its point again (``<stem>.unrecorded[-N].json``).
BENCH_UNRECORDED_INFIX = ".unrecorded"

# ---- what run a folder holds --------------------------------------------------------------------
#: The ``kind`` a manifest says (:func:`mlabench.records.kinds.run_kind` reads it, or derives it for
#: runs recorded before manifests said it): a kernel sweep (``sweep``, ``compare`` measuring, the
#: scripts that measure points), a tuning run, a validation run (``tune --validate``), a serve-bench run.
SWEEP_KIND, TUNE_KIND, VALIDATION_KIND, SERVE_BENCH_KIND = "sweep", "tune", "validation", "serve-bench"
RUN_KINDS = (SWEEP_KIND, TUNE_KIND, VALIDATION_KIND, SERVE_BENCH_KIND)
#: Key of a manifest's ``config`` -> the kind of a run whose manifest does not say it.
_KIND_OF_CONFIG_KEY = {"tune": TUNE_KIND, "validate": VALIDATION_KIND}


def manifest_kind(manifest: dict) -> str:
    """The kind of the run whose parsed ``manifest.json`` is ``manifest``: its ``kind`` when it is
    one of :data:`RUN_KINDS`, else derived from its ``config`` keys (runs recorded before manifests
    said it: ``config.tune`` a tuning run, ``config.validate`` a validation run; serve-bench
    manifests have always said theirs); :data:`SWEEP_KIND` when neither says otherwise."""
    if manifest.get("kind") in RUN_KINDS:
        return str(manifest["kind"])
    config = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
    return next((kind for key, kind in _KIND_OF_CONFIG_KEY.items() if key in config), SWEEP_KIND)


# ---- not a run ----------------------------------------------------------------------------------
#: A script's records (no manifest): named in the error for a folder that holds no run.
SCRIPT_RECORDS_FILE = "records.jsonl"

#: Every name above a run folder's file or folder can have (the gzipped ones included).
RUN_FILE_NAMES = (
    MANIFEST_FILE, RESULTS_FILE, ARCHIVED_RESULTS_FILE, RESULTS_CSV_FILE, SENTINEL_FILE, VISITS_FILE,
    JOURNAL_FILE, ARCHIVED_JOURNAL_FILE, STUDIES_LOCK_FILE, APPEND_LOCK_FILE, CLAIMS_FOLDER, WORKERS_FOLDER,
    WORKER_PAYLOAD_FILE, VALIDATION_FILE, VALIDATION_TABLE_FILE, POLICY_FILE, POLICY_HEADER_FILE,
    POLICY_MODULE_FILE, COMMANDS_FILE, TABLE_FILE, TABLE_JSON_FILE, CHECK_FILE, SCRIPT_RECORDS_FILE,
)
#: Names made from a value (``*`` stands for it): one file per worker, per served variant.
RUN_FILE_PATTERNS = (WORKER_LOG_PATTERN, SERVER_LOG_PATTERN)


def _from_pattern(pattern: str, value: object) -> str:
    """``pattern`` (one of :data:`RUN_FILE_PATTERNS`) with its ``*`` replaced by ``value``."""
    head, tail = pattern.split("*")
    return f"{head}{value}{tail}"


def worker_log_file(index: int) -> str:
    """The log of trial worker ``index`` (0-based) in :data:`WORKERS_FOLDER`: ``worker-<index>.log``."""
    return _from_pattern(WORKER_LOG_PATTERN, index)


def server_log_file(variant: str) -> str:
    """The log of the server serve-bench launched for the variant named ``variant``: ``server-<variant>.log``."""
    return _from_pattern(SERVER_LOG_PATTERN, variant)


def bench_point_stem(variant: str, input_len: int, concurrency: int, repeat: int, several_lens: bool) -> str:
    """File stem of one bench run of serve-bench: ``<variant>-c<conc>-r<rep>``, with
    ``-i<input len>`` after the variant when the run benchmarks several input lengths; its files are
    the stem plus :data:`BENCH_RESULT_SUFFIX` and :data:`BENCH_LOG_SUFFIX`."""
    return f"{variant}{f'-i{input_len}' if several_lens else ''}-c{concurrency}-r{repeat}"


def stored_file(path: Path) -> Path:
    """The file to read for ``path`` in a run folder: ``path`` itself, or its gzipped copy
    (``<name>.gz``, how committed runs keep their raw files) when ``path`` does not exist and that does.

    Readers only: a run appends to the plain name, and an archived run is never appended to.
    """
    gzipped = path.with_name(path.name + GZIP_SUFFIX)
    return gzipped if not path.exists() and gzipped.is_file() else path
