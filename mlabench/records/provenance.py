"""Where a run comes from: the git revision of the code, the library versions and the command line,
as a manifest records them."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path


#: Where a wheel keeps the revision it was built from (``setup.py`` writes it; absent in a checkout).
BUILT_REVISION = Path(__file__).resolve().parents[1] / "_revision.txt"


def git_revision(repo: Path | None = None) -> tuple[str, bool]:
    """``(revision, dirty)`` of the mlabench checkout; outside one (an installed wheel) the revision
    the wheel was built from (``mlabench/_revision.txt``, written by ``setup.py``), else the package
    version, ``("mlabench-0.1.0", False)``.

    Only a git work tree whose top level is ``repo`` (default: the folder above the package)
    counts, so a wheel installed in a virtual environment inside some other repository does not
    record that repository's revision.  ``$MLABENCH_GIT_REVISION`` (``<sha>`` or ``<sha>-dirty``)
    overrides it, for copies of the tree made without ``.git`` (e.g. a working tree shipped to a
    GPU machine).
    """
    from mlabench import __version__

    env = os.environ.get("MLABENCH_GIT_REVISION")
    if env:
        return env.removesuffix("-dirty"), env.endswith("-dirty")
    repo = (repo or Path(__file__).resolve().parents[2]).resolve()
    text = BUILT_REVISION.read_text().strip() if BUILT_REVISION.is_file() else ""
    no_git = (text.removesuffix("-dirty"), text.endswith("-dirty")) if text else (f"mlabench-{__version__}", False)
    try:
        top = subprocess.run(["git", "-C", str(repo), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=10)
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != repo:
            return no_git
        rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        # Only code that can change a measurement counts (not the serving driver).
        paths = ["mlabench", ":!mlabench/serving", ":!mlabench/cli/serve_commands.py"]
        dirty = bool(subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", *paths],
                                    capture_output=True, text=True, timeout=10).stdout.strip())
        return rev, dirty
    except (OSError, subprocess.SubprocessError):
        return no_git


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
