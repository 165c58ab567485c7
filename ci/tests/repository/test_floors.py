"""The dependency floors are written once: pyproject.toml's ``[project] dependencies`` (``name>=floor``);
ci/oldest-constraints.txt pins each floor ``==`` and must say nothing else, and ``make test-oldest`` installs
the project with that file and runs the conformance suite and the golden tests on it (the real check, not run
here: it builds a venv; docs/development.md#dependency-floors)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[3]
CONSTRAINTS = "ci/oldest-constraints.txt"


def floors(pyproject_text):
    """``{name: floor}`` of the ``[project] dependencies``; ValueError naming a dependency without one ``>=``."""
    out = {}
    for line in tomllib.loads(pyproject_text)["project"]["dependencies"]:
        req = Requirement(line)
        lower = [s.version for s in req.specifier if s.operator == ">="]
        if len(lower) != 1:
            raise ValueError(f"dependencies: {line!r} has no single floor (name>=version)")
        out[canonicalize_name(req.name)] = lower[0]
    return out


def pins(constraints_text):
    """``{name: version}`` of a constraints file's ``name==version`` lines; ValueError naming any other line."""
    out = {}
    for line in constraints_text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.+!-]*)", line)
        if m is None:
            raise ValueError(f"constraints: {line!r} is not name==version")
        out[canonicalize_name(m.group(1))] = m.group(2)
    return out


def test_the_oldest_constraints_pin_exactly_the_floors():
    expected = floors((REPO / "pyproject.toml").read_text())
    assert pins((REPO / CONSTRAINTS).read_text()) == expected
    assert {"jax", "numpy", "pytest", "hypothesis", "mpmath", "matplotlib"} <= set(expected)


def test_a_dependency_without_a_floor_or_a_loose_pin_is_refused():
    with pytest.raises(ValueError, match="'numpy'"):
        floors('[project]\ndependencies = ["numpy"]\n')
    with pytest.raises(ValueError, match="numpy>=2"):
        pins("numpy>=2\n")
    assert floors('[project]\ndependencies = ["NumPy>=2.0,<3  "]\n') == pins("numpy==2.0  # floor\n") == {
        "numpy": "2.0"}


def test_make_test_oldest_installs_the_constraints_and_runs_the_suite():
    dry = subprocess.run(["make", "-n", "-B", "test-oldest"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    install = [ln for ln in dry.stdout.splitlines() if "pip install" in ln and " -e ." in ln]
    assert install and all(f"-c {CONSTRAINTS}" in ln and ".venv-oldest/" in ln for ln in install), dry.stdout
    assert "--pyargs gdn2_oracle.property_tests" in dry.stdout and "golden/tests" in dry.stdout
    assert "CI=true" in dry.stdout  # the ci profile of the conformance suite
