"""The layout rules of docs/DESIGN.md §3, checked on the source: one import package, dependencies one way.

* every import of our code goes through ``gdn2_oracle.`` (or is relative): a bare ``import kernels``
  would load the PyPI package of that name once installed;
* ``oracle`` never imports JAX or ``kernels``; ``kernels`` (outside its tests) never imports
  ``oracle``, ``golden``, ``ci`` or ``property_tests``; ``golden`` uses ``oracle`` only;
* the design the code cites is in the repository: every ``DESIGN.md`` reference is to docs/DESIGN.md
  and names a section that exists there; nothing cites an issue tracker.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUBPACKAGES = ("oracle", "kernels", "golden", "ci", "property_tests")
SOURCES = sorted(p for sub in SUBPACKAGES for p in (ROOT / sub).rglob("*.py"))
# What each subpackage's non-test modules may not import (top-level names after gdn2_oracle.).
FORBIDDEN = {
    "oracle": {"jax", "jaxlib", "kernels", "golden", "ci", "property_tests"},
    "kernels": {"oracle", "golden", "ci", "property_tests"},
    "golden": {"jax", "jaxlib", "kernels", "ci", "property_tests"},
}


def _rel(path):
    return path.relative_to(ROOT).as_posix()


def _imports(path):
    """``(lineno, module)`` of every absolute import in ``path`` (``from a.b import c`` -> ``a.b.c``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def _is_test(path):
    parts = path.relative_to(ROOT).parts
    return "tests" in parts or "benchmarks" in parts


def test_sources_found():
    assert len(SOURCES) > 40 and all(p.suffix == ".py" for p in SOURCES)


@pytest.mark.parametrize("path", SOURCES, ids=_rel)
def test_imports_go_through_the_package(path):
    bare = [f"{_rel(path)}:{n}: import {m}" for n, m in _imports(path) if m.split(".")[0] in SUBPACKAGES]
    assert not bare, "import our code as gdn2_oracle.<subpackage> (or relatively):\n" + "\n".join(bare)


@pytest.mark.parametrize("path", [p for p in SOURCES if p.relative_to(ROOT).parts[0] in FORBIDDEN
                                  and not _is_test(p)], ids=_rel)
def test_dependencies_point_one_way(path):
    sub = path.relative_to(ROOT).parts[0]
    bad = []
    for n, m in _imports(path):
        parts = m.split(".")
        top = parts[1] if parts[0] == "gdn2_oracle" and len(parts) > 1 else parts[0]
        if top in FORBIDDEN[sub]:
            bad.append(f"{_rel(path)}:{n}: import {m}")
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):  # relative imports reaching a sibling subpackage (from .. import oracle)
        if isinstance(node, ast.ImportFrom) and node.level >= 2:
            names = [node.module or ""] + [a.name for a in node.names]
            if any(nm.split(".")[0] in FORBIDDEN[sub] for nm in names):
                bad.append(f"{_rel(path)}:{node.lineno}: relative import of {names}")
    assert not bad, f"{sub} must not import {sorted(FORBIDDEN[sub])}:\n" + "\n".join(bad)


# The design's old home outside the repository (spelled in parts so this file does not cite it).
OUTSIDE = "/".join(("..", "shared"))


def _design_sections():
    text = (ROOT / "docs" / "DESIGN.md").read_text()
    return set(re.findall(r"^#+\s*(\d+)\.", text, flags=re.M))


def _cited_files():
    here = Path(__file__).resolve()
    return [p for p in SOURCES if p != here] + [ROOT / "README.md", ROOT / "Makefile", ROOT / "pyproject.toml"]


def test_design_references_point_into_the_repository():
    sections = _design_sections()
    assert {"1", "2", "3", "4"} <= sections, f"docs/DESIGN.md sections found: {sorted(sections)}"
    bad = []
    for path in _cited_files():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if OUTSIDE in line:
                bad.append(f"{_rel(path)}:{n}: {line.strip()}")
            for m in re.finditer(r"(\S*)DESIGN\.md(?:\s*§\s*(\d+))?", line):
                prefix, section = m.group(1), m.group(2)
                if not prefix.endswith("docs/"):
                    bad.append(f"{_rel(path)}:{n}: {m.group(0)} (write docs/DESIGN.md)")
                if section and section not in sections:
                    bad.append(f"{_rel(path)}:{n}: §{section} is not a section of docs/DESIGN.md")
    assert not bad, "\n".join(bad)


def test_no_issue_tracker_references_in_code():
    pattern = re.compile(r"\bissues?\s*#?\d+", re.I)
    bad = [f"{_rel(p)}:{n}: {line.strip()}" for p in SOURCES
           for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not bad, "\n".join(bad)
