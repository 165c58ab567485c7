"""Rules of docs/DESIGN.md §3 that are about the text of the code rather than its imports.

* every ``noqa`` comment names the rule it silences and says why (``# noqa: BLE001 - why``): a bare
  ``# noqa`` silences every rule, and one without a reason cannot be judged when the code around it changes;
* docs/development.md's file map ("The files") names every module of the package (the non-test ``.py`` files
  but ``__init__.py``) under its folder, and every ``.py`` file it names exists;
* docs/DESIGN.md §3's floors of ``ci/`` (``ci/grading/``, ``ci/running/``, ``ci/commands/``) name each of their
  modules;
* no module of the package (tests aside) imports or reads a private name (``_x``) of another of our modules: what
  another module needs is public.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DESIGN = ROOT / "docs/DESIGN.md"
DEVELOPMENT = ROOT / "docs/development.md"
SUBPACKAGES = ("oracle", "kernels", "golden", "ci", "property_tests")
MAP_NAME = re.compile(r"^[\w.]+(?:\.py|/),?$")  # a name in the file map: ``x.py``, ``x.py,`` or ``dir/``
MAP_DESCRIPTION_COLUMN = 24  # a line indented this far continues a description
NOQA = re.compile(r"#\s*noqa\b(?P<rest>.*)", re.IGNORECASE)
# ``: CODE[, CODE...]``, then a separator and a reason of at least a word.
NOQA_WITH_REASON = re.compile(r"^:\s*[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*\s*(?:-|--|:|—|\()\s*\w.*$")


def python_files(root=ROOT):
    files = [root / "conftest.py"] if (root / "conftest.py").exists() else []
    return files + sorted(p for sub in SUBPACKAGES for p in (root / sub).rglob("*.py"))


def noqa_without_reason(source):
    """``(line, comment)`` of every ``noqa`` comment in ``source`` that lacks a rule code or a reason."""
    bad = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        match = NOQA.search(token.string)
        if match and not NOQA_WITH_REASON.match(match.group("rest").strip()):
            bad.append((token.start[0], token.string))
    return bad


@pytest.mark.parametrize("comment, ok", [
    ("# noqa: BLE001 - a worker's failure is reported, not raised", True),
    ("# noqa: E402, F401 - after importorskip", True),
    ("# noqa: S102 (the printed one-liner)", True),
    ("# noqa", False),
    ("# noqa - no rule named", False),
    ("# noqa: BLE001", False),
    ("# noqa: BLE001 -", False),
    ("# noqa:BLE001,E501", False),
])
def test_the_noqa_rule_can_fail(comment, ok):
    assert (noqa_without_reason(f"x = 1  {comment}\n") == []) == ok


def test_every_noqa_names_its_rule_and_says_why():
    files = python_files()
    assert len(files) > 100, files
    bad = [f"{path.relative_to(ROOT).as_posix()}:{line}: {comment}"
           for path in files for line, comment in noqa_without_reason(path.read_text(encoding="utf-8"))]
    assert not bad, "a noqa names the rule it silences and says why (# noqa: CODE - why):\n" + "\n".join(bad)


def file_map(text):
    """The paths the file map of docs/development.md names: an entry is a line of the indented block under
    "## The files" that starts (left of the description column) with names, ``dir/`` or ``x.py`` (several
    separated by commas); an entry indented under a ``dir/`` is in it."""
    block = text.split("\n## The files", 1)[1].split("\n## ", 1)[0]
    listed, folders = set(), []
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        if not line.strip() or indent < 4 or indent >= MAP_DESCRIPTION_COLUMN:
            continue
        while folders and folders[-1][0] >= indent:
            folders.pop()
        prefix = "".join(name for _, name in folders)
        for token in line.split():
            if not MAP_NAME.match(token):
                break
            name = token.rstrip(",")
            listed.add((prefix + name).rstrip("/"))
            if name.endswith("/"):
                folders.append((indent, name))
    return listed


def package_modules(root=ROOT):
    """The package's modules as paths: the non-test ``.py`` files of the subpackages but ``__init__.py``."""
    out = []
    for path in python_files(root):
        rel = path.relative_to(root)
        if rel.parent == Path(".") or "tests" in rel.parts or "benchmarks" in rel.parts:
            continue
        if path.name not in ("__init__.py", "conftest.py"):
            out.append(rel.as_posix())
    return out


def test_the_file_map_rule_can_fail():
    text = ("# Title\n\n## The files\n\n    oracle/             the oracle\n      a.py, b.py,         two\n"
            "      c.py                a description\n                          naming x.py, continued\n"
            "    kernels/\n      pallas/\n        d.py\n"
            "      e.py                after a nested folder\n\n## Next\n    f.py\n")
    assert file_map(text) == {"oracle", "oracle/a.py", "oracle/b.py", "oracle/c.py", "kernels", "kernels/pallas",
                              "kernels/pallas/d.py", "kernels/e.py"}


def test_the_file_map_names_every_module():
    listed = file_map(DEVELOPMENT.read_text(encoding="utf-8"))
    modules = package_modules()
    assert len(modules) > 50, modules
    missing = [m for m in modules if m not in listed]
    assert not missing, "docs/development.md's file map (The files) misses these modules:\n" + "\n".join(missing)
    gone = sorted(p for p in listed if p.endswith(".py") and not (ROOT / p).exists())
    assert not gone, "docs/development.md's file map names files that are not there:\n" + "\n".join(gone)


def design_floor(text, folder):
    """The entry of ``folder`` (``ci/grading/``) in docs/DESIGN.md §3's list of ci's floors: its line and those
    indented under it."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"    {folder} "))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("     "))
    return "\n".join(lines[start:end])


@pytest.mark.parametrize("folder", ["ci/grading/", "ci/running/", "ci/commands/"])
def test_design_names_every_module_of_each_ci_floor(folder):
    entry = design_floor(DESIGN.read_text(encoding="utf-8"), folder)
    modules = sorted(p.stem for p in (ROOT / folder).glob("*.py") if p.name != "__init__.py")
    missing = [m for m in modules if not re.search(rf"\b{m}\b", entry)]
    assert not missing, f"docs/DESIGN.md §3 does not name these modules of {folder}: {missing}\n{entry}"


def private_uses(path):
    """``(line, text)`` of each use in ``path`` of another of our modules' private name: ``from .m import _x`` or
    ``m._x`` where ``m`` was imported from the package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("gdn2_oracle")):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append((node.lineno, f"from {'.' * node.level}{node.module or ''} import {alias.name}"))
                else:
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            modules.update(a.asname or a.name.split(".")[0] for a in node.names if a.name.startswith("gdn2_oracle"))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name) and node.value.id in modules):
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return sorted(found)


def test_the_private_name_rule_can_fail(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from . import recurrence\nfrom .mp import _MPArith, MPForward\nimport numpy as np\n"
                    "x = recurrence._run(np._NoValue, recurrence.run)\n")
    assert private_uses(path) == [(2, "from .mp import _MPArith"), (4, "recurrence._run")]


def test_no_module_uses_another_modules_private_names():
    bad = [f"{path.relative_to(ROOT).as_posix()}:{line}: {text}" for path in python_files()
           if path.parent != ROOT and not {"tests", "benchmarks"} & set(path.relative_to(ROOT).parts)
           for line, text in private_uses(path)]
    assert not bad, "make these names public (or put them behind a public function):\n" + "\n".join(bad)
