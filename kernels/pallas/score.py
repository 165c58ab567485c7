"""Score tiles of a chunk, forward and backward: pairwise decay vs the boundary factorization.

For a chunk with in-chunk cumulative log-decay ``G [C, K]`` the kernels need

    Mq [r, s] = sum_c q [r, c] k[s, c] exp(G[r, c] - G[s, c])      (Aqk = lower_incl(Mq))
    Mbk[r, s] = sum_c bk[r, c] k[s, c] exp(G[r, c] - G[s, c])      (T   = strict_lower(Mbk))

and, in the backward, the two contractions of a cotangent ``W [C, C]`` against that decay:

    rowop(W, X)[r, c] = sum_s W[r, s] X[s, c] exp(G[r, c] - G[s, c])
    colop(W, X)[s, c] = sum_r W[r, s] X[r, c] exp(G[r, c] - G[s, c])

**Pairwise** (``method="pairwise"``): whole-tile vector work, no row loop. Rows are taken in
independent slabs of ``R`` rows (``R x C x K`` float32 within ``config.SLAB_BYTES``); each slab materialises
``exp(min(G_r - G_s, 0))`` [R, C, K] for every key ``s`` -- one ``exp`` per pair per channel, ``C*C*K``
per chunk -- and reduces it over channels (forward, ``rowop``) or over rows (``colop``).

**Factorized**: each level of the split tree (``TileConfig.levels``) contributes its cross tiles
``rows [m, hi) x cols [lo, m)`` as one ``C x K x C`` MXU product of rows scaled by
``F = exp(-|G - G_anchor|)`` (``exp(G_r - G_m)`` for later rows, ``exp(G_m - G_s)`` for earlier ones,
both ``<= 1``; one ``exp`` per token per channel per level). Only the ``leaf x leaf`` diagonal tiles
are pairwise, one ``[leaf, leaf, K]`` slab each (``C*leaf*K`` exps), moved to their lanes by a
one-hot placement product.

``G`` is carried as an unevaluated float32 sum ``hi + lo`` (a compensated in-chunk cumulative sum):
every exponent is formed as ``(hi_r - hi_s) + (lo_r - lo_s)``. After a reset (``g ~ -1e3``) the
cumulative sums are large while the differences that matter are small; ``hi_r - hi_s`` is then exact
(Sterbenz) and ``lo`` restores the bits a single float32 cumulative sum loses.

All functions run inside a Pallas kernel body and work on float32 VMEM refs of one chunk.
"""

from __future__ import annotations

import jax.numpy as jnp

from ._ops import F32, dot, dot_nt, iota, placement, placement_t
from .config import TileConfig, slab_rows


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


def pair_tiles(cfg: TileConfig, K: int):
    """The pairwise tiles as slabs ``(r0, R, s0, n)``: rows ``[r0, r0 + R)`` x keys ``[s0, s0 + n)``.

    Pairwise: the whole key range, rows in slabs of ``R`` with ``R * C * K`` float32 within
    ``config.SLAB_BYTES``; factorized: one slab per ``leaf x leaf`` diagonal tile. Slabs are independent.
    """
    C = cfg.chunk_size
    if cfg.method == "factorized":
        return [(lo, cfg.leaf, lo, cfg.leaf) for lo in range(0, C, cfg.leaf)]
    R = slab_rows(cfg, K)
    return [(r0, min(R, C - r0), 0, C) for r0 in range(0, C, R)]


def decay_slab(G, Gl, r0, R, s0, n):
    """``exp(min(G_r - G_s, 0))`` for rows ``[r0, r0 + R)`` x keys ``[s0, s0 + n)``: [R, n, K]."""
    d = gdiff(G[r0:r0 + R, None, :], Gl[r0:r0 + R, None, :], G[None, s0:s0 + n, :], Gl[None, s0:s0 + n, :])
    return jnp.exp(jnp.minimum(d, 0.0))


def scores_forward(cfg: TileConfig, g_ref, gl_ref, q_ref, k_ref, bk_ref, mq_ref, mbk_ref):
    """Fill ``mq_ref``/``mbk_ref`` [C, C] with the full (unmasked below the diagonal) score tiles."""
    C = cfg.chunk_size
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

    G, Gl = g_ref[...], gl_ref[...]
    q, k, bk = q_ref[...], k_ref[...], bk_ref[...]
    for r0, R, s0, n in pair_tiles(cfg, k.shape[1]):
        ke = k[None, s0:s0 + n, :] * decay_slab(G, Gl, r0, R, s0, n)  # [R, n, K]
        mq_t = jnp.sum(q[r0:r0 + R, None, :] * ke, axis=2)  # [R, n]
        mb_t = jnp.sum(bk[r0:r0 + R, None, :] * ke, axis=2)
        if n == C:
            mq_ref[r0:r0 + R, :] = mq_t
            mbk_ref[r0:r0 + R, :] = mb_t
        else:
            P = placement(s0, n, C)
            mq_ref[r0:r0 + R, :] += dot(mq_t, P)
            mbk_ref[r0:r0 + R, :] += dot(mb_t, P)


def scores_backward(cfg: TileConfig, g_ref, gl_ref, q_ref, k_ref, bk_ref, wq_ref, wt_ref, wqt_ref, wtt_ref,
                    dq_ref, dbk_ref, dk_ref):
    """Score-path cotangents: ``dq_ref = rowop(Wq, k)``, ``dbk_ref = rowop(Wt, k)``,
    ``dk_ref = colop(Wq, q) + colop(Wt, bk)`` where ``Wq = dMq``, ``Wt = dMbk`` (already masked)
    and ``wqt_ref``/``wtt_ref`` hold their transposes."""
    C, K = q_ref.shape
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

    G, Gl = g_ref[...], gl_ref[...]
    q, k, bk = q_ref[...], k_ref[...], bk_ref[...]
    for r0, R, s0, n in pair_tiles(cfg, K):
        e = decay_slab(G, Gl, r0, R, s0, n)  # [R, n, K]: exp(G_r - G_s)
        wq_w, wt_w = wq_ref[r0:r0 + R, :], wt_ref[r0:r0 + R, :]
        if n != C:
            Pt = placement_t(s0, n, C)
            wq_w, wt_w = dot(wq_w, Pt), dot(wt_w, Pt)  # [R, n]: lanes [s0, s0 + n)
        wq3, wt3 = wq_w[:, :, None], wt_w[:, :, None]
        ke = k[None, s0:s0 + n, :] * e
        dq_ref[r0:r0 + R, :] += jnp.sum(wq3 * ke, axis=1)
        dbk_ref[r0:r0 + R, :] += jnp.sum(wt3 * ke, axis=1)
        dk_ref[s0:s0 + n, :] += jnp.sum((wq3 * q[r0:r0 + R, None, :] + wt3 * bk[r0:r0 + R, None, :]) * e, axis=0)
