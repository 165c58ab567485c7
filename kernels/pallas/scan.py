"""Forward kernel: per chunk, score tiles + WY solve + recompute-and-scan of the inter-chunk state.

Grid ``(B*H, n_chunks)``: the first axis is independent ("parallel", split across TensorCores on
megacore chips); the chunk axis is sequential ("arbitrary") and carries the state ``S`` [K, V] in a
float32 VMEM scratch. Per chunk (docs/DESIGN.md §1, chunkwise form)::

    T, Aqk = strict_lower(Mbk), lower_incl(Mq)           (score.py)
    A      = (I + T)^{-1}                                 (wy.py)
    R      = A (Z - Ebar S0)           = U - Y S0
    O      = scale * ((gamma * q) S0 + Aqk R)
    S_C    = Diag(exp(G_C)) S0 + (k * exp(G_C - G))^T R

The state entering each chunk is written out (``states [B*H, n_chunks, K, V]``): it is the only
residual the backward keeps; everything else is recomputed there.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ._ops import F32, dot, dot_tn, row_to_col, tri_masks
from .config import TileConfig, vmem_limit_bytes
from .score import gdiff, scores_forward
from .wy import wy_inverse


def load_chunk(q_ref, k_ref, b_ref, q32, k32, bk32):
    """Upcast the chunk's q, k and b*k into float32 scratch (the score pass reads them from there)."""
    q = q_ref[...].astype(F32)
    k = k_ref[...].astype(F32)
    bk = b_ref[...].astype(F32) * k
    q32[...] = q
    k32[...] = k
    bk32[...] = bk
    return q, k, bk


def chunk_forward(cfg, g_ref, gl_ref, q32, k32, bk32, mq, mbk):
    """Score tiles and WY inverse of the chunk in the refs: returns ``(Aqk, A)`` as values."""
    scores_forward(cfg, g_ref, gl_ref, q32, k32, bk32, mq, mbk)
    masks = tri_masks(cfg.chunk_size)
    aqk = jnp.where(masks["lower"], mq[...], 0.0)
    T = jnp.where(masks["strict_lower"], mbk[...], 0.0)
    A = wy_inverse(cfg, T)
    return aqk, A


def _forward_kernel(cfg: TileConfig, scale: float, n_chunks: int,
                    q_ref, k_ref, g_ref, gl_ref, b_ref, v_ref, w_ref, h0_ref,
                    o_ref, st_ref, fin_ref,
                    s_scr, q32, k32, bk32, mq, mbk):
    c = pl.program_id(1)
    C = cfg.chunk_size

    @pl.when(c == 0)
    def _():
        s_scr[...] = h0_ref[...]

    q, k, bk = load_chunk(q_ref, k_ref, b_ref, q32, k32, bk32)
    aqk, A = chunk_forward(cfg, g_ref, gl_ref, q32, k32, bk32, mq, mbk)

    G, Gl = g_ref[...], gl_ref[...]
    gamma = jnp.exp(G + Gl)
    gC, gCl = G[C - 1:C, :], Gl[C - 1:C, :]
    S0 = s_scr[...]
    z = w_ref[...].astype(F32) * v_ref[...].astype(F32)
    R = dot(A, z - dot(gamma * bk, S0))
    o = scale * (dot(gamma * q, S0) + dot(aqk, R))
    o_ref[...] = o.astype(o_ref.dtype)
    st_ref[...] = S0
    kd = k * jnp.exp(gdiff(gC, gCl, G, Gl))
    S1 = row_to_col(jnp.exp(gC + gCl)) * S0 + dot_tn(kd, R)
    s_scr[...] = S1

    @pl.when(c == n_chunks - 1)
    def _():
        fin_ref[...] = S1


def chunk_scratch(cfg, Kp, Vp):
    C = cfg.chunk_size
    return [
        pltpu.VMEM((Kp, Vp), F32),  # state carry
        pltpu.VMEM((C, Kp), F32),  # q
        pltpu.VMEM((C, Kp), F32),  # k
        pltpu.VMEM((C, Kp), F32),  # b * k
        pltpu.VMEM((C, C), F32),  # Mq
        pltpu.VMEM((C, C), F32),  # Mbk
    ]


def forward_call(cfg: TileConfig, scale: float, BH: int, n_chunks: int, Kp: int, Vp: int,
                 in_dtype, out_dtype, interpret):
    """The forward ``pallas_call``: ``(q, k, G, Gl, b, v, w, h0) -> (o, states, final_state)``.

    Layout: ``q, k, G, Gl, b: [BH, n_chunks*C, Kp]``, ``v, w: [BH, n_chunks*C, Vp]``,
    ``h0: [BH, Kp, Vp]``; ``G + Gl`` is the in-chunk cumulative log-decay as a two-float sum.
    """
    C = cfg.chunk_size
    Tp = n_chunks * C
    kspec = pl.BlockSpec((None, C, Kp), lambda i, c: (i, c, 0))
    vspec = pl.BlockSpec((None, C, Vp), lambda i, c: (i, c, 0))
    sspec = pl.BlockSpec((None, Kp, Vp), lambda i, c: (i, 0, 0))
    stspec = pl.BlockSpec((None, None, Kp, Vp), lambda i, c: (i, c, 0, 0))
    itemsize = jnp.dtype(in_dtype).itemsize
    return pl.pallas_call(
        functools.partial(_forward_kernel, cfg, float(scale), n_chunks),
        out_shape=(
            jax.ShapeDtypeStruct((BH, Tp, Vp), out_dtype),
            jax.ShapeDtypeStruct((BH, n_chunks, Kp, Vp), F32),
            jax.ShapeDtypeStruct((BH, Kp, Vp), F32),
        ),
        grid=(BH, n_chunks),
        in_specs=[kspec, kspec, kspec, kspec, kspec, vspec, vspec, sspec],
        out_specs=(vspec, stspec, sspec),
        scratch_shapes=chunk_scratch(cfg, Kp, Vp),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"),
            vmem_limit_bytes=vmem_limit_bytes(cfg, Kp, Vp, itemsize)),
        interpret=interpret,
        name=f"gdn2_fwd_{cfg.method}_c{cfg.chunk_size}",
    )
