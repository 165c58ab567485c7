"""Conformance: a Gated DeltaNet or KDA kernel against every family golden of its family (``golden/
family_catalogue.py``: 256-bit mpmath references, hash-checked when first loaded), in the golden's input precision,
judged by the family rule (``FamilyCase.judge``) against the stored results: the family lens on
``test_conformance_golden.py``.

A golden whose flags need a call mode (the in-kernel gate) carries its ``gdn2_modes`` mark, so it is deselected for a
kernel whose signature does not take the mode; a golden of the other family is deselected (conftest.py, ``family``).
"""

from __future__ import annotations

import pytest

from gdn2_oracle.ci.grading.families import golden_cases
from gdn2_oracle.ci.running.cases import FamilyRunCase
from gdn2_oracle.golden import family_catalogue
from gdn2_oracle.golden.load import family_judged_cases
from gdn2_oracle.oracle.families import MAPPED
from gdn2_oracle.property_tests import grading

# FLA's families: a GDN-2 kernel is skipped with the reason (conftest.py).
pytestmark = pytest.mark.gdn2_family(*MAPPED)


def _param(entry):
    """The parameter of a family golden: its family (the other family's kernels deselect it) and its modes' mark."""
    return pytest.param(entry.family, entry.name, marks=pytest.mark.gdn2_modes(*entry.modes), id=entry.name)


GOLDENS = [_param(e) for e in family_judged_cases()]


def golden_case(family, name) -> FamilyRunCase:
    """The family golden ``name`` as a case the kernel runs on (judged against its stored results)."""
    precision = family_catalogue.get(name).precision
    return next(c for c in golden_cases((family,), (precision,), case_type=FamilyRunCase) if c.name == name)


@pytest.mark.parametrize("family,name", GOLDENS)
def test_family_kernel_matches_golden(kernel, family, name):
    """The kernel's o, final state and gradients (and dA_log, ddt_bias with the in-kernel gate) on the family golden,
    against its 256-bit reference."""
    case = golden_case(family, name)
    report = case.graded(kernel.fn, case.results(kernel.fn, case.data(), None, None))
    grading.enforce(report, f"kernel {kernel.name!r} on family golden {name!r} ({case.dtype}):\n{report.format()}")
