"""The family serving properties (``property_tests/test_family_serving.py``) catch every deliberately wrong replay
kernel (``replay-recurrent[mutant=NAME]``, ``kernels/replay_decode.py``), with the diagnosis docs/drivers.md quotes.

Direct runs of the properties' sessions through the replay driver: for each mutant, the property that catches it
grades a run FAIL; the correct kernel passes the same runs. A pytest run in a subprocess shows one of them through the
plugin, as a kernel author would see it.
"""

from __future__ import annotations

import pytest

from gdn2_oracle import kernels
from gdn2_oracle.ci.grading.grades import FAIL
from gdn2_oracle.ci.running.serving import run_session
from gdn2_oracle.ci.testing import pytest_run
from gdn2_oracle.kernels.replay_decode import MUTANTS
from gdn2_oracle.property_tests import test_family_serving as props

# the sessions that catch each mutant (a ring of 6: flushes within 14 steps, windows of 3 fit twice)
STEPS = ("steps", 1, 14)  # (kind, prefill, steps)
WINDOWS = ("windows", 3, (3, 2, 1, 3, 3, 1, 2, 2, 3))  # (kind, S, accepted counts)
CAUGHT_BY = {
    "late_flush": (STEPS, "logic"),
    "cursor_all_drafts": (WINDOWS, "rejected-draft"),  # its accepted outputs move with the finite rejected drafts
    "prefix_decay": (STEPS, "logic"),
    "key_per_value_head": (STEPS, "logic"),
    "base_not_advanced": (WINDOWS, "logic"),
    "null_block_live": (STEPS, "padding"),
}


def _session(kind, a, b, seed=0):
    if kind == "steps":
        return props.steps_session("gdn", "float32", seed, a, b)
    return props.windows_session("gdn", "float32", seed, a, list(b))


def test_every_mutant_has_a_catching_property():
    assert set(CAUGHT_BY) == set(MUTANTS)


@pytest.mark.parametrize("name", sorted(CAUGHT_BY))
def test_the_property_catches_the_mutant(name):
    (kind, a, b), diagnosis = CAUGHT_BY[name]
    session = _session(kind, a, b)
    good = run_session(kernels.get("replay-recurrent[capacity=6]"), session)
    assert good.passed, good.format()
    report = run_session(kernels.get(f"replay-recurrent[capacity=6,mutant={name!r}]"), session)
    assert report.grade == FAIL, report.format()
    assert diagnosis in {f.kind for f in report.diagnosis}, [str(f) for f in report.diagnosis]


@pytest.mark.release
def test_the_plugin_fails_a_mutant(tmp_path):
    """``pytest --pyargs gdn2_oracle.property_tests.test_family_serving --gdn2-kernel ...`` on a wrong replay kernel:
    the run fails and names the property."""
    spec = "replay-recurrent[capacity=6,mutant='late_flush']"
    code, out = pytest_run(tmp_path, "--pyargs", "gdn2_oracle.property_tests.test_family_serving", "--gdn2-kernel",
                           spec, "-k", "drawn_steps", "-q")
    assert code == 1, out[-3000:]
    assert "test_drawn_steps" in out and "graded FAIL" in out, out[-3000:]
