"""A wheel install has the presets (issue 8 item 5): build the wheel, install it in a fresh virtual
environment, and run the commands from outside the checkout.

The environment sees the packages this interpreter sees (``--system-site-packages`` and this
interpreter's path: torch is not installed again) and the wheel goes in with ``--no-deps``; the
checkout is kept off the path.
"""

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILT_FROM = "0123456789abcdef0123456789abcdef01234567"  # the revision the test wheel is built as


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``(bin folder, environment, a folder outside the checkout)`` of a venv holding the wheel."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"  # a copy, so that the build leaves nothing in the checkout
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", "results", "tests", "__pycache__", "build",
                                                            "dist", "*.egg-info", ".venv*", ".pytest_cache"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    # The checkout on $PYTHONPATH would make pip think the wheel is installed already.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLABENCH_CONFIGS", "MLABENCH_GIT_REVISION")}
    # The copy has no .git: the build is told its revision, as setup.py takes it from a checkout.
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(src)],
                   check=True, capture_output=True, timeout=300, env={**env, "MLABENCH_GIT_REVISION": BUILT_FROM})
    (wheel,) = (tmp / "dist").glob("mlabench-*.whl")
    venv.create(tmp / "venv", system_site_packages=True, with_pip=False)
    python = tmp / "venv" / "bin" / "python"
    # What this interpreter sees (a virtual environment's packages, packages installed with
    # --target as on the GPU image) stays visible after the environment's own site-packages; the
    # checkout does not.
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    outer = [p for p in sys.path if p and Path(p).is_dir() and not Path(p).resolve().is_relative_to(REPO)]
    (Path(site) / "outer-packages.pth").write_text("\n".join(outer) + "\n")
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", str(wheel)],
                   check=True, capture_output=True, timeout=300, env=env)
    outside = tmp / "elsewhere"
    outside.mkdir()
    return python.parent, env, outside


def run(installed, *args):
    bin_dir, env, outside = installed
    return subprocess.run([str(bin_dir / args[0]), *args[1:]], cwd=outside, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_installed_package_is_the_wheel(installed):
    r = run(installed, "python", "-c", "import mlabench, mlabench.files as c; print(mlabench.__file__); "
                                       "print(c.configs_dir())")
    assert r.returncode == 0, r.stderr
    module, configs = r.stdout.split()
    assert r.returncode == 0 and str(installed[0].parent) in module, r.stderr
    assert configs.endswith("mlabench/_configs") and str(REPO) not in configs
    r = run(installed, "python", "-c", "from mlabench.shapes import list_models; from mlabench.serving.config "
                                       "import load_config; print(list_models(), load_config('cpu-tiny').baseline)")
    assert "'kimi-k3'" in r.stdout and "'deepseek-v3'" in r.stdout and "running" in r.stdout, r.stderr


def test_check_from_outside_the_checkout(installed):
    r = run(installed, "mlabench", "check", "--model", "kimi-k3", "--tp", "8", "--backend", "torch-splitkv",
            "--splits", "1", "--context", "64", "--json")
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)[0]["rows"]
    assert row["verdict"] == "pass" and "H=12" in row["shape"]


def test_sweep_by_name_and_the_recorded_revision(installed):
    bad = run(installed, "mlabench", "sweep", "--config", "no-such-sweep")
    assert bad.returncode == 2 and "known: kimi-k3-tp8" in bad.stderr
    out = installed[2] / "results"
    r = run(installed, "mlabench", "sweep", "--backend", "torch-splitkv", "--context", "32", "--batch", "1",
            "--splits", "1", "--page-size", "16", "--budget-s", "0.05", "--results-dir", str(out), "--json")
    assert r.returncode == 0, r.stderr
    (run_dir,) = out.iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    # issue 25 item 14: the revision the wheel was built from, not 'mlabench-0.1.0'
    assert manifest["git_revision"] == BUILT_FROM and not manifest["git_dirty"]
    assert manifest["config"]["model"] == "kimi-k3"
