"""Build hook: a wheel carries the checkout's presets and Slurm template inside the package.

``pyproject.toml`` holds the project's metadata; this file only extends ``build_py`` so a built
wheel (``pip install .``, ``pip wheel .``) has ``rlsys/_shipped/conf/`` and
``rlsys/_shipped/scripts/slurm/rlsys.sbatch`` (``rlsys.config.shipped`` finds them). An editable
install reads them from the checkout instead."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED_FILES = ("conf", "scripts/slurm/rlsys.sbatch")  # as rlsys/config/shipped.py lists them


class BuildWithShippedFiles(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            return
        target = Path(self.build_lib) / "rlsys" / "_shipped"
        for name in SHIPPED_FILES:
            source, dest = ROOT / name, target / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, dest, dirs_exist_ok=True)
            else:
                shutil.copy2(source, dest)


setup(cmdclass={"build_py": BuildWithShippedFiles})
