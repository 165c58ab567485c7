"""The standard float32 chunked GDN-2 algorithm, forward and chunkwise backward, in NumPy.

The second working-precision baseline of the tolerance model (docs/DESIGN.md §4, "Grades
and the precision-loss bound"): the chunkwise form and backward of docs/DESIGN.md §1 at FLA's chunk
(``call_modes.FLA_CHUNK`` = 64 tokens), as public chunked kernels commonly write it -- every decay exponent
``G_r - G_s`` (and ``G_C - G_r``) is a difference of two float32 within-chunk cumulative sums, so each factor carries
a relative error of order ``ulp(|G|)`` (exponent cancellation). Everything else is the ordinary
algorithm: the WY solve ``A = (I + T)^{-1}`` by forward substitution, the state recurrence over
chunks, and a backward that carries ``dS`` from the last chunk to the first, forms ``dg`` as a
reverse cumulative sum of the gate terms and keeps the undecayed diagonal and the ``Kd``/``gamma_C``
terms out of that sum.

``operands="bfloat16"``: every matrix product and forward score contraction takes its two operands rounded to bfloat16
(accumulating in float32), the forward substitution's included -- what a kernel computing its chunk solve and
its matmuls with 16-bit operands (a ``precision="bf16"`` option) gets; ``operands="bfloat16_solve"``: only the chunk
solve's (``T``, the substitution's products, and ``A`` with its right-hand sides in ``Y = A Ebar``, ``U = A (w v)``
and the backward's ``A^T dR``). The diagnosis compares a kernel's errors with these to tell operand rounding from
a damping (docs/DESIGN.md §4, "Diagnosis").

All arithmetic is in ``dtype`` (float32; float64 only to check the algorithm against the exact
recurrence). Memory: one chunk's ``C x C x K`` decay tensor at a time plus each chunk's entering
state. Shares no code with ``kernels`` (docs/DESIGN.md §3).
"""

from __future__ import annotations

import numpy as np

from .call_modes import FLA_CHUNK
from .generate import round_to_bfloat16
from .problem import Grads, Problem, sum_groups

# Operand precisions of :func:`forward_and_vjp`: None (the inputs' dtype), "bfloat16" (every product's operands) or
# "bfloat16_solve" (the chunk solve's only).
OPERANDS = (None, "bfloat16", "bfloat16_solve")


def _chunks(x, C, dtype):
    """``[B, T, H, D] -> [N, B, H, C, D]`` in ``dtype``, zero-padded at the end (identity tokens)."""
    B, T, H, D = x.shape
    N = -(-T // C)
    x = np.pad(np.asarray(x, dtype=dtype), ((0, 0), (0, N * C - T), (0, 0), (0, 0)))
    return x.reshape(B, N, C, H, D).transpose(1, 0, 3, 2, 4)


def _unchunk(x, T):
    """``[N, B, H, C, D] -> [B, T, H, D]`` (padding dropped)."""
    N, B, H, C, D = x.shape
    return x.transpose(1, 0, 3, 2, 4).reshape(B, N * C, H, D)[:, :T]


def _t(x):
    """Swap the last two axes."""
    return np.swapaxes(x, -1, -2)


def rounding(operands):
    """``(r, r_solve)``: the functions every product's operands and the chunk solve's pass through (None: the
    inputs' own dtype; else rounding to bfloat16, kept in the array's dtype) for ``operands`` (:data:`OPERANDS`)."""
    if operands not in OPERANDS:
        raise ValueError(f"operands: expected one of {OPERANDS}, got {operands!r}")
    if operands is None:
        return None, None
    r = lambda x: round_to_bfloat16(x).astype(np.asarray(x).dtype)  # noqa: E731 - a one-line rounding
    return (r if operands == "bfloat16" else None), r


def matmul(r):
    """``np.matmul``, or with both operands passed through ``r`` first (:func:`rounding`)."""
    return np.matmul if r is None else (lambda a, b: np.matmul(r(a), r(b)))


def unit_lower_inverse(T, r=None):
    """``(I + T)^{-1}`` for strictly lower triangular ``T [..., C, C]``, by forward substitution in T's dtype
    (each product's operands through ``r``, :func:`rounding`)."""
    mm = matmul(r)
    C = T.shape[-1]
    A = np.zeros_like(T)
    A[..., np.arange(C), np.arange(C)] = 1
    for i in range(1, C):
        A[..., i, :i] = -mm(T[..., i : i + 1, :i], A[..., :i, :i])[..., 0, :]
    return A


class _Chunk:
    """One chunk's state-independent quantities (docs/DESIGN.md §1 chunkwise form), all in the inputs' dtype."""

    def __init__(self, q, k, v, g, b, w, r=None, r_solve=None, clip=None):
        C = q.shape[-2]
        self.r, mm = r, matmul(r)
        self.mm, self.solve_mm = mm, matmul(r_solve)
        self.q, self.k, self.v, self.b, self.w = q, k, v, b, w
        G = np.cumsum(g, axis=-2, dtype=g.dtype)  # float32 cumulative sum within the chunk
        self.gamma = np.exp(G)
        GC = G[..., -1:, :]
        self.fC = np.exp(GC - G)  # exp(G_C - G_r): a difference of two rounded cumulative sums
        self.gC = np.exp(GC)  # [..., 1, K]
        lower = np.tril(np.ones((C, C), bool))[:, :, None]
        # D_rsc = exp(G_rc - G_sc) for r >= s, 0 above the diagonal: the exponent-cancellation site.
        diff = np.where(lower, G[..., :, None, :] - G[..., None, :, :], 0)
        kept = np.ones_like(diff, bool) if clip is None else diff >= -clip  # exponents the clip leaves as they are
        self.D = np.where(lower, np.exp(diff if clip is None else np.maximum(diff, -clip)), 0).astype(g.dtype)
        # the decay factors G reaches (a clipped factor is a constant: no gradient through it)
        self.Dg = self.D if clip is None else np.where(kept, self.D, 0).astype(g.dtype)
        self.strict = np.tril(np.ones((C, C), bool), -1)
        self.a = b * k
        self.Ebar = self.gamma * self.a
        self.Qg = self.gamma * q
        self.Kd = self.fC * k
        self.T = np.where(self.strict, self._score(self.a), 0)
        self.Aqk = np.where(self.strict | np.eye(C, dtype=bool), self._score(q), 0)
        self.A = unit_lower_inverse(self.T, r_solve)
        self.Y = self.solve_mm(self.A, self.Ebar)
        self.U = self.solve_mm(self.A, w * v)

    def _score(self, X):
        """``S_rs = sum_c X_rc k_sc D_rsc`` (the decayed operand ``X_r D_rs`` and ``k_s`` through ``r``)."""
        r = self.r or (lambda x: x)
        return np.sum(r(X[..., :, None, :] * self.D) * r(self.k[..., None, :, :]), axis=-1)

    def state(self, S0):
        """``R = U - Y S0`` and the chunk's final state ``Diag(gamma_C) S0 + Kd^T R``."""
        mm = self.mm
        R = self.U - mm(self.Y, S0)
        return R, _t(self.gC) * S0 + mm(_t(self.Kd), R)

    def output(self, S0, R, scale):
        """``O = scale ((gamma q) S0 + Aqk R)``."""
        mm = self.mm
        return scale * (mm(self.Qg, S0) + mm(self.Aqk, R))

    def backward(self, S0, R, dO, dS1, scale):
        """The chunk's six per-token gradients and ``dS0`` (the cotangent of its entering state)."""
        k, b, mm = self.k, self.b, self.mm
        dR = scale * mm(_t(self.Aqk), dO) + mm(self.Kd, dS1)
        dS0 = scale * mm(_t(self.Qg), dO) + _t(self.gC) * dS1 - mm(_t(self.Y), dR)
        dAqk = np.where(self.strict | np.eye(dO.shape[-2], dtype=bool), scale * mm(dO, _t(R)), 0)
        dQg = scale * mm(dO, _t(S0))
        dKd = mm(R, _t(dS1))
        dX = self.solve_mm(_t(self.A), dR)  # R = A X with X = w v - Ebar S0
        dT = -np.where(self.strict, mm(dX, _t(R)), 0)
        dEbar = -mm(dX, _t(S0))
        diag = np.diagonal(dAqk, axis1=-2, axis2=-1)[..., None]  # exponent 0: kept out of the score path
        dAqk = np.where(self.strict, dAqk, 0)
        # score path: S_rs = sum_c X_rc k_sc D_rsc for (X, dS) = (a, dT) and (q, dAqk)
        def through(D):
            """The score path's cotangents of ``a``, ``q`` and ``k`` through decay factors ``D``."""
            return (np.sum(dT[..., None] * D * k[..., None, :, :], axis=-2),
                    np.sum(dAqk[..., None] * D * k[..., None, :, :], axis=-2),
                    np.sum((dT[..., None] * self.a[..., :, None, :] + dAqk[..., None] * self.q[..., :, None, :]) * D,
                           axis=-3))

        dXa, dXq, dk_s = through(self.D)
        dXa_g, dXq_g, dk_s_g = (dXa, dXq, dk_s) if self.Dg is self.D else through(self.Dg)
        da = self.gamma * dEbar + dXa
        dq = self.gamma * dQg + dXq + diag * k
        dk = self.fC * dKd + dk_s + diag * self.q + da * b
        # G_r reaches g_i for i <= r (reverse cumsum); G_C - G_r reaches i > r (exclusive cumsum); G_C every i.
        dG = self.Ebar * dEbar + self.Qg * dQg + self.a * dXa_g + self.q * dXq_g - k * dk_s_g
        dg = np.flip(np.cumsum(np.flip(dG, -2), axis=-2), -2)
        KdK = np.cumsum(self.Kd * dKd, axis=-2)
        dg[..., 1:, :] += KdK[..., :-1, :]
        dg += self.gC * np.sum(dS1 * S0, axis=-1)[..., None, :]
        return (dq, dk, dX * self.w, dg, da * k, dX * self.v), dS0


def forward_and_vjp(problem: Problem, do, dfinal_state, *, chunk_size=FLA_CHUNK, dtype=np.float32, operands=None,
                    clip=None):
    """``((o, final_state), grads)`` of the chunked algorithm in ``dtype``, ``chunk_size`` tokens per chunk
    (grouped value heads as in :func:`oracle.recurrence.run`); ``operands`` (:data:`OPERANDS`): the precision of
    every product's operands (None: ``dtype``); ``clip`` (> 0): every within-chunk pair exponent ``G_r - G_s`` taken
    as at least ``-clip``, the clipped factors constants (no gradient), as a kernel clipping its exponents computes
    (what the diagnosis names an exponent clip by; None: no clip)."""
    if clip is not None and not (np.isfinite(clip) and clip > 0):
        raise ValueError(f"clip: expected a finite number > 0, got {clip!r}")
    r, r_solve = rounding(operands)
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype: expected float32 or float64, got {dtype}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ValueError(f"chunk_size: expected a positive integer, got {chunk_size!r}")
    do, dfinal_state = problem.check_cotangents(do, dfinal_state)
    G = problem.group_size
    if G > 1:  # grouped value heads: per value head, then dq, dk summed over each key head's group
        outputs, grads = forward_and_vjp(problem.per_value_head(), do, dfinal_state, chunk_size=chunk_size,
                                         dtype=dtype, operands=operands, clip=clip)
        return outputs, grads._replace(dq=sum_groups(grads.dq, G), dk=sum_groups(grads.dk, G))
    B, T, H, K, V = problem.shape
    xs = [_chunks(x, chunk_size, dtype) for x in problem.inputs()]
    dOs = _chunks(do, chunk_size, dtype)
    scale = dtype.type(problem.scale)
    S = np.asarray(problem.h0(), dtype=dtype)
    states, outs = [], []
    # Huge finite log-decays overflow the float32 cumulative sums to -inf and give NaN, as they would
    # in a kernel of this kind: the result is then non-finite and the grading ignores it (no warning).
    with np.errstate(over="ignore", invalid="ignore"):
        for n in range(len(dOs)):
            ch = _Chunk(*(x[n] for x in xs), r=r, r_solve=r_solve, clip=clip)
            R, S1 = ch.state(S)
            states.append((S, R))
            outs.append(ch.output(S, R, scale))
            S = S1
        dS = np.asarray(dfinal_state, dtype=dtype)
        grads = [None] * len(dOs)
        for n in reversed(range(len(dOs))):
            # recomputed: one chunk's decay tensor alive at a time
            ch = _Chunk(*(x[n] for x in xs), r=r, r_solve=r_solve, clip=clip)
            grads[n], dS = ch.backward(*states[n], dOs[n], dS, scale)
    per_token = [_unchunk(np.stack([gr[i] for gr in grads]), T) for i in range(6)]
    return (_unchunk(np.stack(outs), T), S), Grads(*per_token, dS)
