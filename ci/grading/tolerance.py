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
from gdn2_oracle.oracle.generate import KERNEL_DTYPES as DTYPES
from gdn2_oracle.oracle.generate import round_to
from gdn2_oracle.oracle.recurrence import forward_and_vjp

from . import diagnose
from .clip import clip_errors
from .grades import worst_grade
from .rule import ABS_FLOOR, FLOOR, MULTIPLE, Yardstick, agree_results, judge_results, metrics, rms
from .rule import scales as result_scales

# The rule's constants and metrics are the tolerance model's public names too (``tolerance.FLOOR``, ...).
__all__ = ["ABS_FLOOR", "FLOOR", "MULTIPLE", "PER_TOKEN", "Report", "agreement", "baseline", "compare",
           "cumulative_baseline", "dtype_name", "envelope", "metrics", "normalised_error", "operand_baseline", "rms",
           "rounded", "scales", "token_profile"]

# Results with one row per token (their per-token error profiles feed the diagnosis).
PER_TOKEN = ("o", "dq", "dk", "dv", "dg", "db", "dw")


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
    """``(scale_rms, scale_max)`` a result's errors are divided by (``rule.scales``, with :func:`envelope`)."""
    return result_scales(ref[name], envelope(name, problem, ref))[:2]


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
    return rounded(oracle.named_results(*forward_and_vjp(problem, do, dfinal_state, dtype=np.float32)), result_dtypes)


def cumulative_baseline(problem: oracle.Problem, do, dfinal_state, result_dtypes=None):
    """The float32 chunked algorithm with cumulative-sum-difference exponents (:mod:`oracle.chunked32`,
    chunk 64) on the same inputs, rounded to the result dtypes like :func:`baseline`: ``e_cum``'s source."""
    return rounded(oracle.named_results(*chunked32.forward_and_vjp(problem, do, dfinal_state)), result_dtypes)


def operand_baseline(problem: oracle.Problem, do, dfinal_state, result_dtypes=None, operands="bfloat16"):
    """:func:`cumulative_baseline` with ``operands`` rounded (``chunked32.OPERANDS``: every product's, or the chunk
    solve's, in bfloat16): what a kernel computing from 16-bit operands gets; the diagnosis tells operand rounding
    from a damping by it."""
    with np.errstate(over="ignore", invalid="ignore"):
        results = chunked32.forward_and_vjp(problem, do, dfinal_state, operands=operands)
    return rounded(oracle.named_results(*results), result_dtypes)


def clipped_baseline(problem: oracle.Problem, do, dfinal_state, clip, chunk_size):
    """The float64 chunked algorithm with every within-chunk decay exponent clipped at ``-clip`` (``chunked32``'s
    ``clip``), ``chunk_size`` tokens per chunk: what a kernel clipping its exponents computes; the diagnosis names an
    exponent clip by it (``clip.py``)."""
    with np.errstate(over="ignore", invalid="ignore"):
        results = chunked32.forward_and_vjp(problem, do, dfinal_state, chunk_size=chunk_size, dtype=np.float64,
                                            clip=clip)
    return oracle.named_results(*results)


def rounded(results, result_dtypes=None):
    """Results by name as float64 arrays holding their values rounded to the result dtypes (missing: float32)."""
    result_dtypes = result_dtypes or {}
    return {n: round_to(np.asarray(x, np.float64), result_dtypes.get(n, "float32")) for n, x in results.items()}


def token_profile(got, ref, scale_rms):
    """Per-token error ``rms over (B, H, dim) of (got - ref)[:, t] / scale_rms`` of a ``[B, T, H, dim]`` result
    (its mean square is ``err_ratio**2``); ``inf`` at tokens with a non-finite value."""
    diff = np.asarray(got, np.float64) - np.asarray(ref, np.float64)
    bad = ~np.all(np.isfinite(diff), axis=(0, 2, 3))
    diff = np.where(np.isfinite(diff), diff, 0.0)
    prof = np.sqrt(np.mean(np.square(diff), axis=(0, 2, 3))) / scale_rms
    return np.where(bad, np.inf, prof)


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
    result_dtypes = {n: dtype_name(got[n]) for n in RESULTS}
    if base is None:
        base = baseline(problem, do, dfinal_state, result_dtypes)
    if cum is None:
        def cum():  # formed only when some finite result is over its tolerance
            return cumulative_baseline(problem, do, dfinal_state, result_dtypes)
    report = Report(dtype=dtype)
    yard = Yardstick(ref, base, dtype, cum, {"dg": envelope("dg", problem, ref)},
                     operands=lambda ops: operand_baseline(problem, do, dfinal_state, result_dtypes, ops))
    for v, s_rms in judge_results(RESULTS, got, yard):
        if not v.passed and v.name in PER_TOKEN:
            report.profiles[v.name] = token_profile(got[v.name], ref[v.name], s_rms)
        report.verdicts.append(v)
    if not report.passed:
        report.diagnosis = diagnose.diagnose_case(
            report, problem, lambda: yard.operand_errors(got),
            lambda X, C: clip_errors(yard.scaled(), got, clipped_baseline(problem, do, dfinal_state, X, C)))
    return report


# --- the tight agreement bound: two results that should agree (``rule.agreement_tolerance``) ---------------------


def agreement(problem: oracle.Problem, a, b, ref, base, dtype, what="agreement", *, cum=None) -> Report:
    """Judge and grade result mapping ``a`` against ``b``: PASS within :func:`rule.agreement_tolerance`, PRECISION
    within :func:`rule.agreement_loss_bound`, else FAIL (a non-finite result: FAIL). Errors are normalised as in
    :func:`compare` (the reference's scale, or the envelope for dg); ``base`` is the :func:`baseline`, ``cum``
    the :func:`cumulative_baseline` (same result dtypes) or a function returning it, called only when some
    finite difference exceeds the tight bound. Without ``cum`` no bound is formed: over the tight bound is FAIL.
    """
    yard = Yardstick(ref, base, dtype, cum, {"dg": envelope("dg", problem, ref)})
    verdicts = agree_results(RESULTS, a, b, yard, what=what, result_dtype=dtype_name)
    return Report(verdicts=verdicts, dtype=dtype)
