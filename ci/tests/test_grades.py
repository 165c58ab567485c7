"""Graded verdicts (PASS / PRECISION / FAIL) and diagnoses (ci/grading/tolerance.py, ci/grading/diagnose.py,
docs/DESIGN.md §4).

The model part judges synthetic results built from the oracle's own arrays (no kernel): an error
between the tolerance and the precision-loss bound is PRECISION, beyond it FAIL, and each planted
pattern gets its diagnosis. The kernel part runs the test kernels of ``kernels/testing.py``: a
logic-correct kernel whose decay exponents are differences of float32 cumulative sums is graded
PRECISION under resets and extreme decay and PASS elsewhere; a kernel that restarts its state every
256 tokens FAILs the long cases of ``validate --cases quick`` with a block-boundary diagnosis.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from gdn2_oracle.ci import cli
from gdn2_oracle.ci.grading import diagnose, references, tolerance
from gdn2_oracle.ci.grading.grades import FAIL, PASS, PRECISION, PrecisionLossWarning, Verdict, worst_grade
from gdn2_oracle.ci.grading.tolerance import FLOOR, MULTIPLE, RESULTS
from gdn2_oracle.ci.running import harness
from gdn2_oracle.kernels import testing
from gdn2_oracle.oracle import Recipe
from gdn2_oracle.property_tests import grading

TESTING = "gdn2_oracle.kernels.testing"


def spec(decay, shape=(1, 65, 2, 32, 16), seed=7, **kw):
    kw = dict(dict(gates="uniform", qk="l2", initial_state=True, seed=seed, cot_seed=seed + 1), **kw)
    return Recipe(*shape, decay=decay, **kw)


def setup(s):
    """``(problem, do, dfs, ref, base)`` of a recipe."""
    p, do, dfs = s.build()
    return p, do, dfs, references.reference_results(p, do, dfs), tolerance.baseline(p, do, dfs)


def never():
    raise AssertionError("the cumulative-sum baseline was computed although nothing exceeded the tolerance")


# --------------------------------------------------------------------------------------------
# the model


def test_errors_up_to_the_cumulative_sum_baseline_are_precision_and_beyond_are_fail():
    """Under resets the cumulative-sum baseline loses ~1e2 x the recurrence's precision: its own results
    are over the tolerance and graded PRECISION; scaled 1.5 x MULTIPLE beyond it they are FAIL."""
    p, do, dfs, ref, base = setup(spec("resets"))
    cum = tolerance.cumulative_baseline(p, do, dfs)
    report = tolerance.compare(p, do, dfs, cum, ref, base=base, cum=cum)
    assert report.grade == PRECISION, report.format()
    over = [v for v in report.verdicts if not v.passed]
    assert {"o", "dq", "db"} <= {v.name for v in over}, report.format()
    for v in over:
        assert v.grade == PRECISION
        e_rec = tolerance.metrics(base[v.name], ref[v.name], *tolerance.scales(v.name, p, ref))[0]
        e_cum = tolerance.metrics(cum[v.name], ref[v.name], *tolerance.scales(v.name, p, ref))[0]
        assert v.bound_ratio == pytest.approx(max(MULTIPLE["float32"] * max(e_rec, e_cum), FLOOR["float32"]))
        assert "bound" in report.format() and "PRECISION" in report.format()
    far = {n: ref[n] + 1.5 * MULTIPLE["float32"] * (cum[n] - ref[n]) for n in RESULTS}
    report = tolerance.compare(p, do, dfs, far, ref, base=base, cum=cum)
    assert report.grade == FAIL and {v.name for v in over} <= {v.name for v in report.verdicts if v.grade == FAIL}


def test_bound_is_the_tolerance_where_cumulative_sums_are_accurate():
    """Moderate decay: e_cum ~ e_rec, so 5 x the tolerance is FAIL, not PRECISION."""
    p, do, dfs, ref, base = setup(spec("moderate"))
    got = {n: ref[n] + 5 * MULTIPLE["float32"] * (base[n] - ref[n]) for n in RESULTS}
    report = tolerance.compare(p, do, dfs, got, ref, base=base)
    assert all(v.grade == FAIL for v in report.verdicts if v.rule == "recurrence"), report.format()


def test_the_baseline_is_computed_only_when_a_result_exceeds_the_tolerance():
    p, do, dfs, ref, base = setup(spec("resets"))
    report = tolerance.compare(p, do, dfs, ref, ref, base=base, cum=never)
    assert report.grade == PASS and not report.diagnosis and not report.profiles
    nan = dict(ref, o=np.where(np.arange(p.shape[1])[None, :, None, None] == 5, np.nan, ref["o"]))
    report = tolerance.compare(p, do, dfs, nan, ref, base=base, cum=never)  # non-finite: FAIL, no bound needed
    assert report["o"].grade == FAIL and report["o"].bound_ratio is None
    [f] = report.diagnosis
    assert f.kind == "non-finite" and f.token == 5 and "first at token 5" in f.text


def test_grade_defaults_and_validation():
    assert Verdict("o", 0, 0, 1, 1, "floor", True).grade == PASS
    assert Verdict("o", 2, 2, 1, 1, "floor", False).grade == FAIL
    with pytest.raises(ValueError, match="grade"):
        Verdict("o", 2, 2, 1, 1, "floor", False, grade="MAYBE")
    assert worst_grade([PASS, PRECISION, PASS]) == PRECISION
    assert worst_grade([PRECISION, FAIL]) == FAIL and worst_grade([]) == PASS


# --------------------------------------------------------------------------------------------
# diagnoses of planted patterns (T = 300: past a 256-token boundary)

LONG = spec("moderate", shape=(1, 300, 1, 16, 16))


def diagnosis(s, **changes):
    """Kinds and findings of the report on the reference with some results replaced by ``changes[name](ref)``."""
    p, do, dfs, ref, base = setup(s)
    got = {n: changes[n](ref[n]) if n in changes else ref[n] for n in RESULTS}
    report = tolerance.compare(p, do, dfs, got, ref, base=base)
    assert report.grade != PASS
    return [f.kind for f in report.diagnosis], report.diagnosis


def after(t0, eps):
    """Relative error ``eps`` on every token from ``t0`` on."""
    return lambda x: x + eps * np.abs(x).max() * (np.arange(x.shape[1]) >= t0)[None, :, None, None]


def test_block_boundary_names_the_first_bad_token():
    kinds, found = diagnosis(LONG, o=after(256, 1e-2))
    assert kinds == ["block-boundary"], found
    assert found[0].token == 256 and "token 256 (a multiple of 256)" in found[0].text


def test_o1_error_is_logic_and_gradient_only_error_is_backward():
    kinds, _ = diagnosis(LONG, o=lambda x: 2 * x)
    assert kinds == ["logic"]
    kinds, found = diagnosis(LONG, dk=lambda x: 1.01 * x, dv=lambda x: 1.01 * x)
    assert kinds == ["backward"] and "dk, dv" in found[0].text


def test_only_dh0_with_an_initial_state_is_initial_state_and_uniform_small_error_is_systematic():
    kinds, _ = diagnosis(LONG, dh0=lambda x: 1.001 * x)
    assert kinds == ["initial-state"]
    kinds, found = diagnosis(LONG, o=lambda x: (1 + 1e-4) * x)
    assert kinds == ["systematic"] and "o" in found[0].text


def test_precision_loss_is_diagnosed_as_exponent_cancellation():
    p, do, dfs, ref, base = setup(spec("resets"))
    report = tolerance.compare(p, do, dfs, tolerance.cumulative_baseline(p, do, dfs), ref, base=base)
    assert [f.kind for f in report.diagnosis] == ["exponent-cancellation"], report.format()
    text = report.diagnosis[0].text
    assert "rank correlation" in text and "the algorithm is right" in text
    r = float(text.split("rank correlation ")[1].split()[0].rstrip(";"))
    assert r >= diagnose.CANCELLATION_CORRELATION


def test_chunk_log_decay_and_rank_correlation():
    g = -np.ones((1, 130, 1, 2))
    np.testing.assert_array_equal(diagnose.chunk_log_decay(g)[[0, 63, 64, 129]], [1, 64, 1, 2])
    assert diagnose.rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert diagnose.rank_correlation([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert diagnose.rank_correlation([1, 1, 1], [1, 2, 3]) == 0.0


def _case(name, dtype, grade, h0=False, kind=None):
    return {"case": name, "dtype": dtype, "grade": grade, "regime": {"initial_state": h0},
            "diagnosis": [{"kind": kind, "text": "", "token": None}] if kind else []}


def test_kernel_diagnosis_spots_bf16_only_and_initial_state_only():
    # a pattern needs enough cases on each side not to be chance (diagnose.PATTERN_CHANCE)
    cases = [_case(f"a{i}", "float32", PASS) for i in range(5)] + [
        _case(f"b{i}", "bfloat16", FAIL, kind="systematic") for i in range(5)] + [_case("c", "bfloat16", PASS, h0=True)]
    found = diagnose.diagnose_kernel(cases)
    assert [f.kind for f in found] == ["systematic", "pattern"] and "fails only in bfloat16" in found[1].text
    cases = [_case(f"a{i}", "float32", PASS) for i in range(4)] + [
        _case("b", "float32", FAIL, h0=True, kind="logic")] + [
        _case(n, "bfloat16", FAIL, h0=True, kind="logic") for n in "cde"]
    found = diagnose.diagnose_kernel(cases)
    assert [f.kind for f in found] == ["logic", "pattern"] and "4 case(s): b, c, d, e" in found[0].text
    assert "fails only with h0" in found[1].text
    assert diagnose.diagnose_kernel([_case("a", "float32", PASS)]) == []


# --------------------------------------------------------------------------------------------
# the conformance suite's policy (--gdn2-strict)


def test_precision_warns_by_default_and_fails_when_strict(monkeypatch):
    p, do, dfs, ref, base = setup(spec("resets"))
    report = tolerance.compare(p, do, dfs, tolerance.cumulative_baseline(p, do, dfs), ref, base=base)
    assert report.grade == PRECISION
    monkeypatch.setattr(grading, "STRICT", False)
    with pytest.warns(PrecisionLossWarning, match="graded PRECISION"):
        grading.enforce(report, "msg")
    monkeypatch.setattr(grading, "STRICT", True)
    with pytest.raises(pytest.fail.Exception, match="graded PRECISION"):
        grading.enforce(report, "msg")
    failing = tolerance.compare(p, do, dfs, {n: 2 * ref[n] for n in RESULTS}, ref, base=base)
    monkeypatch.setattr(grading, "STRICT", False)
    with pytest.raises(pytest.fail.Exception, match="graded FAIL"):
        grading.enforce(failing, "msg")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        grading.enforce(tolerance.compare(p, do, dfs, ref, ref, base=base), "msg")  # PASS: silent


# --------------------------------------------------------------------------------------------
# kernels: precision loss graded PRECISION, rejection mutants FAIL (see test_tolerance.py)

CUMSUM = testing.cumsum_kernel()


@pytest.mark.parametrize("decay,seed", [("resets", 7), ("extreme", 0)])
def test_cumulative_sum_exponent_kernel_is_graded_precision_under_large_decay_spans(decay, seed):
    s = spec(decay, seed=seed)
    report = harness.validate(CUMSUM, *s.build())
    assert report.grade == PRECISION, report.format()
    assert all(v.grade in (PASS, PRECISION) for v in report.verdicts)
    assert "db" in [v.name for v in report.verdicts if v.grade == PRECISION]
    assert [f.kind for f in report.diagnosis] == ["exponent-cancellation"], report.format()


@pytest.mark.parametrize("decay", ["moderate", "strong", "mixed"])
def test_cumulative_sum_exponent_kernel_passes_elsewhere(decay):
    report = harness.validate(CUMSUM, *spec(decay).build())
    assert report.grade == PASS, report.format()


# --------------------------------------------------------------------------------------------
# the command line: PRECISION is a warning (exit 0) unless --strict; the long quick cases catch a
# kernel that restarts its state every 256 tokens

ONE_RESETS = ["--cases", "quick", "--case", "gen_resets_T130", "--dtype", "float32", "--no-progress"]


def test_validate_warns_on_precision_and_strict_fails(capsys, tmp_path):
    path = tmp_path / "v.json"
    code = cli.main(["validate", "--kernel", f"{TESTING}:cumsum_difference", *ONE_RESETS, "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "WARNING: 1 case(s) graded PRECISION" in out and "PRECISION (warning)" in out
    assert "diagnosis exponent-cancellation" in out
    report = json.loads(path.read_text())
    [k] = report["kernels"]
    [c] = k["cases"]
    assert report["grade"] == k["grade"] == c["grade"] == PRECISION and report["outcome"] == "precision"
    assert c["passed"] is False and c["diagnosis"][0]["kind"] == "exponent-cancellation"
    assert {v["grade"] for v in c["verdicts"]} <= {PASS, PRECISION}
    code = cli.main(["validate", "--kernel", f"{TESTING}:cumsum_difference", *ONE_RESETS, "--strict"])
    out = capsys.readouterr().out
    assert code == 1 and "--strict" in out


@pytest.mark.slow
def test_quick_long_cases_catch_a_state_restart_every_256_tokens(capsys, tmp_path):
    path = tmp_path / "v.json"
    code = cli.main(["validate", "--kernel", f"{TESTING}:restarting", "--kernel", "pairwise", "--cases", "quick",
                     "--case", "gen_weak_erase_zero_T1024", "--dtype", "float32", "--no-progress",
                     "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "errors start at token 256 (a multiple of 256)" in out
    bad, good = json.loads(path.read_text())["kernels"]
    assert bad["grade"] == FAIL and good["grade"] == PASS
    [c] = bad["cases"]
    assert c["shape"] == [1, 1024, 1, 8, 8]
    assert [f["token"] for f in c["diagnosis"] if f["kind"] == "block-boundary"] == [256]
    assert [f["kind"] for f in bad["diagnosis"]] == ["block-boundary"]
