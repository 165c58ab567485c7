"""The Makefile's crash rerun (``CRASH_RERUN``): a test whose xdist worker dies runs once more on a fresh worker;
a plain failure is never rerun, and a test that kills its worker twice fails the run.

Run through pytest in a subprocess with the Makefile's own options, on a file of tests that end their worker with a
segfault (a read at address 0), so what is checked is what ``make test`` does at the process boundary.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

TESTS = '''
import ctypes, os, pathlib

def test_dies_once():
    mark = pathlib.Path(os.environ["CRASH_MARK"])
    if not mark.exists():
        mark.write_text("died once")
        ctypes.string_at(0)

def test_dies_when_told():
    if os.environ.get("CRASH_ALWAYS"):
        ctypes.string_at(0)

def test_fails_plainly():
    assert os.environ.get("NEVER_SET") == "set", "a plain failure"

def test_passes():
    pass
'''


def crash_rerun_options():
    """The Makefile's ``CRASH_RERUN`` options, as make passes them to pytest (``$$`` is make's ``$``)."""
    found = re.search(r"^CRASH_RERUN := (.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert found, "the Makefile defines no CRASH_RERUN"
    return shlex.split(found.group(1).replace("$$", "$"))


def outcomes(tmp_path, **env):
    """``{outcome: count}`` of the summary line of a two-worker run of :data:`TESTS` with the Makefile's options."""
    (tmp_path / "test_enders.py").write_text(TESTS)
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2",
                          *crash_rerun_options(), "test_enders.py"], cwd=tmp_path, capture_output=True, text=True,
                         env=dict(os.environ, CRASH_MARK=str(tmp_path / "mark"), PYTHONFAULTHANDLER="", **env),
                         timeout=300)
    last = run.stdout.strip().splitlines()[-1]
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", last)}, run.stdout


@pytest.mark.parametrize("always", [False, True], ids=["dies-once", "dies-twice"])
def test_a_crashed_worker_reruns_its_test_once_and_only_that(tmp_path, always):
    if always:  # only test_dies_when_told dies: two workers dying at once race pytest-rerunfailures' replacement
        (tmp_path / "mark").write_text("test_dies_once has died already")
    got, out = outcomes(tmp_path, **({"CRASH_ALWAYS": "1"} if always else {}))
    if always:  # the second death fails the test: nothing is hidden
        assert got == {"failed": 2, "passed": 2, "rerun": 1}, out
        assert "worker 'gw" in out and "crashed while running 'test_enders.py::test_dies_when_told'" in out
    else:
        assert got == {"failed": 1, "passed": 3, "rerun": 1}, out
    assert "FAILED test_enders.py::test_fails_plainly" in out  # a plain failure is not rerun (one rerun above)
