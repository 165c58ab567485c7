"""``layout=mixed_qkv`` (kernels/adapt.py): a Gated DeltaNet kernel taking serving engines' packed inputs (``mixed_qkv``
= q | k | v, raw gates ``a, b`` with ``A_log``, ``dt_bias``) is judged on FLA's family cases.

A correct packed kernel (``kernels/testing_layouts.py: mixed_gdn``) passes the family cases in the packed layout's
domain, raw in-kernel gates included; a case whose beta lies outside ``(0, 1)`` (which ``sigmoid(b)`` cannot express)
is not run, listed with the reason; a kernel that unpacks k before q fails.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from gdn2_oracle import kernels
from gdn2_oracle.ci.grading.grades import FAIL, PASS
from gdn2_oracle.kernels import adapt

KERNELS = "gdn2_oracle.kernels.testing_layouts"
CASES = ("gdn_gate_softplus", "gdn_gva2_mixed_logits", "gdn_gva4_moderate_beta_two", "gdn_varlen_quick")
OUTSIDE = "gdn_gva4_moderate_beta_two"  # beta near 2: outside the packed layout's domain


def _validate(cli, tmp_path, attr):
    path = tmp_path / "v.json"
    args = ["validate", "--kernel", f"{KERNELS}:{attr}[layout=mixed_qkv,family=gdn]", "--dtype", "float32",
            "--no-progress", "--json", path]
    for c in CASES:
        args += ["--case", c]
    code, out, _ = cli(*args)
    (k,) = json.loads(path.read_text())["kernels"]
    return code, out, {c["case"]: c for c in k["cases"]}, {r["case"]: r["reason"] for r in k["refused_cases"]}


def test_a_packed_kernel_passes_its_domain_and_lists_the_cases_outside_it(cli, tmp_path):
    code, out, cases, refused = _validate(cli, tmp_path, "mixed_gdn")
    assert code == 0 and set(cases) == set(CASES) - {OUTSIDE}, out
    assert list(refused) == [OUTSIDE] and "0 < beta < 1" in refused[OUTSIDE], refused
    assert "1 case(s) outside the kernel's domain: beta: layout=mixed_qkv" in out, out
    assert all(c["grade"] == PASS for c in cases.values()), {n: c["grade"] for n, c in cases.items()}


def test_a_packed_kernel_unpacking_k_before_q_fails(cli, tmp_path):
    code, out, cases, refused = _validate(cli, tmp_path, "mixed_gdn_k_first")
    assert code != 0 and list(refused) == [OUTSIDE]
    assert all(c["grade"] == FAIL and not c.get("error") for c in cases.values()), {n: c["grade"] for n, c in
                                                                                      cases.items()}


def test_the_layout_needs_the_packed_inputs():
    with pytest.raises(ValueError, match="layout: mixed_qkv needs a kernel taking"):
        kernels.get("gdn-factorized", layout="mixed_qkv")


def test_raw_gates_invert_the_log_decay():
    """``softplus(inverse_softplus(y)) = y`` to float32 rounding, from 1e-30 to 60."""
    y = np.geomspace(1e-30, 60.0, 200).astype(np.float32)
    a = np.asarray(adapt.inverse_softplus(y))
    back = np.logaddexp(0.0, a.astype(np.float64))
    np.testing.assert_allclose(back, y, rtol=4e-6)
