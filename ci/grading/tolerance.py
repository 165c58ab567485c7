"""The tolerance model (docs/DESIGN.md §4): a kernel's results judged against the exact reference.

Per result: ``err_ratio = rms(got - ref) / scale_rms`` and ``max_err = max|got - ref| / scale_max``, the
tolerance ``max(MULTIPLE x`` the plain working-precision recurrence's error``, FLOOR)``, the ``dg`` envelope,
the precision-loss bound that separates PRECISION from FAIL, and the tight agreement bound for two results
that should agree. The derivations are in docs/DESIGN.md §4.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gdn2_oracle import oracle
from gdn2_oracle.oracle import RESULTS, chunked32
from gdn2_oracle.oracle.generate import KERNEL_DTYPES as DTYPES, round_to
from gdn2_oracle.oracle.recurrence import forward_and_vjp

from . import diagnose
from .grades import FAIL, PRECISION, Verdict, worst_grade

# Allowed error: this many times the plain working-precision recurrence's error ...
MULTIPLE = {"float32": 32.0, "bfloat16": 8.0}
# ... but never less than this (err_ratio and max_err alike). float32: 2^-20 (~8 ulps of 1);
# bfloat16: 2^-8 (half an ulp of 1: the rounding of the result itself).
FLOOR = {"float32": 2.0 ** -20, "bfloat16": 2.0 ** -8}
# Scale used when a reference is (numerically) zero: below float32's normal range.
ABS_FLOOR = 1e-30

# Results with one row per token (their per-token error profiles feed the diagnosis).
PER_TOKEN = ("o", "dq", "dk", "dv", "dg", "db", "dw")


def rms(x):
    """Root mean square of an array (float64)."""
    x = np.asarray(x, dtype=np.float64)
    return float(np.sqrt(np.mean(np.square(x)))) if x.size else 0.0


@dataclass
class Report:
    """All verdicts for one kernel call; ``passed`` when every verdict passed (grade PASS).

    ``profiles``: per-token error profiles of the non-PASS per-token results (see :func:`token_profile`);
    ``diagnosis``: :class:`diagnose.Finding` s of a non-PASS report.
    """

    verdicts: list = field(default_factory=list)
    dtype: str = "float32"
    profiles: dict = field(default_factory=dict)
    diagnosis: list = field(default_factory=list)

    @property
    def passed(self):
        return all(v.passed for v in self.verdicts)

    @property
    def grade(self):
        """The worst grade of the verdicts (PASS for an empty report)."""
        return worst_grade(v.grade for v in self.verdicts)

    def failures(self):
        return [v for v in self.verdicts if not v.passed]

    def __getitem__(self, name):
        return next(v for v in self.verdicts if v.name == name)

    def format(self):
        """A fixed-width table: name, errors, tolerances, rule, verdict."""
        rows = [f"{'result':<12} {'err_ratio':>10} {'tol':>9} {'max_err':>10} {'tol':>9}  {'rule':<11} verdict"]
        for v in self.verdicts:
            bound = f"bound {v.bound_ratio:.1e}/{v.bound_max:.1e}" if v.bound_ratio is not None else ""
            note = "; ".join(x for x in (v.note, bound) if x)
            rows.append(f"{v.name:<12} {v.err_ratio:>10.2e} {v.tol_ratio:>9.1e} {v.max_err:>10.2e} "
                        f"{v.tol_max:>9.1e}  {v.rule:<11} {v.grade}" + (f"  ({note})" if note else ""))
        if self.diagnosis:
            rows += ["diagnosis:"] + [f"  - {f}" for f in self.diagnosis]
        return "\n".join(rows)


def envelope(name, problem: oracle.Problem, ref):
    """Magnitude envelope of the terms a result is summed from, or None (judged on itself)."""
    if name != "dg":
        return None
    return np.abs(problem.q * ref["dq"]) + np.abs(problem.k * ref["dk"]) + np.abs(problem.b * ref["db"])


def scales(name, problem, ref):
    """``(scale_rms, scale_max)`` a result's errors are divided by (see the module docstring)."""
    r = np.asarray(ref[name], dtype=np.float64)
    s_rms, s_max = rms(r), float(np.max(np.abs(r)))
    env = envelope(name, problem, ref)
    if env is not None:
        s_rms, s_max = max(s_rms, rms(env)), max(s_max, float(np.max(env)))
    return max(s_rms, ABS_FLOOR), max(s_max, ABS_FLOOR)


def metrics(got, ref, scale_rms, scale_max):
    """``(err_ratio, max_err)`` of ``got`` against ``ref``; ``inf`` when got is not finite."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        raise ValueError(f"got: shape {got.shape} does not match the reference's {ref.shape}")
    if not np.all(np.isfinite(got)):
        return float("inf"), float("inf")
    diff = got - ref
    return rms(diff) / scale_rms, float(np.max(np.abs(diff))) / scale_max


def normalised_error(got, ref):
    """``max|got - ref| / max|ref|`` (0/0 counts as 0); non-finite values fail an assertion."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert np.all(np.isfinite(got)), "non-finite values"
    diff = np.max(np.abs(got - ref), initial=0.0)
    scale = np.max(np.abs(ref), initial=0.0)
    return 0.0 if diff == 0 else diff / (scale if scale > 0 else np.finfo(float).tiny)


def baseline(problem: oracle.Problem, do, dfinal_state, result_dtypes=None):
    """The plain float32 token-by-token recurrence on the same inputs, rounded to the result dtypes.

    ``result_dtypes`` maps a result name to the dtype the kernel returned it in ("float32" or
    "bfloat16"); missing names stay float32.
    """
    return _rounded(forward_and_vjp(problem, do, dfinal_state, dtype=np.float32), result_dtypes)


def cumulative_baseline(problem: oracle.Problem, do, dfinal_state, result_dtypes=None):
    """The float32 chunked algorithm with cumulative-sum-difference exponents (:mod:`oracle.chunked32`,
    chunk 64) on the same inputs, rounded to the result dtypes like :func:`baseline`: ``e_cum``'s source."""
    return _rounded(chunked32.forward_and_vjp(problem, do, dfinal_state), result_dtypes)


def _rounded(forward_and_vjp_results, result_dtypes):
    """A forward + VJP's results by name, as float64 holding values rounded to the result dtypes."""
    result_dtypes = result_dtypes or {}
    return {n: round_to(np.asarray(x, np.float64), result_dtypes.get(n, "float32"))
            for n, x in oracle.named_results(*forward_and_vjp_results).items()}


def token_profile(got, ref, scale_rms):
    """Per-token error ``rms over (B, H, dim) of (got - ref)[:, t] / scale_rms`` of a ``[B, T, H, dim]`` result
    (its mean square is ``err_ratio**2``); ``inf`` at tokens with a non-finite value."""
    diff = np.asarray(got, np.float64) - np.asarray(ref, np.float64)
    bad = ~np.all(np.isfinite(diff), axis=(0, 2, 3))
    diff = np.where(np.isfinite(diff), diff, 0.0)
    prof = np.sqrt(np.mean(np.square(diff), axis=(0, 2, 3))) / scale_rms
    return np.where(bad, np.inf, prof)


def _bound(e_rec, e_cum, dtype):
    """``max(MULTIPLE x max(e_rec, e_cum), FLOOR)``; a non-finite ``e_cum`` is ignored."""
    e = max(e_rec, e_cum) if np.isfinite(e_cum) else e_rec
    return max(MULTIPLE[dtype] * e, FLOOR[dtype])


def recurrence_verdict(name, err_ratio, max_err, base_ratio, base_max, dtype, note=""):
    """One result's verdict under ``tol = max(MULTIPLE x e_rec, FLOOR)`` on rms and max (docs/DESIGN.md §4)."""
    by_rule = MULTIPLE[dtype] * base_ratio, MULTIPLE[dtype] * base_max
    tol_ratio, tol_max = max(by_rule[0], FLOOR[dtype]), max(by_rule[1], FLOOR[dtype])
    rule = "recurrence" if by_rule[0] >= FLOOR[dtype] else "floor"
    if not np.isfinite(err_ratio):
        rule, note = "non-finite", "NaN or inf in result"
    passed = bool(err_ratio <= tol_ratio and max_err <= tol_max)
    return Verdict(name, err_ratio, max_err, tol_ratio, tol_max, rule, passed, note)


def dtype_name(x):
    """"bfloat16" for a bfloat16 array (jax/ml_dtypes), else "float32"."""
    return "bfloat16" if "bfloat16" in str(getattr(x, "dtype", "")) else "float32"


def compare(problem: oracle.Problem, do, dfinal_state, got, ref, *, dtype="float32", base=None, cum=None) -> Report:
    """Judge and grade a kernel's results ``got`` against float64 ``ref`` (both mappings over RESULTS).

    ``dtype`` is the kernel's input dtype; ``base`` may hold a precomputed :func:`baseline`, ``cum`` a
    precomputed :func:`cumulative_baseline` or a function returning it (called only when some finite
    result exceeds its tolerance). A non-PASS report gets per-token profiles and a diagnosis.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype: {dtype!r} not one of {DTYPES}")
    missing = [n for n in RESULTS if n not in got]
    if missing:
        raise ValueError(f"got: missing results {missing}")
    if base is None:
        base = baseline(problem, do, dfinal_state, {n: dtype_name(got[n]) for n in RESULTS})
    report = Report(dtype=dtype)
    judged = []
    for name in RESULTS:
        s_rms, s_max = scales(name, problem, ref)
        err_ratio, max_err = metrics(got[name], ref[name], s_rms, s_max)
        base_ratio, base_max = metrics(base[name], ref[name], s_rms, s_max)
        note = "judged on envelope" if s_rms > max(rms(ref[name]), ABS_FLOOR) else ""
        judged.append((recurrence_verdict(name, err_ratio, max_err, base_ratio, base_max, dtype, note),
                       (s_rms, s_max), (base_ratio, base_max)))
    over = [v.name for v, _, _ in judged if not v.passed and np.isfinite(v.err_ratio)]
    if over and cum is None:
        cum = cumulative_baseline(problem, do, dfinal_state, {n: dtype_name(got[n]) for n in RESULTS})
    elif over and callable(cum):
        cum = cum()
    for v, (s_rms, s_max), (base_ratio, base_max) in judged:
        if v.name in over:
            cum_ratio, cum_max = metrics(cum[v.name], ref[v.name], s_rms, s_max)
            b_ratio, b_max = _bound(base_ratio, cum_ratio, dtype), _bound(base_max, cum_max, dtype)
            grade = PRECISION if v.err_ratio <= b_ratio and v.max_err <= b_max else FAIL
            v = Verdict(**{**v.as_dict(), "grade": grade, "bound_ratio": b_ratio, "bound_max": b_max})
        if not v.passed and v.name in PER_TOKEN:
            report.profiles[v.name] = token_profile(got[v.name], ref[v.name], s_rms)
        report.verdicts.append(v)
    if not report.passed:
        report.diagnosis = diagnose.diagnose_case(report, problem)
    return report


# --- the tight agreement bound: two results that should agree (two correct kernels, one kernel
# with other options, a sequence split with its state carried) -------------------------------

# Two correct results differ only where their computations differ, so they must agree to a third
# of the recurrence rule (~11 x e_rec in float32): 3x tighter than either's bound against the
# exact result. Measured worst case (calibrate_tolerance.py): 0.62 of this bound (pairwise vs
# factorized, dh0). The floor is not divided: ~8 float32 ulps is the resolution at which two
# different float32 computations of one quantity can be asked to agree.
AGREE_FRACTION = 1 / 3
# Over the tight bound, within ``max(AGREE_LOSS_FRACTION x MULTIPLE x max(e_rec, e_cum), FLOOR)`` is PRECISION.
# Two runs that differ in chunk alignment form their exponents from different float32 cumulative sums,
# so their cancellation losses share no rounding: the difference is ~sqrt(la^2 + lb^2), at least the
# larger loss, never a fraction of it; and e_cum is measured at one alignment (64-token chunks from 0):
# a run realigned by a split loses up to 0.90 x MULTIPLE x max(e_rec, e_cum) (chunk 16, split at 2,
# extreme decay), the one-call run at most 0.14 x. So the fraction is 1: one run's precision-loss bound,
# the most the realigned run may lose against the oracle anyway (docs/DESIGN.md §4, "Agreement grades").
AGREE_LOSS_FRACTION = 1.0
BF16_ULP = 2.0 ** -7  # one bf16 ulp relative to an element in [1, 2) (the largest one sets max_err)


def agreement_bound(base_ratio, base_max, dtype, bf16_result=False):
    """``(tol_ratio, tol_max)`` two correct results must agree within: ``max(AGREE_FRACTION x MULTIPLE
    x e_rec, FLOOR)``, plus one bf16 ulp when a result was returned in bfloat16 (two kernels whose
    float32 values differ by one float32 ulp can round to neighbouring bf16 values)."""
    out = []
    for e in (base_ratio, base_max):
        t = max(AGREE_FRACTION * MULTIPLE[dtype] * e, FLOOR[dtype])
        out.append(t + BF16_ULP if bf16_result else t)
    return tuple(out)


def agreement_loss_bound(base_ratio, base_max, cum_ratio, cum_max, dtype, bf16_result=False):
    """``(bound_ratio, bound_max)`` separating PRECISION from FAIL in an agreement: ``max(AGREE_LOSS_FRACTION x
    MULTIPLE x max(e_rec, e_cum), FLOOR)`` (plus one bf16 ulp as in :func:`agreement_bound`). A non-finite
    ``e_cum`` (the cumulative sums overflowed) gives the tight bound itself: nothing can be PRECISION."""
    tight = agreement_bound(base_ratio, base_max, dtype, bf16_result)
    out = []
    for e_rec, e_cum, t in zip((base_ratio, base_max), (cum_ratio, cum_max), tight):
        if not np.isfinite(e_cum):
            out.append(t)
            continue
        b = max(AGREE_LOSS_FRACTION * MULTIPLE[dtype] * max(e_rec, e_cum), FLOOR[dtype])
        out.append(max(b + BF16_ULP if bf16_result else b, t))
    return tuple(out)


def agreement(problem: oracle.Problem, a, b, ref, base, dtype, what="agreement", *, cum=None) -> Report:
    """Judge and grade result mapping ``a`` against ``b``: PASS within :func:`agreement_bound`, PRECISION within
    :func:`agreement_loss_bound`, else FAIL (a non-finite result: FAIL). Errors are normalised as in
    :func:`compare` (the reference's scale, or the envelope for dg); ``base`` is the :func:`baseline`, ``cum``
    the :func:`cumulative_baseline` (same result dtypes) or a function returning it, called only when some
    finite difference exceeds the tight bound. Without ``cum`` no bound is formed: over the tight bound is FAIL.
    """
    report = Report(dtype=dtype)
    judged = []
    for name in RESULTS:
        s_rms, s_max = scales(name, problem, ref)
        e_r, e_m = metrics(a[name], b[name], s_rms, s_max)
        b_r, b_m = metrics(base[name], ref[name], s_rms, s_max)
        bf16 = "bfloat16" in (dtype_name(a[name]), dtype_name(b[name]))
        t_r, t_m = agreement_bound(b_r, b_m, dtype, bf16)
        rule = f"{what} ({AGREE_FRACTION:.3g} x recurrence rule{', floor' if t_r <= FLOOR[dtype] else ''})"
        if bf16:
            rule += " + 1 bf16 ulp"
        note = ""
        if not (np.isfinite(e_r) and np.isfinite(e_m)):
            rule, note = "non-finite", "NaN or inf in a result"
        passed = bool(e_r <= t_r and e_m <= t_m)
        judged.append((Verdict(name, e_r, e_m, t_r, t_m, rule, passed, note), (s_rms, s_max), (b_r, b_m), bf16))
    over = [v.name for v, _, _, _ in judged if not v.passed and v.rule != "non-finite"]
    if over and callable(cum):
        cum = cum()
    for v, (s_rms, s_max), (b_r, b_m), bf16 in judged:
        if v.name in over and cum is not None:
            c_r, c_m = metrics(cum[v.name], ref[v.name], s_rms, s_max)
            l_r, l_m = agreement_loss_bound(b_r, b_m, c_r, c_m, dtype, bf16)
            grade = PRECISION if v.err_ratio <= l_r and v.max_err <= l_m else FAIL
            v = Verdict(**{**v.as_dict(), "grade": grade, "bound_ratio": l_r, "bound_max": l_m})
        report.verdicts.append(v)
    return report
