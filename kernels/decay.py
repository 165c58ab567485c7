"""Score tiles S_rs = sum_c X_rc Y_sc exp(G_rc - G_sc) (r >= s) and their VJPs: the only place the two kernels differ.

Shapes: X ``[..., P, n, K]`` (P stacked query-side operands, e.g. ``b*k`` for T and ``q`` for Aqk),
Y ``[..., n, K]`` (the key side, shared), G a :class:`LogDecay` of ``[..., n, K]`` arrays (the within-chunk
cumulative log-decay), scores ``[..., P, n, n]`` lower-including-diagonal (callers mask T to strictly lower).

A decay strategy has one interface: ``workspace(C, K)``, ``scores(X, Y, G)`` and ``scores_vjp(dS, X, Y, G)``
with G always a :class:`LogDecay`.

Every decay exponent is formed by :func:`gap` from the split cumulative sum of :func:`log_decay`, never as a
difference of two rounded float32 cumulative sums (which loses |G| eps32 in the exponent: 2e-4 relative
error in every factor at |G| ~ 4000, e.g. after a reset g ~ -1e3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .contract import MATMUL_PRECISION
from .wy import diagonal_blocks


def _mm(spec, a, b):
    """einsum at HIGHEST precision (every matmul of the kernels goes through here or wy.py)."""
    return jnp.einsum(spec, a, b, precision=MATMUL_PRECISION)


class LogDecay(NamedTuple):
    """Within-chunk cumulative log-decay ``G = hi + lo`` (per channel), both ``[..., n, K]`` float32.

    ``hi`` is the cumulative sum of ``g`` rounded to a grid ``q = 2^(e-22)`` with ``sum_chunk |g| < 2^e``:
    every partial sum is a multiple of ``q`` below ``2^24 q``, so ``hi`` and every difference ``hi_r - hi_s``
    are exact in float32 whatever the summation order. ``lo`` is the cumulative sum of the remainders
    ``|g - round_q(g)| <= q/2``; its rounding error is ~eps32 * C q, negligible.
    """

    hi: Any
    lo: Any

    def rows(self, start=None, stop=None):
        """Rows ``[start, stop)`` (token axis -2) of both parts."""
        return LogDecay(self.hi[..., start:stop, :], self.lo[..., start:stop, :])

    def map(self, fn):
        """``fn`` (a reshape, a slice) applied to both parts."""
        return LogDecay(fn(self.hi), fn(self.lo))

    def total(self):
        """G itself (rounded once): for exp(G), whose float32 condition number |G| is intrinsic."""
        return self.hi + self.lo


def _pow2(e):
    """2.0**e as float32 for integer ``e`` in the normal range, built from its exponent bits (exact)."""
    return jax.lax.bitcast_convert_type((e + 127).astype(jnp.int32) << 23, jnp.float32)


def log_decay(g):
    """Split cumulative sum of ``g [..., n, K]`` along the token axis: ``G_r = sum_{i<=r} g_i`` as a LogDecay."""
    total = jnp.sum(jnp.abs(g), axis=-2, keepdims=True)
    _, e = jnp.frexp(total)  # total < 2^e
    q = _pow2(jnp.clip(e, -100, 126) - 22)
    g_hi = jnp.round(g / q) * q
    return LogDecay(jnp.cumsum(g_hi, axis=-2), jnp.cumsum(g - g_hi, axis=-2))


def gap(Ga, Gb):
    """min(G_a - G_b, 0) without cancellation: the exact hi difference plus the small lo difference.

    Callers pass a later ``a`` and an earlier ``b`` (true value <= 0); the clamp keeps every factor <= 1.
    """
    return jnp.minimum((Ga.hi - Gb.hi) + (Ga.lo - Gb.lo), 0.0)


def pair_decay(G):
    """exp(G_r - G_s) for every pair r >= s and channel, zero above the diagonal: ``[..., n, n, K]``."""
    n = G.hi.shape[-2]
    lower = jnp.tril(jnp.ones((n, n), bool))[:, :, None]
    diff = gap(G.map(lambda x: x[..., :, None, :]), G.map(lambda x: x[..., None, :, :]))
    return jnp.exp(jnp.where(lower, diff, -jnp.inf))


def pairwise_scores(X, Y, G):
    """S_rs = sum_c X_rc Y_sc exp(G_rc - G_sc), r >= s, with the C x C x K decay tensor materialised."""
    return _mm("...prc,...rsc->...prs", X, pair_decay(G) * Y[..., None, :, :])


def pairwise_scores_vjp(dS, X, Y, G):
    """dX_rc = sum_s dS_rs Y_sc D_rsc, dY_sc = sum_{P,r} dS_rs X_rc D_rsc with D materialised."""
    D = pair_decay(G)
    dX = _mm("...prs,...rsc->...prc", dS, D * Y[..., None, :, :])
    dY = jnp.einsum("...prs,...prc,...rsc->...sc", dS, X, D, precision=MATMUL_PRECISION)
    return dX, dY


@dataclass(frozen=True)
class Pairwise:
    """Baseline: one exp(G_r - G_s) per pair per channel over the whole chunk."""

    def workspace(self, C, K):
        """Floats of decay factors one chunk's tiles materialise at once (C x C x K)."""
        return C * C * K

    def scores(self, X, Y, G):
        """Lower-including-diagonal score tile (pairwise decay)."""
        return pairwise_scores(X, Y, G)

    def scores_vjp(self, dS, X, Y, G):
        """(dX, dY) of the score tile (pairwise decay)."""
        return pairwise_scores_vjp(dS, X, Y, G)


@dataclass(frozen=True)
class Factorized:
    """Boundary factorization: cross-block tile = (X exp(G_r - G_m)) @ (Y exp(G_m - G_s))^T, m = boundary.

    ``split`` is the size of the earlier block at the top level (None: the middle); diagonal blocks are
    split again at their middle until they are at most ``leaf`` tokens, then done pairwise.
    """

    split: int | None = None
    leaf: int = 16

    def workspace(self, C, K):
        """Floats of decay factors one chunk's tiles materialise at once (pairwise leaves: ~C x leaf x K)."""
        return C * min(self.leaf, C) * K

    def _boundary(self, n, top):
        return self.split if (top and self.split is not None) else n // 2

    def _balanced(self, n, top):
        """True when the chunk splits at middles all the way down to equal leaves (levels can be batched)."""
        m = n // self.leaf if n % self.leaf == 0 else 0
        return m >= 1 and m & (m - 1) == 0 and (not top or self.split in (None, n // 2))

    def scores(self, X, Y, G, top=True):
        """Lower-including-diagonal score tile; cross blocks as one matmul of decay-scaled factors (each <= 1)."""
        n = X.shape[-2]
        if n <= self.leaf:
            return pairwise_scores(X, Y, G)
        if self._balanced(n, top):
            return _balanced_scores(X, Y, G, self.leaf)
        s = self._boundary(n, top)
        fl, fe = _boundary_factors(G, s)
        Xl = X[..., s:, :] * fl[..., None, :, :]
        Ye = Y[..., :s, :] * fe
        cross = _mm("...prc,...sc->...prs", Xl, Ye)
        early = self.scores(X[..., :s, :], Y[..., :s, :], G.rows(None, s), top=False)
        late = self.scores(X[..., s:, :], Y[..., s:, :], G.rows(s), top=False)
        upper = jnp.concatenate([early, jnp.zeros(early.shape[:-1] + (n - s,), early.dtype)], axis=-1)
        return jnp.concatenate([upper, jnp.concatenate([cross, late], axis=-1)], axis=-2)

    def scores_vjp(self, dS, X, Y, G, top=True):
        """(dX, dY) of the score tile through the same boundary factors as the forward."""
        n = X.shape[-2]
        if n <= self.leaf:
            return pairwise_scores_vjp(dS, X, Y, G)
        if self._balanced(n, top):
            return _balanced_scores_vjp(dS, X, Y, G, self.leaf)
        s = self._boundary(n, top)
        fl, fe = _boundary_factors(G, s)
        dC = dS[..., s:, :s]
        dXl = _mm("...prs,...sc->...prc", dC, Y[..., :s, :] * fe) * fl[..., None, :, :]
        dYe = _mm("...prs,...prc->...sc", dC, X[..., s:, :] * fl[..., None, :, :]) * fe
        dXe, dYe2 = self.scores_vjp(dS[..., :s, :s], X[..., :s, :], Y[..., :s, :], G.rows(None, s), top=False)
        dXl2, dYl = self.scores_vjp(dS[..., s:, s:], X[..., s:, :], Y[..., s:, :], G.rows(s), top=False)
        return (jnp.concatenate([dXe, dXl + dXl2], axis=-2), jnp.concatenate([dYe + dYe2, dYl], axis=-2))


def _boundary_factors(G, s):
    """Boundary factors at split ``s`` (m = s - 1): exp(G_r - G_m) for rows r >= s, exp(G_m - G_j) for j < s."""
    Gm = G.rows(s - 1, s)
    return jnp.exp(gap(G.rows(s), Gm)), jnp.exp(gap(Gm, G.rows(None, s)))


def _blocks(Z, m):
    """``[..., n, K]`` -> ``[..., n/m, 2, m/2, K]``: pairs of (earlier, later) half-blocks of size m/2."""
    return Z.reshape(Z.shape[:-2] + (Z.shape[-2] // m, 2, m // 2, Z.shape[-1]))


def _level_factors(G, m):
    """Boundary factors of every size-m block: exp(G_r - G_m) for the later half, exp(G_m - G_s) for the earlier."""
    Gb = G.map(lambda x: _blocks(x, m))
    early, late = Gb.map(lambda x: x[..., 0, :, :]), Gb.map(lambda x: x[..., 1, :, :])
    Gm = early.rows(-1)
    return jnp.exp(gap(late, Gm)), jnp.exp(gap(Gm, early))


def _leaves(fn, X, Y, G, leaf):
    """Apply a pairwise score function to every diagonal leaf block at once (leaf axis moved before P)."""
    n, K = X.shape[-2:]

    def split(Z):
        return Z.reshape(Z.shape[:-2] + (n // leaf, leaf, K))

    return jnp.swapaxes(fn(jnp.swapaxes(split(X), -4, -3), split(Y), G.map(split)), -4, -3)


def _leaf_vjp(dS, X, Y, G, leaf):
    """(dX, dY) of every diagonal leaf's pairwise tile, ``dS [..., P, n/leaf, leaf, leaf]`` its diagonal blocks.

    One key column s of every leaf at a time (unrolled over the leaf): the factors exp(G_r - G_s) of the
    column are formed as ``[..., n/leaf, leaf, K]`` (rows r < s get cotangent 0) and used at once for dX and
    dY_s, so neither a leaf x leaf x K decay tensor nor a 3-operand einsum's per-row tiny matmuls are made.
    """
    def blk(Z):
        return Z.reshape(Z.shape[:-2] + (Z.shape[-2] // leaf, leaf, Z.shape[-1]))

    Xb, Yb, Gb = blk(X), blk(Y), G.map(blk)
    dS = jnp.where(jnp.tril(jnp.ones((leaf, leaf), bool)), dS, 0.0)
    dX, dY = 0.0, []
    for s in range(leaf):
        E = jnp.exp(gap(Gb, Gb.rows(s, s + 1)))  # clamped to 1 for r < s (zero cotangent)
        d = dS[..., :, s, None]  # [..., P, n/leaf, leaf, 1]
        dX = dX + d * (E * Yb[..., s : s + 1, :])[..., None, :, :, :]
        dY.append(jnp.sum(d * Xb * E[..., None, :, :, :], axis=(-4, -2)))
    return dX.reshape(X.shape), jnp.stack(dY, axis=-2).reshape(Y.shape)


def _balanced_scores(X, Y, G, leaf):
    """Middle splits down to leaves, every level's cross tiles as one batched matmul."""
    n, K = X.shape[-2:]
    lead = X.shape[:-2]
    S = _leaves(pairwise_scores, X, Y, G, leaf)  # [..., P, n/leaf, leaf, leaf]
    m = 2 * leaf
    while m <= n:
        fl, fe = _level_factors(G, m)
        cross = _mm("...pbrc,...bsc->...pbrs", _blocks(X, m)[..., 1, :, :] * fl[..., None, :, :, :],
                    _blocks(Y, m)[..., 0, :, :] * fe)
        S = S.reshape(lead + (n // m, 2, m // 2, m // 2))
        upper = jnp.concatenate([S[..., 0, :, :], jnp.zeros_like(S[..., 0, :, :])], axis=-1)
        S = jnp.concatenate([upper, jnp.concatenate([cross, S[..., 1, :, :]], axis=-1)], axis=-2)
        m *= 2
    return S.reshape(lead + (n, n))


def _balanced_scores_vjp(dS, X, Y, G, leaf):
    """(dX, dY) of ``_balanced_scores``: per level, dX_l = (dC Ye) fl and dY_e = (dC^T Xl) fe, batched."""
    n, K = X.shape[-2:]
    dX, dY = _leaf_vjp(diagonal_blocks(dS, leaf), X, Y, G, leaf)
    m = 2 * leaf
    while m <= n:
        fl, fe = _level_factors(G, m)
        dC = diagonal_blocks(dS, m)[..., m // 2 :, : m // 2]
        Xl = _blocks(X, m)[..., 1, :, :] * fl[..., None, :, :, :]
        dXl = _mm("...pbrs,...bsc->...pbrc", dC, _blocks(Y, m)[..., 0, :, :] * fe) * fl[..., None, :, :, :]
        dYe = _mm("...pbrs,...pbrc->...bsc", dC, Xl) * fe
        dX = dX + jnp.concatenate([jnp.zeros_like(dXl), dXl], axis=-2).reshape(X.shape)
        dY = dY + jnp.concatenate([dYe, jnp.zeros_like(dYe)], axis=-2).reshape(Y.shape)
        m *= 2
    return dX, dY
