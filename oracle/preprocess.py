"""The per-token pre-activations FLA's ``chunk_gdn2`` fuses into its kernel, with hand-derived adjoints.

In-kernel gate (``fla/ops/kda/gate.py``) and q/k L2 normalisation (``fla/modules/norm/l2norm.py``),
fla-core 0.6.0; docs/DESIGN.md §2, "Call modes (training)". Every function works on NumPy floating
arrays or on object arrays of ``mpmath.mpf`` (the caller converts constants to the element type).
"""

from __future__ import annotations

import mpmath
import numpy as np

# l2norm_fwd's default eps (chunk_gdn2 passes none); a Triton float argument, so the kernel adds it
# in float32: float32(1e-6) = 9.999999974752427e-07.
L2NORM_EPS = float(np.float32(1e-6))

_MP = {name: np.frompyfunc(getattr(mpmath, name), 1, 1) for name in ("exp", "log1p", "sqrt")}


def _elementwise(name, x):
    """``np.<name>(x)``, or mpmath's function on an object array."""
    if x.dtype == object:
        return np.asarray(_MP[name](x), dtype=object)
    return getattr(np, name)(x)


def softplus(x):
    """``log(1 + exp(x))`` as ``max(x, 0) + log1p(exp(-|x|))`` (no overflow, no cancellation)."""
    return np.maximum(x, 0) + _elementwise("log1p", _elementwise("exp", -np.abs(x)))


def sigmoid(x):
    """``1 / (1 + exp(-x))``, both signs from ``exp(-|x|) <= 1``."""
    e = _elementwise("exp", -np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def sigmoid_slope(x):
    """``sigmoid'(x) = s (1 - s) = e / (1 + e)^2`` with ``e = exp(-|x|)`` (no ``1 - s`` cancellation)."""
    e = _elementwise("exp", -np.abs(x))
    return e / ((1 + e) * (1 + e))


def _gate_argument(g_raw, dt_bias):
    """``x = g_raw + dt_bias`` with ``dt_bias: [H*K]`` broadcast as ``[H, K]`` over ``[B, T, H, K]``."""
    return g_raw if dt_bias is None else g_raw + dt_bias.reshape(g_raw.shape[-2:])


def gated_log_decay(g_raw, A_log, dt_bias, lower_bound, one):
    """Log-decay ``g = -exp(A_log) softplus(x)``, or with ``lower_bound``: ``g = lower_bound sigmoid(A x)``.

    ``x = g_raw + dt_bias``; ``A = exp(A_log)``, or ``A = one`` when ``A_log`` is None (bounded form
    only). ``A_log: [H]``; None arguments are absent terms.
    """
    x = _gate_argument(g_raw, dt_bias)
    A = one if A_log is None else _elementwise("exp", A_log)[:, None]
    if lower_bound is None:
        return -A * softplus(x)
    return lower_bound * sigmoid(A * x)


def gate_vjp(g_raw, A_log, dt_bias, lower_bound, one, dg):
    """Adjoint of :func:`gate` for the log-decay cotangent ``dg``: ``(dg_raw, dA_log, ddt_bias)``.

    Softplus form: ``dx = -A sigmoid(x) dg``, ``dA_log = sum dg * g``. Bounded form:
    ``dx = lower_bound sigmoid'(A x) A dg``, ``dA_log = sum dx * x``. ``ddt_bias = sum_{B,T} dx``.
    ``dA_log`` / ``ddt_bias`` are None when ``A_log`` / ``dt_bias`` are.
    """
    x = _gate_argument(g_raw, dt_bias)
    A = one if A_log is None else _elementwise("exp", A_log)[:, None]
    if lower_bound is None:
        dx = -A * sigmoid(x) * dg
        dA = dg * (-A * softplus(x))  # d g / d A_log = g
    else:
        dx = lower_bound * sigmoid_slope(A * x) * A * dg
        dA = dx * x
    dA_log = None if A_log is None else np.sum(dA, axis=(0, 1, 3))
    ddt_bias = None if dt_bias is None else np.sum(dx, axis=(0, 1)).reshape(dt_bias.shape)
    return dx, dA_log, ddt_bias


def _inverse_norm(x, eps):
    """``r = 1 / sqrt(sum_c x_c^2 + eps)`` over the last axis, kept as a trailing axis of size 1."""
    return 1 / _elementwise("sqrt", np.sum(x * x, axis=-1, keepdims=True) + eps)


def l2norm(x, eps):
    """``y = x / sqrt(sum_c x_c^2 + eps)`` along the last axis (eps inside the square root)."""
    return x * _inverse_norm(x, eps)


def l2norm_vjp(x, eps, dy):
    """Adjoint of :func:`l2norm`: ``dx = r (dy - (dy . y) y)`` with ``y = r x``."""
    r = _inverse_norm(x, eps)
    y = x * r
    return r * (dy - np.sum(dy * y, axis=-1, keepdims=True) * y)


# --- a call's log-decay and the envelopes of the gradients summed through the gate ----------------------


def call_log_decay(call):
    """The log-decay the core sees for an ``oracle.call.Call``: its ``g``, through the gate when it has one."""
    if not call.gate_in_kernel:
        return call.g
    return gated_log_decay(call.g, call.A_log, call.dt_bias, call.lower_bound, 1.0)


def envelopes(call, inner):
    """``{name: envelope}`` for ``dg`` (and ``dA_log`` / ``ddt_bias``) from the float64 core view ``inner``
    (``oracle.modes.run_call``'s ``inner``: pre-processed inputs and the gradients w.r.t. them): the sums the
    gradients are formed from, every term taken by magnitude (docs/DESIGN.md §4, "The dg envelope")."""
    x, g = inner["inputs"], inner["grads"]
    E = np.abs(x["q"] * g["dq"]) + np.abs(x["k"] * g["dk"]) + np.abs(x["b"] * g["db"])
    if not call.gate_in_kernel:
        return {"dg": E}
    # |dgate/dx| E: the gate's slope has one sign everywhere, so gate_vjp of E gives it up to sign.
    dx, _, _ = gate_vjp(call.g, call.A_log, call.dt_bias, call.lower_bound, 1.0, E)
    dx = np.abs(dx)
    out = {"dg": dx}
    if call.dt_bias is not None:
        out["ddt_bias"] = np.sum(dx, axis=(0, 1)).reshape(call.dt_bias.shape)
    if call.A_log is not None:
        if call.lower_bound is None:  # dA_log = sum dG * g
            terms = E * np.abs(x["g"])
        else:  # dA_log = sum dx * (g_raw + dt_bias)
            terms = dx * np.abs(_gate_argument(call.g, call.dt_bias))
        out["dA_log"] = np.sum(terms, axis=(0, 1, 3))
    return out
