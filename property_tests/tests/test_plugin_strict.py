"""``--gdn2-strict``: a result graded PRECISION passes the conformance suite with a warning by default and
fails it under the option (run as a kernel author would, in a subprocess outside the repository)."""

from __future__ import annotations

import pytest

from gdn2_oracle.ci.testing import pytest_run

PRECISION_LOSING = "gdn2_oracle.kernels.testing:cumsum_difference"
ONE_RESETS_GOLDEN = ["-k", "test_kernel_matches_golden and decay_resets"]


def test_gdn2_strict_is_registered(tmp_path):
    code, out = pytest_run(tmp_path, "--help")
    assert code == 0 and "--gdn2-strict" in out, out


@pytest.mark.slow
def test_precision_grade_warns_by_default_and_fails_with_gdn2_strict(tmp_path):
    args = ["--pyargs", "gdn2_oracle.property_tests", "--gdn2-kernel", PRECISION_LOSING, *ONE_RESETS_GOLDEN]
    code, out = pytest_run(tmp_path, *args)
    assert code == 0 and "1 passed" in out and "PrecisionLossWarning" in out, out
    code, out = pytest_run(tmp_path, *args, "--gdn2-strict")
    assert code == 1 and "1 failed" in out and "graded PRECISION (--gdn2-strict)" in out, out
    assert "exponent-cancellation" in out and "strict grades" in out, out
