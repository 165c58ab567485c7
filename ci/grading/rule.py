"""The grading rule (docs/DESIGN.md §4), written once: every judge -- dense, training call, serving -- calls it.

A result has two metrics (``err_ratio``: rms of the error over the reference's rms scale; ``max_err``: largest
error over the largest reference value), a tolerance and, where one is formed, a precision-loss bound, each a pair
for the two metrics::

    PASS  <=  tol  <  PRECISION  <=  bound  <  FAIL        (both metrics; NaN or inf: FAIL)

    tol   = max(fraction x MULTIPLE[dtype] x e_rec, FLOOR[dtype])          fraction 1 against the exact result,
    bound = max(fraction x MULTIPLE[dtype] x max(e_rec, e_cum), FLOOR)     AGREE_FRACTION for two that must agree

:func:`grade` turns metrics, tolerance and bound into a :class:`Verdict`; :func:`tolerance`, :func:`loss_bound` and
:func:`agreement_tolerance` form the pairs; :func:`judge_results` and :func:`agree_results` grade a set of results
against a reference or against each other (the dense and training-call judges; the serving judge forms its own
metrics over chained calls and calls :func:`grade`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gdn2_oracle.oracle.chunked32 import OPERANDS

from .grades import FAIL, PRECISION, Verdict

# Allowed error: this many times the plain working-precision recurrence's error ... (float16: as bfloat16, a
# 16-bit result's error is its rounding, which the baseline shares)
MULTIPLE = {"float32": 32.0, "bfloat16": 8.0, "float16": 8.0}
# ... but never less than this (both metrics). float32: 2^-20 (~8 ulps of 1); 16-bit: half an ulp of 1.
FLOOR = {"float32": 2.0 ** -20, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
# Scale used when a reference is (numerically) zero: below float32's normal range.
ABS_FLOOR = 1e-30
# One ulp relative to an element in [1, 2) of a 16-bit result (the largest one sets max_err).
ULP = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}
ULP_LABEL = {"bfloat16": "bf16", "float16": "fp16"}
BF16_ULP = ULP["bfloat16"]

# The tight agreement bound (docs/DESIGN.md §4, "The tight agreement bound"): two correct results differ only where
# their computations differ, so they must agree to a third of the recurrence rule (~11 x e_rec in float32).
# Measured worst case (calibrate_tolerance.py): 0.62 of this bound (pairwise vs factorized, dh0). The floor is not
# divided: ~8 float32 ulps is the resolution at which two float32 computations of one quantity can be asked to agree.
AGREE_FRACTION = 1 / 3
# Over the tight bound, within ``max(AGREE_LOSS_FRACTION x MULTIPLE x max(e_rec, e_cum), FLOOR)`` is PRECISION.
# Two runs that differ in chunk alignment form their exponents from different float32 cumulative sums, so their
# cancellation losses share no rounding: the difference is ~sqrt(la^2 + lb^2), at least the larger loss; and e_cum
# is measured at one alignment: a run realigned by a split loses up to 0.90 x MULTIPLE x max(e_rec, e_cum) (chunk
# 16, split at 2, extreme decay), the one-call run at most 0.14 x. So the fraction is 1 (DESIGN §4, "Agreement").
AGREE_LOSS_FRACTION = 1.0

NON_FINITE = "non-finite"
# The rounded-operand baselines the diagnosis compares a kernel's errors with (Yardstick.operand_errors).
OPERAND_BASELINES = tuple(o for o in OPERANDS if o is not None)


def rms(x):
    """Root mean square of an array (float64)."""
    x = np.asarray(x, dtype=np.float64)
    return float(np.sqrt(np.mean(np.square(x)))) if x.size else 0.0


def metrics(got, ref, scale_rms, scale_max):
    """``(err_ratio, max_err)`` of ``got`` against ``ref``; ``inf`` when got is not finite."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        raise ValueError(f"got: shape {got.shape} does not match the reference's {ref.shape}")
    if not np.all(np.isfinite(got)):
        return math.inf, math.inf
    diff = got - ref
    return rms(diff) / scale_rms, float(np.max(np.abs(diff), initial=0.0)) / scale_max


def scales(ref, envelope=None):
    """``(scale_rms, scale_max, on_envelope)`` a result's errors are divided by: the reference's rms and largest
    value, or the envelope of the terms it is summed from where that is larger (docs/DESIGN.md §4, "The dg
    envelope"); ``ABS_FLOOR`` at the least."""
    r = np.asarray(ref, np.float64)
    s_rms, s_max = rms(r), float(np.max(np.abs(r), initial=0.0))
    own = s_rms
    if envelope is not None:
        s_rms, s_max = max(s_rms, rms(envelope)), max(s_max, float(np.max(envelope, initial=0.0)))
    return max(s_rms, ABS_FLOOR), max(s_max, ABS_FLOOR), s_rms > max(own, ABS_FLOOR)


def tolerance(e_rec, dtype, fraction=1.0):
    """``max(fraction x MULTIPLE[dtype] x e_rec, FLOOR[dtype])`` of one metric."""
    return max(fraction * MULTIPLE[dtype] * e_rec, FLOOR[dtype])


def loss_bound(e_rec, e_cum, dtype, fraction=1.0):
    """The precision-loss bound of one metric, ``max(fraction x MULTIPLE x max(e_rec, e_cum), FLOOR)``; a
    non-finite ``e_cum`` (the cumulative sums overflowed) is ignored."""
    return tolerance(max(e_rec, e_cum) if math.isfinite(e_cum) else e_rec, dtype, fraction)


def agreement_tolerance(e_rec, dtype, ulp_dtype=None, e_store=None, state_dtype=None):
    """The tight agreement bound of one metric: ``max(AGREE_FRACTION x MULTIPLE x e_rec, FLOOR)`` (with a stored
    state: also ``AGREE_FRACTION x MULTIPLE[state dtype] x e_store``), plus one ulp of ``ulp_dtype`` when a result
    was returned in 16 bits (two results whose float32 values differ by one ulp can round to neighbouring values)."""
    t = tolerance(e_rec, dtype, AGREE_FRACTION)
    if e_store is not None:
        t = max(t, AGREE_FRACTION * MULTIPLE[state_dtype] * e_store)
    return t + ULP.get(ulp_dtype, 0.0)


def agreement_loss_bound(e_rec, e_cum, dtype, ulp_dtype=None):
    """Over the tight agreement bound, within this is PRECISION: one run's precision-loss bound (fraction
    ``AGREE_LOSS_FRACTION``) plus the ulp, never below the tight bound; a non-finite ``e_cum`` gives the tight bound
    itself (nothing can be PRECISION)."""
    tight = agreement_tolerance(e_rec, dtype, ulp_dtype)
    if not math.isfinite(e_cum):
        return tight
    return max(tolerance(max(e_rec, e_cum), dtype, AGREE_LOSS_FRACTION) + ULP.get(ulp_dtype, 0.0), tight)


def grade(name, err, tol, bound=None, *, rule, note="", non_finite_note="NaN or inf in result"):
    """The :class:`Verdict` of one result: metrics ``err``, tolerance ``tol`` and bound ``bound`` (pairs over
    ``(err_ratio, max_err)``; ``bound`` None: none formed, over the tolerance is FAIL). PASS within ``tol`` on both
    metrics, PRECISION within ``bound``, else FAIL; a non-finite metric is FAIL under rule ``non-finite``. The bound
    is recorded on a verdict that is not PASS."""
    finite = math.isfinite(err[0]) and math.isfinite(err[1])
    if not finite:
        rule, note = NON_FINITE, non_finite_note
    passed = bool(finite and err[0] <= tol[0] and err[1] <= tol[1])
    if passed:
        return Verdict(name, err[0], err[1], tol[0], tol[1], rule, True, note)
    if bound is None or not finite:
        return Verdict(name, err[0], err[1], tol[0], tol[1], rule, False, note, FAIL)
    within = err[0] <= bound[0] and err[1] <= bound[1]
    return Verdict(name, err[0], err[1], tol[0], tol[1], rule, False, note, PRECISION if within else FAIL,
                   bound[0], bound[1])


def _pairs(fn, *pairs, **kw):
    """``fn`` applied metric by metric to some ``(err_ratio, max_err)`` pairs."""
    return tuple(fn(*xs, **kw) for xs in zip(*pairs))


def _recurrence_rule(e_rec, dtype):
    return "recurrence" if MULTIPLE[dtype] * e_rec >= FLOOR[dtype] else "floor"


class _Scaled:
    """Errors of results against one reference, normalised by its scales (or envelopes), with the baseline errors
    a result inherits from the result its terms are summed from (``inherits``)."""

    def __init__(self, ref, envelopes, inherits):
        self.ref, self.env, self.inherits = ref, envelopes or {}, inherits or {}
        self._scales = {}

    def scales(self, name):
        if name not in self._scales:
            self._scales[name] = scales(self.ref[name], self.env.get(name))
        return self._scales[name]

    def error(self, name, got, ref=None):
        s_rms, s_max, _ = self.scales(name)
        return metrics(got, self.ref[name] if ref is None else ref, s_rms, s_max)

    def baseline_error(self, name, base):
        """The baseline's error: its own, or at least that of the result it inherits from."""
        own = self.error(name, base[name])
        parent = self.inherits.get(name)
        if parent is None or parent not in base:
            return own
        other = self.error(parent, base[parent])
        return max(own[0], other[0]), max(own[1], other[1])


@dataclass(frozen=True)
class Yardstick:
    """What a set of results is judged against: the float64 ``ref``, the working-precision baseline ``base``
    (``e_rec``'s source), the kernel's input ``dtype``, the cumulative-sum baseline ``cum`` or a function returning
    it (``e_cum``'s source, formed only when some finite result is over its tolerance; None: no bound), the
    ``envelopes`` by name (the scale of a result summed from larger terms) and ``inherits`` (name -> the result whose
    baseline error a result at least has: a sum of that result's terms). ``operands``: a function of an operand
    precision (``oracle.chunked32.OPERANDS``: "bfloat16", "bfloat16_solve") returning the chunked baseline with those
    operands rounded, read only by the diagnosis."""

    ref: dict
    base: dict
    dtype: str
    cum: object = None
    envelopes: dict | None = None
    inherits: dict | None = None
    operands: object = None

    def scaled(self):
        return _Scaled(self.ref, self.envelopes, self.inherits)

    def cumulative(self):
        """The cumulative-sum baseline (called at most once per judgement: only when needed)."""
        return self.cum() if callable(self.cum) else self.cum

    def operand_errors(self, got):
        """``{operands: {name: (err_ratio, cosine)}}`` of each rounded-operand baseline (:attr:`operands`): its error
        against the reference, and the cosine between its error and the kernel's (``got - ref``); {} without one."""
        if self.operands is None:
            return {}
        s, out = self.scaled(), {}
        for precision in OPERAND_BASELINES:
            ops = self.operands(precision)
            out[precision] = {n: (s.error(n, ops[n])[0], cosine(np.asarray(got[n], np.float64) - self.ref[n],
                                                               np.asarray(ops[n], np.float64) - self.ref[n]))
                              for n in ops if n in self.ref and n in got and ops[n] is not None}
        return out


def cosine(a, b):
    """The cosine between two arrays' flattened values (0 when either is zero or not finite)."""
    a, b = np.ravel(a), np.ravel(b)
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return 0.0
    na, nb = float(np.sqrt(a @ a)), float(np.sqrt(b @ b))
    return float(a @ b) / (na * nb) if na > 0 and nb > 0 else 0.0


def _over(err, tol):
    """Whether finite metrics ``err`` exceed the tolerance ``tol`` (a non-finite result needs no bound)."""
    return math.isfinite(err[0]) and not (err[0] <= tol[0] and err[1] <= tol[1])


def judge_results(names, got, yard: Yardstick):
    """``[(Verdict, scale_rms)]`` of results ``got`` against ``yard.ref`` over ``names``: the tolerance from the
    working-precision baseline, the precision-loss bound from the cumulative-sum baseline (:class:`Yardstick`)."""
    s, dtype = yard.scaled(), yard.dtype
    first = []
    for name in names:
        _, _, on_env = s.scales(name)
        e_rec = s.baseline_error(name, yard.base)
        note = "; ".join(x for x in ("judged on envelope" if on_env else "",
                                     f"{s.inherits[name]}'s baseline" if name in s.inherits else "") if x)
        first.append((name, s.error(name, got[name]), e_rec, _pairs(tolerance, e_rec, dtype=dtype), note))
    cum = yard.cumulative() if any(_over(err, tol) for _, err, _, tol, _ in first) else None
    out = []
    for name, err, e_rec, tol, note in first:
        bound = None
        if cum is not None and _over(err, tol):
            bound = _pairs(loss_bound, e_rec, s.baseline_error(name, cum), dtype=dtype)
        out.append((grade(name, err, tol, bound, rule=_recurrence_rule(e_rec[0], dtype), note=note),
                    s.scales(name)[0]))
    return out


def agree_results(names, a, b, yard: Yardstick, *, what="agreement", result_dtype=None):
    """``[Verdict]`` of results ``a`` against ``b`` that should agree, over ``names``: errors normalised by the
    reference's scales, PASS within :func:`agreement_tolerance`, PRECISION within :func:`agreement_loss_bound` (from
    ``yard``'s cumulative-sum baseline; none: over the tight bound is FAIL), else FAIL. ``result_dtype(x)``: the
    dtype name of a result (a 16-bit result adds one ulp)."""
    s, dtype = yard.scaled(), yard.dtype
    first = []
    for name in names:
        err = s.error(name, a[name], b[name])
        e_rec = s.baseline_error(name, yard.base)
        ulp = next((d for d in map(result_dtype, (a[name], b[name])) if d in ULP), None) if result_dtype else None
        tol = _pairs(agreement_tolerance, e_rec, dtype=dtype, ulp_dtype=ulp)
        rule = f"{what} ({AGREE_FRACTION:.3g} x recurrence rule{', floor' if tol[0] <= FLOOR[dtype] else ''})"
        first.append((name, err, e_rec, tol, rule + (f" + 1 {ULP_LABEL[ulp]} ulp" if ulp else ""), ulp))
    cum = yard.cumulative() if any(_over(err, tol) for _, err, _, tol, _, _ in first) else None
    out = []
    for name, err, e_rec, tol, rule, ulp in first:
        bound = None
        if cum is not None and _over(err, tol):
            bound = _pairs(agreement_loss_bound, e_rec, s.baseline_error(name, cum), dtype=dtype, ulp_dtype=ulp)
        out.append(grade(name, err, tol, bound, rule=rule, non_finite_note="NaN or inf in a result"))
    return out
