"""Diagnoses in a family kernel's own terms (ci/grading/family_diagnosis.py, ci/grading/patterns.py): the per-value-head
breakdown with its head map tested on the oracle, the tail finding of a gate applied to padding, cross-case patterns
over the FAIL cases only (a PRECISION case never hides them), "only in bfloat16" from float32 twins; each on the
suite's own family mutants (kernels/testing_families.py) judged by the family judge, and on synthetic case records.
"""

from __future__ import annotations

import pytest

from gdn2_oracle.ci.commands import hunt_families
from gdn2_oracle.ci.grading import diagnose, family_diagnosis
from gdn2_oracle.ci.grading.grades import FAIL, PASS, PRECISION
from gdn2_oracle.kernels import testing_families
from gdn2_oracle.kernels.families import FamilyKernel, gdn_pairwise
from gdn2_oracle.oracle import family_recipes


def record(name, grade, *, dtype="float32", T=100, mode=None, kind="logic"):
    """A case record as ``validate`` keeps it (a family case's shape: B, T, H, HV, K, V)."""
    return {"case": name, "dtype": dtype, "shape": [1, T, 2, 4, 16, 16], "grade": grade, "passed": grade == PASS,
            "modes": [mode] if mode else [], "regime": {"family": "gdn", "decay": "moderate", "initial_state": False},
            "diagnosis": [{"kind": kind, "text": "", "primary": True}] if grade != PASS else []}


def patterns(results):
    return [f.text for f in diagnose.diagnose_kernel(results) if f.kind == "pattern"]


# --- cross-case patterns ---------------------------------------------------------------------------------------


def test_a_precision_case_never_hides_the_pattern_of_the_failures():
    """Three bfloat16 cases FAIL, four float32 ones PASS and one float32 case is PRECISION: the pattern is read over
    the FAIL cases (before, the PRECISION case was counted as off and no pattern was clean)."""
    cases = ([record(f"b{i}_bf16", FAIL, dtype="bfloat16") for i in range(3)]
             + [record(f"f{i}", PASS) for i in range(4)] + [record("p", PRECISION, kind="exponent-cancellation")])
    found = patterns(cases)
    assert any(f.startswith("fails only in bfloat16: 3 of the 3 case(s) in bfloat16 fail, every case in float32 (5) "
                            "passes or is PRECISION") for f in found), found
    # the same for a mode: three gate cases FAIL among dense ones, one dense case PRECISION
    cases = ([record(f"g{i}", FAIL, mode="gate") for i in range(3)] + [record(f"d{i}", PASS) for i in range(5)]
             + [record("p", PRECISION, kind="exponent-cancellation")])
    assert any(f.startswith("fails only in mode gate:") for f in patterns(cases)), patterns(cases)
    # nothing FAILs: the PRECISION cases are what a pattern splits off, as before
    cases = [record(f"p{i}_bf16", PRECISION, dtype="bfloat16") for i in range(3)] + [record(f"f{i}", PASS)
                                                                                    for i in range(5)]
    assert any(f.startswith("is off (FAIL or PRECISION) only in bfloat16") for f in patterns(cases)), patterns(cases)


def test_only_in_bfloat16_from_a_float32_twin():
    """Two bfloat16 FAILs are too few for a pattern by chance, but a failing case's float32 twin (the same recipe)
    passing is evidence; without a twin nothing is said."""
    cases = [record("a_bf16", FAIL, dtype="bfloat16"), record("b_bf16", FAIL, dtype="bfloat16"), record("a", PASS),
             record("c", PASS)]
    [line] = patterns(cases)
    assert line.startswith("fails only in bfloat16: 2 of the 2 bfloat16 case(s) fail, every float32 case (2) passes, "
                           "among them the float32 twins (the same recipe) of a_bf16"), line
    cases[2] = record("z", PASS)  # no twin
    assert patterns(cases) == []
    cases[2] = record("a", FAIL)  # a float32 case fails: not only in bfloat16
    assert not any("bfloat16" in f for f in patterns(cases))


def test_tail_line_needs_every_failure_to_be_a_tail_finding():
    cases = [record("g", FAIL, T=100, mode="gate", kind="tail"), record("g128", PASS, T=128, mode="gate"),
             record("d", PASS, T=130)]
    [line] = patterns(cases)
    assert line.startswith("the final state only, when T is not a multiple of 64: 1 case(s) (T = 100) off in "
                           "final_state with o exact; every case with T a multiple of 64 (1) passes"), line
    cases.append(record("x", FAIL, T=130, kind="logic"))
    assert not any("the final state only" in f for f in patterns(cases))


# --- the family judge's findings on the mutants ----------------------------------------------------------------


def judged(kernel, name):
    """The family judge's report of ``kernel`` on the catalogued family recipe ``name``."""
    return hunt_families.judge(kernel, family_recipes.get(name))


def test_value_heads_named_and_the_head_map_tested_on_the_oracle():
    """gdn_gva_modulo at H = 2, G = 2: heads 0 and 3 read the right key head, 1 and 2 the wrong one; the oracle with
    the map hv % H matches, so it is said; a correct kernel passes."""
    report = judged(testing_families.gdn_gva_modulo, "gdn_gva2_moderate_h0")
    first = report.diagnosis[0]
    assert first.primary and first.kind == "value-heads", report.format()
    assert first.text.startswith("value heads 1, 2 off, 0, 3 exact: value head hv reads key head hv % H, not hv // G")
    assert judged(gdn_pairwise(16), "gdn_gva2_moderate_h0").passed


def test_no_head_map_is_claimed_that_the_oracle_does_not_confirm():
    """A kernel whose value heads are partly off without another head map: the breakdown without a claimed cause."""
    class OneHeadOff(FamilyKernel):
        def gates(self, beta, K, V):
            b, w = super().gates(beta, K, V)
            return b, w.at[:, :, 1].multiply(0.5)

    kernel = OneHeadOff("one_head_off", "gdn", gdn_pairwise(16).core)
    report = judged(kernel, "gdn_gva2_moderate_h0")
    first = report.diagnosis[0]
    assert first.kind == "value-heads" and first.text.startswith("value heads 1 off, 0, 2, 3 exact"), report.format()
    assert "no alternative head map (hv % H) matches" in first.text


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_a_gate_on_padding_is_a_tail_finding_not_a_state_taken_early(family):
    """The padded-tail mutant on the softplus gate at T = 100: o exact, the final state decayed further; the primary
    says "the final state only, when T is not a multiple of 64" and never "taken early"."""
    report = judged(getattr(testing_families, f"{family}_padded_tail_gate"), f"{family}_gate_softplus")
    kinds = [f.kind for f in report.diagnosis]
    assert kinds[:2] == ["tail", "extra-decay"], report.format()
    assert "the final state only, when T is not a multiple of 64 (T = 100" in report.diagnosis[0].text
    assert "taken early" not in report.format()
    assert report["o"].grade == PASS and report["final_state"].grade == FAIL


def test_extra_decay_needs_a_state_that_is_the_right_one_scaled_down():
    import numpy as np

    ref = np.random.default_rng(0).standard_normal((1, 4, 16, 8))
    factors = np.linspace(0.1, 0.9, 64).reshape(1, 4, 16)
    c, residual = family_diagnosis.decay_factors(ref * factors[..., None], ref)
    assert np.allclose(c, factors) and residual < 1e-12
    _, residual = family_diagnosis.decay_factors(ref[..., ::-1], ref)  # another state: nothing left over is small
    assert residual > 0.5


# --- through validate ------------------------------------------------------------------------------------------

# mutant -> the kernel-level line (validate's "Diagnosis (across cases)") that names it
SMOKE_LINES = {
    "bf16_decay": "fails only in bfloat16",
    "padded_tail_gate": "the final state only, when T is not a multiple of 64",
    "gva_modulo": "value head hv reads key head hv % H, not hv // G",
}


def validate_out(cli, tmp_path, kernel, *argv):
    """``(exit code, printed report, JSON report)`` of ``validate`` on ``kernel`` with ``argv``."""
    import json

    path = tmp_path / "v.json"
    code, out, _ = cli("validate", "--kernel", f"gdn2_oracle.kernels.testing_families:{kernel}", *argv,
                       "--no-progress", "--json", path)
    return code, out, json.loads(path.read_text())


def test_validate_names_the_tail_over_the_cases_selected(cli, tmp_path):
    """The padded-tail mutant on the smoke set's softplus gate cases at T = 100 and T = 128: the first FAILs in the
    final state alone, the second passes, and the kernel-level line says both."""
    code, out, report = validate_out(cli, tmp_path, "gdn_padded_tail_gate", "--cases", "smoke",
                                     "--case", "gdn_gate_softplus", "--case", "gdn_gate_softplus_T128")
    assert code == 1, out
    [k] = report["kernels"]
    assert {c["case"]: c["grade"] for c in k["cases"]} == {"gdn_gate_softplus": FAIL, "gdn_gate_softplus_T128": PASS}
    lines = [f["text"] for f in k["diagnosis"] if f["kind"] == "pattern"]
    assert any(t.startswith("the final state only, when T is not a multiple of 64: 1 case(s) (T = 100) off in "
                            "final_state with o exact; every case with T a multiple of 64 (1) passes")
               for t in lines), out
    assert "taken early" not in out


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("name", list(SMOKE_LINES))
def test_validate_smoke_fails_each_family_mutant_with_the_diagnosis_that_names_it(cli, tmp_path, family, name):
    """Every new family mutant (and the modulo head map) FAILs ``--cases smoke`` with its kernel-level line; the
    bfloat16 mutant's float32 cases all pass."""
    code, out, report = validate_out(cli, tmp_path, f"{family}_{name}", "--cases", "smoke")
    assert code == 1, out
    [k] = report["kernels"]
    assert any(SMOKE_LINES[name] in f["text"] for f in k["diagnosis"]), out
    if name == "bf16_decay":
        assert all(c["passed"] for c in k["cases"] if c["dtype"] == "float32"), out
