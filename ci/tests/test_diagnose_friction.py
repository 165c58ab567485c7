"""Diagnoses that misled new users, each run on the situation that misled and held to the corrected line
(ci/grading/diagnose.py, docs/judging.md "Diagnoses"): a localiser's "only X differs" agrees with the case's
grade line.
"""

from __future__ import annotations

from gdn2_oracle.ci.grading.case import Case
from gdn2_oracle.ci.grading.grades import PASS
from gdn2_oracle.ci.running import harness
from gdn2_oracle.kernels import testing_diagnose as buggy
from gdn2_oracle.oracle import Recipe

SHAPE = (1, 200, 2, 16, 16)


def judge(fn, decay="moderate", gates="uniform", h0=False, dtype="float32", shape=SHAPE, seed=3):
    """The tolerance report of kernel ``fn`` on one generated recipe, judged as ``validate`` judges it."""
    recipe = Recipe(*shape, decay=decay, gates=gates, initial_state=h0, precision=dtype, seed=seed)
    case = Case.from_recipe(f"{decay}_{gates}_{dtype}", recipe)
    problem, do, dfs = case.data()
    return case.judge(harness.kernel_results(fn, problem, do, dfs, dtype=dtype))


# --------------------------------------------------------------------------------------------
# "only X differs" is said only when X is all the grade line counts over tolerance


def test_only_dh0_is_not_claimed_when_other_results_are_over_tolerance():
    """h0 decayed twice under extreme decay: dh0 FAILs and db is PRECISION (over tolerance, within the bound), so
    the grade line reads "2/9 over tolerance"; the diagnosis said "only dh0 differs ... the other gradients too"."""
    report = judge(buggy.h0_decayed_twice, decay="extreme", h0=True)
    off = [v.name for v in report.verdicts if v.grade != PASS]
    assert "dh0" in off and len(off) > 1, report.format()  # the situation: dh0 FAIL beside a PRECISION result
    f = report.diagnosis[0]
    assert f.kind == "initial-state" and f.results == ("dh0",), report.format()
    assert "only dh0 differs" not in f.text and "the other gradients too" not in f.text, f.text
    n = len(report.verdicts)
    assert f"only dh0 exceeds the precision-loss bound ({len(off)}/{n} results over tolerance, " in f.text, f.text
    for name in off:
        assert name in f.text, f.text


def test_only_dh0_differs_where_it_alone_is_over_tolerance():
    """Without h0 the same bug leaves dh0 alone off (dh0 of h0 -> S_1 does not depend on h0's value): there
    "only dh0 differs" is true and still said."""
    report = judge(buggy.h0_decayed_twice, decay="extreme")
    assert [v.name for v in report.verdicts if v.grade != PASS] == ["dh0"], report.format()
    assert report.diagnosis[0].text.startswith("only dh0 differs (o and final_state within tolerance"), report.format()
