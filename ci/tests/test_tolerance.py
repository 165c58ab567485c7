"""The tolerance model (ci/grading/tolerance.py) rejects wrong kernels and accepts right ones.

Kernel-independent: these tests run once whatever ``--kernel`` selects. Mutants wrap our correct
pairwise kernel (or its chunked machinery) and break one thing each; every mutant must be rejected
with the verdict that names the broken result and the rule it broke, graded FAIL (not PRECISION:
docs/DESIGN.md §4, "Grades and the precision-loss bound"), and the correct kernel must pass on the
same example.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn2_oracle import oracle
from gdn2_oracle.ci.grading import references, tolerance
from gdn2_oracle.ci.grading.grades import FAIL
from gdn2_oracle.ci.grading.tolerance import FLOOR, MULTIPLE, RESULTS
from gdn2_oracle.ci.running import harness
from gdn2_oracle.kernels.testing import anchored_kernel, clipped_kernel, damped_kernel
from gdn2_oracle.oracle import Recipe
from gdn2_oracle.property_tests import strategies

SHAPE = (1, 65, 2, 32, 16)  # a CORE shape: the correct kernel is already compiled for it


def spec(decay="moderate", gates="uniform", precision="float32", **kw):
    kw = dict(dict(qk="l2", initial_state=True, seed=7, cot_seed=8), **kw)
    return Recipe(*SHAPE, decay=decay, gates=gates, precision=precision, **kw)


def validate(fn, s):
    p = s.problem()
    do, dfs = s.cotangents(p)
    return harness.validate(fn, p, do, dfs, dtype=s.dtype)


def correct():
    return strategies.kernel_fn("pairwise")


def failed(report):
    """The results over tolerance; a rejection must be graded FAIL, never PRECISION."""
    assert all(v.grade == FAIL for v in report.failures()), report.format()
    return sorted(v.name for v in report.failures())


# --------------------------------------------------------------------------------------------
# mutant kernels


def grad_mutant(fn, mutate):
    """``fn`` with its forward unchanged and its seven gradients passed through ``mutate(dict) -> dict``."""

    def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):
        if initial_state is None:
            initial_state = jnp.zeros(q.shape[:1] + q.shape[2:] + v.shape[-1:], jnp.float32)
        h0 = initial_state

        @jax.custom_vjp
        def call(q, k, v, g, b, w, h0):
            return fn(q, k, v, g, b, w, scale=scale, initial_state=h0)

        def call_fwd(*args):
            return jax.vjp(lambda *a: fn(*a[:6], scale=scale, initial_state=a[6]), *args)

        def call_bwd(pullback, ct):
            grads = dict(zip(("dq", "dk", "dv", "dg", "db", "dw", "dh0"), pullback(ct)))
            grads = mutate(grads)
            return tuple(grads[n] for n in ("dq", "dk", "dv", "dg", "db", "dw", "dh0"))

        call.defvjp(call_fwd, call_bwd)
        return call(q, k, v, g, b, w, h0)

    return kernel


def output_mutant(fn, mutate):
    """``fn`` with its output value replaced by ``mutate(o)`` and its gradients left exact."""

    def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):
        o, S = fn(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
        return o + jax.lax.stop_gradient(mutate(o) - o), S

    return kernel


def input_mutant(fn, **replace):
    """``fn`` called with some inputs replaced by ``replace[name](x)``."""

    def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):
        args = dict(q=q, k=k, v=v, g=g, b=b, w=w)
        args = {n: replace[n](x) if n in replace else x for n, x in args.items()}
        return fn(**args, scale=scale, initial_state=initial_state)

    return kernel


# One object per mutant for the session (one compile each).
MUTANTS = {
    "output+1e-3": output_mutant(correct(), lambda o: o * (1 + 1e-3)),
    "output+2^-5": output_mutant(correct(), lambda o: o * (1 + 2.0 ** -5)),
    "output-nan": output_mutant(correct(), lambda o: o.at[0, -1, 0, 0].set(jnp.nan)),
    "no-erase-gate": input_mutant(correct(), b=jnp.zeros_like),
    "dg-zero": grad_mutant(correct(), lambda d: {**d, "dg": jnp.zeros_like(d["dg"])}),
    "swap-dq-dk": grad_mutant(correct(), lambda d: {**d, "dq": d["dk"], "dk": d["dq"]}),
    "db-sign": grad_mutant(correct(), lambda d: {**d, "db": -d["db"]}),
    "dh0-halved": grad_mutant(correct(), lambda d: {**d, "dh0": 0.5 * d["dh0"]}),
    "wy-damped": damped_kernel(1e-3),  # solves I + 0.999 T (the peers' wy_eps)
    "exponent-clipped": clipped_kernel(20.0),  # pairwise exponent clipped to [-20, 20] (the atomic-ops peer)
}


# --------------------------------------------------------------------------------------------
# the correct kernel passes where the mutants are judged


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
@pytest.mark.parametrize("decay", ["moderate", "extreme"])
def test_correct_kernel_is_accepted(decay, precision):
    s = spec(decay, precision=precision)
    report = validate(correct(), s)
    assert report.passed, report.format()
    for v in report.verdicts:
        assert v.rule in ("recurrence", "floor"), v


def test_perturbed_output_is_rejected_float32():
    """A 1e-3 relative error in o is ~1000x the float32 tolerance: o fails, nothing else does."""
    report = validate(MUTANTS["output+1e-3"], spec())
    assert failed(report) == ["o"], report.format()
    v = report["o"]
    assert v.rule == "recurrence" and v.err_ratio > 10 * v.tol_ratio, report.format()
    assert report.grade == FAIL and v.bound_ratio is not None and v.err_ratio > 10 * v.bound_ratio


def test_wy_damping_is_rejected():
    """Solving I + 0.999 T instead of I + T: every result the erase gate reaches is off by ~1e-4."""
    report = validate(MUTANTS["wy-damped"], spec())
    assert {"o", "final_state", "db", "dk"} <= set(failed(report)), report.format()
    assert report.grade == FAIL and [f.kind for f in report.diagnosis] == ["systematic"], report.format()


def test_clipped_decay_exponent_is_rejected_under_extreme_decay():
    """exp(max(G_r - G_s, -20)) instead of exp(G_r - G_s): under extreme decay the true factors are ~e^-40
    and below, db is O(1) wrong (forward right: o is read through the same tiles but the error is tiny there)."""
    report = validate(MUTANTS["exponent-clipped"], spec("extreme"))
    assert failed(report) == ["db"], report.format()
    assert report["db"].err_ratio > 1 and report.grade == FAIL
    assert [f.kind for f in report.diagnosis] == ["exponent-clip", "backward", "logic"], report.format()
    assert report.diagnosis[0].evidence["clip"] == pytest.approx(MUTANTS["exponent-clipped"].decay.limit, abs=0.1)


def test_perturbed_output_in_bfloat16():
    """bfloat16: 1e-3 is below half an ulp (2^-9) and is (correctly) accepted; 2^-5 (4 ulps) is rejected."""
    assert validate(MUTANTS["output+1e-3"], spec(precision="bfloat16")).passed
    report = validate(MUTANTS["output+2^-5"], spec(precision="bfloat16"))
    assert failed(report) == ["o"], report.format()
    assert report["o"].rule in ("recurrence", "floor")


def test_nan_is_rejected_as_non_finite():
    report = validate(MUTANTS["output-nan"], spec())
    v = report["o"]
    assert not v.passed and v.rule == "non-finite" and np.isinf(v.err_ratio), report.format()
    assert "NaN" in v.note


def test_dropped_erase_gate_is_rejected():
    report = validate(MUTANTS["no-erase-gate"], spec(gates="uniform"))
    assert {"o", "final_state", "db"} <= set(failed(report)), report.format()
    assert all(v.rule == "recurrence" for v in report.failures()), report.format()


def test_dropped_erase_gate_is_harmless_when_b_is_zero():
    """Not a false positive: with b = 0 the mutant computes the right forward (but db is still wrong)."""
    report = validate(MUTANTS["no-erase-gate"], spec(gates="erase_zero"))
    assert report["o"].passed and report["final_state"].passed, report.format()


def test_swapped_gradients_are_rejected():
    report = validate(MUTANTS["swap-dq-dk"], spec())
    assert failed(report) == ["dk", "dq"], report.format()


def test_wrong_sign_db_and_halved_dh0_are_rejected():
    assert failed(validate(MUTANTS["db-sign"], spec())) == ["db"]
    assert failed(validate(MUTANTS["dh0-halved"], spec())) == ["dh0"]


# --------------------------------------------------------------------------------------------
# the extreme-decay dg trap


@pytest.mark.parametrize("decay", ["weak", "moderate", "strong", "mixed"])
def test_zeroed_dg_is_rejected_outside_extreme_decay(decay):
    """The envelope (dg judged on |q dq| + |k dk| + |b db|) must not hide a missing dg where dg is not
    cancelling: a dg-zeroing mutant fails its dg verdict (and only that one) in every non-extreme regime."""
    report = validate(MUTANTS["dg-zero"], spec(decay))
    assert failed(report) == ["dg"], report.format()
    assert report["dg"].rule in ("recurrence", "floor"), report.format()
    assert report["dg"].err_ratio > 100 * report["dg"].tol_ratio, report.format()


def test_extreme_decay_dg_is_judged_on_the_envelope():
    """Under extreme decay the true dg is tiny next to its terms: the correct kernel passes because dg is
    judged on the envelope, and the verdict says so."""
    report = validate(correct(), spec("extreme"))
    assert report["dg"].passed, report.format()
    assert report["dg"].note == "judged on envelope", report.format()


def test_zeroed_dg_under_extreme_decay_documents_the_envelope_blind_spot():
    """Under extreme decay the dg signal is below float32 resolution of the terms it is summed from, so
    the model cannot (and does not try to) tell dg = 0 from the true dg; record what it decides."""
    report = validate(MUTANTS["dg-zero"], spec("extreme"))
    others = [v for v in report.verdicts if v.name != "dg"]
    assert all(v.passed for v in others), report.format()
    # dg = 0 is within the envelope's tolerance iff rms(dg_ref) is below it: both outcomes are by design.
    p = spec("extreme").problem()
    do, dfs = spec("extreme").cotangents(p)
    ref = references.reference_results(p, do, dfs)
    s_rms, _ = tolerance.scales("dg", p, ref)
    assert report["dg"].err_ratio == pytest.approx(tolerance.rms(ref["dg"]) / s_rms, rel=1e-6)


# --------------------------------------------------------------------------------------------
# anchoring at the chunk start overflows: the suite shows it rather than assuming it


@pytest.mark.slow
def test_chunk_start_anchoring_is_fine_under_moderate_decay():
    assert validate(anchored_kernel(), spec("moderate")).passed


@pytest.mark.slow
@pytest.mark.parametrize("decay", ["extreme", "resets"])
def test_chunk_start_anchoring_overflows_under_strong_decay(decay):
    report = validate(anchored_kernel(), spec(decay))
    assert not report.passed, report.format()
    assert any(v.rule == "non-finite" for v in report.failures()), report.format()


# --------------------------------------------------------------------------------------------
# the model itself (no kernel)


def _ref_and_base(s):
    p = s.problem()
    do, dfs = s.cotangents(p)
    ref = references.reference_results(p, do, dfs)
    return p, do, dfs, ref, tolerance.baseline(p, do, dfs)


@pytest.mark.parametrize("decay", oracle.DECAYS)
def test_reference_and_baseline_pass_and_rules_are_named(decay):
    """The exact result passes with zero error; the float32 recurrence itself passes at 1/MULTIPLE of
    its tolerance (by construction), every verdict naming its rule."""
    p, do, dfs, ref, base = _ref_and_base(spec(decay))
    exact = tolerance.compare(p, do, dfs, ref, ref, base=base)
    assert exact.passed and all(v.err_ratio == 0 for v in exact.verdicts)
    rec = tolerance.compare(p, do, dfs, base, ref, base=base)
    assert rec.passed, rec.format()
    for v in rec.verdicts:
        assert v.rule in ("recurrence", "floor")
        if v.rule == "recurrence":
            assert v.err_ratio == pytest.approx(v.tol_ratio / MULTIPLE["float32"], rel=1e-12)
        assert v.tol_ratio >= FLOOR["float32"] and v.tol_max >= FLOOR["float32"]
    assert "recurrence" in rec.format() and "PASS" in rec.format()


def test_floor_rule_applies_when_the_recurrence_is_exact_by_luck():
    """g = 0 with zero gates: the float32 recurrence is exact for o (= 0 + q.h0 ...) or nearly; the floor
    keeps the tolerance from collapsing to zero."""
    p, do, dfs, ref, base = _ref_and_base(spec("none", gates="zero", initial_state=False))
    report = tolerance.compare(p, do, dfs, ref, ref, base=base)
    assert any(v.rule == "floor" for v in report.verdicts), report.format()
    for v in report.verdicts:
        if v.rule == "floor":
            assert v.tol_ratio == FLOOR["float32"]


def test_model_rejects_errors_just_above_tolerance_and_accepts_just_below():
    """Scaling the float32 recurrence's error by MULTIPLE x 1.5 fails recurrence-rule verdicts, x 0.5 passes."""
    p, do, dfs, ref, base = _ref_and_base(spec("moderate"))
    for factor, ok in ((0.5, True), (1.5, False)):
        got = {n: ref[n] + factor * MULTIPLE["float32"] * (base[n] - ref[n]) for n in RESULTS}
        report = tolerance.compare(p, do, dfs, got, ref, base=base)
        for v in report.verdicts:
            if v.rule == "recurrence":
                assert v.passed == ok, (factor, report.format())


def test_compare_validates_its_arguments():
    p, do, dfs, ref, base = _ref_and_base(spec())
    with pytest.raises(ValueError, match="dtype"):
        tolerance.compare(p, do, dfs, ref, ref, dtype="float16")
    with pytest.raises(ValueError, match="missing"):
        tolerance.compare(p, do, dfs, {"o": ref["o"]}, ref)
    bad = dict(ref, o=ref["o"][:, :-1])
    with pytest.raises(ValueError, match="shape"):
        tolerance.compare(p, do, dfs, bad, ref, base=base)
