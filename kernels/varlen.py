"""Packed variable-length sequences (FLA ``cu_seqlens``) in the chunked kernels: a reset inside the chunk form.

N sequences are packed into one row of T tokens (``cu_seqlens = [0, ..., T]``, B == 1) and cut into C-token
chunks that straddle sequence boundaries; no sequence is padded. In terms of docs/DESIGN.md §1's chunk form:

1. **Reset.** Every sequence start ``t0 > 0`` gets ``RESET`` added to its log-decay before the core. Every decay
   factor that spans a start is then ``exp(<= RESET) = 0`` in float32, so the tiles T and Aqk are block-diagonal
   by sequence (the WY solve never mixes sequences), ``gamma = exp(G)`` is 0 from a start on, ``gamma_C = 0``
   in a chunk holding a start and ``Kd`` keeps only the chunk's last sequence. The unchanged chunk form
   (``chunked.affine_core``, with its hand-written backward) thus runs every token as if its sequence entered
   with the carried state S0 when it began before the chunk, and with the zero state when it begins inside it.
   ``RESET`` is just large enough for exact zeros, so it coarsens decay.log_decay's hi/lo grid little (it adds
   at most ``128 C`` to a chunk's ``sum |g|``; exponents stay exact differences); ``dg = dg'``.
2. **Entering states, by linearity.** Sequence n starting at ``t0 > 0`` enters with ``h0[n]``: with
   ``gs_r = exp(g_t0 + ... + g_r)`` (its decay from the start) for its tokens r in its first chunk, the exact
   chunk form adds ``-(gs b k)_r^T h0[n]`` to the WY right-hand side Z_r (``R = A (Z + dz) - Y S0``: the solve
   carries it through ``A`` and ``Aqk`` like any value), ``scale (gs q)_r^T h0[n]`` to o_r, and
   ``Diag(gs_last) h0[n]`` to the state leaving the chunk when n is still running there (``affine_core``'s
   ``dz`` and ``hc``). The sequence holding token 0 starts from the core's own initial state.
3. **States read at a token.** The state after token e of sequence n in chunk c is
   ``Diag(exp(G_e - G_a)) E + sum_{s in n, s <= e} (exp(G_e - G_s) k_s) R_s^T`` with E the chunk's carried S0
   (a = the chunk start) or, if n starts in c, ``h0[n]`` (a = the token before t0), and R the core's v_new.
   Final states (read at each sequence's last token; an empty sequence returns its ``h0``) and FLA's
   intermediate states (before each sequence's j-th C-token chunk) both use it.

**Gradients.** Everything inside the chunk form goes through ``affine_core``'s hand-written backward
(including the cotangents of the chunk states and R that step 3 reads); steps 1-3 around it are plain JAX,
differentiated by JAX autodiff (gathers, scatter-adds, the anchored exponents). Exponents here are formed like
``decay.gap`` (exact hi difference plus lo difference), with a straight-through clamp so that a zero exponent
keeps its full derivative.

**Cost.** The core is a dense call on the same ``ceil(T/C)`` chunks. Steps 2-3 gather, per sequence, one
chunk of rows and do one ``C x K x V`` product (two more with an initial state): ``O(N C K V)`` flops and
``O(N C (K + V) + N K V)`` memory: small next to the core while N is at most about one sequence a chunk.
Measured on CPU (T = 4096, H = 4, K = V = 64, C = 64, forward + backward, median of 9 against a dense call of
the same length): 1.0-1.05x for N = 4...64 (1.1-1.2x with initial states), 1.3-1.5x at N = 512 (1.6-2.0x).

**Across devices.** ``packed_pass`` (steps 1-2 on chunk-major inputs) and ``states_after`` also serve the
context-parallel kernels (kernels/context_parallel.py), on each device's slice in the augmented form.

**cu_seqlens is traced.** N and T are static (from the shapes); the offsets' values may be traced, so one
compiled program serves every packing with the same N and T (pad ``cu_seqlens`` with empty sequences at T to
fix N). Only ``return_intermediate_states`` needs them on the host (the number of chunks depends on them).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .chunked import affine_core, from_chunks, to_chunks
from .contract import ACC_DTYPE, MATMUL_PRECISION, floor_log_decay
from .decay import log_decay

# Added to the log-decay of each sequence's first token (t > 0): exp(x) is 0 in float32 below about -104 and
# g <= 0, so every decay factor across a start is exactly 0; no larger, to keep decay.log_decay's grid fine.
RESET = -128.0


class Packing(NamedTuple):
    """Per token of the chunk-padded row, ``[num_chunks, C]`` arrays (padding: the last token's sequence)."""

    seg: Any  # int32: the token's sequence n
    new: Any  # bool: its sequence starts in this chunk at t0 > 0 (it enters with h0[n], not the carried state)
    anchor: Any  # int32: 1 + in-chunk index of the token before t0 if new, else 0 (the chunk start)
    reset: Any  # bool: the token is a sequence start t0 > 0


def packing(cu, T, C):
    """Sequence membership of each token from ``cu_seqlens`` (values may be traced; N, T, C static)."""
    N = cu.shape[0] - 1
    nc = -(-T // C)
    pos = jnp.arange(nc * C, dtype=jnp.int32)
    seg = jnp.searchsorted(cu[1:], jnp.minimum(pos, T - 1), side="right").astype(jnp.int32)
    seg = jnp.minimum(seg, N - 1)
    start = cu[seg]
    chunk_start = pos - pos % C
    new = (start > 0) & (start >= chunk_start)
    anchor = jnp.where(new, start - chunk_start, 0)
    reset = (pos == start) & (pos > 0)
    return Packing(*(x.reshape(nc, C) for x in (seg, new, anchor, reset)))


def _tokens(x):
    """``[nc, C]`` per-token values -> ``[nc, 1, 1, C, 1]`` (broadcast over batch, heads and channels)."""
    return x[:, None, None, :, None]


def _min0(x):
    """min(x, 0) with x's own gradient: the clamp only absorbs rounding of an exponent that is <= 0."""
    return x - jax.lax.stop_gradient(jnp.maximum(x, 0.0))


def _exponent(Ga, Gb):
    """G_a - G_b (a later, b earlier) as in ``decay.gap``: exact hi difference plus lo difference, clamped at 0."""
    return _min0((Ga.hi - Gb.hi) + (Ga.lo - Gb.lo))


def _at(G, idx):
    """Rows ``idx`` (``[..., 1]`` broadcast over channels, token axis -2) of a LogDecay."""
    def take(x):
        return jnp.take_along_axis(x, jnp.broadcast_to(idx, x.shape[:-2] + idx.shape[-2:-1] + x.shape[-1:]), axis=-2)

    return G.map(take)


def _with_start(G):
    """G with a zero row in front: row 0 is the chunk start (G_{-1} = 0), row i + 1 is token i."""
    return G.map(lambda x: jnp.concatenate([jnp.zeros_like(x[..., :1, :]), x], axis=-2))


def _entering_terms(P, pk, cu, h0, seqs=None):
    """Per chunk, ``P [nc, 1, H, C, P, K]`` (rows of new tokens) times their own sequence's ``h0 [N, H, K, V]``.

    One gathered chunk per sequence (its first), masked to its own rows, scatter-added back: ``[nc, 1, H, C, P, V]``.
    ``seqs`` (default all): the sequences that may start inside these chunks (the others add nothing).
    """
    nc, C = pk.seg.shape
    if seqs is None:
        N = h0.shape[0]
        c0 = jnp.clip(cu[:-1] // C, 0, nc - 1)
        rows = (pk.seg[c0] == jnp.arange(N)[:, None]) & pk.new[c0]  # [N, C]
    else:
        c0 = jnp.clip(cu[seqs] // C, 0, nc - 1)
        rows = (pk.seg[c0] == seqs[:, None]) & pk.new[c0]
        h0 = h0[seqs]
    D = jnp.einsum("nbhcpk,nhkv->nbhcpv", P[c0] * rows[:, None, None, :, None, None], h0, precision=MATMUL_PRECISION)
    return jnp.zeros((nc,) + D.shape[1:], D.dtype).at[c0].add(D)


def states_after(e, n, cu, pk, G, kc, R, S0s, h0):
    """The state right after token ``e[m]`` of sequence ``n[m]`` (step 3 of the module docstring): ``[M, H, K, V]``.

    ``G`` the chunks' LogDecay (original log-decays), ``kc [nc, 1, H, C, K]``, ``R [nc, 1, H, C, V]`` and
    ``S0s [nc, 1, H, K, V]`` from the core, ``h0 [N, H, K, V]`` or None (zeros).
    """
    _, C = pk.seg.shape
    c = e // C
    p = e - c * C
    rows = (pk.seg[c] == n[:, None]) & (jnp.arange(C) <= p[:, None])  # [M, C]: n's tokens up to e
    Gc = G.map(lambda x: x[c])
    Ge = _at(Gc, p[:, None, None, None, None])  # [M, 1, H, 1, K]
    x = jnp.where(rows[:, None, None, :, None], _exponent(Ge, Gc), -jnp.inf)
    S = jnp.einsum("mbhck,mbhcv->mbhkv", jnp.exp(x) * kc[c], R[c], precision=MATMUL_PRECISION)
    start = cu[n]
    new = (start > 0) & (start >= c * C)
    Ga = _at(_with_start(Gc), jnp.where(new, start - c * C, 0)[:, None, None, None, None])
    decay = jnp.swapaxes(jnp.exp(_exponent(Ge, Ga)), -1, -2)  # [M, 1, H, K, 1]
    own = jnp.zeros_like(S0s[c]) if h0 is None else h0[n][:, None]
    entering = jnp.where(new[:, None, None, None, None], own, S0s[c])
    return (S + decay * entering)[:, 0]


def packed_pass(cfg, pk, cu, qc, kc, vc, gc, bc, wc, S0, h0, seqs=None):
    """Steps 1-2 on chunk-major inputs: ``(o, leaving state, S0s, R, G)`` of the packed chunk form.

    ``pk = packing(cu, ...)``; ``gc`` the floored log-decays; ``S0 [1, H, K, V]`` the state the sequence holding
    the first token enters with; ``h0 [N, H, K, V]`` (V the values' width) or None (zeros) the entering states
    of the sequences starting later (``seqs``: those that may start here, default all); ``G`` the chunks'
    LogDecay of the original log-decays (for step 3).
    """
    G = log_decay(gc)
    gs = jnp.exp(_exponent(G, _at(_with_start(G), _tokens(pk.anchor))))  # decay from each token's entering state
    dz = hc = D = None
    if h0 is not None:
        new = _tokens(pk.new)
        D = _entering_terms(jnp.stack([new * gs * bc * kc, new * gs * qc], axis=-2), pk, cu, h0, seqs)
        dz = -D[..., 0, :]
        last = pk.seg[:, -1]
        hc = jnp.where(pk.new[:, -1, None, None, None, None], gs[..., -1, :, None] * h0[last][:, None], 0.0)
    o, hT, S0s, R = affine_core(cfg, qc, kc, vc, gc + RESET * _tokens(pk.reset), bc, wc, S0, dz, hc)
    if h0 is not None:
        o = o + cfg.scale * D[..., 1, :]
    return o, hT, S0s, R, G


def run(cfg, q, k, v, g, b, w, h0, cu, chunk_starts=None):
    """Packed forward: ``(o [1, T, H, V], final_state [N, H, K, V], intermediate [1, NT, H, K, V] or None)``.

    ``g`` is the log-decay (floored here), ``h0 [N, H, K, V]`` or None, ``cu [N + 1]`` int32 (may be traced).
    ``chunk_starts`` = ``(e, n, first)`` int arrays: the intermediate states to read (state after token e of
    sequence n, or ``h0[n]`` where ``first``).
    """
    _, T, H, K = q.shape
    V = v.shape[-1]
    C = cfg.chunk_size
    N = cu.shape[0] - 1
    pk = packing(cu, T, C)
    qc, kc, vc, gc, bc, wc = (to_chunks(x, C) for x in (q, k, v, floor_log_decay(g), b, w))
    h_first = jnp.zeros((1, H, K, V), ACC_DTYPE) if h0 is None else h0[pk.seg[0, 0]][None]
    o, _, S0s, R, G = packed_pass(cfg, pk, cu, qc, kc, vc, gc, bc, wc, h_first, h0)

    def read(e, n, initial):
        """States after tokens e of sequences n, or their initial states where ``initial``."""
        S = states_after(e, n, cu, pk, G, kc, R, S0s, h0)
        return jnp.where(initial[:, None, None, None], 0.0 if h0 is None else h0[n], S)

    final = read(jnp.maximum(cu[1:] - 1, 0), jnp.arange(N), cu[1:] == cu[:-1])  # empty: its initial state
    inter = None if chunk_starts is None else read(*chunk_starts)[None]
    return from_chunks(o, T).astype(v.dtype), final, inter


def chunk_start_queries(cu, C):
    """Host side: ``(e, n, first)`` for FLA's intermediate states, sequence by sequence, chunk by chunk.

    Sequence n's j-th chunk starts at ``t = cu[n] + j C``: its state is the one after token ``t - 1`` of n,
    or ``h0[n]`` for ``j = 0``. ``NT = sum_n ceil(len_n / C)``.
    """
    e, n, first = [], [], []
    for i in range(len(cu) - 1):
        for t in range(int(cu[i]), int(cu[i + 1]), C):
            e.append(max(t - 1, 0))
            n.append(i)
            first.append(t == cu[i])
    return np.asarray(e, np.int32), np.asarray(n, np.int32), np.asarray(first, bool)
