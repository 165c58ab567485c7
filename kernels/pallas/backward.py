"""Backward kernel: reverse scan over chunks, recomputing each chunk from its saved entering state.

Grid ``(B*H, n_chunks)`` with the chunk axis walked backwards (index maps ``c -> n_chunks-1-c``);
the state cotangent ``dS`` [K, V] is carried in a float32 VMEM scratch. Per chunk, from ``S0`` (the
saved entering state) the kernel recomputes scores, ``A``, ``W0 = Z - Ebar S0`` and ``R = A W0``,
then applies the adjoint of the chunkwise form::

    dR    = scale Aqk^T dO + Kd dS            dKd  = R dS^T         dQg = scale dO S0^T
    dAqk  = lower_incl(scale dO R^T)          dW0  = A^T dR         dA  = dR W0^T
    dT    = -strict_lower(A^T dA A^T)         dEbar = -dW0 S0^T
    dS0   = scale Qg^T dO + Diag(exp(G_C)) dS - Ebar^T dW0

score-path cotangents through ``score.scores_backward`` (pairwise or factorized, like the forward),
and the gate terms turned into ``dg`` inside the kernel: the terms of ``G_r`` by a reverse cumulative
sum (a triangular matmul), the ``Kd`` terms as the exclusive prefix sum they telescope to, and the
diagonal of ``dAqk`` kept out of ``dg`` -- in exact arithmetic these are the same numbers as the
textbook "collect dG, then reverse cumsum", but they avoid cancellations that leave float32 residue
of order eps * O(1) where the true ``dg`` is tiny (extreme decay).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ._ops import F32, as_f32, col_to_row, dot, dot_nt, dot_tn, iota, row_to_col, tri_masks
from .config import TileConfig, vmem_limit_bytes
from .scan import chunk_forward, chunk_scratch, load_chunk
from .score import gdiff, scores_backward


class _Fwd(NamedTuple):
    """The chunk's forward quantities, recomputed from its saved entering state (float32 values)."""

    q: Any
    k: Any
    bk: Any  # b * k
    v: Any
    w: Any
    aqk: Any  # lower_incl(Mq)
    A: Any  # (I + T)^{-1}
    gamma: Any  # exp(G)
    egc: Any  # exp(G_C)                     [1, K]
    decay_to_end: Any  # exp(G_C - G)
    kd: Any  # k exp(G_C - G)
    ebar: Any  # gamma b k
    qg: Any  # gamma q
    S0: Any  # entering state                [K, V]
    w0: Any  # Z - Ebar S0
    R: Any  # A W0


def _recompute(cfg, q_ref, k_ref, g_ref, gl_ref, b_ref, v_ref, w_ref, st_ref, q32, k32, bk32, mq, mbk):
    """Forward recompute from S0: Aqk, A = (I + T)^{-1}, W0 = Z - Ebar S0, R = A W0 (as in scan.py)."""
    C = q_ref.shape[0]
    q, k, bk = load_chunk(q_ref, k_ref, b_ref, q32, k32, bk32)
    aqk, A = chunk_forward(cfg, g_ref, gl_ref, q32, k32, bk32, mq, mbk)
    G, Gl = g_ref[...], gl_ref[...]
    gamma = jnp.exp(G + Gl)
    gC, gCl = G[C - 1:C, :], Gl[C - 1:C, :]
    decay_to_end = jnp.exp(gdiff(gC, gCl, G, Gl))
    S0 = st_ref[...]
    v = v_ref[...].astype(F32)
    w = w_ref[...].astype(F32)
    ebar = gamma * bk
    w0 = w * v - dot(ebar, S0)
    return _Fwd(q, k, bk, v, w, aqk, A, gamma, jnp.exp(gC + gCl), decay_to_end, k * decay_to_end, ebar,
                gamma * q, S0, w0, dot(A, w0))


def _state_path(scale, f, do, dS):
    """Output and state paths: dR = scale Aqk^T dO + Kd dS, dKd = R dS^T, dQg = scale dO S0^T."""
    return scale * dot_tn(f.aqk, do) + dot(f.kd, dS), dot_nt(f.R, dS), scale * dot_nt(do, f.S0)


def _wy_path(f, dR):
    """WY path: dW0 = A^T dR, dT = -A^T dA A^T with dA = dR W0^T (and dT^T), dEbar = -dW0 S0^T."""
    dW0 = dot_tn(f.A, dR)
    dT = -dot_tn(f.A, dot_nt(dot_nt(dR, f.w0), f.A))
    dTt = -dot(f.A, dot(dot_nt(f.w0, dR), f.A))
    return dW0, dT, dTt, -dot_nt(dW0, f.S0)


def _score_path(cfg, scale, f, do, dT, dTt, g_ref, gl_ref, q32, k32, bk32, wq, wt, wqt, wtt,
                dq_side, dbk_side, dk_side):
    """Score path: dAqk = lower_incl(scale dO R^T), dT strict_lower, through the score tiles' decay factors.

    Returns ``(dq_s, dbk_s, dk_s, wdiag)``; the diagonal of dAqk (exp(G_r - G_r) = 1) is kept apart as
    ``wdiag`` [C, 1]: it contributes to dq and dk but not to dG, where its two halves would cancel only
    to rounding.
    """
    masks = tri_masks(f.q.shape[0])
    wq[...] = jnp.where(masks["strict_lower"], scale * dot_nt(do, f.R), 0.0)
    wqt[...] = jnp.where(masks["strict_upper"], scale * dot_nt(f.R, do), 0.0)
    wt[...] = jnp.where(masks["strict_lower"], dT, 0.0)
    wtt[...] = jnp.where(masks["strict_upper"], dTt, 0.0)
    wdiag = scale * jnp.sum(do * f.R, axis=1, keepdims=True)
    scores_backward(cfg, g_ref, gl_ref, q32, k32, bk32, wq, wt, wqt, wtt, dq_side, dbk_side, dk_side)
    return dq_side[...], dbk_side[...], dk_side[...], wdiag


def _gate_path(f, dqg, debar, dkd, dq_s, dbk_s, dk_s, dS):
    """dg_i = sum_{r >= i} dG_r + sum_{r < i} Kd_r dKd_r + exp(G_C) sum_v S0 dS (G_r = sum_{j <= r} g_j).

    The terms attached to G_r reach every g_i, i <= r (reverse cumulative sum as a triangular matmul); the
    terms of Kd = k exp(G_C - G_r) telescope to an exclusive prefix sum, and those of exp(G_C) reach every i.
    """
    C = f.q.shape[0]
    dG = f.qg * dqg + f.ebar * debar + f.q * dq_s + f.bk * dbk_s - f.k * dk_s
    ri, ci = iota((C, C), 0), iota((C, C), 1)
    dg = dot(as_f32(ci >= ri), dG) + dot(as_f32(ci < ri), f.kd * dkd)
    return dg + f.egc * col_to_row(jnp.sum(f.S0 * dS, axis=1, keepdims=True))


def _backward_kernel(cfg: TileConfig, scale: float, n_chunks: int,
                     q_ref, k_ref, g_ref, gl_ref, b_ref, v_ref, w_ref, st_ref, do_ref, dfin_ref,
                     dq_ref, dk_ref, dg_ref, db_ref, dv_ref, dw_ref, dh0_ref,
                     ds_scr, q32, k32, bk32, mq, mbk,
                     wq, wt, wqt, wtt, dq_side, dbk_side, dk_side):
    """One chunk of the reverse scan: recompute, then the state, WY, score and gate paths of the adjoint."""
    c = pl.program_id(1)

    @pl.when(c == 0)
    def _():
        ds_scr[...] = dfin_ref[...]

    f = _recompute(cfg, q_ref, k_ref, g_ref, gl_ref, b_ref, v_ref, w_ref, st_ref, q32, k32, bk32, mq, mbk)
    dS = ds_scr[...]
    do = do_ref[...].astype(F32)
    dR, dkd, dqg = _state_path(scale, f, do, dS)
    dW0, dT, dTt, debar = _wy_path(f, dR)
    # dS0 = scale Qg^T dO + Diag(exp(G_C)) dS - Ebar^T dW0
    dS0 = scale * dot_tn(f.qg, do) + row_to_col(f.egc) * dS - dot_tn(f.ebar, dW0)
    dq_s, dbk_s, dk_s, wdiag = _score_path(cfg, scale, f, do, dT, dTt, g_ref, gl_ref, q32, k32, bk32,
                                           wq, wt, wqt, wtt, dq_side, dbk_side, dk_side)

    b = b_ref[...].astype(F32)
    dbk = f.gamma * debar + dbk_s
    dq_ref[...] = f.gamma * dqg + dq_s + wdiag * f.k
    db_ref[...] = f.k * dbk
    dk_ref[...] = b * dbk + f.decay_to_end * dkd + dk_s + wdiag * f.q
    dv_ref[...] = dW0 * f.w
    dw_ref[...] = dW0 * f.v
    dg_ref[...] = _gate_path(f, dqg, debar, dkd, dq_s, dbk_s, dk_s, dS)
    ds_scr[...] = dS0

    @pl.when(c == n_chunks - 1)
    def _():
        dh0_ref[...] = dS0


def backward_call(cfg: TileConfig, scale: float, BH: int, n_chunks: int, Kp: int, Vp: int,
                  in_dtype, interpret):
    """The backward ``pallas_call``:
    ``(q, k, G, Gl, b, v, w, states, do, dfinal) -> (dq, dk, dg, db, dv, dw, dh0)`` (all float32)."""
    C = cfg.chunk_size
    Tp = n_chunks * C
    last = n_chunks - 1
    kspec = pl.BlockSpec((None, C, Kp), lambda i, c: (i, last - c, 0))
    vspec = pl.BlockSpec((None, C, Vp), lambda i, c: (i, last - c, 0))
    sspec = pl.BlockSpec((None, Kp, Vp), lambda i, c: (i, 0, 0))
    stspec = pl.BlockSpec((None, None, Kp, Vp), lambda i, c: (i, last - c, 0, 0))
    itemsize = jnp.dtype(in_dtype).itemsize
    scratch = chunk_scratch(cfg, Kp, Vp) + [
        pltpu.VMEM((C, C), F32),  # dMq (masked)
        pltpu.VMEM((C, C), F32),  # dMbk = dT (masked)
        pltpu.VMEM((C, C), F32),  # dMq^T
        pltpu.VMEM((C, C), F32),  # dT^T
        pltpu.VMEM((C, Kp), F32),  # rowop(dMq, k)
        pltpu.VMEM((C, Kp), F32),  # rowop(dT, k)
        pltpu.VMEM((C, Kp), F32),  # colop(dMq, q) + colop(dT, bk)
    ]
    kout = jax.ShapeDtypeStruct((BH, Tp, Kp), F32)
    vout = jax.ShapeDtypeStruct((BH, Tp, Vp), F32)
    return pl.pallas_call(
        functools.partial(_backward_kernel, cfg, float(scale), n_chunks),
        out_shape=(kout, kout, kout, kout, vout, vout, jax.ShapeDtypeStruct((BH, Kp, Vp), F32)),
        grid=(BH, n_chunks),
        in_specs=[kspec, kspec, kspec, kspec, kspec, vspec, vspec, stspec, vspec, sspec],
        out_specs=(kspec, kspec, kspec, kspec, vspec, vspec, sspec),
        scratch_shapes=scratch,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"),
            vmem_limit_bytes=vmem_limit_bytes(cfg, Kp, Vp, itemsize, backward=True)),
        interpret=interpret,
        name=f"gdn2_bwd_{cfg.method}_c{cfg.chunk_size}",
    )
