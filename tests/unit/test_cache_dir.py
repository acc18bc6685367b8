"""Where rlsys caches built-in models and warm starts, and that the suite keeps every cache
inside the checkout (tests/conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path

from rlsys.run.cache import cache_dir

ROOT = Path(__file__).resolve().parents[2]


def test_cache_dir_takes_rlsys_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("RLSYS_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("RLSYS_CACHE_DIR")
    assert cache_dir() == tmp_path / "xdg" / "rlsys"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "rlsys"


def test_the_suite_caches_inside_the_checkout():
    assert cache_dir().is_relative_to(ROOT)
    for key in ("XDG_CACHE_HOME", "TORCH_EXTENSIONS_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        assert Path(os.environ[key]).is_relative_to(ROOT), key
