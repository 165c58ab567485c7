"""The family goldens judged as a judge would take them (``golden.load.family_judged_cases`` into
``ci.grading.families.FamilyCase`` with the stored reference as its exact results): the float32 family pipeline
passes every case, and a 1% error in one result fails it, naming that result."""

from __future__ import annotations

import numpy as np
import pytest

from gdn2_oracle.ci.grading.families import FamilyCase
from gdn2_oracle.golden.load import family_judged_cases, family_names, load_family
from gdn2_oracle.oracle import families


def _case(entry):
    """The judge's case of a family golden: its stored results are the reference (``exact``)."""
    flags = tuple(f for f in entry.flags if f != "use_gate_in_kernel")  # the in-kernel log-decay is a mode
    return FamilyCase(entry.name, "golden", entry.dtype, entry.shape, entry.build, entry.modes, dict(entry.regime),
                      family=entry.family, flags=flags, stored_reference=entry.reference)


@pytest.mark.parametrize("entry", family_judged_cases(), ids=family_names())
def test_a_family_golden_passes_the_float32_pipeline_and_fails_an_error(entry):
    case = _case(entry)
    fcall, do, dfs = case.data()
    stored = load_family(entry.name).reference()
    assert set(case.names()) == set(stored)
    for n, a in case.reference().items():  # the judge's reference is the stored mpmath results
        np.testing.assert_array_equal(a, stored[n], err_msg=n)
    out = families.run(fcall, np.float32, do, dfs)
    got = {n: np.asarray(out[n], np.float32) for n in case.names()}
    assert case.judge(got).grade == "PASS"
    got["dbeta"] = got["dbeta"] * np.float32(1.01)
    report = case.judge(got)
    assert report.grade == "FAIL" and [v.name for v in report.failures()] == ["dbeta"]
