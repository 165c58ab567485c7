"""The repository's conftest.py orders the suite's heaviest modules first (its ``HEAVIEST``): each one it names
exists and is a slow module (a test marked slow), so a renamed or lightened module cannot silently drop out of the
front of the run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _conftest():
    spec = importlib.util.spec_from_file_location("repository_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_heaviest_modules_exist_and_are_slow_modules():
    heaviest = _conftest().HEAVIEST
    assert len(set(heaviest)) == len(heaviest) and heaviest
    for name in heaviest:
        path = ROOT / name
        assert path.is_file(), f"conftest.py HEAVIEST names {name}, which does not exist"
        assert "pytest.mark.slow" in path.read_text(encoding="utf-8"), f"{name} has no test marked slow"
