"""Score tiles of a chunk, forward and backward: pairwise decay vs the boundary factorization.

For a chunk with in-chunk cumulative log-decay ``G [C, K]`` the kernels need

    Mq [r, s] = sum_c q [r, c] k[s, c] exp(G[r, c] - G[s, c])      (Aqk = lower_incl(Mq))
    Mbk[r, s] = sum_c bk[r, c] k[s, c] exp(G[r, c] - G[s, c])      (T   = strict_lower(Mbk))

and, in the backward, the two contractions of a cotangent ``W [C, C]`` against that decay:

    rowop(W, X)[r, c] = sum_s W[r, s] X[s, c] exp(G[r, c] - G[s, c])
    colop(W, X)[s, c] = sum_r W[r, s] X[r, c] exp(G[r, c] - G[s, c])

**Pairwise** (``method="pairwise"``): a loop over query rows ``r``; each step materialises the
``[C, K]`` slab ``exp(min(G_r - G_s, 0))`` for every key ``s`` -- one ``exp`` per pair per channel,
``C*C*K`` per chunk -- and reduces it over channels on the MXU.

**Factorized**: each level of the split tree (``TileConfig.levels``) contributes its cross tiles
``rows [m, hi) x cols [lo, m)`` as one ``C x K x C`` MXU product of rows scaled by
``F = exp(-|G - G_anchor|)`` (``exp(G_r - G_m)`` for later rows, ``exp(G_m - G_s)`` for earlier ones,
both ``<= 1``; one ``exp`` per token per channel per level). Only the ``leaf x leaf`` diagonal tiles
use the pairwise row loop, restricted to the leaf window (``C*leaf*K`` exps), and are moved to their
lanes by a one-hot placement product.

``G`` is carried as an unevaluated float32 sum ``hi + lo`` (a compensated in-chunk cumulative sum):
every exponent is formed as ``(hi_r - hi_s) + (lo_r - lo_s)``. After a reset (``g ~ -1e3``) the
cumulative sums are large while the differences that matter are small; ``hi_r - hi_s`` is then exact
(Sterbenz) and ``lo`` restores the bits a single float32 cumulative sum loses.

All functions run inside a Pallas kernel body and work on float32 VMEM refs of one chunk.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ._ops import F32, dot, dot_nt, iota, placement, placement_t
from .config import TileConfig


def window(cfg: TileConfig) -> int:
    """Width of the pairwise window: the whole chunk (pairwise) or one leaf (factorized)."""
    return cfg.chunk_size if cfg.method == "pairwise" else cfg.leaf


def gdiff(hi_a, lo_a, hi_b, lo_b):
    """``G_a - G_b`` from the two-float parts."""
    return (hi_a - hi_b) + (lo_a - lo_b)


def level_factors(G, Gl, level):
    """For one tree level: ``F = exp(-|G - G_anchor|)`` [C, K], later/earlier row masks, cross masks."""
    C, K = G.shape
    rows = iota((C, K), 0)
    ri, ci = iota((C, C), 0), iota((C, C), 1)
    ganc = G
    ganc_l = Gl
    later = jnp.zeros((C, K), jnp.bool_)
    earlier = jnp.zeros((C, K), jnp.bool_)
    cross = jnp.zeros((C, C), jnp.bool_)
    cross_t = jnp.zeros((C, C), jnp.bool_)
    for lo, m, hi in level:
        inblk = (rows >= lo) & (rows < hi)
        ganc = jnp.where(inblk, jnp.broadcast_to(G[m - 1:m, :], (C, K)), ganc)
        ganc_l = jnp.where(inblk, jnp.broadcast_to(Gl[m - 1:m, :], (C, K)), ganc_l)
        later = later | ((rows >= m) & (rows < hi))
        earlier = earlier | ((rows >= lo) & (rows < m))
        cross = cross | ((ri >= m) & (ri < hi) & (ci >= lo) & (ci < m))
        cross_t = cross_t | ((ci >= m) & (ci < hi) & (ri >= lo) & (ri < m))
    F = jnp.exp(-jnp.abs(gdiff(G, Gl, ganc, ganc_l)))
    return F, later, earlier, cross, cross_t


PAIRWISE_UNROLL = 4


def for_rows(C, n, fn):
    """Call ``fn(r, lo)`` for every row ``r`` of the chunk, ``lo`` the start of its ``n``-window.

    With ``n < C`` the loop runs over the position ``j`` inside a window and, unrolled, over the
    ``C // n`` windows: the rows of one step are independent (different windows), so their small
    MXU products can overlap, and ``lo`` is static. With ``n == C`` (pairwise) it is a plain loop
    over rows, unrolled by ``PAIRWISE_UNROLL``.
    """
    if n == C:
        def body(r, carry):
            fn(r, 0)
            return carry

        jax.lax.fori_loop(0, C, body, 0, unroll=PAIRWISE_UNROLL)
        return

    def body(j, carry):
        for blk in range(C // n):
            fn(blk * n + j, blk * n)
        return carry

    jax.lax.fori_loop(0, n, body, 0)


def decay_window(g_ref, gl_ref, r, lo, n):
    """``exp(min(G_r - G_s, 0))`` for the ``n`` keys ``s`` of the window starting at ``lo``: [n, K]."""
    d = gdiff(g_ref[pl.ds(r, 1), :], gl_ref[pl.ds(r, 1), :], g_ref[pl.ds(lo, n), :], gl_ref[pl.ds(lo, n), :])
    return jnp.exp(jnp.minimum(d, 0.0))


def scores_forward(cfg: TileConfig, g_ref, gl_ref, q_ref, k_ref, bk_ref, mq_ref, mbk_ref):
    """Fill ``mq_ref``/``mbk_ref`` [C, C] with the full (unmasked below the diagonal) score tiles."""
    C = cfg.chunk_size
    n = window(cfg)
    if cfg.method == "factorized":
        G, Gl = g_ref[...], gl_ref[...]
        q, k, bk = q_ref[...], k_ref[...], bk_ref[...]
        mq = jnp.zeros((C, C), F32)
        mbk = jnp.zeros((C, C), F32)
        for level in cfg.levels():
            F, later, earlier, cross, _ = level_factors(G, Gl, level)
            ks = jnp.where(earlier, k * F, 0.0)
            mq = mq + jnp.where(cross, dot_nt(jnp.where(later, q * F, 0.0), ks), 0.0)
            mbk = mbk + jnp.where(cross, dot_nt(jnp.where(later, bk * F, 0.0), ks), 0.0)
        mq_ref[...] = mq
        mbk_ref[...] = mbk

    def row(r, lo):
        ke = k_ref[pl.ds(lo, n), :] * decay_window(g_ref, gl_ref, r, lo, n)
        mq_r = dot_nt(q_ref[pl.ds(r, 1), :], ke)
        mb_r = dot_nt(bk_ref[pl.ds(r, 1), :], ke)
        if n == C:
            mq_ref[pl.ds(r, 1), :] = mq_r
            mbk_ref[pl.ds(r, 1), :] = mb_r
        else:
            P = placement(lo, n, C)
            mq_ref[pl.ds(r, 1), :] += dot(mq_r, P)
            mbk_ref[pl.ds(r, 1), :] += dot(mb_r, P)

    for_rows(C, n, row)


def scores_backward(cfg: TileConfig, g_ref, gl_ref, q_ref, k_ref, bk_ref, wq_ref, wt_ref, wqt_ref, wtt_ref,
                    dq_ref, dbk_ref, dk_ref):
    """Score-path cotangents: ``dq_ref = rowop(Wq, k)``, ``dbk_ref = rowop(Wt, k)``,
    ``dk_ref = colop(Wq, q) + colop(Wt, bk)`` where ``Wq = dMq``, ``Wt = dMbk`` (already masked)
    and ``wqt_ref``/``wtt_ref`` hold their transposes."""
    C, K = q_ref.shape
    n = window(cfg)
    if cfg.method == "factorized":
        G, Gl = g_ref[...], gl_ref[...]
        q, k, bk = q_ref[...], k_ref[...], bk_ref[...]
        wq, wt, wqt, wtt = wq_ref[...], wt_ref[...], wqt_ref[...], wtt_ref[...]
        dq = jnp.zeros((C, K), F32)
        dbk = jnp.zeros((C, K), F32)
        dk = jnp.zeros((C, K), F32)
        for level in cfg.levels():
            F, later, earlier, cross, cross_t = level_factors(G, Gl, level)
            ks = jnp.where(earlier, k * F, 0.0)
            dq = dq + jnp.where(later, dot(jnp.where(cross, wq, 0.0), ks) * F, 0.0)
            dbk = dbk + jnp.where(later, dot(jnp.where(cross, wt, 0.0), ks) * F, 0.0)
            qs = jnp.where(later, q * F, 0.0)
            bs = jnp.where(later, bk * F, 0.0)
            part = dot(jnp.where(cross_t, wqt, 0.0), qs) + dot(jnp.where(cross_t, wtt, 0.0), bs)
            dk = dk + jnp.where(earlier, part * F, 0.0)
        dq_ref[...] = dq
        dbk_ref[...] = dbk
        dk_ref[...] = dk
    else:
        dq_ref[...] = jnp.zeros((C, K), F32)
        dbk_ref[...] = jnp.zeros((C, K), F32)
        dk_ref[...] = jnp.zeros((C, K), F32)

    def row(r, lo):
        e = decay_window(g_ref, gl_ref, r, lo, n)  # [n, K]: exp(G_r - G_s), s in window
        ke = k_ref[pl.ds(lo, n), :] * e
        wq_r = wq_ref[pl.ds(r, 1), :]
        wt_r = wt_ref[pl.ds(r, 1), :]
        if n != C:
            Pt = placement_t(lo, n, C)
            wq_r = dot(wq_r, Pt)
            wt_r = dot(wt_r, Pt)
        dq_ref[pl.ds(r, 1), :] += dot(wq_r, ke)
        dbk_ref[pl.ds(r, 1), :] += dot(wt_r, ke)
        # Column r of W over the window rows s, read from the transposes with a lane mask.
        lane_r = iota((n, C), 1) == r
        cq = jnp.sum(jnp.where(lane_r, wqt_ref[pl.ds(lo, n), :], 0.0), axis=1, keepdims=True)
        ct = jnp.sum(jnp.where(lane_r, wtt_ref[pl.ds(lo, n), :], 0.0), axis=1, keepdims=True)
        contrib = (cq * q_ref[pl.ds(r, 1), :] + ct * bk_ref[pl.ds(r, 1), :]) * e
        dk_ref[pl.ds(lo, n), :] += contrib

    for_rows(C, n, row)
