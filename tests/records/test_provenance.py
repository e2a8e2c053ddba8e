"""The revision a run records: the commit, and whether code that can change a measurement was
edited since (the serving driver does not count), or what $MLABENCH_GIT_REVISION says."""

import shutil
import subprocess

import pytest

from mlabench.records.provenance import git_revision

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    monkeypatch.delenv("MLABENCH_GIT_REVISION", raising=False)
    for path in ("mlabench/measure/timing.py", "mlabench/serving/bench.py", "mlabench/cli/serve_commands.py", "README.md"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x = 1\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "snapshot")
    return tmp_path


def test_a_clean_checkout_records_its_commit(repo):
    assert git_revision(repo) == (git(repo, "rev-parse", "HEAD"), False)


@pytest.mark.parametrize("edited, dirty", [("mlabench/measure/timing.py", True), ("mlabench/new_kernel.py", True),
                                           ("mlabench/serving/bench.py", False),
                                           ("mlabench/cli/serve_commands.py", False), ("README.md", False)])
def test_only_edits_that_can_change_a_measurement_make_it_dirty(repo, edited, dirty):
    (repo / edited).write_text("x = 2\n")
    assert git_revision(repo) == (git(repo, "rev-parse", "HEAD"), dirty)


def test_outside_git_the_package_version_stands_for_the_revision(tmp_path, monkeypatch):
    from mlabench import __version__

    monkeypatch.delenv("MLABENCH_GIT_REVISION", raising=False)
    assert git_revision(tmp_path) == (f"mlabench-{__version__}", False)


@pytest.mark.parametrize("value, want", [("abc1234", ("abc1234", False)), ("abc1234-dirty", ("abc1234", True))])
def test_the_environment_names_the_revision_of_a_copy_without_git(tmp_path, monkeypatch, value, want):
    monkeypatch.setenv("MLABENCH_GIT_REVISION", value)
    assert git_revision(tmp_path) == want


@pytest.mark.parametrize("value", ["0" * 40, "abc123", "main", "abc1234-dirtyish", "-dirty"])
def test_an_environment_revision_that_is_no_commit_is_refused(tmp_path, monkeypatch, value):
    """A run recorded git's null id (40 zeros) or a branch name as the commit it measured."""
    from mlabench.errors import ConfigError

    monkeypatch.setenv("MLABENCH_GIT_REVISION", value)
    with pytest.raises(ConfigError, match=r"MLABENCH_GIT_REVISION=.* is not a commit id"):
        git_revision(tmp_path)


@pytest.mark.parametrize("text, want", [("0123456789abcdef0123\n", ("0123456789abcdef0123", False)),
                                        ("0123456789abcdef0123-dirty\n", ("0123456789abcdef0123", True))])
def test_an_installed_wheel_records_the_revision_it_was_built_from(tmp_path, monkeypatch, text, want):
    """Issue 25 item 14: an installed wheel recorded 'mlabench-0.1.0' as its git revision."""
    monkeypatch.delenv("MLABENCH_GIT_REVISION", raising=False)
    built = tmp_path / "_revision.txt"
    built.write_text(text)
    monkeypatch.setattr("mlabench.records.provenance.BUILT_REVISION", built)
    assert git_revision(tmp_path / "elsewhere") == want


def test_diff_cuts_a_commit_id_but_not_a_version():
    """Issue 25 item 14: diff cut 'mlabench-0.1.0' to 'mlabench-0.1'."""
    from mlabench.sweep.diff import short_revision

    assert short_revision("mlabench-0.1.0") == "mlabench-0.1.0"
    assert short_revision("0123456789abcdef0123") == "0123456789ab"


def test_a_stamp_names_the_revision_of_a_copy_over_an_older_checkout(repo):
    """A GPU machine's copy of the tree sat over the .git of an older checkout: its sweeps recorded
    that commit, dirty (d034bfa for code at f8cbc3d).  The stamp written where the code was
    committed names the right one, and only while the code is what was stamped."""
    from mlabench.records.provenance import write_revision_stamp

    old = git(repo, "rev-parse", "HEAD")
    (repo / "mlabench/measure/timing.py").write_text("x = 2\n")
    git(repo, "commit", "-qam", "new code")
    stamp = write_revision_stamp(repo)
    new = git(repo, "rev-parse", "HEAD")
    assert stamp["revision"] == new and not stamp["dirty"]
    git(repo, "reset", "-q", "--soft", old)  # the copy: new files over the old commit's .git
    assert git_revision(repo) == (new, False)
    (repo / "mlabench/serving/bench.py").write_text("x = 3\n")  # the driver does not count
    assert git_revision(repo) == (new, False)
    (repo / "mlabench/measure/timing.py").write_text("x = 4\n")  # edited since the stamp
    assert git_revision(repo) == (new, True)
    subprocess.run(["rm", "-rf", str(repo / ".git")], check=True)  # a copy without any .git
    assert git_revision(repo) == (new, True)
    assert old


def test_a_clean_checkout_wins_over_a_stamp(repo):
    from mlabench.records.provenance import write_revision_stamp

    (repo / "mlabench/measure/timing.py").write_text("x = 2\n")
    write_revision_stamp(repo)  # dirty stamp of the first commit
    git(repo, "commit", "-qam", "commit the edit")
    assert git_revision(repo) == (git(repo, "rev-parse", "HEAD"), False)


def test_stamping_outside_git_is_refused(tmp_path):
    from mlabench.records.provenance import write_revision_stamp

    (tmp_path / "mlabench").mkdir()
    with pytest.raises(RuntimeError, match="not a git checkout"):
        write_revision_stamp(tmp_path)


def test_the_stamp_script_outside_git_is_one_error_line(tmp_path):
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts/stamp_revision.py"
    (tmp_path / "mlabench").mkdir()
    r = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.strip() == f"error: {tmp_path} is not a git checkout: nothing to stamp"


def test_an_exported_tree_stamped_with_its_commit_records_it(tmp_path):
    """``scripts/h200_bisect.sh prepare`` exports a commit's mlabench/ with git archive (no .git)
    and stamps it with that commit: its runs record it, and a hand-edited copy records it dirty
    (a fresh user's review: such runs recorded ``mlabench-0.1.0`` and diff called them the same)."""
    import sys
    from pathlib import Path

    (tmp_path / "mlabench/measure").mkdir(parents=True)
    (tmp_path / "mlabench/measure/timing.py").write_text("x = 1\n")
    script = Path(__file__).resolve().parents[2] / "scripts/stamp_revision.py"
    r = subprocess.run([sys.executable, str(script), str(tmp_path), "ab" * 20], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert git_revision(tmp_path) == ("ab" * 20, False)
    (tmp_path / "mlabench/measure/timing.py").write_text("x = 2\n")
    assert git_revision(tmp_path) == ("ab" * 20, True)
    for bad, said in (("HEAD", "is not a full commit id"), ("ab" * 4, "is not a full commit id"),
                       ("0" * 40, "is git's null id")):
        r = subprocess.run([sys.executable, str(script), str(tmp_path), bad], capture_output=True, text=True)
        assert r.returncode == 1 and said in r.stderr, r.stderr
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "mlabench/measure"), "ab" * 20],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "has no mlabench/ to stamp" in r.stderr, r.stderr
