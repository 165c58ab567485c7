"""``validate --cases golden`` judges the mode goldens (golden/mode_catalogue.py) against their stored 256-bit
results: the golden set holds them (by the modes selected), a correct kernel passes one, a mutant of
kernels/testing_modes.py fails it, and a kernel without the mode lists it as not accepted."""

from __future__ import annotations

import numpy as np
import pytest

from gdn2_oracle import golden
from gdn2_oracle.ci.commands import validate
from gdn2_oracle.ci.grading import modes as grading
from gdn2_oracle.ci.grading.grades import FAIL, PASS
from gdn2_oracle.ci.grading.modes import ModeCase
from gdn2_oracle.ci.running.cases import CallCase
from gdn2_oracle.golden import mode_catalogue

CASE = "mode_varlen_edges"  # packed 0, 1, 63, 64, 65 with initial states: one compile of a chunk-64 kernel
PLAIN = "gdn2_oracle.kernels.testing:correct"  # the dense contract only: accepts no mode
ENV = {"device_kind": "cpu", "platform": "cpu", "jax_version": "-"}  # the report's environment, not looked up


def _spec(text):
    from gdn2_oracle.kernels import KernelSpec

    return KernelSpec.parse(text)


def test_the_golden_set_holds_the_mode_goldens_of_the_selected_modes():
    every = [c for c in validate.build_cases("golden") if isinstance(c, ModeCase)]
    assert [c.name for c in every] == golden.mode_names()
    assert all(c.source == "golden" and c.describe()["source"] == "golden" for c in every)
    varlen = [c.name for c in validate.build_cases("golden", ("float32",), modes=("varlen",))]
    assert varlen == [n for n in golden.mode_names() if mode_catalogue.get(n).modes == ("varlen",)
                      and mode_catalogue.get(n).recipe.precision == "float32"] and CASE in varlen
    assert not any(isinstance(c, ModeCase) for c in validate.build_cases("golden", modes=("dense",)))
    assert set(golden.mode_names()) <= {c.name for c in grading.cases("full")}
    assert not set(golden.mode_names()) & {c.name for c in grading.cases("quick")}  # quick keeps its two


def test_a_mode_golden_is_judged_against_its_stored_results():
    case = ModeCase.golden("mode_intermediate_varlen")
    stored = golden.load_mode(case.name).reference()
    ref = case.reference()  # at the golden's chunk size (64): the stored results, every one
    assert set(ref) == set(stored)
    for n in ref:
        np.testing.assert_array_equal(ref[n], stored[n], err_msg=n)
    other = case.reference(chunk_size=32)["intermediate_states"]  # another chunk size: the float64 forward's
    assert other.shape[1] == 3 + 1 + 0 + 2 != stored["intermediate_states"].shape[1]  # lengths 65, 1, 0, 64
    got = {n: np.asarray(x, np.float32) for n, x in ref.items()}
    assert case.judge(got).grade == PASS
    bad = dict(got, dh0=(got["dh0"] * (1 + 1e-3)).astype(np.float32))
    assert case.judge(bad)["dh0"].grade == FAIL


@pytest.fixture(scope="module")
def varlen_run():
    """``validate --kernel pairwise --cases golden --modes varlen --case mode_varlen_edges``."""
    return validate.run_validation([_spec("pairwise")], validate.ValidateOptions(
        cases="golden", modes=("varlen",), only=[CASE], show_progress=False, env=ENV))


def test_validate_judges_a_mode_golden_and_a_correct_kernel_passes(varlen_run):
    [kernel] = varlen_run.kernels
    [case] = kernel["cases"]
    assert case["case"] == CASE and case["source"] == "golden" and case["modes"] == ["varlen"]
    assert case["grade"] == PASS and varlen_run.outcome == "pass", validate.format_validation(varlen_run)
    assert {v["name"] for v in case["verdicts"]} == set(grading.result_names(ModeCase.golden(CASE).call))
    assert kernel["modes"] == {"judged": ["varlen"], "not_accepted": []}
    assert "1 cases (1 golden, 0 generated; set 'golden')" in validate.format_validation(varlen_run)


def test_a_mutant_fails_a_mode_golden():
    from gdn2_oracle.kernels import testing_modes

    res = CallCase.golden(CASE).run(testing_modes.leaky_state)
    assert res.grade == FAIL, res
    failed = {v.name for v in res.verdicts if v.grade == FAIL}
    assert {"o", "final_state"} <= failed, failed


def test_a_kernel_without_the_modes_lists_the_mode_goldens_as_not_accepted():
    report = validate.run_validation([_spec(PLAIN)], validate.ValidateOptions(
        cases="golden", only=[CASE, "mode_all"], show_progress=False, env=ENV))
    [kernel] = report.kernels
    assert kernel["cases"] == [] and sorted(kernel["not_accepted_cases"]) == sorted([CASE, "mode_all"])
    assert "does not accept varlen, gate, l2norm, state_v_first, intermediate" in validate.format_validation(report)
