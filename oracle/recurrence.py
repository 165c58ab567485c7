"""NumPy token-by-token GDN-2 recurrence (DESIGN.md §1) and its hand-derived adjoint.

The core works on any element type NumPy can do arithmetic on: float32, float64,
``np.longdouble`` here, and object arrays of ``mpmath.mpf`` in :mod:`oracle.mp`.
Memory is O(T/N + N) states: the forward pass keeps a checkpoint every N tokens and
the backward pass recomputes the states inside one segment at a time.
"""

from __future__ import annotations

import numpy as np

from .problem import GRADS, Grads, Problem

# Working precisions of the plain recurrence; float32 is the "plain recurrence in working
# precision" that the tolerance model compares kernels with.
DTYPES = (np.float32, np.float64, np.longdouble)
CHECKPOINT_EVERY = 64


class _Arith:
    """Element type of one run: how to convert a float64 array in and how to take exp."""

    def __init__(self, dtype):
        dtype = np.dtype(dtype)
        if dtype not in [np.dtype(d) for d in DTYPES]:
            raise ValueError(f"dtype: {dtype} not supported (float32, float64 or longdouble)")
        self.dtype = dtype

    def array(self, x):
        return np.asarray(x).astype(self.dtype)

    def exp(self, x):
        return np.exp(x)

    def to_float64(self, x):
        return np.asarray(x, dtype=np.float64)


def _token(S, alpha, k_t, e_t, z_t):
    """One step in place: ``Sbar = Diag(alpha) S``, ``u = z - Sbar^T e``, ``S = Sbar + k u^T``; returns u."""
    S *= alpha[..., :, None]
    u = z_t - np.matmul(e_t[..., None, :], S)[..., 0, :]
    S += k_t[..., :, None] * u[..., None, :]
    return u


def _read_out(S, q_t, scale):
    """``o_t = scale * S_t^T q_t``."""
    return scale * np.matmul(q_t[..., None, :], S)[..., 0, :]


def _run(problem, ar, do=None, dfinal_state=None, checkpoint_every=CHECKPOINT_EVERY):
    """Forward (and, given cotangents, the adjoint walk) in the element type of ``ar``."""
    B, T, H, K, V = problem.shape
    q, k, v, g, b, w = (ar.array(x) for x in problem.inputs())
    scale = ar.array(problem.scale)[()]
    S = ar.array(problem.h0()).copy()
    e = b * k
    z = w * v
    o = np.empty((B, T, H, V), dtype=S.dtype)
    checkpoints = {}
    for t in range(T):
        if t % checkpoint_every == 0:
            checkpoints[t] = S.copy()
        _token(S, ar.exp(g[:, t]), k[:, t], e[:, t], z[:, t])
        o[:, t] = _read_out(S, q[:, t], scale)
    if do is None:
        return o, S
    do = ar.array(do)
    dS = ar.array(dfinal_state).copy()
    grads = {name: np.empty_like(x) for name, x in zip(GRADS, (q, k, v, g, b, w))}
    for start in sorted(checkpoints, reverse=True):
        S = checkpoints.pop(start)
        stop = min(start + checkpoint_every, T)
        prev, us = [], []
        for t in range(start, stop):  # recompute the segment's states
            prev.append(S.copy())
            us.append(_token(S, ar.exp(g[:, t]), k[:, t], e[:, t], z[:, t]))
        for t in range(stop - 1, start - 1, -1):
            _adjoint_token(dS, prev.pop(), us.pop(), t, q, k, v, g, b, w, e, do, scale, ar, grads)
    grads["dh0"] = dS
    return o, S, grads


def _adjoint_token(dS, S_prev, u, t, q, k, v, g, b, w, e, do, scale, ar, grads):
    """Token t of the adjoint walk of DESIGN.md §1, updating dS (= dL/dS_t) in place to dL/dS_{t-1}."""
    alpha = ar.exp(g[:, t])
    q_t, k_t, e_t, do_t = q[:, t], k[:, t], e[:, t], do[:, t]
    dS += scale * q_t[..., :, None] * do_t[..., None, :]
    du = np.matmul(k_t[..., None, :], dS)[..., 0, :]  # du = dS^T k
    dk = np.matmul(dS, u[..., :, None])[..., 0]  # dk = dS u
    # S_{t-1} [dO, du]: gives Sbar dO (for dq) and Sbar du (for de) after the decay.
    M = np.matmul(S_prev, np.stack([do_t, du], axis=-1))
    Sbar_do = alpha * M[..., 0]
    de = -alpha * M[..., 1]  # de = -Sbar du
    # dq = scale S_t dO with S_t = Sbar + k u^T
    grads["dq"][:, t] = scale * (Sbar_do + k_t * np.sum(u * do_t, axis=-1)[..., None])
    grads["dw"][:, t] = du * v[:, t]
    grads["dv"][:, t] = du * w[:, t]
    grads["db"][:, t] = de * k_t
    grads["dk"][:, t] = dk + de * b[:, t]
    # dg = rowsum(dSbar * Sbar) with dSbar = dS - e du^T and Sbar = Diag(alpha) S_{t-1}
    grads["dg"][:, t] = alpha * np.einsum("...kv,...kv->...k", dS, S_prev) + e_t * de
    dS -= e_t[..., :, None] * du[..., None, :]
    dS *= alpha[..., :, None]


def forward(problem: Problem, dtype=np.float64, *, checkpoint_every=CHECKPOINT_EVERY):
    """Token-by-token forward in working precision ``dtype``: returns ``(o, final_state)``."""
    ar = _Arith(dtype)
    return _run(problem, ar, checkpoint_every=checkpoint_every)


def vjp(problem: Problem, do, dfinal_state, dtype=np.float64, *, checkpoint_every=CHECKPOINT_EVERY):
    """Hand-derived adjoint (DESIGN.md §1): all seven gradients for cotangents ``(do, dfinal_state)``."""
    ar = _Arith(dtype)
    do, dfinal_state = problem.check_cotangents(do, dfinal_state)
    _check_every(checkpoint_every)
    _, _, grads = _run(problem, ar, do, dfinal_state, checkpoint_every)
    return Grads(**grads)


def forward_and_vjp(problem: Problem, do, dfinal_state, dtype=np.float64, *, checkpoint_every=CHECKPOINT_EVERY):
    """Forward and adjoint in one pass: ``((o, final_state), grads)``."""
    ar = _Arith(dtype)
    do, dfinal_state = problem.check_cotangents(do, dfinal_state)
    _check_every(checkpoint_every)
    o, S, grads = _run(problem, ar, do, dfinal_state, checkpoint_every)
    return (o, S), Grads(**grads)


def _check_every(n):
    if not (isinstance(n, (int, np.integer)) and n >= 1):
        raise ValueError(f"checkpoint_every: expected a positive integer, got {n!r}")
