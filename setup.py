"""Build hook: the wheel ships the top-level ``configs/`` (model presets, sweeps, serve examples)
inside the package as ``mlabench/_configs/``, so that an installed mlabench has its presets.
``configs/`` stays the one place people edit; everything else is in ``pyproject.toml``."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

CONFIGS = Path(__file__).resolve().parent / "configs"


class BuildPyWithConfigs(build_py):
    """``build_py`` that also copies ``configs/**/*.toml`` to ``<build>/mlabench/_configs/``."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "mlabench" / "_configs"
        for source in sorted(CONFIGS.rglob("*.toml")):
            dest = target / source.relative_to(CONFIGS)
            self.mkpath(str(dest.parent))
            self.copy_file(str(source), str(dest))


setup(cmdclass={"build_py": BuildPyWithConfigs})
