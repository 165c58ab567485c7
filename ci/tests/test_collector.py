"""The garbage collector's young threshold (ci/running/collector.py): raised in the console script's child and in the
conformance suite's pytest session, never lowered, never turned back on."""

from __future__ import annotations

import gc
import json

import pytest

from gdn2_oracle.ci.running import collector
from gdn2_oracle.ci.testing import console, pytest_run


@pytest.fixture
def threshold():
    """This process's thresholds, restored after the test."""
    kept = gc.get_threshold()
    yield
    gc.set_threshold(*kept)


@pytest.mark.parametrize("before, after", [((700, 10, 10), (collector.GEN0, 10, 10)),
                                           ((700, 3, 4), (collector.GEN0, 3, 4)),
                                           ((50_000, 10, 10), (50_000, 10, 10)),
                                           ((0, 10, 10), (0, 10, 10))],
                         ids=["default", "older-generations-kept", "higher-kept", "off-kept"])
def test_the_young_threshold_is_raised_only(threshold, before, after):
    gc.set_threshold(*before)
    collector.raise_threshold()
    assert gc.get_threshold() == after


PROBE = '''
import gc, json, os
from gdn2_oracle import kernels

_base = kernels.get("pairwise")


def fn(q, k, v, g, b, w, scale=None, initial_state=None):
    with open(os.environ["GC_PROBE_OUT"], "w") as f:
        json.dump(gc.get_threshold(), f)
    return _base(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
'''


def test_the_console_scripts_child_traces_with_the_raised_threshold(tmp_path):
    (tmp_path / "gcprobe.py").write_text(PROBE)
    out = tmp_path / "threshold.json"
    proc = console(tmp_path, "validate", "--kernel", "gcprobe:fn", "--cases", "golden", "--case", "len_1", "--dtype",
                   "float32", "--no-progress", PYTHONPATH=str(tmp_path), GC_PROBE_OUT=str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(out.read_text())[0] == collector.GEN0


SESSION = '''
import gc


def test_threshold():
    print("THRESHOLD", gc.get_threshold()[0])
'''


def test_the_conformance_suites_session_runs_with_the_raised_threshold(tmp_path):
    (tmp_path / "test_gc_session.py").write_text(SESSION)
    code, out = pytest_run(tmp_path, "--pyargs", "gdn2_oracle.property_tests.test_conformance", "test_gc_session.py",
                           "-k", "test_threshold", "-s", "-q")
    assert code == 0 and f"THRESHOLD {collector.GEN0}" in out, out
