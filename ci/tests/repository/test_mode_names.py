"""A call mode is named in few places: the registry (oracle/call_modes.py), the oracle's mode math and recipes,
the kernels' own keyword tables and the golden corpus -- never in ci/ or property_tests/, which iterate the
registry (docs/adding-a-mode.md).

A file names a mode when one of its identifiers (a NAME token) or a word of one of its string literals (split
on non-word characters; docstrings, comments and tests/ folders do not count) equals the mode's name. ci/benchmarks
is included. "gate" is also the English word for GDN-2's erase and write gates (``b``, ``w``): the phrases in
:data:`ORDINARY` are not the gate mode.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

from gdn2_oracle.oracle import call_modes

ROOT = Path(__file__).resolve().parents[3]
TREES = ("oracle", "kernels", "golden", "ci", "property_tests")
ITERATING = ("ci/", "property_tests/")  # trees that must name no mode
MOST_FILES = 10  # a mode is named in at most this many files overall
ORDINARY = re.compile(r"\b(erase gates?|write gates?|gate regimes?|erase and write gates)\b")
# Files of ci/ and property_tests/ not yet moved onto the registry (each a known debt, to shrink to none).
PENDING = set()


def _is_docstring(tokens, i):
    """Whether STRING token ``i`` is a statement by itself."""
    skip = (tokenize.NL, tokenize.COMMENT)
    j = i - 1
    while j >= 0 and tokens[j].type in skip:
        j -= 1
    k = i + 1
    while k < len(tokens) and tokens[k].type in skip:
        k += 1
    before = j < 0 or tokens[j].type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING)
    after = k >= len(tokens) or tokens[k].type in (tokenize.NEWLINE, tokenize.ENDMARKER)
    return before and after


def named_words(text):
    """The identifiers and string-literal words (docstrings aside) of Python source ``text``."""
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    words = set()
    for i, t in enumerate(tokens):
        if t.type == tokenize.NAME:
            words.add(t.string)
        elif t.type == tokenize.STRING and not _is_docstring(tokens, i):
            words.update(re.split(r"\W+", ORDINARY.sub(" ", t.string)))
    return words


def naming_files(root=ROOT):
    """``{mode: [file, ...]}``: the non-test sources of :data:`TREES` naming each registry mode."""
    out = {m: [] for m in call_modes.names()}
    for tree in TREES:
        for path in sorted((root / tree).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if "/tests/" in rel:
                continue
            words = named_words(path.read_text())
            for mode in out:
                if mode in words:
                    out[mode].append(rel)
    return out


def test_named_words_skip_docstrings_and_split_strings():
    src = 'def f():\n    """gate varlen"""\n    return g(x="a gate", y="erase gate b")\n'
    assert {"f", "g", "x", "a", "gate", "b"} <= named_words(src) and "varlen" not in named_words(src)
    assert "gate" not in named_words('y = "erase gate b"\n')


def test_ci_and_property_tests_name_no_mode():
    found = {m: [f for f in files if f.startswith(ITERATING) and f not in PENDING]
             for m, files in naming_files().items()}
    assert not {m: f for m, f in found.items() if f}, "name the mode through oracle/call_modes.py instead"


def test_every_mode_is_named_in_few_files():
    counted = {m: [f for f in files if f not in PENDING] for m, files in naming_files().items()}
    assert {m: len(f) for m, f in counted.items() if len(f) > MOST_FILES} == {}
