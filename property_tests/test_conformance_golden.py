"""Conformance: the kernel under test against every case of the golden corpus (256-bit mpmath).

The kernels are the suite's selection (``--gdn2-kernel`` / ``GDN2_KERNEL``, default pairwise and
factorized). Each case is judged by the tolerance model in the kernel's input dtype (the case's
precision); cases sharing a shape run back to back so a kernel compiles once per shape.
"""

from __future__ import annotations

import pytest

from gdn2_oracle import golden
from gdn2_oracle.ci.grading.families import GDN2
from gdn2_oracle.ci.running import harness
from gdn2_oracle.golden import catalogue
from gdn2_oracle.property_tests import grading

# The plain contract's properties: a Gated DeltaNet or KDA kernel is skipped with the reason (conftest.py).
pytestmark = pytest.mark.gdn2_family(GDN2)

NAMES = golden.names()


@pytest.fixture(scope="module")
def goldens():
    """Every golden, loaded (and hash-checked) once."""
    return {n: golden.load(n) for n in NAMES}


def _compile_key(name):
    r = catalogue.get(name).recipe
    return r.shape, r.precision, r.scale or 0.0, name


# Order cases so that ones sharing a compiled function run back to back.
_KERNEL_CASES = sorted(NAMES, key=_compile_key)


def _judge(fn, gd, label):
    dtype = "bfloat16" if gd.precision == "bfloat16" else "float32"
    report = harness.validate(fn, gd.problem(), *gd.cotangents(), dtype=dtype, ref=gd.reference())
    grading.enforce(report, f"{label} on golden {gd.case.name!r} ({dtype}):\n{report.format()}")


@pytest.mark.parametrize("name", _KERNEL_CASES)
def test_kernel_matches_golden(goldens, kernel, name):
    _judge(kernel.fn, goldens[name], f"kernel {kernel.name!r}")
