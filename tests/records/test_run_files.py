"""The names of :mod:`mlabench.run_files`: distinct, the archives gzipped, the patterns filled in.

That no other module spells them: ``tests/core/test_run_file_names.py``.
"""

from __future__ import annotations

from mlabench import run_files


def test_the_names_are_distinct_and_the_archives_are_gzipped():
    assert len(set(run_files.RUN_FILE_NAMES)) == len(run_files.RUN_FILE_NAMES)
    assert run_files.ARCHIVED_RESULTS_FILE == "results.jsonl.gz"
    assert run_files.ARCHIVED_JOURNAL_FILE == "study.journal.gz"
    assert run_files.ARCHIVED_JSONL_GLOB == "*.jsonl.gz"


def test_the_patterns_name_one_file_per_worker_and_per_variant():
    assert run_files.worker_log_file(3) == "worker-3.log"
    assert run_files.server_log_file("fast") == "server-fast.log"
    assert all(p.count("*") == 1 for p in run_files.RUN_FILE_PATTERNS)


def test_the_policy_files_are_the_exported_formats():
    assert run_files.POLICY_FILES == {"json": "policy.json", "cpp": "policy.h", "python": "policy.py"}
