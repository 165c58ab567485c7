"""NumPy token-by-token GDN-2 recurrence (docs/DESIGN.md §1) and its hand-derived adjoint.

The core works on any element type NumPy can do arithmetic on: float32, float64,
``np.longdouble`` here, and object arrays of ``mpmath.mpf`` in :mod:`oracle.mp`.
Memory is O(T/N + N) states: the forward pass keeps a checkpoint every N tokens and
the backward pass recomputes the states inside one segment at a time. The specification,
:func:`_spec_run`, steps all (batch, head) pairs at once; NumPy element types run the pairs a
cache-sized group at a time (:func:`run`), with the same calls on the same operands, so with
the same bits (and then the states held are those of one group).
"""

from __future__ import annotations

import math

import numpy as np

from .problem import GRADS, Grads, Problem, repeat_heads, sum_groups

# Working precisions of the plain recurrence; float32 is the "plain recurrence in working
# precision" that the tolerance model compares kernels with.
DTYPES = (np.float32, np.float64, np.longdouble)
CHECKPOINT_EVERY = 64


class Arith:
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


def token_step(S, alpha, k_t, b_t, v_t, w_t, buf):
    """One step in place: ``Sbar = Diag(alpha) S``, ``u = w*v - Sbar^T (b*k)``, ``S = Sbar + k u^T``; returns u."""
    S *= alpha[..., :, None]
    u = w_t * v_t - np.matmul((b_t * k_t)[..., None, :], S)[..., 0, :]
    _add_outer(S, k_t, u, buf)
    return u


def read_out(S, q_t, scale):
    """``o_t = scale * S_t^T q_t``."""
    return scale * np.matmul(q_t[..., None, :], S)[..., 0, :]


# The NumPy path runs the (batch, head) recurrences a group at a time, through all the tokens, so that the
# group's state (and in the adjoint its co-state and buffers) stays in a core's cache instead of every pass
# over the state going to memory (docs/performance.md, "The oracle"). Bytes of state a group holds at most:
GROUP_BYTES = 2**20
# State-sized arrays each token reads or writes (a pass each; ops over one state-sized array or its buffer),
# counted from the code below: the forward's decay, e^T S, outer product, its addition and the read-out
# (2 + 1 + 1 + 3 + 1); the adjoint's recomputation (the same without the read-out, the decay writing the next
# slot of the segment: 2 + 1 + 1 + 3); the adjoint token's dS^T k, dS u, [dO, du] S^T, rowsum(dS * S),
# decay, rank-2 product and its addition (1 + 1 + 1 + 2 + 2 + 1 + 3).
STATE_PASSES = {"forward": 8, "recompute": 7, "adjoint": 11}


def _groups(B, H, state_bytes):
    """``[(batches, heads)]`` slices covering every (batch, head) pair: whole batches when one batch's states fit
    in :data:`GROUP_BYTES`, else the heads of one batch split evenly into groups that fit (one head at least)."""
    per = max(1, GROUP_BYTES // state_bytes)  # recurrences a group
    if per >= H:
        nb = per // H
        return [(slice(b0, min(b0 + nb, B)), slice(0, H)) for b0 in range(0, B, nb)]
    parts = -(-H // per)
    edges = [H * i // parts for i in range(parts + 1)]
    return [(slice(b, b + 1), slice(h0, h1)) for b in range(B) for h0, h1 in zip(edges, edges[1:])]


def run(problem, ar, do=None, dfinal_state=None, checkpoint_every=CHECKPOINT_EVERY, outputs=True):
    """Forward (and, given cotangents, the adjoint walk) in the element type of ``ar``.

    Returns ``(o, final_state)`` or ``(o, final_state, grads)``; ``o`` is None when not ``outputs``. Grouped value
    heads (``HV = G H``) run per value head with q, k repeated, ``dq, dk`` summed over each group. NumPy
    element types run group by group (:func:`_groups`), bit for bit :func:`_spec_run`; other element types
    (mpmath objects) run :func:`_spec_run` itself.
    """
    _check_every(checkpoint_every)
    G = _heads_per_key(problem)
    if G > 1:  # grouped value heads: per value head, then dq, dk summed over each key head's group
        results = run(_PerValueHead(problem, G), ar, do, dfinal_state, checkpoint_every, outputs)
        if do is not None:
            for name in ("dq", "dk"):
                results[2][name] = sum_groups(results[2][name], G)
        return results
    if not isinstance(ar, Arith):
        return _spec_run(problem, ar, do, dfinal_state, checkpoint_every, outputs)
    B, T, H, K, V = problem.shape
    inputs = tuple(ar.array(x) for x in problem.inputs())
    scale = ar.array(problem.scale)[()]
    h0 = ar.array(problem.h0())
    o = np.empty((B, T, H, V), dtype=ar.dtype) if outputs else None
    # States keep the memory layout of the initial state and of dL/dS_T (np.array and empty_like keep it), as in
    # _spec_run: BLAS is then called on the same matrices (a [V, K] state stored transposed stays so).
    final = np.empty_like(h0)
    grads = None
    if do is not None:
        do, dfinal_state = ar.array(do), ar.array(dfinal_state)
        grads = {name: np.empty_like(x) for name, x in zip(GRADS, inputs)}
        grads["dh0"] = np.empty_like(dfinal_state)
    scratch = _Scratch(ar.dtype)
    for rows, heads in _groups(B, H, K * V * ar.dtype.itemsize):
        group = _Group(tuple(x[rows, :, heads].swapaxes(0, 1) for x in inputs), scale, ar, checkpoint_every, scratch)
        S = np.array(h0[rows, heads])
        buf = np.empty_like(S)
        checkpoints = group.forward(S, buf, None if o is None else o[rows, :, heads].swapaxes(0, 1), do is not None)
        final[rows, heads] = S
        if do is not None:
            dS = np.array(dfinal_state[rows, heads])
            group.adjoint(checkpoints, dS, buf, do[rows, :, heads].swapaxes(0, 1),
                          {name: x[rows, :, heads].swapaxes(0, 1) for name, x in grads.items() if name != "dh0"})
            grads["dh0"][rows, heads] = dS
    if outputs:
        np.multiply(o, scale, out=o)  # o_t = scale * S_t^T q_t (the read-outs wrote S_t^T q_t)
    return (o, final) if do is None else (o, final, grads)


def _heads_per_key(problem):
    """``HV // H``: the value heads (v's) reading each key head (q's); 1 without grouped value heads."""
    inputs = problem.inputs()
    return inputs[2].shape[2] // inputs[0].shape[2]


class _PerValueHead:
    """A problem (anything with ``shape``, ``scale``, ``inputs()`` and ``h0()``) with grouped value heads seen per
    value head: q and k repeated ``G`` times (:func:`problem.repeat_heads`), so ``H == HV``."""

    def __init__(self, problem, G):
        B, T, H, K, V = problem.shape
        q, k, *rest = problem.inputs()
        self.shape, self.scale = (B, T, H * G, K, V), problem.scale
        self._inputs, self.h0 = (repeat_heads(q, G), repeat_heads(k, G), *rest), problem.h0

    def inputs(self):
        return self._inputs


class _Scratch:
    """Scratch arrays by name, reused by every group of a run: a fresh array costs a page fault and a zeroed
    page for every 4 KiB, per group. Contents are left over from the previous group."""

    def __init__(self, dtype):
        self.dtype, self._flat = dtype, {}

    def __call__(self, name, shape):
        """A C-contiguous array of ``shape`` in the scratch ``name``."""
        size = math.prod(shape)
        if name not in self._flat or self._flat[name].size < size:
            self._flat[name] = np.empty(size, self.dtype)
        return self._flat[name][:size].reshape(shape)


class _Group:
    """The recurrences of one group, token-major: inputs ``q, k, v, g, b, w`` as views ``[T, nb, nh, dim]``.

    Each token makes the same NumPy calls as :func:`_spec_run` on the same per-(batch, head) operands (BLAS sees
    the same matrices, vectors and strides; the elementwise products are exact per element), so the results are
    its bits. Per-token vectors (``exp(g)``, ``b * k``, ...) and gradients are computed a segment of tokens at a
    time.
    """

    def __init__(self, inputs, scale, ar, every, scratch):
        self.q, self.k, self.v, self.g, self.b, self.w = inputs
        self.scale, self.ar, self.every, self.scratch = scale, ar, every, scratch
        self.T = self.q.shape[0]
        self.nb_nh, self.K, self.V = self.q.shape[1:3], self.q.shape[-1], self.v.shape[-1]

    def _segment(self, s0, s1):
        """``(alpha, e, wv, left)`` of tokens ``s0 .. s1-1``: ``exp(g)``, ``b * k``, ``w * v`` and the
        outer-product operand ``[k, 0]`` ``[n, nb, nh, K, 2]``."""
        k, n = self.k[s0:s1], s1 - s0
        e, wv = self.scratch("e", k.shape), self.scratch("wv", (n,) + self.nb_nh + (self.V,))
        np.multiply(self.b[s0:s1], k, out=e)
        np.multiply(self.w[s0:s1], self.v[s0:s1], out=wv)
        left = self.scratch("left", k.shape + (2,))
        left[..., 0], left[..., 1] = k, 0
        return self.ar.exp(self.g[s0:s1]), e, wv, left

    def forward(self, S, buf, o, keep_checkpoints):
        """Every token in place on ``S [nb, nh, K, V]`` (``buf``: a buffer like it); ``S_t^T q_t`` into
        ``o [T, nb, nh, V]`` (unless None). Returns the states before tokens 0, every, 2 every, ... (C order, as
        ``S.copy()`` gives) when ``keep_checkpoints``."""
        y, right = self.scratch("y", self.nb_nh + (1, self.V)), self.scratch("right", self.nb_nh + (2, self.V))
        starts = range(0, self.T, self.every)
        checkpoints = self.scratch("checkpoints", (len(starts) if keep_checkpoints else 0,) + S.shape)
        for j, s0 in enumerate(starts):
            if keep_checkpoints:
                checkpoints[j] = S
            alpha, e, wv, left = self._segment(s0, min(s0 + self.every, self.T))
            for i in range(len(alpha)):
                _step(S, S, alpha[i], e[i], wv[i], left[i], y, right, buf)
                if o is not None:
                    np.matmul(self.q[s0 + i][..., None, :], S, out=o[s0 + i][..., None, :])
        return checkpoints

    def adjoint(self, checkpoints, dS, buf, do, grads):
        """The adjoint walk t = T..1 (:func:`_spec_adjoint`): ``dS`` from dL/dS_T to dL/dh0 in place, the gradients
        of every token into ``grads`` (views ``[T, nb, nh, dim]`` by name); ``buf``: the forward's buffer."""
        T, scale, nb_nh, K, V, scratch = self.T, self.scale, self.nb_nh, self.K, self.V, self.scratch
        y, right = scratch("y", nb_nh + (1, V)), scratch("right", nb_nh + (2, V))
        # dS = dL/dS_T, including o_T's term scale q_T dO_T^T
        left = scratch("left_T", nb_nh + (K, 2))
        np.multiply(self.q[T - 1], scale, out=left[..., 0])
        left[..., 1] = 0
        right[..., 0, :] = right[..., 1, :] = do[T - 1]
        dS += np.matmul(left, right, out=buf)
        n_max = min(self.every, T)
        prev = scratch("prev", (n_max + 1,) + dS.shape)  # the segment's S_{t-1}, and the last token's Sbar
        us = scratch("u", (n_max,) + nb_nh + (V,))
        dodu = scratch("dodu", (n_max,) + nb_nh + (2, V))  # [dO_t, du_t]
        M = scratch("M", (n_max,) + nb_nh + (2, K))  # [dO_t, du_t] S_{t-1}^T
        dSu = scratch("dSu", (n_max,) + nb_nh + (K,))  # dS u
        rowsum = scratch("rowsum", (n_max,) + nb_nh + (K,))  # rowsum(dS * S_{t-1})
        for j, s0 in reversed(list(enumerate(range(0, T, self.every)))):
            s1 = min(s0 + self.every, T)
            n = s1 - s0
            alpha, e, wv, fwd_left = self._segment(s0, s1)
            prev[0] = checkpoints[j]
            for i in range(n):  # recompute the segment's states S_{t-1} and u_t
                _step(prev[i], prev[i + 1], alpha[i], e[i], wv[i], fwd_left[i], y, right, buf, full=i + 1 < n)
                us[i] = right[..., 0, :]
            lefts, rights = self._rank2_operands(s0, s1, alpha, e, do)
            dodu[:n, ..., 0, :] = do[s0:s1]
            for i in reversed(range(n)):
                np.matmul(self.k[s0 + i][..., None, :], dS, out=dodu[i][..., 1:, :])  # du = dS^T k
                np.matmul(dS, us[i][..., :, None], out=dSu[i][..., None])  # dS u
                np.matmul(dodu[i], np.swapaxes(prev[i], -1, -2), out=M[i])
                np.einsum("...kv,...kv->...k", dS, prev[i], out=rowsum[i])
                dS *= alpha[i][..., :, None]
                rights[i][..., 0, :] = dodu[i][..., 1, :]
                dS += np.matmul(lefts[i], rights[i], out=buf)
            self._token_grads(slice(s0, s1), alpha, e, us[:n], dodu[:n], M[:n], dSu[:n], rowsum[:n], do, grads)

    def _rank2_operands(self, s0, s1, alpha, e, do):
        """The operands of each token's rank-2 update of dS, tokens ``s0 .. s1-1``: ``[-alpha e_t, scale q_{t-1}]``
        ``[n, nb, nh, K, 2]`` and ``[du_t, dO_{t-1}]`` ``[n, nb, nh, 2, V]`` (du_t left to fill; zeros before
        token 0)."""
        n = s1 - s0
        lefts = self.scratch("lefts", (n,) + self.nb_nh + (self.K, 2))
        rights = self.scratch("rights", (n,) + self.nb_nh + (2, self.V))
        np.multiply(-alpha, e, out=lefts[..., 0])
        first = 1 if s0 == 0 else 0  # token 0 has no read-out before it
        np.multiply(self.q[s0 + first - 1:s1 - 1], self.scale, out=lefts[first:, ..., 1])
        rights[first:, ..., 1, :] = do[s0 + first - 1:s1 - 1]
        if first:
            lefts[0, ..., 1] = 0
            rights[0, ..., 1, :] = 0
        return lefts, rights

    def _token_grads(self, ts, alpha, e, u, dodu, M, dSu, rowsum, do, grads):
        """The gradients of tokens ``ts`` from the adjoint walk's products (:func:`_spec_adjoint_token`)."""
        k_t, v_t, b_t, w_t, do_t = self.k[ts], self.v[ts], self.b[ts], self.w[ts], do[ts]
        du = dodu[..., 1, :]
        de = -alpha * M[..., 1, :]  # de = -Sbar du
        grads["dq"][ts] = self.scale * (alpha * M[..., 0, :] + k_t * np.sum(u * do_t, axis=-1)[..., None])
        grads["dw"][ts] = du * v_t
        grads["dv"][ts] = du * w_t
        grads["db"][ts] = de * k_t
        grads["dk"][ts] = dSu + de * b_t
        grads["dg"][ts] = alpha * rowsum + e * de


def _step(S, out, alpha, e, wv, left, y, right, buf, full=True):
    """One token (:func:`token_step`) from ``S`` into ``out`` (``S`` itself, or the next slot):
    ``Sbar = Diag(alpha) S``, ``u = w*v - Sbar^T e`` into both rows of ``right``, then ``out = Sbar + k u^T``
    (``left = [k, 0]``) if ``full``."""
    np.multiply(S, alpha[..., :, None], out=out)
    np.matmul(e[..., None, :], out, out=y)
    np.subtract(wv, y[..., 0, :], out=right[..., 0, :])
    if full:
        right[..., 1, :] = right[..., 0, :]
        out += np.matmul(left, right, out=buf)


def _spec_run(problem, ar, do=None, dfinal_state=None, checkpoint_every=CHECKPOINT_EVERY, outputs=True):
    """The specification: forward (and, given cotangents, the adjoint walk) over all (batch, head) pairs at once,
    token by token, in the element type of ``ar``; :func:`run`'s results, and what it runs on mpmath objects."""
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
        token_step(S, ar.exp(g[:, t]), k[:, t], b[:, t], v[:, t], w[:, t], buf)
        if outputs:
            o[:, t] = read_out(S, q[:, t], scale)
    if do is None:
        return o, S
    grads = _spec_adjoint(checkpoints, T, q, k, v, g, b, w, ar.array(do), ar.array(dfinal_state), scale, ar,
                     checkpoint_every, buf)
    return o, S, grads


def _spec_adjoint(checkpoints, T, q, k, v, g, b, w, do, dfinal_state, scale, ar, every, buf):
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
            us.append(token_step(S, ar.exp(g[:, t]), k[:, t], b[:, t], v[:, t], w[:, t], buf))
        for t in range(stop - 1, start - 1, -1):
            _spec_adjoint_token(dS, prev[t - start], us.pop(), t, q, k, v, g, b, w, do, scale, ar, grads, buf)
    grads["dh0"] = dS
    return grads


def _spec_adjoint_token(dS, S_prev, u, t, q, k, v, g, b, w, do, scale, ar, grads, buf):
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
    return run(problem, Arith(dtype), checkpoint_every=checkpoint_every)


def vjp(problem: Problem, do, dfinal_state, dtype=np.float64, *, checkpoint_every=CHECKPOINT_EVERY):
    """Hand-derived adjoint (docs/DESIGN.md §1): all seven gradients for cotangents ``(do, dfinal_state)``."""
    ar = Arith(dtype)
    do, dfinal_state = problem.check_cotangents(do, dfinal_state)
    _, _, grads = run(problem, ar, do, dfinal_state, checkpoint_every, outputs=False)
    return Grads(**grads)


def forward_and_vjp(problem: Problem, do, dfinal_state, dtype=np.float64, *, checkpoint_every=CHECKPOINT_EVERY):
    """Forward and adjoint sharing one forward pass: ``((o, final_state), grads)``."""
    ar = Arith(dtype)
    do, dfinal_state = problem.check_cotangents(do, dfinal_state)
    o, S, grads = run(problem, ar, do, dfinal_state, checkpoint_every)
    return (o, S), Grads(**grads)


def _check_every(n):
    if isinstance(n, bool) or not (isinstance(n, (int, np.integer)) and n >= 1):
        raise ValueError(f"checkpoint_every: expected a positive integer, got {n!r}")
