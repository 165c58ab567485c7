"""Chunked GDN-2 (docs/DESIGN.md §1, chunkwise form) with a hand-written chunkwise backward (custom_vjp).

Forward: state-independent chunk work (G, tiles T and Aqk, A = (I+T)^{-1}, Y = A Ebar, U = A Z) for all
chunks in parallel (at once, or in groups by lax.map), the state recurrence R = U - Y S0, S_C = ... by
lax.scan, then O = scale((gamma q) S0 + Aqk R) in parallel. Backward: reverse lax.scan carrying dS, then every chunk's
gradients in parallel. Saved between passes (``Saved``): each chunk's starting state S0 and the per-chunk
tiles and products the forward already made (A, Aqk, R, Y, Kd, gC, Qg: C x C or C x dim per chunk, less
than the K x V states), so the backward builds the score tiles only once (their VJP). Both passes are jitted
functions of the configuration and float32 chunk-major arrays, so JAX traces each once per shape: the float32 and
bfloat16 programs of one shape share them.
The decay strategy (kernels/decay.py) is the only difference between the pairwise and factorized kernels:
it builds the score tiles in the forward and their gradients in the backward. ``affine_core`` is the same
core with additive terms and the chunk states and R as outputs (packed sequences, intermediate states:
kernels/varlen.py, kernels/modes.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from . import wy
from .contract import ACC_DTYPE, MATMUL_PRECISION, floor_log_decay
from .decay import gap, log_decay

# Chunks are processed in parallel groups holding at most this many decay-factor floats at once.
WORKSPACE_FLOATS = 2**25


def _mm(spec, a, b):
    """einsum at HIGHEST precision."""
    return jnp.einsum(spec, a, b, precision=MATMUL_PRECISION)


@dataclass(frozen=True)
class Config:
    """Static configuration of one traced call."""

    chunk_size: int
    scale: float
    decay: Any  # Pairwise() or Factorized(split, leaf)


def _strict(C):
    """Strictly-lower mask r > s of a C x C tile."""
    return jnp.tril(jnp.ones((C, C), bool), -1)


class Local(NamedTuple):
    """State-independent quantities of one chunk (cheap elementwise ones; the score tiles are separate)."""

    G: Any  # within-chunk cumsum of g, G_r = sum_{i<=r} g_i, as a decay.LogDecay of [..., C, K]
    gamma: Any  # exp(G)
    a: Any  # b * k (erase-weighted key)
    Ebar: Any  # gamma * b * k
    Qg: Any  # gamma * q
    fC: Any  # exp(G_C - G) (suffix decay, formed by decay.gap: never a difference of rounded cumsums)
    Kd: Any  # exp(G_C - G) * k
    gC: Any  # exp(G_C)                                       [..., 1, K]


def _local(q, g, b, k):
    """G = cumsum(g), gamma = exp(G), Ebar = gamma b k, Qg = gamma q, Kd = exp(G_C - G) k."""
    G = log_decay(g)
    gamma = jnp.exp(G.total())
    GC = G.rows(-1)
    fC = jnp.exp(gap(GC, G))
    a = b * k
    return Local(G, gamma, a, gamma * a, gamma * q, fC, fC * k, jnp.exp(GC.total()))


def _tiles(decay, L, q, k):
    """T = strict_lower(sum_c a k exp(G_r - G_s)), Aqk = lower(sum_c q k exp(G_r - G_s)), A = (I + T)^{-1}."""
    scores = decay.scores(jnp.stack([L.a, q], axis=-3), k, L.G)
    T = jnp.where(_strict(q.shape[-2]), scores[..., 0, :, :], 0.0)
    return T, scores[..., 1, :, :], wy.inverse(T)


def _fwd_local(decay, x, dz=None):
    """Per chunk, in parallel: Y = A Ebar, U = A Z (Z = w v, plus ``dz`` if given), Kd, gC, Qg, Aqk, A."""
    q, k, v, g, b, w = x
    L = _local(q, g, b, k)
    _, Aqk, A = _tiles(decay, L, q, k)
    Z = w * v if dz is None else w * v + dz
    return _mm("...rs,...sk->...rk", A, L.Ebar), _mm("...rs,...sv->...rv", A, Z), L.Kd, L.gC, L.Qg, Aqk, A


def _state_step(S0, inp):
    """R = U - Y S0;  S_C = Diag(gamma_C) S0 + Kd^T R (+ Hc, a state added at the chunk end, if given)."""
    Y, U, Kd, gC, *hc = inp
    R = U - _mm("...ck,...kv->...cv", Y, S0)
    S1 = jnp.swapaxes(gC, -1, -2) * S0 + _mm("...ck,...cv->...kv", Kd, R)
    return (S1 + hc[0] if hc else S1), (S0, R)


def _dstate_step(dS1, inp):
    """dS0 = scale Qg^T dO + Diag(gamma_C) dS1 - Ebar^T A^T (scale Aqk^T dO + Kd dS1)  (c holds the dO terms)."""
    Y, Kd, gC, c = inp
    dS0 = c + jnp.swapaxes(gC, -1, -2) * dS1 - _mm("...ck,...cv->...kv", Y, _mm("...ck,...kv->...cv", Kd, dS1))
    return dS0, dS1


def _bwd_chunk(cfg, x, S0, dO, dS1, A, Aqk, R, dRo):
    """Chunkwise backward (paper App. B): output, state, WY-inverse, score paths; dg by reverse cumsum."""
    q, k, v, g, b, w = x
    L = _local(q, g, b, k)
    s = cfg.scale
    C = q.shape[-2]
    # output and state paths (dRo = scale Aqk^T dO)
    dR = dRo + _mm("...ck,...kv->...cv", L.Kd, dS1)
    dAqk = jnp.where(jnp.tril(jnp.ones((C, C), bool)), s * _mm("...rv,...sv->...rs", dO, R), 0.0)
    dQg = s * _mm("...cv,...kv->...ck", dO, S0)
    dKd = _mm("...cv,...kv->...ck", R, dS1)
    # WY-inverse path: R = A X, A = (I+T)^{-1}  =>  dX = A^T dR, dT = -strict_lower(A^T dA A^T) = -strict_lower(dX R^T)
    dX = _mm("...rs,...rv->...sv", A, dR)
    dT = jnp.where(_strict(C), -_mm("...rv,...sv->...rs", dX, R), 0.0)
    dEbar = -_mm("...cv,...kv->...ck", dX, S0)
    # score path (same decay-factor code as the forward tiles); Aqk's diagonal (no decay) is kept apart
    diag = jnp.diagonal(dAqk, axis1=-2, axis2=-1)[..., None]
    dAqk = jnp.where(_strict(C), dAqk, 0.0)
    dXs, dk_s = cfg.decay.scores_vjp(jnp.stack([dT, dAqk], axis=-3), jnp.stack([L.a, q], axis=-3), k, L.G)
    da = L.gamma * dEbar + dXs[..., 0, :, :]
    dq = L.gamma * dQg + dXs[..., 1, :, :] + diag * k
    dk = L.fC * dKd + dk_s + diag * q + da * b
    db = da * k
    # gate terms. G_r = sum_{i<=r} g_i, so a term depending on G_r reaches dg_i for i <= r (reverse cumsum):
    # gamma (Ebar, Qg) and the tiles' off-diagonal pairs (X dX - Y dY; pairs r > s cancel for i <= s).
    # Kd_r = exp(G_C - G_r) k_r reaches dg_i for i > r (exclusive cumsum) and gamma_C = exp(G_C) every i.
    # Keeping the undecayed diagonal and last-token terms out avoids cancelling O(1) terms when dg is tiny.
    dG = L.Ebar * dEbar + L.Qg * dQg + L.a * dXs[..., 0, :, :] + q * dXs[..., 1, :, :] - k * dk_s
    dg = jnp.flip(jnp.cumsum(jnp.flip(dG, -2), axis=-2), -2)
    KdK = jnp.cumsum(L.Kd * dKd, axis=-2)
    KdK = jnp.concatenate([jnp.zeros_like(KdK[..., :1, :]), KdK[..., :-1, :]], axis=-2)  # exclusive cumsum
    dg = dg + KdK + L.gC * jnp.sum(dS1 * S0, axis=-1)[..., None, :]
    return dq, dk, dX, dg, db


def _bwd_grads(cfg, with_dx, x, *rest):
    """The six input gradients of one chunk (dv = dX w, dw = dX v), and dX itself when ``with_dx``."""
    dq, dk, dX, dg, db = _bwd_chunk(cfg, x, *rest)
    grads = (dq, dk, dX * x[5], dg, db, dX * x[2])
    return grads + (dX,) if with_dx else grads


def _map(cfg, fn, xs):
    """fn over chunks in parallel: all at once (the chunk axis is one more batch axis of fn's ``...``) when the
    decay strategy's workspace allows, else in groups (lax.map + vmap, whose scan and batching rules made tracing
    a program ~1.6x as long: docs/performance.md)."""
    N, B, H, C, K = xs[0][0].shape
    group = max(1, min(N, WORKSPACE_FLOATS // (B * H * cfg.decay.workspace(C, K))))
    if group == N:
        return fn(*xs)
    return jax.lax.map(lambda a: fn(*a), xs, batch_size=group)


@partial(jax.jit, static_argnums=0)
def _forward(cfg, xs, h0, dz=None, hc=None):
    """Parallel local stage, sequential state scan, parallel output O = scale((gamma q) S0 + Aqk R)."""
    extra = () if dz is None else (dz,)
    Y, U, Kd, gC, Qg, Aqk, A = _map(cfg, lambda x, *e: _fwd_local(cfg.decay, x, *e), (xs,) + extra)
    hT, (S0s, R) = jax.lax.scan(_state_step, h0, (Y, U, Kd, gC) + (() if hc is None else (hc,)))
    o = cfg.scale * (_mm("...ck,...kv->...cv", Qg, S0s) + _mm("...rs,...sv->...rv", Aqk, R))
    return o, hT, Saved(S0s, R, A, Aqk, Y, Kd, gC, Qg)


class Saved(NamedTuple):
    """Forward quantities the backward reuses (per chunk): small next to the inputs, costly to recompute."""

    S0: Any  # chunk starting states           [N, B, H, K, V]
    R: Any  # v_new = U - Y S0                 [N, B, H, C, V]
    A: Any  # (I + T)^{-1}                     [N, B, H, C, C]
    Aqk: Any  # decayed q k^T tile             [N, B, H, C, C]
    Y: Any  # A Ebar                           [N, B, H, C, K]
    Kd: Any  # exp(G_C - G) k                  [N, B, H, C, K]
    gC: Any  # exp(G_C)                        [N, B, H, 1, K]
    Qg: Any  # gamma q                         [N, B, H, C, K]


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def chunked_core(cfg, q, k, v, g, b, w, h0):
    """(o, final_state) on chunk-major float32 inputs ``[N, B, H, C, dim]``, h0 ``[B, H, K, V]``."""
    o, hT, _ = _forward(cfg, (q, k, v, g, b, w), h0)
    return o, hT


def _core_fwd(cfg, q, k, v, g, b, w, h0):
    o, hT, saved = _forward(cfg, (q, k, v, g, b, w), h0)
    return (o, hT), ((q, k, v, g, b, w), saved)


@partial(jax.jit, static_argnums=0, static_argnames="with_dx")
def _backward(cfg, xs, sv, do, dhT, dS0s=None, dR=None, with_dx=False):
    """dO terms of dS (all chunks at once), reverse scan carrying dS, then per-chunk gradients (parallel).

    ``dS0s``/``dR`` are cotangents of the chunk starting states and of R when those are outputs too
    (:func:`affine_core`): dR joins scale Aqk^T dO, dS0s joins the dO part of each chunk's dS0.
    Returns (dq, dk, dv, dg, db, dw[, dX], dh0, dS1s).
    """
    # c = scale Qg^T dO - Y^T dRo with dRo = scale Aqk^T dO: the dO part of dS0 (see _dstate_step)
    dRo = cfg.scale * _mm("...rs,...rv->...sv", sv.Aqk, do)
    if dR is not None:
        dRo = dRo + dR
    c = cfg.scale * _mm("...ck,...cv->...kv", sv.Qg, do) - _mm("...ck,...cv->...kv", sv.Y, dRo)
    if dS0s is not None:
        c = c + dS0s
    dh0, dS1s = jax.lax.scan(_dstate_step, dhT, (sv.Y, sv.Kd, sv.gC, c), reverse=True)
    grads = _map(cfg, lambda *a: _bwd_grads(cfg, with_dx, *a), (xs, sv.S0, do, dS1s, sv.A, sv.Aqk, sv.R, dRo))
    return (*grads, dh0, dS1s)


def _core_bwd(cfg, res, cts):
    """Cotangents of the seven inputs (:func:`_backward`)."""
    xs, sv = res
    return _backward(cfg, xs, sv, *cts)[:-1]


chunked_core.defvjp(_core_fwd, _core_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def affine_core(cfg, q, k, v, g, b, w, h0, dz, hc):
    """:func:`chunked_core` with additive terms and the chunk-level results as outputs too.

    ``dz`` (chunk-major like v, or None) is added to the values Z = w v of the WY solve (R = A (Z + dz) - Y S0),
    ``hc`` (``[N, B, H, K, V]`` or None) to each chunk's leaving state. Returns ``(o, final_state, S0s, R)``:
    S0s ``[N, B, H, K, V]`` the chunk starting states, R ``[N, B, H, C, V]`` (v_new). Differentiable in all
    of them with the hand-written backward: the cotangents of S0s and R join the reverse scan's dO terms,
    ``dz``'s is dX and ``hc``'s the carried dS at each chunk end.
    """
    o, hT, sv = _forward(cfg, (q, k, v, g, b, w), h0, dz, hc)
    return o, hT, sv.S0, sv.R


def _affine_fwd(cfg, q, k, v, g, b, w, h0, dz, hc):
    o, hT, sv = _forward(cfg, (q, k, v, g, b, w), h0, dz, hc)
    present = tuple(None if a is None else () for a in (dz, hc))  # empty pytrees: which terms were given
    return (o, hT, sv.S0, sv.R), ((q, k, v, g, b, w), sv, present)


def _affine_bwd(cfg, res, cts):
    xs, sv, (dz, hc) = res
    do, dhT, dS0s, dR = cts
    *grads, dX, dh0, dS1s = _backward(cfg, xs, sv, do, dhT, dS0s, dR, with_dx=True)
    return (*grads, dh0, None if dz is None else dX, None if hc is None else dS1s)


affine_core.defvjp(_affine_fwd, _affine_bwd)


def to_chunks(x, C):
    """[B, T, H, D] -> [N, B, H, C, D] float32, padded at the end with zeros (identity tokens: g=k=0)."""
    B, T, H, D = x.shape
    N = -(-T // C)
    x = jnp.pad(x.astype(ACC_DTYPE), ((0, 0), (0, N * C - T), (0, 0), (0, 0)))
    return x.reshape(B, N, C, H, D).transpose(1, 0, 3, 2, 4)


def from_chunks(o, T):
    """[N, B, H, C, V] -> [B, T, H, V] (drops padding)."""
    N, B, H, C, V = o.shape
    return o.transpose(1, 0, 3, 2, 4).reshape(B, N * C, H, V)[:, :T]


@partial(jax.jit, static_argnums=0)
def run(cfg, q, k, v, g, b, w, h0):
    """Floor g, pad, chunk, run the custom_vjp core, unchunk; output in v.dtype, final state float32."""
    B, T, H, K = q.shape
    if h0 is None:
        h0 = jnp.zeros((B, H, K, v.shape[-1]), ACC_DTYPE)
    g = floor_log_decay(g)  # outside the custom_vjp: its gradient zeroes dg below the floor
    xs = [to_chunks(x, cfg.chunk_size) for x in (q, k, v, g, b, w)]
    o, hT = chunked_core(cfg, *xs, h0)
    return from_chunks(o, T).astype(v.dtype), hT
