"""NumPy token-by-token GDN-2 recurrence (docs/DESIGN.md §1) and its hand-derived adjoint.

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
        try:
            dtype = np.dtype(dtype)
        except Exception:  # noqa: BLE001 - np.dtype raises TypeError, ValueError or SyntaxError on junk
            raise ValueError(f"dtype: {dtype!r} is not a dtype (float32, float64 or longdouble)") from None
        if dtype not in [np.dtype(d) for d in DTYPES]:
            raise ValueError(f"dtype: {dtype} not supported (float32, float64 or longdouble)")
        self.dtype = dtype

    def array(self, x):
        return np.asarray(x, dtype=self.dtype)  # no copy when already in working precision

    def exp(self, x):
        return np.exp(x)


def _add_low_rank(S, left, right, buf):
    """``S += left @ right`` in place (``left: [..., K, r]``, ``right: [..., r, V]``) via the buffer ``buf``.

    Reusing one state-sized buffer avoids a fresh page-faulted allocation per token.
    """
    if S.dtype == object:
        S += np.matmul(left, right)
    else:
        S += np.matmul(left, right, out=buf)


def _add_outer(S, x, y, buf):
    """``S += x y^T`` over the leading (batch, head) axes, in place."""
    # A rank-2 product with a zero column: NumPy's matmul bypasses BLAS for inner size 1.
    _add_low_rank(S, np.stack([x, np.zeros_like(x)], axis=-1), np.stack([y, y], axis=-2), buf)


def _token(S, alpha, k_t, b_t, v_t, w_t, buf):
    """One step in place: ``Sbar = Diag(alpha) S``, ``u = w*v - Sbar^T (b*k)``, ``S = Sbar + k u^T``; returns u."""
    S *= alpha[..., :, None]
    u = w_t * v_t - np.matmul((b_t * k_t)[..., None, :], S)[..., 0, :]
    _add_outer(S, k_t, u, buf)
    return u


def _read_out(S, q_t, scale):
    """``o_t = scale * S_t^T q_t``."""
    return scale * np.matmul(q_t[..., None, :], S)[..., 0, :]


def _run(problem, ar, do=None, dfinal_state=None, checkpoint_every=CHECKPOINT_EVERY, outputs=True):
    """Forward (and, given cotangents, the adjoint walk) in the element type of ``ar``.

    Returns ``(o, final_state)`` or ``(o, final_state, grads)``; ``o`` is None when not ``outputs``.
    """
    _check_every(checkpoint_every)
    B, T, H, K, V = problem.shape
    q, k, v, g, b, w = (ar.array(x) for x in problem.inputs())
    scale = ar.array(problem.scale)[()]
    S = np.array(ar.array(problem.h0()))
    buf = np.empty_like(S)
    o = np.empty((B, T, H, V), dtype=S.dtype) if outputs else None
    checkpoints = {}
    for t in range(T):
        if do is not None and t % checkpoint_every == 0:
            checkpoints[t] = S.copy()
        _token(S, ar.exp(g[:, t]), k[:, t], b[:, t], v[:, t], w[:, t], buf)
        if outputs:
            o[:, t] = _read_out(S, q[:, t], scale)
    if do is None:
        return o, S
    grads = _adjoint(checkpoints, T, q, k, v, g, b, w, ar.array(do), ar.array(dfinal_state), scale, ar,
                     checkpoint_every, buf)
    return o, S, grads


def _adjoint(checkpoints, T, q, k, v, g, b, w, do, dfinal_state, scale, ar, every, buf):
    """Walk t = T..1 (docs/DESIGN.md §1, token-by-token adjoint), recomputing each segment's states."""
    grads = {name: np.empty_like(x) for name, x in zip(GRADS, (q, k, v, g, b, w))}
    dS = np.array(dfinal_state)
    _add_outer(dS, scale * q[:, T - 1], do[:, T - 1], buf)  # dS = dL/dS_T, including o_T's term
    prev = np.empty((min(every, T),) + dS.shape, dtype=dS.dtype)  # the segment's S_{t-1}
    for start in sorted(checkpoints, reverse=True):
        S = checkpoints.pop(start)
        stop = min(start + every, T)
        us = []
        for t in range(start, stop):  # recompute the segment's states S_{t-1} and u_t
            prev[t - start] = S
            us.append(_token(S, ar.exp(g[:, t]), k[:, t], b[:, t], v[:, t], w[:, t], buf))
        for t in range(stop - 1, start - 1, -1):
            _adjoint_token(dS, prev[t - start], us.pop(), t, q, k, v, g, b, w, do, scale, ar, grads, buf)
    grads["dh0"] = dS
    return grads


def _adjoint_token(dS, S_prev, u, t, q, k, v, g, b, w, do, scale, ar, grads, buf):
    """Token t of the adjoint: gradients of token t; ``dS`` goes from dL/dS_t to dL/dS_{t-1} in place.

    On entry ``dS`` already holds ``scale q_t dO_t^T``; on exit it holds ``scale q_{t-1} dO_{t-1}^T``
    (the decay, the erase term and the next read-out fused into one rank-2 update).
    """
    alpha = ar.exp(g[:, t])
    q_t, k_t, b_t, do_t = q[:, t], k[:, t], b[:, t], do[:, t]
    e_t = b_t * k_t
    du = np.matmul(k_t[..., None, :], dS)[..., 0, :]  # du = dS^T k
    dk = np.matmul(dS, u[..., :, None])[..., 0]  # dk = dS u
    # [dO, du] S_{t-1}^T: gives Sbar dO (for dq) and Sbar du (for de) after the decay.
    M = np.matmul(np.stack([do_t, du], axis=-2), np.swapaxes(S_prev, -1, -2))
    de = -alpha * M[..., 1, :]  # de = -Sbar du
    # dq = scale S_t dO with S_t = Sbar + k u^T
    grads["dq"][:, t] = scale * (alpha * M[..., 0, :] + k_t * np.sum(u * do_t, axis=-1)[..., None])
    grads["dw"][:, t] = du * v[:, t]
    grads["dv"][:, t] = du * w[:, t]
    grads["db"][:, t] = de * k_t
    grads["dk"][:, t] = dk + de * b_t
    # dg = rowsum(dSbar * Sbar) with dSbar = dS - e du^T, Sbar = Diag(alpha) S_{t-1}
    grads["dg"][:, t] = alpha * np.einsum("...kv,...kv->...k", dS, S_prev) + e_t * de
    # dS_{t-1} = Diag(alpha) (dS - e du^T), plus token t-1's read-out term scale q dO^T
    if t > 0:
        left, right = scale * q[:, t - 1], do[:, t - 1]
    else:
        left, right = np.zeros_like(q_t), np.zeros_like(do_t)
    dS *= alpha[..., :, None]
    _add_low_rank(dS, np.stack([-alpha * e_t, left], axis=-1), np.stack([du, right], axis=-2), buf)


def forward(problem: Problem, dtype=np.float64, *, checkpoint_every=CHECKPOINT_EVERY):
    """Token-by-token forward in working precision ``dtype``: returns ``(o, final_state)``."""
    return _run(problem, _Arith(dtype), checkpoint_every=checkpoint_every)


def vjp(problem: Problem, do, dfinal_state, dtype=np.float64, *, checkpoint_every=CHECKPOINT_EVERY):
    """Hand-derived adjoint (docs/DESIGN.md §1): all seven gradients for cotangents ``(do, dfinal_state)``."""
    ar = _Arith(dtype)
    do, dfinal_state = problem.check_cotangents(do, dfinal_state)
    _, _, grads = _run(problem, ar, do, dfinal_state, checkpoint_every, outputs=False)
    return Grads(**grads)


def forward_and_vjp(problem: Problem, do, dfinal_state, dtype=np.float64, *, checkpoint_every=CHECKPOINT_EVERY):
    """Forward and adjoint sharing one forward pass: ``((o, final_state), grads)``."""
    ar = _Arith(dtype)
    do, dfinal_state = problem.check_cotangents(do, dfinal_state)
    o, S, grads = _run(problem, ar, do, dfinal_state, checkpoint_every)
    return (o, S), Grads(**grads)


def _check_every(n):
    if isinstance(n, bool) or not (isinstance(n, (int, np.integer)) and n >= 1):
        raise ValueError(f"checkpoint_every: expected a positive integer, got {n!r}")
