"""Score tiles S_rs = sum_c X_rc Y_sc exp(G_rc - G_sc) (r >= s) and their VJPs: the only place the two kernels differ.

Shapes: X ``[..., P, n, K]`` (P stacked query-side operands, e.g. ``b*k`` for T and ``q`` for Aqk),
Y ``[..., n, K]`` (the key side, shared), G ``[..., n, K]`` (within-chunk cumulative log-decay),
scores ``[..., P, n, n]`` lower-including-diagonal (callers mask T to strictly lower).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp

from .contract import MATMUL_PRECISION
from .wy import diagonal_blocks


def _mm(spec, a, b):
    """einsum at HIGHEST precision (every matmul of the kernels goes through here or wy.py)."""
    return jnp.einsum(spec, a, b, precision=MATMUL_PRECISION)


def pair_decay(G):
    """exp(G_r - G_s) for every pair r >= s and channel, zero above the diagonal: ``[..., n, n, K]``."""
    n = G.shape[-2]
    lower = jnp.tril(jnp.ones((n, n), bool))[:, :, None]
    diff = G[..., :, None, :] - G[..., None, :, :]
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
        Gm = G[..., s - 1 : s, :]
        Xl = X[..., s:, :] * jnp.exp(G[..., s:, :] - Gm)[..., None, :, :]
        Ye = Y[..., :s, :] * jnp.exp(Gm - G[..., :s, :])
        cross = _mm("...prc,...sc->...prs", Xl, Ye)
        early = self.scores(X[..., :s, :], Y[..., :s, :], G[..., :s, :], top=False)
        late = self.scores(X[..., s:, :], Y[..., s:, :], G[..., s:, :], top=False)
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
        Gm = G[..., s - 1 : s, :]
        fl = jnp.exp(G[..., s:, :] - Gm)
        fe = jnp.exp(Gm - G[..., :s, :])
        dC = dS[..., s:, :s]
        dXl = _mm("...prs,...sc->...prc", dC, Y[..., :s, :] * fe) * fl[..., None, :, :]
        dYe = _mm("...prs,...prc->...sc", dC, X[..., s:, :] * fl[..., None, :, :]) * fe
        dXe, dYe2 = self.scores_vjp(dS[..., :s, :s], X[..., :s, :], Y[..., :s, :], G[..., :s, :], top=False)
        dXl2, dYl = self.scores_vjp(dS[..., s:, s:], X[..., s:, :], Y[..., s:, :], G[..., s:, :], top=False)
        return (jnp.concatenate([dXe, dXl + dXl2], axis=-2), jnp.concatenate([dYe + dYe2, dYl], axis=-2))


def _blocks(Z, m):
    """``[..., n, K]`` -> ``[..., n/m, 2, m/2, K]``: pairs of (earlier, later) half-blocks of size m/2."""
    return Z.reshape(Z.shape[:-2] + (Z.shape[-2] // m, 2, m // 2, Z.shape[-1]))


def _level_factors(G, m):
    """Boundary factors of every size-m block: exp(G_r - G_m) for the later half, exp(G_m - G_s) for the earlier."""
    Gb = _blocks(G, m)
    Gm = Gb[..., 0, -1:, :]
    return jnp.exp(Gb[..., 1, :, :] - Gm), jnp.exp(Gm - Gb[..., 0, :, :])


def _leaves(fn, X, Y, G, leaf, dS=None):
    """Apply a pairwise function to every diagonal leaf block at once (leaf axis moved before P)."""
    n, K = X.shape[-2:]
    split = lambda Z: Z.reshape(Z.shape[:-2] + (n // leaf, leaf, K))
    Xb = jnp.swapaxes(split(X), -4, -3)
    if dS is None:
        return jnp.swapaxes(fn(Xb, split(Y), split(G)), -4, -3)
    dX, dY = fn(jnp.swapaxes(dS, -4, -3), Xb, split(Y), split(G))
    return jnp.swapaxes(dX, -4, -3), dY


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
    dX, dY = _leaves(pairwise_scores_vjp, X, Y, G, leaf, dS=diagonal_blocks(dS, leaf))
    dX, dY = dX.reshape(X.shape), dY.reshape(Y.shape)
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
