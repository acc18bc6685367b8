"""Files that live at a checkout's top level and inside an installed wheel.

A checkout (and the editable install) keeps the presets in ``conf/`` and the Slurm template in
``scripts/slurm/``; a built wheel carries copies of them in the package, under
``rlsys/_shipped/`` (``setup.py`` puts them there), so ``pip install rlsys-*.whl`` runs with
no checkout beside it."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

SHIPPED = "_shipped"  # the folder inside the package that setup.py fills
SHIPPED_FILES = ("conf", "scripts/slurm/rlsys.sbatch")  # what it copies, from the checkout


def shipped(name: str) -> Path:
    """``name`` (a path relative to the checkout's top level, one of ``SHIPPED_FILES`` or
    inside one) from the installed package's copy where there is one, else from the
    checkout the package was imported from."""
    packaged = Path(str(resources.files("rlsys").joinpath(SHIPPED, name)))
    if packaged.exists():
        return packaged
    return Path(__file__).resolve().parents[2] / name
