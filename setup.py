"""Build hook: the wheel ships the top-level ``configs/`` (model presets, sweeps, serve examples)
inside the package as ``mlabench/_configs/``, so that an installed mlabench has its presets, and the
git revision it was built from as ``mlabench/_revision.txt`` (``<sha>`` or ``<sha>-dirty``:
``$MLABENCH_GIT_REVISION``, else the checkout's ``git rev-parse HEAD``; no file when neither is
known), which runs of the installed package record.  ``configs/`` stays the one place people edit;
everything else is in ``pyproject.toml``."""

import os
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
CONFIGS = ROOT / "configs"


def build_revision() -> str | None:
    """The revision this tree was built from (module docstring), or None."""
    env = os.environ.get("MLABENCH_GIT_REVISION")
    if env:
        return env
    try:
        top = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != ROOT:
            return None
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "mlabench"],
                               capture_output=True, text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


class BuildPyWithConfigs(build_py):
    """``build_py`` that also copies ``configs/**/*.toml`` to ``<build>/mlabench/_configs/`` and writes
    ``<build>/mlabench/_revision.txt``."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "mlabench" / "_configs"
        for source in sorted(CONFIGS.rglob("*.toml")):
            dest = target / source.relative_to(CONFIGS)
            self.mkpath(str(dest.parent))
            self.copy_file(str(source), str(dest))
        revision = build_revision()
        if revision:
            (Path(self.build_lib) / "mlabench" / "_revision.txt").write_text(revision + "\n")


setup(cmdclass={"build_py": BuildPyWithConfigs})
