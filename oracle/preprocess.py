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


def _sigmoid_slope(x):
    """``sigmoid'(x) = s (1 - s) = e / (1 + e)^2`` with ``e = exp(-|x|)`` (no ``1 - s`` cancellation)."""
    e = _elementwise("exp", -np.abs(x))
    return e / ((1 + e) * (1 + e))


def _gate_argument(g_raw, dt_bias):
    """``x = g_raw + dt_bias`` with ``dt_bias: [H*K]`` broadcast as ``[H, K]`` over ``[B, T, H, K]``."""
    return g_raw if dt_bias is None else g_raw + dt_bias.reshape(g_raw.shape[-2:])


def gate(g_raw, A_log, dt_bias, lower_bound, one):
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
        dx = lower_bound * _sigmoid_slope(A * x) * A * dg
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
