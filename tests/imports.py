"""What importing a module loads, seen from a fresh interpreter (shared by the tests that keep a
light module away from a heavy one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def modules_loaded_by(statement: str) -> set[str]:
    """The names in ``sys.modules`` after ``statement`` (e.g. ``"import mlabench.tune.space"``) runs in
    a new Python process with this checkout first on its path."""
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    return set(out.stdout.split())
