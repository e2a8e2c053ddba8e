"""Rules of the run store tested beside their code (issue 35 item 16; they were tested only from
the sweep, report and golden tests): which keys a resumed run counts as finished, and which of a
raw file's plain and gzipped copies a reader takes."""

from __future__ import annotations

import gzip

from mlabench.records.store import ARCHIVED_RESULTS_FILE, RESULTS_FILE, ResultStore, stored_file
from tests.records.test_results import manifest, record


def test_finished_keys_are_every_complete_record_whatever_its_status(tmp_path):
    """A resumed run skips every point with a record: an incorrect, failed or unsupported point
    is a row, not a gap, and is not measured again; a record cut short by an interruption is not
    finished, so that point is measured again."""
    store = ResultStore.create(tmp_path / "r1", manifest())
    statuses = {1: "ok", 2: "incorrect", 3: "error", 4: "unsupported", 5: "timeout"}
    for i, status in statuses.items():
        store.append(record(i, status))
    with open(store.jsonl, "a") as fh:  # an interrupted write of point 6
        fh.write(record(6).model_dump_json()[:50])
    assert store.finished_keys() == {record(i).key for i in statuses}
    assert record(6).key not in ResultStore.open_existing(store.run_dir).finished_keys()


def test_a_reader_takes_the_plain_file_before_its_gzipped_copy(tmp_path):
    """``stored_file``: the plain file where it exists (a run appends to it), the ``.gz`` only
    where the plain one does not, the plain name where neither does."""
    plain, gz = tmp_path / RESULTS_FILE, tmp_path / ARCHIVED_RESULTS_FILE
    assert stored_file(plain) == plain
    gz.write_bytes(gzip.compress(b""))
    assert stored_file(plain) == gz
    plain.write_text("")
    assert stored_file(plain) == plain
    (tmp_path / "x.jsonl.gz").mkdir()  # a folder of that name is no copy
    assert stored_file(tmp_path / "x.jsonl") == tmp_path / "x.jsonl"


def test_a_run_folder_with_both_copies_reads_the_plain_records(tmp_path):
    store = ResultStore.create(tmp_path / "r1", manifest())
    for i in (1, 2):
        store.append(record(i))
    (store.run_dir / ARCHIVED_RESULTS_FILE).write_bytes(gzip.compress(record(9).model_dump_json().encode() + b"\n"))
    again = ResultStore(store.run_dir)
    assert not again.archived and [r.context_len for r in again.records()] == [1, 2]
