import json

import pytest

from mlabench.errors import ResultsError
from mlabench.results import Manifest, Record, ResultStore, point_key, utc_now


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


def test_corrupt_middle_line_is_an_error(tmp_path):
    store = ResultStore.create(tmp_path / "r1", manifest())
    store.append(record(1))
    with open(store.jsonl, "a") as fh:
        fh.write("{garbage}\n")
    store.append(record(2))
    with pytest.raises(ResultsError, match=":2: not a valid record"):
        store.records()


def test_records_forbid_unknown_fields():
    with pytest.raises(Exception):
        Record.model_validate({**record(1).model_dump(), "surprise": 1})


def test_run_folders_and_records_of(tmp_path):
    from mlabench.results import records_of, run_folders

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

    from mlabench.results import records_of, run_folders

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
    with pytest.raises(ResultsError, match="one level down: " + str(tmp_path / "parent")):
        run_folders([tmp_path])


def test_git_revision_only_of_the_checkout_itself(tmp_path, monkeypatch):
    """A package folder inside some other repository (a venv in a project) records the package
    version, not that repository's revision; the checkout records its HEAD."""
    import subprocess

    from mlabench import __version__
    from mlabench.results import git_revision

    monkeypatch.delenv("MLABENCH_GIT_REVISION", raising=False)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    inner = tmp_path / "venv" / "lib"
    inner.mkdir(parents=True)
    assert git_revision(inner) == (f"mlabench-{__version__}", False)
    assert git_revision(tmp_path / "nowhere") == (f"mlabench-{__version__}", False)
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
