"""An empty run (nothing judged for a kernel) and an interrupted one never report PASS:
EMPTY (exit 4) and INTERRUPTED grades, and an output option given an empty path is a usage error."""

from __future__ import annotations

import json

import pytest

from gdn2_oracle.ci.commands import bench, validate
from gdn2_oracle.ci.commands.output import EXIT, interrupt_error
from gdn2_oracle.ci.grading.grades import EMPTY, FAIL, INTERRUPTED, PASS, PRECISION, run_grade
from gdn2_oracle.ci.testing import pytest_run

PLAIN = "gdn2_oracle.kernels.testing:correct"  # the dense contract only: accepts no call mode


def test_run_grades_are_never_pass_for_an_empty_or_interrupted_run():
    assert run_grade([]) == EMPTY and run_grade([], interrupted=True) == INTERRUPTED
    assert run_grade([PASS, PASS], interrupted=True) == INTERRUPTED
    assert run_grade([PASS, FAIL], interrupted=True) == FAIL  # a FAIL found stands
    assert run_grade([PASS, PRECISION]) == PRECISION and run_grade([PASS]) == PASS


def test_a_validate_grade_is_empty_when_one_kernel_judged_nothing():
    assert validate.report_grade([PASS, EMPTY], False) == EMPTY
    assert validate.report_grade([FAIL, EMPTY], False) == FAIL
    assert validate.report_grade([INTERRUPTED, INTERRUPTED], True) == INTERRUPTED
    assert validate.outcome([{"cases": []}]) == "empty" and EXIT["empty"] == 4


def test_the_error_of_a_kernel_call_an_interrupt_broke_off_is_recognised():
    assert interrupt_error("KernelError: KeyboardInterrupt:") and interrupt_error("KernelError: Terminated: signal 15")
    assert not interrupt_error("KernelError: ValueError: shapes differ") and not interrupt_error(None)


def test_bench_with_nothing_timed_is_empty():
    assert bench.bench_outcome([], False) == "empty" and bench.bench_outcome([], True) == "interrupted"


def test_validate_on_modes_the_kernel_does_not_take_is_empty_not_pass(cli, tmp_path):
    """Before: ``PASS (0/0 cases pass)``, exit 0, JSON passed true."""
    path = tmp_path / "v.json"
    code, out, err = cli("validate", "--kernel", "pairwise", "--modes", "decode,speculative", "--json", path,
                         "--no-progress")
    assert code == EXIT["empty"] == 4, out + err
    assert "pairwise: EMPTY (no case judged" in out and "overall: EMPTY" in out and "PASS" not in out, out
    report = json.loads(path.read_text())
    assert (report["passed"], report["outcome"], report["grade"]) == (False, "empty", EMPTY)
    assert report["kernels"][0]["grade"] == EMPTY and report["kernels"][0]["passed"] is False


@pytest.mark.parametrize("argv, option", [
    (["validate", "--json", ""], "--json"),
    (["bench", "--json", ""], "--json"),
    (["validate", "--plot", " "], "--plot"),
    (["bench", "--plot", ""], "--plot"),
    (["validate", "--dump", ""], "--dump"),
    (["domain", "--kernel", "pairwise", "--out", ""], "--out"),
])
def test_an_empty_output_path_is_a_usage_error(cli, argv, option):
    """Before: ``--json ''`` ran the command, exit 0, and wrote no report."""
    code, out, err = cli(*argv)
    assert code == EXIT["usage"], out + err
    assert option in err and "empty" in err, err


def test_hunt_with_no_recipe_the_kernel_takes_is_empty(cli):
    """Before: ``hunt: no FAIL found``, exit 0, with no recipe judged."""
    code, out, err = cli("hunt", "--kernel", PLAIN, "--modes", "varlen", "--seed", "1", "--budget", "3",
                         "--no-progress")
    assert code == EXIT["empty"], out + err
    assert "hunt: EMPTY: no recipe was judged" in out and "no FAIL found" not in out, out


def test_domain_with_no_sweep_the_kernel_takes_is_empty(cli, tmp_path):
    """Before: ``domain: no FAIL`` and a summary saying every result is PASS in every cell, exit 0."""
    code, out, err = cli("domain", "--kernel", PLAIN, "--modes", "varlen", "--out", tmp_path, "--no-progress")
    assert code == EXIT["empty"], out + err
    assert "domain: EMPTY: no cell judged" in out, out
    summary = (tmp_path / "summary.txt").read_text()
    assert "no cell was judged" in summary and "PASS in every cell" not in summary, summary


@pytest.mark.slow
def test_the_plugin_run_that_judges_a_selected_kernel_on_nothing_is_not_a_pass(tmp_path):
    """Before: the serving tests ran on the fallback ``decode`` kernel only and the run passed (exit 0), the selected
    kernel (which takes no state pool) judged on nothing. Now they are skipped with the reason, and a run whose only
    tests for the kernel were skipped judged it on nothing: EMPTY (exit 5), not a pass."""
    code, out = pytest_run(tmp_path, "--pyargs", "gdn2_oracle.property_tests.test_serving", "--gdn2-kernel", PLAIN,
                           "-k", "pool_gather_scatter", "-q", "-rs")
    assert code == 5 and "skipped" in out and "passed" not in out and f"gdn2: EMPTY for {PLAIN}" in out, out
    assert "takes no state pool" in out, out


SWALLOWS_CTRL_C = '''
import os
import signal

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    try:
        os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C ...
    except KeyboardInterrupt:
        pass  # ... swallowed by the code it hit, as JAX's gc callback does
    yield
'''


@pytest.mark.slow
def test_a_plugin_run_reached_by_a_swallowed_ctrl_c_is_interrupted_not_passed(tmp_path):
    """Before: the test went on, passed, and the run exited 0."""
    (tmp_path / "swallow_ctrl_c.py").write_text(SWALLOWS_CTRL_C)
    code, out = pytest_run(tmp_path, "-p", "swallow_ctrl_c", "--pyargs", "gdn2_oracle.property_tests.test_serving",
                           "-k", "pool_gather_scatter", "-q", env={"PYTHONPATH": str(tmp_path)})
    assert code == 2 and "gdn2: INTERRUPTED" in out and "passed" in out, out
