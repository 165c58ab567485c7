"""Test support: buggy GDN-2 kernels whose bugs the diagnosis must point at (ci/tests/test_diagnose.py,
docs/DESIGN.md §4, "Diagnosis").

Each is the plain token-by-token recurrence of docs/DESIGN.md §1 as a ``jax.lax.scan`` in float32 (gradients
by autodiff, so the backward is always the exact adjoint of the forward written) with one bug planted:

* :func:`skip_erase_every_64` -- the first token of every 64-token chunk does not erase (``r_t = 0`` at
  ``t = 0, 64, 128, ...``): without an initial state the errors start at token 64 and jump every 64 tokens;
* :func:`transposed_erase` -- the erase gate on the wrong side, ``(I - (b*k) k^T)`` instead of
  ``(I - k (b*k)^T)``: the same wherever ``b`` is equal in every channel (scalar gates, KDA, GDN);
* :func:`h0_in_bf16` -- the initial state read in bfloat16: exact without one (zeros), wrong from token 0 with
  one, the error fading as the state decays;
* :func:`h0_decayed_twice` -- the first token's erase reads ``D_1 D_1 h0`` instead of ``D_1 h0``: under
  moderate decay ``o`` is wrong from token 0 with an initial state, while under extreme decay the forward
  error is below float32's resolution and only the gradients (``dh0``) see it -- also without an initial
  state, since ``dh0`` of the map ``h0 -> S_1`` does not depend on ``h0``'s value;
* :func:`final_state_early` -- returns the state before the last token as the final state;
* :func:`bf16_log_decay` -- the cumulative log-decay over the sequence kept in the input dtype: right in
  float32, wrong in bfloat16 (the decay factor between tokens ``s < t`` off by up to ``exp(ulp_bf16(|G_t|))``,
  growing along the sequence);
* :func:`bf16_operands` -- no bug in the algorithm: the chunked form of docs/DESIGN.md §1 (64-token chunks) with
  every product's operands, the chunk solve's included, cast to bfloat16 and accumulated in float32 (what a
  ``precision="bf16"`` option does); for a float32 call its errors are rounding in a 16-bit operand, not a
  damping, and the diagnosis must say so; :func:`bf16_solve`, only the chunk solve's operands so (``T``, ``A`` and
  the right-hand sides of ``A Ebar``, ``A (w v)``); and :func:`damped_solve`, the same in float32 with a damped
  chunk solve (``(I + T)^{-1}`` of ``T`` scaled by ``1 - DAMPING``): errors as large, a damping the diagnosis must
  not call rounding; :func:`clipped_exponent`, the same in float32 with every within-chunk decay exponent clipped at
  ``-CLIP`` (``exp(max(G_r - G_s, -CLIP))``): wrong only under extreme decay, an exponent clip the diagnosis must
  name.

Pure JAX; never imports the oracle (docs/DESIGN.md §3).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

PERIOD = 64  # skip_erase_every_64's period


def _recurrence(q, k, v, g, b, w, *, scale=None, initial_state=None, erase_mask=None, transposed=False,
                first_erase_decay=False, early_state=False, log_decay=None):
    """The recurrence with the planted bugs selected by the keywords (all off: a correct kernel)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    q, k, v, g, b, w = (jnp.asarray(x).astype(jnp.float32) for x in (q, k, v, g, b, w))
    if log_decay is not None:
        g = log_decay(g)
    S0 = (jnp.zeros((B, H, K, V), jnp.float32) if initial_state is None
          else jnp.asarray(initial_state).astype(jnp.float32))
    keep = jnp.ones((T,), jnp.float32) if erase_mask is None else erase_mask(T)

    def step(S, xs):
        t, keep_t, qt, kt, vt, gt, bt, wt = xs
        decay = jnp.exp(gt)[..., None]
        Sbar = decay * S
        e = bt * kt
        read = jnp.where((t == 0) & first_erase_decay, decay * Sbar, Sbar)
        if transposed:
            erase = e[..., None] * jnp.sum(kt[..., None] * read, axis=-2)[..., None, :]
            S = Sbar + kt[..., None] * (wt * vt)[..., None, :] - keep_t * erase
        else:
            r = jnp.sum(read * e[..., None], axis=-2)
            S = Sbar + kt[..., None] * (wt * vt - keep_t * r)[..., None, :]
        o = scale * jnp.sum(S * qt[..., None], axis=-2)
        return S, (o, S)

    xs = (jnp.arange(T), keep) + tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, b, w))
    S, (o, states) = jax.lax.scan(step, S0, xs)
    if early_state:
        S = states[-2] if T > 1 else S0
    return jnp.moveaxis(o, 0, 1), S


def _kernel(**bug):
    def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):
        o, S = _recurrence(q, k, v, g, b, w, scale=scale, initial_state=initial_state, **bug)
        return o.astype(v.dtype), S

    return kernel


def _every(period):
    return lambda T: jnp.where(jnp.arange(T) % period == 0, 0.0, 1.0).astype(jnp.float32)


def _bf16_cumsum(g):
    """Per-token log-decay ``G_t - G_{t-1}`` from the cumulative sum ``G`` over the sequence rounded to bfloat16."""
    G = jnp.cumsum(g, axis=1).astype(jnp.bfloat16).astype(jnp.float32)
    return jnp.minimum(G - jnp.pad(G, ((0, 0), (1, 0), (0, 0), (0, 0)))[:, :-1], 0.0)


def reference(q, k, v, g, b, w, *, scale=None, initial_state=None):
    """The recurrence without a bug (the buggy kernels' baseline: it passes)."""
    return _kernel()(q, k, v, g, b, w, scale=scale, initial_state=initial_state)


skip_erase_every_64 = _kernel(erase_mask=_every(PERIOD))
transposed_erase = _kernel(transposed=True)
h0_decayed_twice = _kernel(first_erase_decay=True)
final_state_early = _kernel(early_state=True)


def h0_in_bf16(q, k, v, g, b, w, *, scale=None, initial_state=None):
    """The initial state rounded to bfloat16 before use (its gradient passes straight through the rounding)."""
    h0 = initial_state
    if h0 is not None:
        h0 = jnp.asarray(h0, jnp.float32)
        h0 = h0 + jax.lax.stop_gradient(h0.astype(jnp.bfloat16).astype(jnp.float32) - h0)
    return reference(q, k, v, g, b, w, scale=scale, initial_state=h0)


def bf16_log_decay(q, k, v, g, b, w, *, scale=None, initial_state=None):
    """The cumulative log-decay rounded to the input dtype: exact in float32, wrong in bfloat16."""
    log_decay = _bf16_cumsum if v.dtype == jnp.bfloat16 else None
    return _kernel(log_decay=log_decay)(q, k, v, g, b, w, scale=scale, initial_state=initial_state)


CHUNK = 64  # bf16_operands' and damped_solve's chunk
DAMPING = 2e-3  # damped_solve's
CLIP = 20.0  # clipped_exponent's: its within-chunk decay exponents at least -CLIP


def _chunked(q, k, v, g, b, w, *, scale=None, initial_state=None, operand=jnp.float32, solve=jnp.float32,
             damping=0.0, clip=None):
    """The chunkwise form of docs/DESIGN.md §1 in float32, every product's operands cast to ``operand`` and the chunk
    solve's to ``solve`` (float32 accumulation), the within-chunk tiles ``T`` scaled by ``1 - damping`` before the
    solve; ``clip``: every within-chunk pair exponent ``G_r - G_s`` taken as at least ``-clip``."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    N = -(-T // CHUNK)
    pad = ((0, 0), (0, N * CHUNK - T), (0, 0), (0, 0))

    def chunks(x):  # [B, T, H, D] -> [N, B, H, C, D], identity tokens after T
        x = jnp.pad(jnp.asarray(x).astype(jnp.float32), pad)
        return jnp.moveaxis(x.reshape(B, N, CHUNK, H, x.shape[-1]), 3, 2).swapaxes(0, 1)

    def mm(spec, a, c, to=operand):
        return jnp.einsum(spec, a.astype(to), c.astype(to), preferred_element_type=jnp.float32,
                          precision=jax.lax.Precision.HIGHEST)

    lower = jnp.tril(jnp.ones((CHUNK, CHUNK), bool))
    strict = jnp.tril(jnp.ones((CHUNK, CHUNK), bool), -1)
    eye = jnp.eye(CHUNK, dtype=jnp.float32)

    def step(S0, xs):
        qc, kc, vc, gc, bc, wc = xs
        G = jnp.cumsum(gc, axis=-2)
        diff = jnp.where(lower[..., None], G[..., :, None, :] - G[..., None, :, :], 0.0)
        diff = diff if clip is None else jnp.maximum(diff, -clip)
        D = jnp.where(lower[..., None], jnp.exp(diff), 0.0)  # [B, H, C, C, K]
        a = bc * kc
        Tt = jnp.where(strict, mm("...rsk,...sk->...rs", a[..., :, None, :] * D, kc), 0.0) * (1.0 - damping)
        Aqk = jnp.where(lower, mm("...rsk,...sk->...rs", qc[..., :, None, :] * D, kc), 0.0)
        A = jax.scipy.linalg.solve_triangular(eye + Tt.astype(solve).astype(jnp.float32),
                                              jnp.broadcast_to(eye, Tt.shape), lower=True, unit_diagonal=True)
        gamma = jnp.exp(G)
        GC = G[..., -1:, :]
        to = solve if solve != jnp.float32 else operand
        Y = mm("...rs,...sk->...rk", A, gamma * a, to)
        U = mm("...rs,...sv->...rv", A, wc * vc, to)
        R = U - mm("...ck,...kv->...cv", Y, S0)
        o = scale * (mm("...ck,...kv->...cv", gamma * qc, S0) + mm("...rs,...sv->...rv", Aqk, R))
        S1 = jnp.swapaxes(jnp.exp(GC), -1, -2) * S0 + mm("...ck,...cv->...kv", jnp.exp(GC - G) * kc, R)
        return S1, o

    S0 = (jnp.zeros((B, H, K, V), jnp.float32) if initial_state is None
          else jnp.asarray(initial_state).astype(jnp.float32))
    S, o = jax.lax.scan(step, S0, tuple(chunks(x) for x in (q, k, v, g, b, w)))
    o = jnp.moveaxis(o.swapaxes(0, 1), 2, 3).reshape(B, N * CHUNK, H, V)[:, :T]
    return o.astype(v.dtype), S


def bf16_operands(q, k, v, g, b, w, *, scale=None, initial_state=None):
    """The chunked form with every product's operands in bfloat16 (float32 accumulation)."""
    return _chunked(q, k, v, g, b, w, scale=scale, initial_state=initial_state, operand=jnp.bfloat16)


def bf16_solve(q, k, v, g, b, w, *, scale=None, initial_state=None):
    """The chunked form with only the chunk solve's operands in bfloat16."""
    return _chunked(q, k, v, g, b, w, scale=scale, initial_state=initial_state, solve=jnp.bfloat16)


def damped_solve(q, k, v, g, b, w, *, scale=None, initial_state=None):
    """The chunked form in float32 with the chunk solve's tiles damped by ``1 - DAMPING``."""
    return _chunked(q, k, v, g, b, w, scale=scale, initial_state=initial_state, damping=DAMPING)


def clipped_exponent(q, k, v, g, b, w, *, scale=None, initial_state=None):
    """The chunked form in float32 with every within-chunk decay exponent clipped at ``-CLIP`` (a guard against
    underflow): right wherever no pair in a chunk decays by more than ``e^-CLIP``."""
    return _chunked(q, k, v, g, b, w, scale=scale, initial_state=initial_state, clip=CLIP)
