"""The GDN-2 recurrence and adjoint in mpmath at a chosen precision, with error estimates.

The token-by-token core is :mod:`oracle.recurrence`'s, run on object arrays of ``mpmath.mpf``.
Error estimate: the same computation repeated at twice the precision; the estimate for every
element is ``|x_prec - x_2prec|``. For a computation that is stable at ``prec`` bits (every
factor here is a decay ``exp(g) <= 1`` or an O(1) gate), the error of the ``prec`` run dominates
that of the ``2*prec`` run by ~2^prec, so the difference is the error of the ``prec`` run to
first order, and it costs only one more run. An ``mpmath.iv`` enclosure would be rigorous but
overestimates badly through the long product of dependent terms (the wrapping effect grows with T).
"""

from __future__ import annotations

from typing import NamedTuple

import mpmath
import numpy as np

from . import recurrence
from .problem import GRADS, Problem

DEFAULT_PREC = 256
_mpf = np.frompyfunc(mpmath.mpf, 1, 1)
_exp = np.frompyfunc(mpmath.exp, 1, 1)
_float = np.frompyfunc(float, 1, 1)


class MPArith:
    """Element type ``mpmath.mpf``: float64 inputs convert exactly; exp is mpmath's."""

    def array(self, x):
        x = np.asarray(x)
        if x.dtype == object:
            return x.copy()
        return np.asarray(_mpf(x.astype(np.float64)), dtype=object)

    def exp(self, x):
        return np.asarray(_exp(x), dtype=object)


class MPForward(NamedTuple):
    """``(o, final_state)`` as float64 plus ``errors``: per-element error estimates by name."""

    o: np.ndarray
    final_state: np.ndarray
    errors: dict


MPGrads = NamedTuple("MPGrads", [(name, np.ndarray) for name in GRADS] + [("errors", dict)])
MPGrads.__doc__ = ("The seven gradients (fields of GRADS) as float64 plus ``errors``: per-element error estimates "
                   "by name.")


def to_float64(x):
    """Round an object array of mpf to the nearest float64 values."""
    return np.asarray(_float(np.asarray(x, dtype=object)), dtype=np.float64)


def check_prec(prec):
    if not isinstance(prec, (int, np.integer)) or prec < 53:
        raise ValueError(f"prec: expected an integer number of bits >= 53, got {prec!r}")


def run_mpf(problem: Problem, prec, do=None, dfinal_state=None, *, overrides=None):
    """Forward (and adjoint, given cotangents) at ``prec`` bits, returned as mpf object arrays.

    ``overrides`` maps input names (``q, k, v, g, b, w, initial_state``) to object arrays that
    replace the problem's values (used for finite differences at high precision).
    """
    check_prec(prec)
    with mpmath.workprec(int(prec)):
        if overrides:
            problem = _Overridden(problem, overrides)
        return recurrence.run(problem, MPArith(), do, dfinal_state)


class _Overridden:
    """A view of a Problem with some inputs replaced by mpf object arrays (no float64 round trip)."""

    def __init__(self, problem, overrides):
        self._p, self._o = problem, overrides
        self.shape, self.scale = problem.shape, overrides.get("scale", problem.scale)

    def inputs(self):
        return tuple(self._o.get(n, getattr(self._p, n)) for n in ("q", "k", "v", "g", "b", "w"))

    def h0(self):
        return self._o.get("initial_state", self._p.h0())


def error_estimate(lo, hi):
    """Per-element ``|lo - hi|`` in float64 (the error estimate of the low-precision run)."""
    with mpmath.workprec(53 + 64):
        return to_float64(np.abs(lo - hi))


def forward(problem: Problem, prec=DEFAULT_PREC) -> MPForward:
    """Forward at ``prec`` bits: float64 ``(o, final_state)`` and their error estimates."""
    o, S = run_mpf(problem, prec)
    o2, S2 = run_mpf(problem, 2 * prec)
    errors = {"o": error_estimate(o, o2), "final_state": error_estimate(S, S2)}
    return MPForward(to_float64(o), to_float64(S), errors)


def vjp(problem: Problem, do, dfinal_state, prec=DEFAULT_PREC) -> MPGrads:
    """Adjoint at ``prec`` bits: float64 gradients ``dq..dh0`` and their error estimates."""
    do, dfinal_state = problem.check_cotangents(do, dfinal_state)
    _, _, grads = run_mpf(problem, prec, do, dfinal_state)
    _, _, grads2 = run_mpf(problem, 2 * prec, do, dfinal_state)
    errors = {n: error_estimate(grads[n], grads2[n]) for n in GRADS}
    return MPGrads(**{n: to_float64(grads[n]) for n in GRADS}, errors=errors)


def forward_and_vjp(problem: Problem, do, dfinal_state, prec=DEFAULT_PREC):
    """Forward and adjoint in one run per precision: ``(MPForward, MPGrads)``."""
    do, dfinal_state = problem.check_cotangents(do, dfinal_state)
    o, S, grads = run_mpf(problem, prec, do, dfinal_state)
    o2, S2, grads2 = run_mpf(problem, 2 * prec, do, dfinal_state)
    fwd = MPForward(to_float64(o), to_float64(S), {"o": error_estimate(o, o2), "final_state": error_estimate(S, S2)})
    errors = {n: error_estimate(grads[n], grads2[n]) for n in GRADS}
    return fwd, MPGrads(**{n: to_float64(grads[n]) for n in GRADS}, errors=errors)
