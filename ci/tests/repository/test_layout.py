"""The layout rules of docs/DESIGN.md §3, checked on the source (AST): one import package, floors, no cycles.

* every import of our code goes through ``gdn2_oracle.`` (or is relative): a bare ``import kernels``
  would load the PyPI package of that name once installed;
* the import graph of the package's modules (tests and benchmarks aside; function-local imports count)
  has no cycle between files, and none between floors (``oracle``, ``kernels``, ``golden``,
  ``ci.grading``, ``ci.running``, ``ci.commands``, ``ci`` (cli, testing), ``property_tests``);
* each floor imports only what it may (:data:`FORBIDDEN`): ``oracle`` never JAX nor ``kernels``; ``kernels``
  never ``oracle``; ``ci.grading`` no JAX, no argparse, nothing of ``running`` or ``commands``; ``ci.running``
  nothing of ``commands``; ``property_tests`` nothing of ``commands``;
* the design the code cites is in the repository: every ``DESIGN.md`` reference is to docs/DESIGN.md
  and names a section that exists there; nothing cites an issue tracker.

A planted cycle and a planted floor violation, in a copy of the tree, are caught (the rules can fail).
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SUBPACKAGES = ("oracle", "kernels", "golden", "ci", "property_tests")
PACKAGE_DIRS = {"gdn2_oracle": "ci/_root", **{f"gdn2_oracle.{s}": s for s in SUBPACKAGES}}
# What each floor's modules may not import: module prefixes (``jax`` covers ``jax.numpy``).
FORBIDDEN = {
    "oracle": ("jax", "jaxlib", "gdn2_oracle.kernels", "gdn2_oracle.golden", "gdn2_oracle.ci",
               "gdn2_oracle.property_tests"),
    "kernels": ("gdn2_oracle.oracle", "gdn2_oracle.golden", "gdn2_oracle.ci", "gdn2_oracle.property_tests"),
    "golden": ("jax", "jaxlib", "gdn2_oracle.kernels", "gdn2_oracle.ci", "gdn2_oracle.property_tests"),
    "ci.grading": ("jax", "jaxlib", "argparse", "gdn2_oracle.kernels", "gdn2_oracle.ci.running",
                   "gdn2_oracle.ci.commands", "gdn2_oracle.ci.cli", "gdn2_oracle.ci.testing",
                   "gdn2_oracle.property_tests"),
    "ci.running": ("gdn2_oracle.ci.commands", "gdn2_oracle.ci.cli", "gdn2_oracle.ci.testing"),
    "property_tests": ("gdn2_oracle.ci.commands", "gdn2_oracle.ci.cli", "gdn2_oracle.ci.testing"),
}


def _rel(path, root=ROOT):
    return path.relative_to(root).as_posix()


def _is_test(path, root=ROOT):
    parts = path.relative_to(root).parts
    return "tests" in parts or "benchmarks" in parts or path.name == "conftest.py"


def sources(root=ROOT):
    """Every ``.py`` file of the subpackages' folders."""
    return sorted(p for sub in SUBPACKAGES for p in (root / sub).rglob("*.py"))


def module_name(path, root=ROOT):
    """The dotted module a package file installs as (``ci/grading/case.py`` -> ``gdn2_oracle.ci.grading.case``)."""
    rel = path.relative_to(root)
    if rel.parts[:2] == ("ci", "_root"):
        parts = ["gdn2_oracle", *rel.parts[2:]]
    else:
        parts = ["gdn2_oracle", *rel.parts]
    parts[-1] = parts[-1].removesuffix(".py")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def floor(module):
    """The floor of one of our modules: ``oracle``, ..., ``ci.grading``, ``ci.running``, ``ci.commands``, ``ci``."""
    parts = module.split(".")[1:]
    if not parts:
        return "root"
    if parts[0] == "ci" and len(parts) > 1 and parts[1] in ("grading", "running", "commands"):
        return f"ci.{parts[1]}"
    return parts[0]


def imports(path, root=ROOT):
    """``(lineno, module)`` of every import in ``path``, anywhere in it, relative ones resolved
    (``from a.b import c`` -> ``a.b.c``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = module_name(path, root)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out


def graph(root=ROOT):
    """``{module: {imported module: first line}}`` over the package's non-test modules (ours only)."""
    modules = {module_name(p, root): p for p in sources(root) if not _is_test(p, root)}
    edges = {}
    for name, path in modules.items():
        out = edges.setdefault(name, {})
        for line, target in imports(path, root):
            while target and target not in modules:  # ``from pkg import attr``: the package's __init__
                target = target.rpartition(".")[0]
            if target and target != name:
                out.setdefault(target, line)
    return edges


def cycles(edges):
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def floor_graph(edges):
    """The same graph between floors (edges inside a floor dropped)."""
    out = {}
    for a, targets in edges.items():
        for b in targets:
            if floor(a) != floor(b):
                out.setdefault(floor(a), {})[floor(b)] = 1
    return out


def floor_violations(root=ROOT):
    """``path:line: import X`` for every import a floor may not make."""
    bad = []
    for path in sources(root):
        if _is_test(path, root):
            continue
        rules = FORBIDDEN.get(floor(module_name(path, root)), ())
        for line, target in imports(path, root):
            if any(target == f or target.startswith(f + ".") for f in rules):
                bad.append(f"{_rel(path, root)}:{line}: import {target}")
    return bad


SOURCES = sources()


def test_sources_found():
    assert len(SOURCES) > 40 and all(p.suffix == ".py" for p in SOURCES)


@pytest.mark.parametrize("path", SOURCES, ids=_rel)
def test_imports_go_through_the_package(path):
    bare = [f"{_rel(path)}:{n}: import {m}" for n, m in imports(path) if m.split(".")[0] in SUBPACKAGES]
    assert not bare, "import our code as gdn2_oracle.<subpackage> (or relatively):\n" + "\n".join(bare)


def test_no_import_cycle_between_files_or_floors():
    edges = graph()
    assert len(edges) > 60 and "gdn2_oracle.ci.grading.tolerance" in edges["gdn2_oracle.ci.grading.case"]
    assert not cycles(edges), cycles(edges)
    assert not cycles(floor_graph(edges)), cycles(floor_graph(edges))


def test_each_floor_imports_only_what_it_may():
    assert not floor_violations(), "\n".join(floor_violations())


def _copy(tmp_path):
    for sub in SUBPACKAGES:
        shutil.copytree(ROOT / sub, tmp_path / sub, ignore=shutil.ignore_patterns("__pycache__", "data"))
    return tmp_path


def test_a_planted_cycle_and_a_planted_floor_violation_are_caught(tmp_path):
    root = _copy(tmp_path)
    grades = root / "ci" / "grading" / "grades.py"
    assert not cycles(graph(root)) and not floor_violations(root)
    # grades is imported by tolerance, diagnose, case, ...: importing case back closes a cycle
    grades.write_text(grades.read_text() + "\n\ndef _late():\n    from .case import Case\n    return Case\n")
    assert any({"gdn2_oracle.ci.grading.case", "gdn2_oracle.ci.grading.grades"} <= set(c)
               for c in cycles(graph(root))), cycles(graph(root))
    grades.write_text(grades.read_text() + "\nimport jax\nfrom ..commands import output\n")
    found = floor_violations(root)
    assert any(v.endswith("import jax") for v in found) and any("ci.commands.output" in v for v in found), found
    # a planted cycle between floors: running -> commands -> running
    (root / "ci" / "running" / "late.py").write_text("from gdn2_oracle.ci.commands import validate\n")
    assert any("ci.commands" in c and "ci.running" in c for c in cycles(floor_graph(graph(root))))


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


def test_test_modules_outside_packages_have_unique_names():
    """Test folders have no __init__.py, so pytest imports their files by basename: two ``test_x.py`` in
    different folders collide ("import file mismatch") under pytest's default import mode."""
    loose = [p for p in SOURCES if p.name.startswith("test_") and not (p.parent / "__init__.py").exists()]
    names = [p.name for p in loose]
    assert len(loose) > 30 and len(set(names)) == len(names), sorted(n for n in names if names.count(n) > 1)
