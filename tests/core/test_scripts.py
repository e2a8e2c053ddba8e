"""The shell and Python scripts under ``scripts/`` that a user runs as the README writes them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: A ``python3`` that has no torch and logs every pip command line instead of installing.
FAKE_PYTHON = """#!/bin/sh
case "$*" in
  *"import torch"*) exit 1 ;;
  "-m pip"*) echo "$*" >> "$PIP_LOG" ;;
esac
exit 0
"""


def test_setup_on_a_cpu_machine_takes_torch_from_pytorchs_cpu_index(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(FAKE_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    (bin_dir / "dirname").symlink_to(shutil.which("dirname"))  # the script's only outside tool; no nvidia-smi
    log = tmp_path / "pip.log"
    env = {"PATH": str(bin_dir), "PIP_LOG": str(log), "HOME": str(tmp_path)}
    subprocess.run([shutil.which("bash"), str(REPO / "scripts/setup.sh")], env=env, check=True, timeout=60)
    torch_line, mlabench_line = log.read_text().splitlines()
    assert "--index-url https://download.pytorch.org/whl/cpu" in torch_line and "torch==2.13.0" in torch_line
    assert ("--find-links /opt/wheels" in torch_line) == os.path.isdir("/opt/wheels")
    assert mlabench_line.endswith(" -e .")  # torch, now installed, is not asked for again


def test_h200_readme_tables_runs_as_the_readme_writes_it_outside_an_install(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-I", "scripts/h200_readme_tables.py"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "| batch | context | floor µs |" in done.stdout
