"""A run folder after a full disk or a damaged file (issue 35 item 13): nothing left half-made or
dropped without a word."""

import errno
import gzip
import os

import pytest

from mlabench.errors import FileAccessError
from mlabench.records.store import ResultStore
from tests.records.test_results import manifest, record


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_manifest_that_cannot_be_written_leaves_no_run_folder(tmp_path, monkeypatch):
    monkeypatch.setattr("mlabench.files._write_file", _disk_full)
    with pytest.raises(FileAccessError, match=r"the disk is full .* \(nothing was recorded; the run folder was removed\)$"):
        ResultStore.create(tmp_path / "r1", manifest())
    assert not (tmp_path / "r1").exists()


def test_a_torn_last_record_is_cut_off_on_resume_with_a_notice(tmp_path, capsys):
    store = ResultStore.create(tmp_path / "r1", manifest())
    store.append(record(1))
    with open(store.jsonl, "a") as fh:  # a write cut short
        fh.write(record(2).model_dump_json()[:40])
    ResultStore.open_existing(store.run_dir, identity=manifest().identity())
    err = capsys.readouterr().err
    assert err.startswith(f"notice: {store.jsonl}: its last line was torn (40 bytes") and "measured again" in err
    ResultStore.open_existing(store.run_dir, identity=manifest().identity())
    assert capsys.readouterr().err == ""                     # a whole file: nothing to say


def test_a_reader_of_a_run_whose_last_record_is_torn_is_told(tmp_path, capsys):
    """A fresh user's review: compare, diff, report and plot read a run whose last record was cut
    short (plain or in a whole archive) as a whole run of one point fewer, without a word."""
    store = ResultStore.create(tmp_path / "r1", manifest())
    store.append(record(1))
    with open(store.jsonl, "a") as fh:
        fh.write(record(2).model_dump_json()[:40])
    assert [r.key for r in store.records()] == [record(1).key]
    assert capsys.readouterr().err == (f"notice: {store.jsonl}: its last line is cut short (40 bytes, an "
                                       "interrupted write) and is left out\n")
    data = store.jsonl.read_bytes()
    store.jsonl.unlink()
    (store.run_dir / "results.jsonl.gz").write_bytes(gzip.compress(data))
    assert len(ResultStore(store.run_dir).records()) == 1
    assert "results.jsonl.gz: its last line is cut short (40 bytes" in capsys.readouterr().err


def test_an_empty_archive_is_refused_rather_than_read_as_no_records(tmp_path):
    store = ResultStore.create(tmp_path / "r1", manifest())
    store.jsonl.unlink()
    (store.run_dir / "results.jsonl.gz").write_bytes(b"")
    with pytest.raises(FileAccessError, match=r"records file is empty \(0 bytes, not a gzip file\)"):
        ResultStore(store.run_dir).records()


def test_a_corrupt_archive_beside_the_plain_file_is_named(tmp_path, capsys):
    store = ResultStore.create(tmp_path / "r1", manifest())
    store.append(record(1))
    gzipped = store.run_dir / "results.jsonl.gz"
    gzipped.write_bytes(gzip.compress(store.jsonl.read_bytes())[:20])
    assert len(store.records()) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"notice: archived run results is not a whole gzip file (cut short): {gzipped}; "
                          "results.jsonl beside it is read")
    gzipped.write_bytes(gzip.compress(store.jsonl.read_bytes()))
    assert len(store.records()) == 1 and capsys.readouterr().err == ""
