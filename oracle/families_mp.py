"""A family call (``oracle/families.py``: KDA, Gated DeltaNet) in mpmath at a chosen precision, with error estimates.

The chain of :func:`oracle.families.forward_and_vjp`, every step on object arrays of ``mpmath.mpf``
(:class:`oracle.mp.MPArith`): the activations (beta's sigmoid, times 2 with ``allow_neg_eigval``; the in-kernel
log-decay ``-exp(A_log) softplus(g + dt_bias)`` or ``lower_bound sigmoid(exp(A_log)(g + dt_bias))``; the q/k L2
norm), the GDN-2 recurrence and adjoint of :mod:`oracle.recurrence` on the grouped-value-head problem, then the
projection back (``dbeta = sum_k db + sum_v dw``, Gated DeltaNet's ``dg = sum_k dg_k``) and the activations'
adjoints. The activations are :class:`oracle.families.FamilyCall`'s own (``_values``, ``_beta``,
``_log_decay``), run on mpmath values. Error estimate as in :mod:`oracle.mp`: the whole chain again at twice the
precision, ``|x_prec - x_2prec|`` per element.
"""

from __future__ import annotations

from typing import NamedTuple

import mpmath
import numpy as np

from . import mp, preprocess, recurrence
from .families import FAMILY_GRADS, GDN, FamilyCall, FamilyGrads
from .problem import GRADS, as_float_array

DEFAULT_PREC = mp.DEFAULT_PREC
# The results of a family call with cotangents, in report order (dA_log, ddt_bias only when the call has them).
FAMILY_RESULTS = ("o", "final_state") + FAMILY_GRADS


class MPFamilyGrads(NamedTuple):
    """The family gradients (fields of :class:`oracle.families.FamilyGrads`) as float64, ``dA_log`` / ``ddt_bias``
    None without those parameters, plus ``errors``: per-element error estimates by name of those present."""

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    dg: np.ndarray
    dbeta: np.ndarray
    dh0: np.ndarray
    dA_log: np.ndarray | None = None
    ddt_bias: np.ndarray | None = None
    errors: dict | None = None


class _Core(NamedTuple):
    """The GDN-2 problem of a family call as :func:`oracle.recurrence.run` reads it: mpf ``(q, k, v, g, b, w)``
    (``q, k`` on the key heads, the rest on the value heads) and the initial state."""

    arrays: tuple
    state: np.ndarray
    scale: float

    @property
    def shape(self):
        B, T, H, K = self.arrays[0].shape
        return B, T, H, K, self.arrays[2].shape[-1]

    def inputs(self):
        return self.arrays

    def h0(self):
        return self.state


def check_cotangents(fcall: FamilyCall, do, dfinal_state):
    """``do: [B,T,HV,V]`` and ``dfinal_state: [B,HV,K,V]`` as float64, or ValueError naming the argument."""
    B, T, H, HV, K, V = fcall.shape
    do, dfs = as_float_array("do", do), as_float_array("dfinal_state", dfinal_state)
    if do.shape != (B, T, HV, V):
        raise ValueError(f"do: shape {do.shape} does not match o's {(B, T, HV, V)}")
    if dfs.shape != (B, HV, K, V):
        raise ValueError(f"dfinal_state: shape {dfs.shape} does not match {(B, HV, K, V)}")
    return do, dfs


def check_unpacked(fcall: FamilyCall):
    """ValueError unless ``fcall`` is one call of ``[B, T]`` tokens without packed sequences, chunk states or the
    ``[V, K]`` state layout: the calls this module runs."""
    modes = [n for n in ("cu_seqlens", "intermediate_chunk_size") if getattr(fcall, n, None) is not None]
    modes += [n for n, on in getattr(fcall, "call_keywords", ()) if on]
    if modes:
        raise ValueError(f"fcall: {', '.join(modes)}: not supported by the mpmath family call (one call of [B, T] "
                         "tokens, [K, V] states)")


def gdn2_inputs(fcall: FamilyCall, x, eps):
    """The GDN-2 ``(q, k, v, g, b, w)`` of the call from its values ``x`` (``FamilyCall._values``): ``q, k``
    normalised (``x / sqrt(|x|^2 + eps)``) when the call says so, ``b = beta 1_K``, ``w = beta 1_V`` with beta
    through its sigmoid, ``g`` the log-decay (Gated DeltaNet's ``g 1_K``); as :meth:`FamilyCall.to_gdn2`."""
    B, T, H, HV, K, V = fcall.shape
    q, k = x["q"], x["k"]
    if fcall.use_qk_l2norm_in_kernel:
        q, k = (preprocess.l2norm(a, eps) for a in (q, k))
    beta = fcall._beta(x)
    g = fcall._log_decay(x)
    if fcall.family is GDN:
        g = np.broadcast_to(g[..., None], (B, T, HV, K))
    b = np.broadcast_to(beta[..., None], (B, T, HV, K))
    w = np.broadcast_to(beta[..., None], (B, T, HV, V))
    return q, k, x["v"], g, b, w


def project(fcall: FamilyCall, x, eps, grads) -> FamilyGrads:
    """The GDN-2 gradients ``grads`` (by name, ``dq ... dh0``) mapped back onto the call's arguments from its values
    ``x``: ``dbeta = sum_k db + sum_v dw`` through beta's sigmoid, Gated DeltaNet's ``dg = sum_k dg_k``, the gate's
    and the L2 norm's adjoints; as :meth:`FamilyCall.project`."""
    dbeta = np.sum(grads["db"], axis=-1) + np.sum(grads["dw"], axis=-1)
    if fcall.use_beta_sigmoid_in_kernel:
        dbeta = fcall.beta_scale * preprocess.sigmoid_slope(x["beta"]) * dbeta
    dg = np.sum(grads["dg"], axis=-1) if fcall.family is GDN else grads["dg"]
    dA_log = ddt_bias = None
    if fcall.use_gate_in_kernel:
        dg, dA_log, ddt_bias = preprocess.gate_vjp(fcall._gate_view(x["g"]), x["A_log"], x["dt_bias"],
                                                   x["lower_bound"], x["one"], fcall._gate_view(dg))
        dg = dg[..., 0] if fcall.family is GDN else dg
    dq, dk = grads["dq"], grads["dk"]
    if fcall.use_qk_l2norm_in_kernel:
        dq, dk = (preprocess.l2norm_vjp(x[n], eps, dn) for n, dn in (("q", dq), ("k", dk)))
    return FamilyGrads(dq, dk, grads["dv"], dg, dbeta, grads["dh0"], dA_log, ddt_bias)


def run_mpf(fcall: FamilyCall, prec, do=None, dfinal_state=None, *, overrides=None):
    """The family call at ``prec`` bits: a dict of mpf object arrays over ``o, final_state`` and, given cotangents,
    the family gradients (``dA_log`` / ``ddt_bias`` None without those parameters).

    ``overrides`` maps argument names (``q, k, v, g, beta, A_log, dt_bias``) to object arrays of mpf used instead
    of the call's values (finite differences at high precision)."""
    mp.check_prec(prec)
    check_unpacked(fcall)
    B, T, H, HV, K, V = fcall.shape
    with mpmath.workprec(int(prec)):
        ar = mp.MPArith()
        x = fcall._values(ar)
        x.update(overrides or {})
        eps = ar.array(preprocess.L2NORM_EPS)[()]
        h0 = np.zeros((B, HV, K, V)) if fcall.initial_state is None else fcall.initial_state
        core = _Core(gdn2_inputs(fcall, x, eps), ar.array(h0), fcall.scale)
        if do is None:
            o, S = recurrence.run(core, ar)
            return {"o": o, "final_state": S}
        o, S, grads = recurrence.run(core, ar, ar.array(do), ar.array(dfinal_state))
        return {"o": o, "final_state": S, **project(fcall, x, eps, {n: grads[n] for n in GRADS})._asdict()}


def _results(fcall, prec, do=None, dfinal_state=None):
    """``(float64 results, errors)`` by name: the run at ``prec`` rounded to float64 and ``|x_prec - x_2prec|``."""
    lo = run_mpf(fcall, prec, do, dfinal_state)
    hi = run_mpf(fcall, 2 * prec, do, dfinal_state)
    present = [n for n, a in lo.items() if a is not None]
    return ({n: mp.to_float64(lo[n]) for n in present}, {n: mp.error_estimate(lo[n], hi[n]) for n in present})


def forward(fcall: FamilyCall, prec=DEFAULT_PREC) -> mp.MPForward:
    """Forward at ``prec`` bits: float64 ``(o, final_state)`` and their error estimates."""
    results, errors = _results(fcall, prec)
    return mp.MPForward(results["o"], results["final_state"], errors)


def forward_and_vjp(fcall: FamilyCall, do, dfinal_state, prec=DEFAULT_PREC):
    """Forward and adjoint at ``prec`` bits, one run per precision: ``(mp.MPForward, MPFamilyGrads)`` with errors."""
    do, dfinal_state = check_cotangents(fcall, do, dfinal_state)
    results, errors = _results(fcall, prec, do, dfinal_state)
    fwd = mp.MPForward(results["o"], results["final_state"], {n: errors[n] for n in ("o", "final_state")})
    names = [n for n in FAMILY_GRADS if n in results]
    return fwd, MPFamilyGrads(**{n: results[n] for n in names}, errors={n: errors[n] for n in names})
