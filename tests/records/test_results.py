import json

import pytest

from mlabench.errors import FileAccessError, ResultsError
from mlabench.records.record import Manifest, Record, point_key, utc_now
from mlabench.records.store import ResultStore


def manifest(run_id="r1", rev="abc"):
    return Manifest(run_id=run_id, created=utc_now(), command=["mlabench", "sweep"], git_revision=rev,
                    git_dirty=False, host="h", device={"name": "cpu"}, driver="n/a",
                    versions={"torch": "2.13.0"}, copy_bandwidth_tbps=0.02)


def record(i, status="ok"):
    shape = {"num_heads": 12, "context_lens": [i]}
    return Record(key=point_key("b", {"num_kv_splits": i}, shape), run_id="r1", backend="b",
                  params={"num_kv_splits": i}, shape=shape, batch=1, num_heads=12, context_len=i,
                  status=status, timestamp=utc_now())


def test_append_read_csv(tmp_path):
    store = ResultStore.create(tmp_path / "r1", manifest())
    for i in range(1, 4):
        store.append(record(i, "ok" if i != 2 else "incorrect"))
    recs = store.records()
    assert [r.context_len for r in recs] == [1, 2, 3] and recs[1].status == "incorrect"
    csv_text = store.write_csv().read_text().splitlines()
    assert csv_text[0].startswith("backend,params") and len(csv_text) == 4


def test_create_refuses_existing_run(tmp_path):
    ResultStore.create(tmp_path / "r1", manifest())
    with pytest.raises(ResultsError, match="--resume"):
        ResultStore.create(tmp_path / "r1", manifest())


def test_resume_drops_a_cut_short_line_and_keeps_the_rest(tmp_path):
    store = ResultStore.create(tmp_path / "r1", manifest())
    store.append(record(1))
    store.append(record(2))
    with open(store.jsonl, "a") as fh:  # an interrupted write
        fh.write(record(3).model_dump_json()[:40])
    assert len(store.records()) == 2
    again = ResultStore.open_existing(tmp_path / "r1", identity=manifest().identity())
    again.append(record(3))
    assert [r.context_len for r in again.records()] == [1, 2, 3]
    assert all(json.loads(line) for line in again.jsonl.read_text().splitlines())


def test_resume_refuses_another_identity(tmp_path):
    ResultStore.create(tmp_path / "r1", manifest(rev="abc"))
    with pytest.raises(ResultsError, match="git_revision"):
        ResultStore.open_existing(tmp_path / "r1", identity=manifest(rev="def").identity())


def _store_with_a_line_between(tmp_path, line: str) -> ResultStore:
    """A run folder holding record 1, ``line``, record 2."""
    store = ResultStore.create(tmp_path / "r1", manifest())
    store.append(record(1))
    with open(store.jsonl, "a") as fh:
        fh.write(line)
    store.append(record(2))
    return store


def test_corrupt_middle_line_is_an_error(tmp_path):
    store = _store_with_a_line_between(tmp_path, "{garbage}\n")
    with pytest.raises(ResultsError, match=":2: not a valid record"):
        store.records()


def test_records_forbid_unknown_fields():
    with pytest.raises(Exception):
        Record.model_validate({**record(1).model_dump(), "surprise": 1})


def test_run_folders_and_records_of(tmp_path):
    from mlabench.records.store import records_of, run_folders

    for name in ("r1", "r2"):
        ResultStore.create(tmp_path / "parent" / name, manifest(name)).append(record(int(name[1])))
    runs = run_folders([tmp_path / "parent"])
    assert [p.name for p in runs] == ["r1", "r2"] and run_folders([runs[0]]) == [runs[0]]
    assert [r.context_len for r in records_of([tmp_path / "parent"])] == [1, 2]
    with pytest.raises(ResultsError, match="no run folder"):
        run_folders([tmp_path / "nowhere"])
    other = manifest("r3").model_copy(update={"device": {"name": "NVIDIA H200"}})
    ResultStore.create(tmp_path / "r3", other).append(record(3))
    with pytest.raises(ResultsError, match="different devices"):
        records_of([tmp_path / "parent", tmp_path / "r3"])


def test_an_archived_run_is_read_as_it_is_and_never_appended_to(tmp_path):
    import gzip

    from mlabench.records.store import records_of, run_folders

    store = ResultStore.create(tmp_path / "parent" / "r1", manifest())
    for i in range(1, 4):
        store.append(record(i))
    (store.run_dir / "results.jsonl.gz").write_bytes(gzip.compress(store.jsonl.read_bytes()))
    store.jsonl.unlink()
    assert run_folders([tmp_path / "parent"]) == [store.run_dir]
    assert [r.context_len for r in records_of([tmp_path / "parent"])] == [1, 2, 3]
    archived = ResultStore(store.run_dir)
    assert archived.archived and [r.context_len for r in archived.records()] == [1, 2, 3]
    with pytest.raises(ResultsError, match="archived .*gunzip"):
        archived.append(record(4))
    with pytest.raises(ResultsError, match="archived .*gunzip"):  # refused before anything is written
        ResultStore.open_existing(store.run_dir)
    assert len(ResultStore(store.run_dir).records()) == 3
    with pytest.raises(ResultsError, match="further down .*: " + str(store.run_dir)):
        run_folders([tmp_path])


def test_resume_is_refused_while_a_sentinel_file_is_still_gzipped(tmp_path):
    """Records gunzipped but sentinel.jsonl.gz left: a resumed run would start a new plain
    sentinel file that readers take instead of the old readings; refused, naming the file."""
    import gzip

    from mlabench.records.store import refuse_archived

    store = ResultStore.create(tmp_path / "r1", manifest())
    store.append(record(1))
    (store.run_dir / "sentinel.jsonl.gz").write_bytes(gzip.compress(b"{}\n"))
    with pytest.raises(ResultsError, match="sentinel.jsonl.gz is still gzipped: gunzip it too"):
        ResultStore.open_existing(store.run_dir)
    (store.run_dir / "sentinel.jsonl").write_text("{}\n")
    refuse_archived(store.run_dir)  # both there: the plain file is the one appended to and read


def test_git_revision_only_of_the_checkout_itself(tmp_path, monkeypatch):
    """A package folder inside some other repository (a venv in a project) records the package
    version, not that repository's revision; the checkout records its HEAD."""
    import subprocess

    from mlabench import __version__
    from mlabench.records.provenance import git_revision

    monkeypatch.delenv("MLABENCH_GIT_REVISION", raising=False)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    inner = tmp_path / "venv" / "lib"
    inner.mkdir(parents=True)
    assert git_revision(inner) == (f"mlabench-{__version__}", False)
    assert git_revision(tmp_path / "nowhere") == (f"mlabench-{__version__}", False)
    assert git_revision(tmp_path) == (f"mlabench-{__version__}", False)  # a checkout without a commit
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert git_revision(tmp_path) == (head, False)
    assert git_revision(inner) == (f"mlabench-{__version__}", False)  # still not that repository's revision
    from pathlib import Path

    if (Path(__file__).parents[2] / ".git").exists():  # a checkout (not a copy of the tree)
        rev, _ = git_revision()
        assert len(rev) == 40 and int(rev, 16) >= 0


@pytest.mark.parametrize("damage, why", [
    (lambda data: data[: len(data) // 2], "cut short"),  # gzip raised EOFError, which Click took for Ctrl-C
    (lambda data: b"hello\n", "Not a gzipped file"),
    (lambda data: data[:-8] + bytes(8), "CRC check failed"),
])
def test_a_damaged_archive_is_one_error_line_and_exit_2(tmp_path, damage, why):
    import gzip
    import subprocess
    import sys

    store = ResultStore.create(tmp_path / "r1", manifest())
    for i in range(1, 40):
        store.append(record(i))
    (store.run_dir / "results.jsonl.gz").write_bytes(damage(gzip.compress(store.jsonl.read_bytes())))
    store.jsonl.unlink()
    from mlabench.errors import FileAccessError

    with pytest.raises(FileAccessError, match=f"records file is not a whole gzip file \\({why}"):
        ResultStore(store.run_dir).records()
    res = subprocess.run([sys.executable, "-m", "mlabench", "compare", "--from", str(store.run_dir)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and not res.stdout
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"error: records file is not a whole gzip file ({why}")
    assert line.endswith(f": {store.run_dir / 'results.jsonl.gz'}")


@pytest.mark.parametrize("field, other", [("schema_version", 0), ("device", {"name": "NVIDIA H200"}),
                                          ("driver", "550.1"), ("versions", {"torch": "2.14.0"}),
                                          ("git_revision", "def")])
def test_resume_refuses_a_run_of_another_device_driver_versions_revision_or_schema(tmp_path, field, other):
    m = manifest()
    assert m.identity() == {"schema_version": 1, "device": "cpu", "driver": "n/a", "versions": {"torch": "2.13.0"},
                            "git_revision": "abc", "git_dirty": False}
    ResultStore.create(tmp_path / "r1", m)
    theirs = m.model_copy(update={field: other, "command": ["other"], "created": "then", "host": "elsewhere"})
    with pytest.raises(ResultsError, match=f"was recorded with another {field} "):
        ResultStore.open_existing(tmp_path / "r1", identity=theirs.identity())
    # what is not identity (command line, time, host) does not matter
    ResultStore.open_existing(tmp_path / "r1", identity=m.model_copy(update={"host": "elsewhere"}).identity())


def test_resume_refuses_code_edited_since_the_run_was_recorded(tmp_path):
    """A fresh user's review: a run recorded from a clean tree resumed with edited code, and its
    manifest still said git_dirty false: one run held points of two versions of the code."""
    ResultStore.create(tmp_path / "r1", manifest())
    edited = manifest().model_copy(update={"git_dirty": True})
    with pytest.raises(ResultsError, match=r"^\S+ was recorded at abc without uncommitted changes, and the code "
                                           r"here has some: its points would mix two versions of the code"):
        ResultStore.open_existing(tmp_path / "r1", identity=edited.identity())


def test_resume_names_every_field_that_differs_with_both_values(tmp_path):
    """A fresh user's review: several fields differed and only the first one's values were shown."""
    ResultStore.create(tmp_path / "r1", manifest())
    theirs = manifest(rev="def").model_copy(update={"driver": "550.1", "versions": {"torch": "2.14.0", "triton": "3.6"}})
    with pytest.raises(ResultsError, match=r"^\S+ was recorded with another driver \(n/a there, 550\.1 here\), "
                                           r"git_revision \(abc there, def here\), versions \(torch 2\.13\.0 there, "
                                           r"2\.14\.0 here; triton None there, 3\.6 here\); start a new run instead$"):
        ResultStore.open_existing(tmp_path / "r1", identity=theirs.identity())


@pytest.mark.parametrize("given", ["a54eaac", "A54EAAC2AF3B6AC3CDD0410E74ADE6F18C129448"])
def test_resume_takes_a_short_or_upper_case_id_of_the_recorded_commit(tmp_path, given):
    """A fresh user's review: $MLABENCH_GIT_REVISION=a54eaac resuming a run recorded at the full id
    was refused as 'another git_revision'."""
    full = "a54eaac2af3b6ac3cdd0410e74ade6f18c129448"
    ResultStore.create(tmp_path / "r1", manifest(rev=full))
    ResultStore.open_existing(tmp_path / "r1", identity=manifest(rev=given).identity())
    with pytest.raises(ResultsError, match="another git_revision"):
        ResultStore.open_existing(tmp_path / "r1", identity=manifest(rev="a54eaad").identity())


def test_update_manifest_rewrites_summaries_and_refuses_identity_fields(tmp_path):
    store = ResultStore.create(tmp_path / "r1", manifest())
    store.update_manifest(warmups=[{"steady_s": 5.0}], drift={"max_pct": 1.5})
    again = ResultStore(tmp_path / "r1").manifest()
    assert again.warmups == [{"steady_s": 5.0}] and again.drift == {"max_pct": 1.5}
    for field in ("schema_version", "device", "driver", "versions", "git_revision", "run_id"):
        with pytest.raises(ValueError, match=rf"^the manifest's identity does not change: \['{field}'\]$"):
            store.update_manifest(**{field: None})


def test_a_results_file_that_cannot_be_read_is_named_on_resume(tmp_path):
    store = ResultStore.create(tmp_path / "r1", manifest())
    store.jsonl.unlink()
    store.jsonl.mkdir()  # not a file
    with pytest.raises(FileAccessError, match=rf"^run results is a folder, not a file: {store.jsonl}$"):
        ResultStore.open_existing(tmp_path / "r1")


def test_a_run_stopped_before_its_first_record_is_a_run_folder(tmp_path):
    """A fresh user's review: a sweep stopped before its first point left a manifest and no
    results.jsonl, which report, plot, compare and diff called 'no run folder'."""
    from mlabench.records.store import holds_run, run_folders

    store = ResultStore.create(tmp_path / "r1", manifest())
    assert holds_run(store.run_dir) and store.records() == []
    assert run_folders([tmp_path]) == [store.run_dir]


def test_a_copy_of_a_run_beside_it_is_refused_not_counted_twice(tmp_path):
    """A fresh user's review: report --from RUN --from COPY listed 544 points for a 272-point run."""
    import shutil

    from mlabench.records.store import records_of

    store = ResultStore.create(tmp_path / "r1", manifest())
    store.append(record(1))
    shutil.copytree(store.run_dir, tmp_path / "copy")
    with pytest.raises(ResultsError, match=r"r1 and .*copy hold the same run \(.*\): one is a copy"):
        records_of([tmp_path / "r1", tmp_path / "copy"])
    assert len(records_of([tmp_path / "r1", tmp_path / "r1"])) == 1  # one folder named twice: read once


def test_no_run_folder_says_why_and_where_the_runs_are(tmp_path):
    from mlabench.records.store import run_folders

    def message(path):
        with pytest.raises(ResultsError) as info:
            run_folders([path])
        return str(info.value).removeprefix(f"{path}: no run folder (results.jsonl, manifest.json) here or one level down")

    (tmp_path / "file").write_text("")
    assert message(tmp_path / "file") == " (not a folder)"
    assert message(tmp_path / "typo.json") == " (not found: no such file or folder)"  # read as 'not a folder'
    assert message(tmp_path / "file" / "run") == f" (not found: its folder {tmp_path / 'file'} is a file)"
    (tmp_path / "script").mkdir()
    (tmp_path / "script" / "records.jsonl").write_text("")
    assert message(tmp_path / "script") == ("; its records.jsonl is a script's output, not a run (its README.md says "
                                            "what reads it)")
    for run in ("a/h200/r1", "a/h200/r2", "a/mi355x/x/r3"):  # two and three levels down
        ResultStore.create(tmp_path / run, manifest()).append(record(1))
    assert message(tmp_path / "a") == ("; run folders further down (name one, or the folder just above it): "
                                       f"{tmp_path}/a/h200/r1, {tmp_path}/a/h200/r2, {tmp_path}/a/mi355x/x/r3")
    (tmp_path / "empty").mkdir()
    assert message(tmp_path / "empty") == ""


def test_describe_records_lists_up_to_four_lengths_then_a_range():
    from mlabench.records.store import describe_records

    recs = [record(n).model_copy(update={"qo_len": q}) for n, q in ((1024, 1), (2048, 2), (4096, 1), (8192, 1))]
    assert describe_records(recs) == "backends b; batch 1; qo_len 1, 2; context 1024, 2048, 4096, 8192"
    five = recs + [record(16384)]
    assert describe_records(five) == "backends b; batch 1; qo_len 1, 2; context 1024-16384 (5 lengths)"


def test_each_record_reaches_the_disk_before_append_returns(tmp_path, monkeypatch):
    import os

    store = ResultStore.create(tmp_path / "r1", manifest())
    synced = []
    monkeypatch.setattr("mlabench.files.os.fsync", lambda fd: synced.append(os.fstat(fd).st_size))
    store.append(record(1))
    assert synced == [store.jsonl.stat().st_size]  # flushed whole, then fsync'ed
    store.jsonl.unlink()
    store.jsonl.mkdir()
    with pytest.raises(FileAccessError, match=rf"^run results is a folder, not a file: {store.jsonl}$"):
        store.append(record(2))


def test_manifest_and_csv_are_written_whole_through_a_temporary_file(tmp_path):
    """Both go through ``<name>.tmp`` renamed over the file (an interrupted write leaves the old
    one); a folder in the temporary file's place shows it, and the error names the file."""
    store = ResultStore.create(tmp_path / "r1", manifest())
    assert store.manifest_path.read_text().startswith('{\n  "schema_version": 1,\n  "run_id": "r1",\n')
    (tmp_path / "r1" / "manifest.json.tmp").mkdir()
    with pytest.raises(FileAccessError, match=rf"^run manifest is a folder, not a file: {store.manifest_path}$"):
        store.update_manifest(warmups=[])
    store.append(record(1))
    (tmp_path / "r1" / "results.csv.tmp").mkdir()
    with pytest.raises(FileAccessError, match=rf"^results CSV is a folder, not a file: {tmp_path / 'r1' / 'results.csv'}$"):
        store.write_csv()


def test_csv_params_are_json_with_sorted_keys():
    from mlabench.records.csv_rows import csv_row

    rec = record(1).model_copy(update={"params": {"num_kv_splits": 4, "head_padding": 16}})
    assert csv_row(rec)["params"] == '{"head_padding": 16, "num_kv_splits": 4}'


def test_csv_row_of_a_checked_and_timed_record_and_of_one_that_never_ran():
    """Every field of both rows: the relative errors of a checked record (the committed H200 CSV
    predates them), and blanks, not made-up values, where a failed point has no verdict or time."""
    from mlabench.checks.verdict import Verdict
    from mlabench.measure.stats import summarize
    from mlabench.records.csv_rows import CSV_FIELDS, csv_row

    verdict = Verdict(passed=True, shape_ok=True, all_finite=True, max_abs_err=0.002, rmse=0.001, cosine=1.0,
                      output_shape=[1, 12, 512], ref_rms=0.04, rel_rmse=0.025, rel_max_err=0.05)
    ran = record(64).model_copy(update={
        "shape": {"num_heads": 12, "context_lens": [64], "page_size": 16, "kv_dtype": "bfloat16"},
        "verdict": verdict, "timing_mode": "wall", "achieved_tbps": 1.5, "floor_us": 0.5, "pct_of_floor": 25.0,
        "stats": summarize([2.0, 1.0, 3.0]).model_copy(update={"calls_per_sample": 4}), "bytes_moved": 1000,
        "refresh_us": 0.0, "clock_below_steady": False})
    row = csv_row(ran)
    assert set(row) == set(CSV_FIELDS)
    assert {k: row[k] for k in ("verdict_passed", "max_abs_err", "rel_rmse", "rel_max_err", "median_us", "iqr_us",
                                "min_us", "n_samples", "noisy", "eager_median_us", "refresh_us", "page_size",
                                "kv_dtype", "achieved_tbps", "floor_us", "pct_of_floor", "calls_per_sample",
                                "clock_below_steady")} == {
        "verdict_passed": True, "max_abs_err": 0.002, "rel_rmse": 0.025, "rel_max_err": 0.05, "median_us": 2.0,
        "iqr_us": 1.0, "min_us": 1.0, "n_samples": 3, "noisy": ran.stats.noisy, "eager_median_us": "",
        "refresh_us": 0.0, "page_size": 16, "kv_dtype": "bfloat16", "achieved_tbps": 1.5, "floor_us": 0.5,
        "pct_of_floor": 25.0, "calls_per_sample": 4, "clock_below_steady": False}
    never = csv_row(record(64, status="error").model_copy(update={"message": "inputs could not be created"}))
    blank = ["verdict_passed", "max_abs_err", "rel_rmse", "rel_max_err", "median_us", "iqr_us", "min_us", "n_samples",
             "median_rel_ci", "noisy", "eager_median_us", "refresh_us", "achieved_tbps", "floor_us", "pct_of_floor",
             "calls_per_sample", "clock_below_steady"]
    assert {k: never[k] for k in blank} == dict.fromkeys(blank, "")
    assert (never["status"], never["message"], never["timing_mode"]) == ("error", "inputs could not be created", "")


def test_a_blank_line_between_records_loses_none_of_them_and_an_unreadable_file_is_named(tmp_path):
    store = _store_with_a_line_between(tmp_path, "\n")
    assert [r.context_len for r in store.records()] == [1, 2]
    store.jsonl.unlink()
    store.jsonl.mkdir()
    with pytest.raises(FileAccessError, match=rf"^records file is a folder, not a file: {store.jsonl}$"):
        store.records()


def test_the_recorded_command_line_shows_the_program_as_mlabench(monkeypatch):
    from mlabench.records.provenance import command_line

    monkeypatch.setattr("sys.argv", ["/venv/bin/mlabench", "sweep", "--heads", "12"])
    assert command_line() == ["mlabench", "sweep", "--heads", "12"]
    monkeypatch.setattr("sys.argv", ["/src/mlabench/__main__.py", "check"])
    assert command_line() == ["mlabench", "check"]
    monkeypatch.setattr("sys.argv", ["/usr/bin/a-wrapper", "check"])  # another program keeps its name
    assert command_line() == ["a-wrapper", "check"]


def test_library_versions_name_python_torch_its_gpu_runtimes_each_package_and_mlabench():
    import platform

    import torch

    from mlabench import __version__
    from mlabench.records.provenance import library_versions

    versions = library_versions({"triton": ("no-such-dist", "torch"), "flashmla": ("no-such-dist",)})
    assert versions == {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                        "hip": torch.version.hip, "triton": versions["triton"], "flashmla": None,
                        "mlabench": __version__}
    assert versions["triton"] is not None  # the first installed name counts


def test_record_timestamps_are_utc_whatever_the_local_zone(monkeypatch):
    import datetime as dt
    import time

    monkeypatch.setenv("TZ", "Asia/Tokyo")  # 9 h off UTC
    time.tzset()
    try:
        stamp = dt.datetime.fromisoformat(utc_now())
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert stamp.utcoffset() == dt.timedelta(0)
    assert abs((dt.datetime.now(dt.timezone.utc) - stamp).total_seconds()) < 60


def _fill_disk_after(monkeypatch, nbytes):
    """``os.write`` writes at most ``nbytes`` more bytes, then fails as a full disk does (ENOSPC)."""
    import errno
    import os

    real_write, left = os.write, [nbytes]

    def write(fd, data):
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real_write(fd, bytes(data)[:left[0]])
        left[0] -= n
        return n

    monkeypatch.setattr("mlabench.files.os.write", write)


def test_a_full_disk_leaves_no_torn_record(tmp_path, monkeypatch):
    """A record is written whole or not at all: a write cut short by a full disk is cut back off,
    and the error says the disk is full."""
    store = ResultStore.create(tmp_path / "r1", manifest())
    store.append(record(1))
    before = store.jsonl.read_bytes()
    with monkeypatch.context() as m:
        _fill_disk_after(m, 40)
        with pytest.raises(FileAccessError, match=rf"^run results could not be written: the disk is full \(no space left on device\): {store.jsonl}$"):
            store.append(record(2))
    assert store.jsonl.read_bytes() == before
    store.append(record(3))
    assert [r.context_len for r in store.records()] == [1, 3]


def test_a_full_disk_leaves_no_temporary_file(tmp_path, monkeypatch):
    store = ResultStore.create(tmp_path / "r1", manifest())
    store.append(record(1))
    with monkeypatch.context() as m:
        _fill_disk_after(m, 10)
        with pytest.raises(FileAccessError, match="the disk is full"):
            store.write_csv()
    assert sorted(p.name for p in store.run_dir.iterdir()) == ["manifest.json", "results.jsonl"]


def test_a_run_folder_made_on_a_full_disk_is_a_full_disk_error(tmp_path, monkeypatch):
    """ResultStore.create words the failure again (nothing recorded, the folder removed): it stays a
    DiskFullError, exit 3, as every other full-disk write (a review: it became exit 2)."""
    from mlabench.errors import DiskFullError

    with monkeypatch.context() as m:
        _fill_disk_after(m, 0)
        with pytest.raises(DiskFullError, match="the disk is full.*nothing was recorded; the run folder was removed") as info:
            ResultStore.create(tmp_path / "r1", manifest())
    assert info.value.exit_code == 3 and not (tmp_path / "r1").exists()


def test_a_file_or_a_folder_of_runs_is_refused_as_no_run_folder(tmp_path):
    """A fresh user's review: `tune --export RUN/policy.json` said "run manifest is not a folder", and
    a folder of runs "run manifest not found"."""
    for name in ("a", "b"):
        ResultStore.create(tmp_path / "runs" / name, manifest(run_id=name))
    with pytest.raises(ResultsError, match=r"runs is no run folder; it holds runs \(name one\): \S+/runs/a, \S+/runs/b$"):
        ResultStore(tmp_path / "runs").manifest()
    (tmp_path / "policy.json").write_text("{}")
    with pytest.raises(ResultsError, match=r"policy\.json is a file, not a run folder$"):
        ResultStore(tmp_path / "policy.json").manifest()
    with pytest.raises(ResultsError, match=r"nope: no such folder$"):  # a fresh user's review: "run manifest not found"
        ResultStore(tmp_path / "nope").manifest()
