"""A ReplaySSM-style Gated DeltaNet decode kernel in JAX: a checkpoint plus a ring of rank-1 entries per slot.

GDN with grouped value heads (``H`` key heads, ``HV = G H`` value heads, value head ``hv`` reading key head
``hv // G``); the state of a value head is ``S [V, K]`` (K innermost, vLLM's layout). One token with log-decay
``g <= 0`` (``alpha = exp(g)``), ``beta``, ``q, k [K]`` (its key head's) and ``v [V]``::

    d_t = beta (v - alpha S_prev k)                    (the update vector, [V])
    S_t = alpha S_prev + d_t k^T
    o_t = scale S_t q = alpha (S_prev q_s) + d_t (k . q_s),   q_s = scale q

A slot does not hold ``S``: it holds a checkpoint ``C [HV, V, K]`` and a ring of the last ``n`` tokens' entries
``(d [HV, V], k [H, K], g [HV])`` at ring positions ``(cache_base + c) mod buf``, ``c = 0..n-1``, encoding::

    S_n = exp(sum_c g_c) C + sum_c exp(sum_{c<i<n} g_i) d_c k_c^T

A step computes ``S_prev k`` and ``S_prev q_s`` from ``C`` and the valid entries (weights ``exp(G_n - G_c)``,
``G`` the inclusive cumulative sum of the history's ``g``) in float32 and writes only its own entry; the full
state is materialised (into the checkpoint) only on a flush.

Storage, :class:`ReplayCache`: ``checkpoint [P, HV, V, K]`` (``state_dtype``), ``d [P, HV, buf, V]`` and
``k [P, H, buf, K]`` (``cache_dtype``; float32, bfloat16 or float16 each), ``g [P, HV, buf]`` float32 and the
per-slot cursors ``write_pos``, ``cache_base``, ``is_flush [P]`` int32. Slot ids ``<= NULL_BLOCK_ID`` (0) are
padding: such a row reads nothing, writes nothing and outputs exact zeros. All arithmetic is float32; values are
rounded only when stored (entries to ``cache_dtype``, checkpoints to ``state_dtype``); ``o`` comes back in v's
dtype. Every function is functional (new arrays come back; slots not written are bit-identical).

* :func:`new_cache` -- zeros; ``buf = capacity``, or the next power of two ``>= capacity`` with speculation.
* :func:`load` -- prefill hand-off: states into the checkpoints, cursors to 0.
* :func:`recurrent_step` -- one token per row, caller-supplied ``write_pos`` (tokens since the load, mod ``capacity``);
  the step at ``write_pos == capacity - 1`` is a flush (``S_t`` to the checkpoint, no entry written).
* :func:`spec_decode` -- a speculative window of ``max_spec_len`` tokens per row from the slot's cursors
  (verify: window after the committed entries; flush: history folded into the checkpoint first).
* :func:`commit` -- moves the cursors by the accepted counts; :func:`reset` -- cursors of a fresh request.

Two live rows sharing a slot in one call give unspecified results. Shape and dtype checks are static (ValueError
naming the argument); cursor values are trusted (a ring position is always taken ``mod buf``).

Test support (``kernels/tests/test_replay_decode.py``): :func:`recurrent_step`, :func:`spec_decode` and
:func:`commit` take ``mutant=None`` or a name from :data:`MUTANTS`, a deliberately wrong variant (a function
applies the mutants that concern it and ignores the others, so one name can be passed to every call of a scenario):

* ``late_flush`` (decode): flushes at ``write_pos == capacity`` instead of ``capacity - 1`` -- one step late, so
  the entry at ``capacity - 1`` is written and the next step (``write_pos`` 0) has lost the history;
* ``cursor_all_drafts`` (commit): advances ``write_pos`` by the window length ``max_spec_len`` (every draft written)
  instead of the accepted count;
* ``prefix_decay`` (decode, spec_decode): weighs history entry ``c`` by ``exp(G_c)`` (the prefix) instead of
  ``exp(G_n - G_c)`` (the entries after it);
* ``key_per_value_head`` (decode, spec_decode): addresses the key cache by value head ``hv % H`` instead of key
  head ``hv // G``, when written (value head by value head, in order) and when read;
* ``base_not_advanced`` (commit): leaves ``cache_base`` where it was after a flush;
* ``null_block_live`` (decode, spec_decode, commit): treats only negative slot ids as padding, so slot 0 (the null
  block) is read, written and output like any other.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .contract import ACC_DTYPE, MATMUL_PRECISION, STORAGE_DTYPES, floor_log_decay, storage_dtype

DTYPES = STORAGE_DTYPES
NULL_BLOCK_ID = 0
MUTANTS = ("late_flush", "cursor_all_drafts", "prefix_decay", "key_per_value_head", "base_not_advanced",
           "null_block_live")


class ReplayCache(NamedTuple):
    """The replay storage of ``P`` slots (module docstring); a pytree, so it passes through ``jax.jit``."""

    checkpoint: jax.Array  # [P, HV, V, K] state_dtype
    d: jax.Array  # [P, HV, buf, V] cache_dtype
    k: jax.Array  # [P, H, buf, K] cache_dtype
    g: jax.Array  # [P, HV, buf] float32
    write_pos: jax.Array  # [P] int32
    cache_base: jax.Array  # [P] int32
    is_flush: jax.Array  # [P] int32


# --- validation ---------------------------------------------------------------------------------------------------


def _int(name, value, low):
    """A Python integer ``>= low``; ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")
    return value


def _mutant(mutant):
    if mutant is not None and mutant not in MUTANTS:
        raise ValueError(f"mutant: expected None or one of {MUTANTS}, got {mutant!r}")
    return mutant


def _cache_dims(cache):
    """``(P, H, HV, K, V, buf)`` of a consistent :class:`ReplayCache`; ValueError naming ``cache`` otherwise."""
    if not isinstance(cache, ReplayCache):
        raise ValueError(f"cache: expected a ReplayCache, got {type(cache).__name__}")
    ck, d, k, g = cache.checkpoint, cache.d, cache.k, cache.g
    if ck.ndim != 4 or d.ndim != 4 or k.ndim != 4 or g.ndim != 3:
        raise ValueError("cache: expected checkpoint [P, HV, V, K], d [P, HV, buf, V], k [P, H, buf, K], "
                         f"g [P, HV, buf]; got {ck.shape}, {d.shape}, {k.shape}, {g.shape}")
    P, HV, V, K = ck.shape
    H, buf = k.shape[1], k.shape[2]
    if (d.shape != (P, HV, buf, V) or k.shape != (P, H, buf, K) or g.shape != (P, HV, buf) or H == 0
            or HV % H):
        raise ValueError(f"cache: inconsistent shapes checkpoint {ck.shape}, d {d.shape}, k {k.shape}, g {g.shape}")
    for name in ("write_pos", "cache_base", "is_flush"):
        x = getattr(cache, name)
        if x.shape != (P,) or not jnp.issubdtype(x.dtype, jnp.integer):
            raise ValueError(f"cache: {name} must be an integer array [{P}], got {x.dtype} {x.shape}")
    return P, H, HV, K, V, buf


def _check_array(name, x, shape, integer=False):
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise ValueError(f"{name}: expected an array, got {type(x).__name__}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(x.shape)}")
    if integer and not jnp.issubdtype(x.dtype, jnp.integer):
        raise ValueError(f"{name}: expected an integer array, got {x.dtype}")
    if not integer and not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name}: expected a floating array, got {x.dtype}")


def _check_tokens(q, k, v, g, beta, lead, H, HV, K, V):
    """Token inputs with leading axes ``lead`` (``(N,)`` or ``(N, S)``)."""
    _check_array("q", q, (*lead, H, K))
    _check_array("k", k, (*lead, H, K))
    _check_array("v", v, (*lead, HV, V))
    _check_array("g", g, (*lead, HV))
    _check_array("beta", beta, (*lead, HV))


def _scale(scale, K):
    if scale is None:
        return K**-0.5
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise ValueError(f"scale: expected a Python number or None, got {type(scale).__name__}")
    return float(scale)


def _rows(name, q):
    if not hasattr(q, "shape") or len(q.shape) < 1 or q.shape[0] == 0:
        raise ValueError(f"{name}: expected at least one row, got shape {tuple(getattr(q, 'shape', ()))}")
    return q.shape[0]


# --- the cache ----------------------------------------------------------------------------------------------------


def ring_size(capacity, max_spec_len=0):
    """``buf``: ``capacity`` without speculation, else the next power of two ``>= capacity``."""
    return capacity if max_spec_len == 0 else 1 << (capacity - 1).bit_length()


def new_cache(slots, H, HV, K, V, capacity, *, max_spec_len=0, state_dtype="float32", cache_dtype="float32"):
    """Zero :class:`ReplayCache` of ``slots`` slots, a ring of ``buf = ring_size(capacity, max_spec_len)``."""
    for name, value in (("slots", slots), ("H", H), ("HV", HV), ("K", K), ("V", V), ("capacity", capacity)):
        _int(name, value, 1)
    _int("max_spec_len", max_spec_len, 0)
    if HV % H:
        raise ValueError(f"HV: {HV} value heads is not a multiple of H = {H} key heads")
    if max_spec_len > 0 and capacity < 2 * max_spec_len:
        raise ValueError(f"capacity: {capacity} < 2 * max_spec_len = {2 * max_spec_len}")
    sd, cd = storage_dtype("state_dtype", state_dtype), storage_dtype("cache_dtype", cache_dtype)
    buf = ring_size(capacity, max_spec_len)
    cursor = jnp.zeros((slots,), jnp.int32)
    return ReplayCache(jnp.zeros((slots, HV, V, K), sd), jnp.zeros((slots, HV, buf, V), cd),
                       jnp.zeros((slots, H, buf, K), cd), jnp.zeros((slots, HV, buf), ACC_DTYPE),
                       cursor, cursor, cursor)


def load(cache, slots, states):
    """Prefill hand-off: ``checkpoint[slots] = states`` (rounded to state_dtype), cursors of ``slots`` to 0."""
    P, H, HV, K, V, buf = _cache_dims(cache)
    n = _rows("slots", slots)
    _check_array("slots", slots, (n,), integer=True)
    _check_array("states", states, (n, HV, V, K))
    return _load(cache, slots, states)


@jax.jit
def _load(cache, slots, states):
    P = cache.checkpoint.shape[0]
    rows = jnp.where(slots > NULL_BLOCK_ID, slots, P).astype(jnp.int32)
    zero = jnp.zeros(rows.shape, jnp.int32)
    put = partial(_put, rows)
    return ReplayCache(put(cache.checkpoint, states), cache.d, cache.k, cache.g, put(cache.write_pos, zero),
                       put(cache.cache_base, zero), put(cache.is_flush, zero))


def _put(rows, x, values):
    """``x[rows] = values`` (cast to x's dtype), rows outside ``x`` dropped."""
    return x.at[rows].set(values.astype(x.dtype), mode="drop")


# --- the replay arithmetic (one row, traced) ----------------------------------------------------------------------


def _weights(g, mask, mutant):
    """Entry weights ``exp(G_n - G_c)`` (0 where not valid) and the checkpoint's ``exp(G_n)``; ``G`` the inclusive
    cumulative sum of the valid log-decays along the last axis."""
    gm = jnp.where(mask, g, 0.0)
    G = jnp.cumsum(gm, axis=-1)
    Gn = G[..., -1:]
    w = jnp.exp(G) if mutant == "prefix_decay" else jnp.exp(Gn - G)
    return jnp.where(mask, w, 0.0), jnp.exp(Gn[..., 0])


def _apply(C, d, k, g, mask, x, mutant):
    """``S x`` for the state encoded by ``C [HV, V, K]`` and entries ``d [HV, L, V]``, ``k [HV, L, K]``, ``g [HV, L]``
    valid where ``mask [L]``: ``exp(G_n) C x + sum_c exp(G_n - G_c) (k_c . x) d_c`` (``x [HV, K]``)."""
    w, wc = _weights(g, mask, mutant)
    kx = jnp.einsum("hlk,hk->hl", k, x, precision=MATMUL_PRECISION)
    return (wc[:, None] * jnp.einsum("hvk,hk->hv", C, x, precision=MATMUL_PRECISION)
            + jnp.einsum("hl,hlv->hv", w * kx, d, precision=MATMUL_PRECISION))


def _fold(C, d, k, g, mask, mutant):
    """The encoded state ``exp(G_n) C + sum_c exp(G_n - G_c) d_c k_c^T`` ``[HV, V, K]``."""
    w, wc = _weights(g, mask, mutant)
    return wc[:, None, None] * C + jnp.einsum("hl,hlv,hlk->hvk", w, d, k, precision=MATMUL_PRECISION)


def _masked(mask, d, k, g):
    """Entries zeroed where not valid (a rejected draft's entry may hold NaN: never multiplied by a 0 weight)."""
    return (jnp.where(mask[None, :, None], d, 0.0), jnp.where(mask[None, :, None], k, 0.0),
            jnp.where(mask[None, :], g, 0.0))


def _key_map(H, HV, mutant):
    """Key head of every value head: ``hv // G`` (``hv % H`` for the ``key_per_value_head`` mutant's cache)."""
    hv = jnp.arange(HV)
    return hv % H if mutant == "key_per_value_head" else hv // (HV // H)


def _history(cache, p, base, mask_len, mutant):
    """A slot's checkpoint (float32) and ring entries in logical order ``c = 0..buf-1`` (ring position
    ``(base + c) mod buf``), the key entries per value head, masked to ``c < mask_len``."""
    H, buf = cache.k.shape[1], cache.k.shape[2]
    HV = cache.d.shape[1]
    order = (base + jnp.arange(buf)) % buf
    C = cache.checkpoint[p].astype(ACC_DTYPE)
    d = cache.d[p][:, order].astype(ACC_DTYPE)
    k = cache.k[p][_key_map(H, HV, mutant)][:, order].astype(ACC_DTYPE)
    g = cache.g[p][:, order].astype(ACC_DTYPE)
    mask = jnp.arange(buf) < mask_len
    return C, *_masked(mask, d, k, g), mask


def _token(C, d, k, g, mask, q, kt, v, gt, bt, scale, mutant):
    """One token against an encoded history: ``(o, d_t)`` (module docstring), all float32, ``q, kt [HV, K]``."""
    qs = scale * q
    Sk = _apply(C, d, k, g, mask, kt, mutant)
    Sq = _apply(C, d, k, g, mask, qs, mutant)
    alpha = jnp.exp(gt)[:, None]
    dt = bt[:, None] * (v - alpha * Sk)
    o = alpha * Sq + dt * jnp.sum(kt * qs, axis=-1)[:, None]
    return o, dt


def _live(slots, mutant):
    return slots >= 0 if mutant == "null_block_live" else slots > NULL_BLOCK_ID


def _key_rows(kt, G):
    """Value-head keys ``[..., HV, K]`` of key-head keys ``[..., H, K]``: key head ``hv // G`` (the current token's
    key is always read right, by every variant; ``key_per_value_head`` only misaddresses the cache)."""
    return jnp.repeat(kt, G, axis=-2) if G > 1 else kt


def _write_keys(kc, rows, pos, kt, H, G, mutant):
    """``kc[rows, h, pos] = kt[:, h]`` per key head; the ``key_per_value_head`` mutant writes value head ``hv``'s key
    to row ``hv % H``, value head by value head (the last writer of a row wins)."""
    if mutant != "key_per_value_head":
        return kc.at[rows[:, None], jnp.arange(H)[None, :], pos[:, None]].set(kt.astype(kc.dtype), mode="drop")
    for hv in range(H * G):
        kc = kc.at[rows, hv % H, pos].set(kt[:, hv // G].astype(kc.dtype), mode="drop")
    return kc


# --- non-speculative decode ---------------------------------------------------------------------------------------


def recurrent_step(q, k, v, g, beta, cache, slots, write_pos, *, capacity, scale=None, mutant=None):
    """One token per row ``-> (o [N, HV, V] in v.dtype, cache)``: ``o = alpha S_prev q_s + d_t (k . q_s)``; the
    token's entry goes to ring position ``write_pos``, or ``S_t`` to the checkpoint at ``write_pos == capacity - 1``.

    ``q, k [N, H, K]``, ``v [N, HV, V]``, ``g, beta [N, HV]``, ``slots [N]``, ``write_pos [N]`` (per row: tokens
    decoded since the slot was loaded, mod ``capacity``; history = entries ``0..write_pos-1``). No cursor moves.
    """
    P, H, HV, K, V, buf = _cache_dims(cache)
    N = _rows("q", q)
    _check_tokens(q, k, v, g, beta, (N,), H, HV, K, V)
    _check_array("slots", slots, (N,), integer=True)
    _check_array("write_pos", write_pos, (N,), integer=True)
    _int("capacity", capacity, 1)
    if capacity > buf:
        raise ValueError(f"capacity: {capacity} exceeds the cache's ring of {buf} entries")
    return _decode(q, k, v, g, beta, cache, slots, write_pos, capacity, _scale(scale, K), _mutant(mutant))


@partial(jax.jit, static_argnums=(8, 9, 10))
def _decode(q, k, v, g, beta, cache, slots, write_pos, capacity, scale, mutant):
    P, H, buf, _ = cache.k.shape
    HV = cache.d.shape[1]
    G = HV // H
    slots = slots.astype(jnp.int32)
    live = _live(slots, mutant)
    p = jnp.clip(jnp.where(live, slots, 0), 0, P - 1)
    n = write_pos.astype(jnp.int32)
    qf, kf, vf, bf = (x.astype(ACC_DTYPE) for x in (q, k, v, beta))
    gf = floor_log_decay(g.astype(ACC_DTYPE))
    kv, qv = _key_rows(kf, G), _key_rows(qf, G)

    def row(p, n, q, kt, v, gt, bt):
        C, d, kc, gc, mask = _history(cache, p, 0, n, mutant)
        o, dt = _token(C, d, kc, gc, mask, q, kt, v, gt, bt, scale, mutant)
        S = jnp.exp(gt)[:, None, None] * _fold(C, d, kc, gc, mask, mutant) + dt[:, :, None] * kt[:, None, :]
        return o, dt, S

    o, dt, S = jax.vmap(row)(p, n, qv, kv, vf, gf, bf)
    flush = n == (capacity if mutant == "late_flush" else capacity - 1)
    ck_rows = jnp.where(live & flush, slots, P)
    en_rows = jnp.where(live & ~flush, slots, P)
    pos = n % buf
    heads = jnp.arange(HV)[None, :]
    new = ReplayCache(
        _put(ck_rows, cache.checkpoint, S),
        cache.d.at[en_rows[:, None], heads, pos[:, None]].set(dt.astype(cache.d.dtype), mode="drop"),
        _write_keys(cache.k, en_rows, pos, kf, H, G, mutant),
        cache.g.at[en_rows[:, None], heads, pos[:, None]].set(gf, mode="drop"),
        cache.write_pos, cache.cache_base, cache.is_flush)
    o = jnp.where(live[:, None, None], o, 0.0)
    return o.astype(v.dtype), new


# --- speculative decode -------------------------------------------------------------------------------------------


def _check_spec(cache, max_cache_len, max_spec_len):
    P, H, HV, K, V, buf = _cache_dims(cache)
    _int("max_spec_len", max_spec_len, 1)
    _int("max_cache_len", max_cache_len, 1)
    if max_cache_len < max_spec_len:
        raise ValueError(f"max_cache_len: {max_cache_len} < max_spec_len = {max_spec_len}")
    if max(max_cache_len, 2 * max_spec_len) > buf:  # the most entries a window's span can hold
        raise ValueError(f"max_cache_len: the cache's ring of {buf} entries holds less than max(max_cache_len = "
                         f"{max_cache_len}, 2 * max_spec_len = {2 * max_spec_len})")
    return P, H, HV, K, V, buf


def spec_decode(q, k, v, g, beta, cache, slots, lengths, *, max_cache_len, max_spec_len, scale=None, mutant=None):
    """A speculative window per row ``-> (o [N, S, HV, V] in v.dtype, cache)``: token ``s`` sees the slot's
    committed history (folded into the checkpoint first when ``is_flush``) and window tokens ``0..s-1``; its entry
    goes to ring position ``(cache_base + write_pos + s) mod buf``.

    ``q, k [N, S, H, K]``, ``v [N, S, HV, V]``, ``g, beta [N, S, HV]`` with ``S == max_spec_len``, ``slots [N]``,
    ``lengths [N]`` (tokens run per row, 1..S; the others output 0 and write nothing). No cursor moves.
    """
    P, H, HV, K, V, buf = _check_spec(cache, max_cache_len, max_spec_len)
    N = _rows("q", q)
    if len(q.shape) != 4 or q.shape[1] != max_spec_len:
        raise ValueError(f"q: expected shape [N, max_spec_len = {max_spec_len}, {H}, {K}], got {tuple(q.shape)}")
    _check_tokens(q, k, v, g, beta, (N, max_spec_len), H, HV, K, V)
    _check_array("slots", slots, (N,), integer=True)
    _check_array("lengths", lengths, (N,), integer=True)
    return _spec_decode(q, k, v, g, beta, cache, slots, lengths, _scale(scale, K), _mutant(mutant))


@partial(jax.jit, static_argnums=(8, 9))
def _spec_decode(q, k, v, g, beta, cache, slots, lengths, scale, mutant):
    P, H, buf, _ = cache.k.shape
    N, S, HV, V = v.shape
    G = HV // H
    slots = slots.astype(jnp.int32)
    live = _live(slots, mutant)
    p = jnp.clip(jnp.where(live, slots, 0), 0, P - 1)
    wp = jnp.where(live, cache.write_pos[p], 0)
    base = jnp.where(live, cache.cache_base[p], 0)
    fl = live & (cache.is_flush[p] != 0)
    qf, kf, vf, bf = (x.astype(ACC_DTYPE) for x in (q, k, v, beta))
    gf = floor_log_decay(g.astype(ACC_DTYPE))
    kv, qv = _key_rows(kf, G), _key_rows(qf, G)
    cd = cache.d.dtype

    def row(p, wp, base, fl, q, kt, v, gt, bt):
        C, d, kc, gc, mask = _history(cache, p, base, wp, mutant)
        folded = _fold(C, d, kc, gc, mask, mutant).astype(cache.checkpoint.dtype)
        C = jnp.where(fl, folded.astype(ACC_DTYPE), C)
        mask = mask & ~fl
        d, kc, gc = _masked(mask, d, kc, gc)
        win = jnp.arange(S)

        def step(carry, xs):
            wd, wk, wg = carry
            s, q_s, k_s, v_s, g_s, b_s = xs
            wmask = jnp.concatenate([mask, win < s])
            ed, ek, eg = _masked(wmask, jnp.concatenate([d, wd], 1), jnp.concatenate([kc, wk], 1),
                                 jnp.concatenate([gc, wg], 1))
            o, dt = _token(C, ed, ek, eg, wmask, q_s, k_s, v_s, g_s, b_s, scale, mutant)
            # later window tokens read this entry as it is stored (rounded to cache_dtype), as after a commit
            wd = wd.at[:, s].set(dt.astype(cd).astype(ACC_DTYPE))
            wk = wk.at[:, s].set(k_s.astype(cd).astype(ACC_DTYPE))
            wg = wg.at[:, s].set(g_s)
            return (wd, wk, wg), (o, dt)

        init = (jnp.zeros((HV, S, V), ACC_DTYPE), jnp.zeros((HV, S, kt.shape[-1]), ACC_DTYPE),
                jnp.zeros((HV, S), ACC_DTYPE))
        _, (o, dt) = jax.lax.scan(step, init, (win, q, kt, v, gt, bt))
        return o, dt, folded

    o, dt, folded = jax.vmap(row)(p, wp, base, fl, qv, kv, vf, gf, bf)
    active = live[:, None] & (jnp.arange(S)[None, :] < lengths.astype(jnp.int32)[:, None])  # [N, S]
    en_rows = jnp.where(active, slots[:, None], P)  # [N, S]
    pos = (base + wp)[:, None] + jnp.arange(S)[None, :]
    pos = pos % buf
    heads = jnp.arange(HV)[None, None, :]
    dcache = cache.d.at[en_rows[..., None], heads, pos[..., None]].set(dt.astype(cd), mode="drop")
    gcache = cache.g.at[en_rows[..., None], heads, pos[..., None]].set(gf, mode="drop")
    kcache = _write_keys(cache.k, en_rows.reshape(-1), pos.reshape(-1), kf.reshape(N * S, H, -1), H, G, mutant)
    new = ReplayCache(_put(jnp.where(fl, slots, P), cache.checkpoint, folded), dcache, kcache, gcache,
                      cache.write_pos, cache.cache_base, cache.is_flush)
    o = jnp.where(active[..., None, None], o, 0.0)
    return o.astype(v.dtype), new


# --- cursors ------------------------------------------------------------------------------------------------------


def commit(cache, num_accepted, slots, *, max_cache_len, max_spec_len, mutant=None):
    """Cursors after a window with ``num_accepted`` accepted tokens (0..S, bonus included): after a flush
    ``cache_base += write_pos`` (mod buf) and ``write_pos = acc``, else ``write_pos += acc``; then
    ``is_flush = write_pos + 2 max_spec_len > max_cache_len``."""
    _check_spec(cache, max_cache_len, max_spec_len)
    N = _rows("slots", slots)
    _check_array("slots", slots, (N,), integer=True)
    _check_array("num_accepted", num_accepted, (N,), integer=True)
    return _commit(cache, num_accepted, slots, max_cache_len, max_spec_len, _mutant(mutant))


@partial(jax.jit, static_argnums=(3, 4, 5))
def _commit(cache, num_accepted, slots, max_cache_len, max_spec_len, mutant):
    P, _, buf, _ = cache.k.shape
    slots = slots.astype(jnp.int32)
    live = _live(slots, mutant)
    p = jnp.clip(jnp.where(live, slots, 0), 0, P - 1)
    rows = jnp.where(live, slots, P)
    acc = num_accepted.astype(jnp.int32)
    if mutant == "cursor_all_drafts":
        acc = jnp.full_like(acc, max_spec_len)
    wp, base, fl = cache.write_pos[p], cache.cache_base[p], cache.is_flush[p] != 0
    if mutant != "base_not_advanced":
        base = jnp.where(fl & (acc > 0), (base + wp) % buf, base)
    wp = jnp.where(fl, acc, wp + acc)
    flag = (wp + 2 * max_spec_len > max_cache_len).astype(jnp.int32)
    return cache._replace(write_pos=_put(rows, cache.write_pos, wp), cache_base=_put(rows, cache.cache_base, base),
                          is_flush=_put(rows, cache.is_flush, flag))


def reset(cache, slots, *, max_cache_len, max_spec_len):
    """Cursors of a request's first speculative step: ``write_pos = cache_base = 0``,
    ``is_flush = 2 max_spec_len > max_cache_len``."""
    _check_spec(cache, max_cache_len, max_spec_len)
    N = _rows("slots", slots)
    _check_array("slots", slots, (N,), integer=True)
    return _reset(cache, slots, int(2 * max_spec_len > max_cache_len))


@partial(jax.jit, static_argnums=(2,))
def _reset(cache, slots, flag):
    P = cache.checkpoint.shape[0]
    rows = jnp.where(slots.astype(jnp.int32) > NULL_BLOCK_ID, slots, P)
    zero = jnp.zeros(rows.shape, jnp.int32)
    put = partial(_put, rows)
    return cache._replace(write_pos=put(cache.write_pos, zero), cache_base=put(cache.cache_base, zero),
                          is_flush=put(cache.is_flush, zero + flag))


__all__ = ["DTYPES", "MUTANTS", "NULL_BLOCK_ID", "ReplayCache", "commit", "load", "new_cache", "recurrent_step",
           "reset", "ring_size", "spec_decode"]
