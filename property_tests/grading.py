"""How the conformance suite acts on a graded report (docs/DESIGN.md §4): FAIL fails the test; PRECISION
(over the working-precision tolerance, within the precision-loss bound) passes with a
``PrecisionLossWarning``, or fails under ``--gdn2-strict``."""

from __future__ import annotations

import warnings

import pytest

from gdn2_oracle.ci.grading.grades import PRECISION, PrecisionLossWarning

# Set from --gdn2-strict when pytest starts (conftest.py).
STRICT = False


def enforce(report, message):
    """Fail with ``message`` unless ``report`` passed; a PRECISION grade only warns unless STRICT."""
    if report.passed:
        return
    if report.grade == PRECISION and not STRICT:
        warnings.warn(PrecisionLossWarning(f"graded PRECISION (a warning; --gdn2-strict fails it): {message}"),
                      stacklevel=2)
        return
    pytest.fail(f"graded {report.grade}" + (" (--gdn2-strict)" if report.grade == PRECISION else "")
                + f": {message}", pytrace=False)
