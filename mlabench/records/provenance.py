"""Where a run comes from: the git revision of the code, the library versions and the command line,
as a manifest records them."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from mlabench.errors import ConfigError


#: Where a wheel keeps the revision it was built from (``setup.py`` writes it; absent in a checkout).
BUILT_REVISION = Path(__file__).resolve().parents[1] / "_revision.txt"
#: The revision stamp of a checkout copied without its ``.git`` (git-ignored; :func:`write_revision_stamp`).
STAMP_NAME = ".mlabench-revision.json"
#: Parts of the package whose edits cannot change a measurement (the serving driver): they neither
#: make a checkout dirty nor enter a stamp's digest.
_DRIVER_PATHS = ("mlabench/serving", "mlabench/cli/serve_commands.py")


def code_digest(repo: Path) -> str:
    """sha256 (hex) over the path and bytes of every file of ``repo/mlabench`` that can change a
    measurement (not the serving driver, caches or a wheel's ``_revision.txt``), in path order."""
    digest = hashlib.sha256()
    root = repo / "mlabench"
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(repo).as_posix()
        if (not path.is_file() or "__pycache__" in path.parts or path.name == BUILT_REVISION.name
                or any(rel == d or rel.startswith(d + "/") for d in _DRIVER_PATHS)):
            continue
        digest.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def is_commit(revision: str) -> bool:
    """Whether a manifest's ``git_revision`` is a git commit id (7 to 40 hex digits, e.g. a short id
    from ``$MLABENCH_GIT_REVISION``), not the package version :func:`git_revision` records where it
    found neither git, a stamp nor a wheel's revision (``mlabench-0.1.0``)."""
    return 7 <= len(revision) <= 40 and all(c in "0123456789abcdef" for c in revision.lower())


def same_commit(x: str, y: str) -> bool:
    """Whether two recorded revisions name one commit: equal, or both commit ids (:func:`is_commit`)
    and one a prefix of the other in any case (a short or upper-case ``$MLABENCH_GIT_REVISION``
    beside the full id git records)."""
    if x == y:
        return True
    x, y = x.lower(), y.lower()
    return is_commit(x) and is_commit(y) and (x.startswith(y) or y.startswith(x))


def is_null_id(revision: str) -> bool:
    """Whether ``revision`` is git's null id (zeros only, e.g. 40 of them: no commit, what git
    prints for a ref that does not exist yet)."""
    return bool(revision) and not revision.strip("0")


def write_revision_stamp(repo: Path | None = None, revision: str | None = None) -> dict:
    """Write ``repo/.mlabench-revision.json``: the checkout's git revision, whether it is dirty, and
    :func:`code_digest` of its code.  A copy of the tree without ``.git`` (a GPU machine's) that
    carries the stamp records that revision, dirty once its code no longer has that digest
    (:func:`git_revision`).  ``revision``: ``repo`` is that commit's ``mlabench/`` exported with
    ``git archive`` (no checkout of its own), stamped clean as it is now.  Returns the stamp.
    Raises RuntimeError outside a git checkout when no ``revision`` is given, and for a
    ``revision`` that is not a full 40-digit commit id (git's null id, 40 zeros, included) or a
    ``repo`` without ``mlabench/``."""
    repo = (repo or Path(__file__).resolve().parents[2]).resolve()
    if revision is not None and not (len(revision) == 40 and revision == revision.lower() and is_commit(revision)):
        raise RuntimeError(f"{revision!r} is not a full commit id (40 lower-case hex digits: git rev-parse REV)")
    if revision is not None and is_null_id(revision):
        raise RuntimeError(f"{revision!r} is git's null id, no commit (git rev-parse REV)")
    if revision is not None and not (repo / "mlabench").is_dir():
        raise RuntimeError(f"{repo} has no mlabench/ to stamp")
    rev = (revision, False) if revision else _checkout_revision(repo)
    if rev is None:
        raise RuntimeError(f"{repo} is not a git checkout: nothing to stamp")
    stamp = {"revision": rev[0], "dirty": rev[1], "digest": code_digest(repo)}
    (repo / STAMP_NAME).write_text(json.dumps(stamp, indent=1) + "\n")
    return stamp


def _stamped_revision(repo: Path) -> tuple[str, bool] | None:
    """The stamp's ``(revision, dirty)`` when ``repo`` has one: dirty as stamped while its digest is
    the code's, dirty once the code was edited since; None without a (readable) stamp."""
    try:
        stamp = json.loads((repo / STAMP_NAME).read_text())
        return str(stamp["revision"]), bool(stamp["dirty"]) or stamp["digest"] != code_digest(repo)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _checkout_revision(repo: Path) -> tuple[str, bool] | None:
    """``(HEAD, dirty)`` of the git work tree whose top level is ``repo``, else None."""
    try:
        top = subprocess.run(["git", "-C", str(repo), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=10)
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != repo:
            return None
        rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        paths = ["mlabench", *(f":!{d}" for d in _DRIVER_PATHS)]
        dirty = bool(subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", *paths],
                                    capture_output=True, text=True, timeout=10).stdout.strip())
        return rev, dirty
    except (OSError, subprocess.SubprocessError):
        return None


def git_revision(repo: Path | None = None) -> tuple[str, bool]:
    """``(revision, dirty)`` of the mlabench checkout ``repo`` (default: the folder above the
    package); dirty when code that can change a measurement (not the serving driver) was edited
    since the commit.  In order:

    1. ``$MLABENCH_GIT_REVISION`` (``<sha>`` or ``<sha>-dirty``; :class:`ConfigError` for anything
       else, git's null id of 40 zeros included);
    2. git, where ``repo`` is the top level of a clean git work tree (so a wheel installed in a
       virtual environment inside some other repository does not record that repository's
       revision);
    3. the checkout's stamp (:func:`write_revision_stamp`): a copy of the tree shipped to a GPU
       machine without its ``.git``, or over the ``.git`` of an older checkout (which git would
       call that commit, dirty); dirty as stamped while the code is what was stamped, else dirty;
    4. git's dirty work tree;
    5. outside one (an installed wheel), the revision the wheel was built from
       (``mlabench/_revision.txt``, written by ``setup.py``), else the package version,
       ``("mlabench-0.1.0", False)``.
    """
    from mlabench import __version__

    env = os.environ.get("MLABENCH_GIT_REVISION")
    if env:
        rev = _named_revision(env)
        if not is_commit(rev[0]) or is_null_id(rev[0]):
            raise ConfigError(f"$MLABENCH_GIT_REVISION={env!r} is not a commit id (7 to 40 hex digits, not git's "
                              "null id, optionally ending in -dirty: git rev-parse HEAD)")
        return rev
    repo = (repo or Path(__file__).resolve().parents[2]).resolve()
    checkout = _checkout_revision(repo)
    if checkout and not checkout[1]:
        return checkout
    found = _stamped_revision(repo) or checkout
    if found:
        return found
    text = BUILT_REVISION.read_text().strip() if BUILT_REVISION.is_file() else ""
    return _named_revision(text) if text else (f"mlabench-{__version__}", False)


def _named_revision(text: str) -> tuple[str, bool]:
    """``<sha>`` or ``<sha>-dirty`` (``$MLABENCH_GIT_REVISION``, a wheel's ``_revision.txt``) as
    ``(revision, dirty)``."""
    return text.removesuffix("-dirty"), text.endswith("-dirty")


def library_versions(packages: Mapping[str, Sequence[str]]) -> dict[str, str | None]:
    """Versions of python, torch (with its CUDA/HIP), mlabench, and each of ``packages``.

    ``packages`` maps a manifest key to distribution names, the first installed one counting
    (``{"triton": ("triton", "pytorch-triton-rocm")}``); callers pass what the registered backends
    declare (:func:`mlabench.backends.registry.backend_packages`).  A missing package is None.
    """
    import torch

    from mlabench import __version__
    from mlabench.extras import package_version

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        **{key: package_version(tuple(names)) for key, names in packages.items()},
        "mlabench": __version__,
    }


def command_line() -> list[str]:
    """``sys.argv`` with the program shown as ``mlabench`` (also under ``python -m mlabench``)."""
    prog = Path(sys.argv[0]).name
    return ["mlabench" if prog in ("__main__.py", "mlabench") else prog, *sys.argv[1:]]
