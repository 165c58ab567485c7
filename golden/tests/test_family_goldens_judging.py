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


# A projected golden of GDN-2's (bf16 inputs, a strong decay, an initial state) that gdn-factorized and the bf16-decay
# mutant run in process (two compiled programs): every golden of our family kernels runs in ``validate --cases
# golden`` (ci/tests/test_families_validate.py), a sample of them through the plugin
# (property_tests/tests/test_family_mutants.py).
SAMPLE = ("gdn_bf16_strong_h0",)
ENV = {"device_kind": "cpu", "platform": "cpu", "jax_version": "-"}  # the report's environment, not looked up


def test_gdn_factorized_passes_projected_goldens_that_a_bf16_decay_fails():
    """``validate --cases golden --case ...`` in process: our chunked GDN kernel PASSes the sample, the mutant whose
    cumulative decay runs in bfloat16 for bf16 inputs (kernels/testing_families.py) FAILs its bf16 golden."""
    from gdn2_oracle.ci.commands import validate
    from gdn2_oracle.kernels import KernelSpec

    specs = [KernelSpec.parse(s) for s in ("gdn-factorized", "gdn2_oracle.kernels.testing_families:gdn_bf16_decay")]
    report = validate.run_validation(specs, validate.ValidateOptions(cases="golden", only=SAMPLE, show_progress=False,
                                                                     env=ENV))
    ours, mutant = ({c["case"]: c["grade"] for c in k["cases"]} for k in report.kernels)
    assert set(ours) == set(SAMPLE) and set(ours.values()) == {"PASS"}, validate.format_validation(report)
    assert mutant["gdn_bf16_strong_h0"] == "FAIL", validate.format_validation(report)
