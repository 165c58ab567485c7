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

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ._ops import F32, as_f32, col_to_row, dot, dot_nt, dot_tn, iota, row_to_col, tri_masks
from .config import TileConfig, vmem_limit_bytes
from .scan import chunk_forward, chunk_scratch, load_chunk
from .score import gdiff, scores_backward


def _backward_kernel(cfg: TileConfig, scale: float, n_chunks: int,
                     q_ref, k_ref, g_ref, gl_ref, b_ref, v_ref, w_ref, st_ref, do_ref, dfin_ref,
                     dq_ref, dk_ref, dg_ref, db_ref, dv_ref, dw_ref, dh0_ref,
                     ds_scr, q32, k32, bk32, mq, mbk, t_scr, a_scr,
                     wq, wt, wqt, wtt, dq_side, dbk_side, dk_side):
    c = pl.program_id(1)
    C, Kp = q_ref.shape

    @pl.when(c == 0)
    def _():
        ds_scr[...] = dfin_ref[...]

    q, k, bk = load_chunk(q_ref, k_ref, b_ref, q32, k32, bk32)
    aqk, A = chunk_forward(cfg, g_ref, gl_ref, q32, k32, bk32, mq, mbk, t_scr, a_scr)
    masks = tri_masks(C)

    G, Gl = g_ref[...], gl_ref[...]
    gamma = jnp.exp(G + Gl)
    gC, gCl = G[C - 1:C, :], Gl[C - 1:C, :]
    egc = jnp.exp(gC + gCl)
    S0 = st_ref[...]
    dS = ds_scr[...]
    v = v_ref[...].astype(F32)
    w = w_ref[...].astype(F32)
    ebar = gamma * bk
    qg = gamma * q
    decay_to_end = jnp.exp(gdiff(gC, gCl, G, Gl))
    kd = k * decay_to_end
    w0 = w * v - dot(ebar, S0)
    R = dot(A, w0)
    do = do_ref[...].astype(F32)

    dR = scale * dot_tn(aqk, do) + dot(kd, dS)
    dkd = dot_nt(R, dS)
    dqg = scale * dot_nt(do, S0)
    dW0 = dot_tn(A, dR)
    dT = -dot_tn(A, dot_nt(dot_nt(dR, w0), A))
    dTt = -dot(A, dot(dot_nt(w0, dR), A))
    debar = -dot_nt(dW0, S0)
    dS0 = scale * dot_tn(qg, do) + row_to_col(egc) * dS - dot_tn(ebar, dW0)

    # Score cotangents. The diagonal of dAqk (exp(G_r - G_r) = 1) is kept apart: it contributes to
    # dq and dk but not to dG, where its two halves would cancel only to rounding.
    wq[...] = jnp.where(masks["strict_lower"], scale * dot_nt(do, R), 0.0)
    wqt[...] = jnp.where(masks["strict_upper"], scale * dot_nt(R, do), 0.0)
    wt[...] = jnp.where(masks["strict_lower"], dT, 0.0)
    wtt[...] = jnp.where(masks["strict_upper"], dTt, 0.0)
    wdiag = scale * jnp.sum(do * R, axis=1, keepdims=True)  # [C, 1]
    scores_backward(cfg, g_ref, gl_ref, q32, k32, bk32, wq, wt, wqt, wtt, dq_side, dbk_side, dk_side)
    dq_s, dbk_s, dk_s = dq_side[...], dbk_side[...], dk_side[...]

    b = b_ref[...].astype(F32)
    dbk = gamma * debar + dbk_s
    dq_ref[...] = gamma * dqg + dq_s + wdiag * k
    db_ref[...] = k * dbk
    dk_ref[...] = b * dbk + decay_to_end * dkd + dk_s + wdiag * q
    dv_ref[...] = dW0 * w
    dw_ref[...] = dW0 * v
    # dg_i = sum_{r >= i} dG_r (G_r = sum_{j <= r} g_j) for the terms attached to G_r; the terms of
    # Kd = k exp(G_C - G_r) telescope to an exclusive prefix sum, and those of exp(G_C) reach every i.
    dG = qg * dqg + ebar * debar + q * dq_s + bk * dbk_s - k * dk_s
    ri, ci = iota((C, C), 0), iota((C, C), 1)
    dg = dot(as_f32(ci >= ri), dG) + dot(as_f32(ci < ri), kd * dkd)
    dg = dg + egc * col_to_row(jnp.sum(S0 * dS, axis=1, keepdims=True))
    dg_ref[...] = dg
    ds_scr[...] = dS0

    @pl.when(c == n_chunks - 1)
    def _():
        dh0_ref[...] = dS0


def backward_call(cfg: TileConfig, scale: float, BH: int, n_chunks: int, Kp: int, Vp: int,
                  in_dtype, interpret):
    """The backward ``pallas_call``:
    ``(q, k, G, Gl, b, v, w, states, do, dfinal) -> (dq, dk, dg, db, dv, dw, dh0)`` (all float32)."""
    C = cfg.chunk
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
        name=f"gdn2_bwd_{cfg.method}_c{cfg.chunk}",
    )
