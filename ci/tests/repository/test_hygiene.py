"""Rules of docs/DESIGN.md §3 that are about the text of the code rather than its imports.

* every ``noqa`` comment names the rule it silences and says why (``# noqa: BLE001 - why``): a bare
  ``# noqa`` silences every rule, and one without a reason cannot be judged when the code around it changes.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SUBPACKAGES = ("oracle", "kernels", "golden", "ci", "property_tests")
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
