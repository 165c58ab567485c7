"""GDN-2 decode (serving) kernel in JAX: a state pool, slot indices, packed and speculative steps.

The serving contract (docs/DESIGN.md, "Decode contract (serving)"; pinned from FLA 0.6.0
``fla/ops/gdn2/fused_recurrent.py``, ``fused_recurrent_gdn2_fwd`` with ``ssm_state_indices``,
``num_accepted_tokens``, ``inplace_final_state=True``)::

    o, new_pool = decode(q, k, v, g, b, w, *, state_pool, state_indices, cu_seqlens=None,
                         num_accepted_tokens=None, scale=None)

* Grouped value heads (docs/DESIGN.md §1): ``q, k: [B, T, H, K]``, ``g, b: [B, T, HV, K]``, ``v, w: [B, T, HV, V]``
  with ``HV = G H``; value head ``hv`` reads key head ``hv // G`` (:meth:`DecodeKernel.key_heads`). ``HV == H`` is
  the plain layout.
* ``state_pool: [P, HV, K, V]`` in the kernel's ``state_dtype`` (float32; ``decode_kernel(state_dtype=
  "bfloat16" | "float16")`` stores the state in that dtype between calls: read and upcast at the start of a
  call, carried in float32 through the call's tokens, rounded at every store, as FLA does with a bf16 pool).
* Without ``cu_seqlens`` every batch row is a sequence of T tokens; with ``cu_seqlens [N+1]`` (B = 1) sequence
  n is tokens ``cu[n]:cu[n+1]`` of the packed axis.
* ``state_indices [N]``: sequence n starts from slot ``idx[n]``; its final state is written back there.
* ``state_indices [N, S]`` (speculative): it starts from ``idx[n, a_n - 1]`` (``a_n`` =
  ``num_accepted_tokens[n]``, the previous call's accepted tokens, 1 when not given) and the state after its
  token t is written to ``idx[n, t]``.
* Index -1: padding (nothing read or written, outputs 0; at a draft column: that state is not written).
* The pool update is functional (a new pool comes back; every slot not written is bit-identical).

Called as the training contract (docs/DESIGN.md §2) -- no ``state_pool`` -- it runs each batch row from
``initial_state`` (zeros when absent, stored in ``state_dtype``) and returns ``(o, final_state float32)``;
then it is differentiable (a token-by-token scan), so the suite's harness can validate it like any kernel.

Shape and dtype checks are static; value checks (slot ranges, slot collisions, accepted counts, offsets,
finiteness of what is read) force a host sync and run with ``check_values=True``. Without them, invalid
indices give unspecified (but finite-time, in-bounds) results. Everything is pure JAX and jit-able.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from .contract import ACC_DTYPE, MATMUL_PRECISION, STORAGE_DTYPES, Shape, check_inputs, floor_log_decay, storage_dtype

STATE_DTYPES = STORAGE_DTYPES
PAD_SLOT = -1


def _mm(spec, a, b):
    return jnp.einsum(spec, a, b, precision=MATMUL_PRECISION)


def _is_int_array(x):
    return hasattr(x, "dtype") and hasattr(x, "shape") and jnp.issubdtype(x.dtype, jnp.integer)


class DecodeKernel:
    """The decode kernel with the serving contract (module docstring); options fixed at construction.

    The methods :meth:`read_slots`, :meth:`address`, :meth:`carry` and :meth:`key_heads` are the bookkeeping steps
    that ``kernels/testing_decode.py`` overrides to build deliberately wrong kernels.
    """

    name = "decode"

    def __init__(self, state_dtype="float32", o_dtype=None):
        self.state_dtype = storage_dtype("state_dtype", state_dtype)
        if o_dtype not in (None, "float16"):
            raise ValueError(f"o_dtype: expected None (v's dtype) or 'float16', got {o_dtype!r}")
        self.o_dtype = o_dtype  # "float16": an fp16 output buffer beside a float32 state (serving calls)

    def __repr__(self):
        extra = f", o_dtype={self.o_dtype!r}" if self.o_dtype else ""
        return f"{type(self).__name__}(state_dtype={self.state_dtype!r}{extra})"

    # --- bookkeeping hooks (traced) ----------------------------------------------------------------------
    def read_slots(self, indices, accepted):
        """Starting slot of every sequence: ``idx[n]``, or ``idx[n, a_n - 1]`` with a draft axis."""
        if indices.ndim == 1:
            return indices
        col = jnp.ones(indices.shape[:1], indices.dtype) if accepted is None else accepted.astype(indices.dtype)
        col = jnp.clip(col - 1, 0, indices.shape[1] - 1)
        return jnp.take_along_axis(indices, col[:, None], axis=1)[:, 0]

    def address(self, slots, P):
        """Pool row of a slot index; padding (-1) maps to P, outside the pool (never read, writes dropped)."""
        return jnp.where(slots < 0, P, slots)

    def carry(self, S):
        """The running state between tokens of one call: float32 (FLA keeps it in registers)."""
        return S

    def key_heads(self, x, G):
        """Key-head tokens ``[..., H, K]`` to the value heads ``[..., G H, K]``: value head ``hv`` reads key head
        ``hv // G`` (FLA: ``i_h = i_hv // (HV // H)``)."""
        return x if G == 1 else jnp.repeat(x, G, axis=-2)

    # --- calls --------------------------------------------------------------------------------------------
    def __call__(self, q, k, v, g, b, w, *, state_pool=None, state_indices=None, cu_seqlens=None,
                 num_accepted_tokens=None, scale=None, initial_state=None, check_values=False):
        """Serving call ``-> (o [B, T, HV, V] in v.dtype, new_pool)``; without ``state_pool`` the training
        contract ``-> (o, final_state [B, HV, K, V] float32)`` (module docstring)."""
        if state_pool is None:
            return self._contract_call(q, k, v, g, b, w, state_indices, cu_seqlens, num_accepted_tokens, scale,
                                       initial_state, check_values)
        if initial_state is not None:
            raise ValueError("initial_state: not used with state_pool (the pool holds the states)")
        shape, scale, lmax = self.check(q, k, v, g, b, w, state_pool=state_pool, state_indices=state_indices,
                                        cu_seqlens=cu_seqlens, num_accepted_tokens=num_accepted_tokens, scale=scale)
        if check_values:
            check_values_host(shape, q, k, v, g, b, w, state_pool, state_indices, cu_seqlens, num_accepted_tokens)
        o, pool = _run(self, scale, lmax, q, k, v, g, b, w, state_pool, state_indices, cu_seqlens,
                       num_accepted_tokens)
        return (o.astype(jnp.float16) if self.o_dtype else o), pool

    def _contract_call(self, q, k, v, g, b, w, state_indices, cu_seqlens, num_accepted_tokens, scale,
                       initial_state, check_values):
        for name, x in (("state_indices", state_indices), ("cu_seqlens", cu_seqlens),
                        ("num_accepted_tokens", num_accepted_tokens)):
            if x is not None:
                raise ValueError(f"{name}: needs state_pool (without it the call is the training contract)")
        (B, T, _, K, V), HV, scale = check_grouped(q, k, v, g, b, w, scale=scale, initial_state=initial_state,
                                                   check_values=check_values)
        h0 = jnp.zeros((B, HV, K, V), ACC_DTYPE) if initial_state is None else initial_state
        pool = h0.astype(self.state_dtype)
        o, pool = _run(self, scale, T, q, k, v, g, b, w, pool, jnp.arange(B, dtype=jnp.int32), None, None)
        return o, pool.astype(ACC_DTYPE)

    def check(self, q, k, v, g, b, w, *, state_pool, state_indices, cu_seqlens=None, num_accepted_tokens=None,
              scale=None):
        """Static checks of a serving call: ``(Shape, scale, lmax)`` (lmax: static token-loop bound or None)."""
        shape, HV, scale = check_grouped(q, k, v, g, b, w, scale=scale)
        B, T, H, K, V = shape
        if not hasattr(state_pool, "shape") or not hasattr(state_pool, "dtype"):
            raise ValueError(f"state_pool: expected an array, got {type(state_pool).__name__}")
        if state_pool.ndim != 4 or tuple(state_pool.shape[1:]) != (HV, K, V) or state_pool.shape[0] == 0:
            heads = "H" if HV == H else "HV"
            raise ValueError(f"state_pool: expected shape [P >= 1, {heads}, K, V] = [P, {HV}, {K}, {V}], "
                             f"got {tuple(state_pool.shape)}")
        if jnp.dtype(state_pool.dtype).name != self.state_dtype:
            raise ValueError(f"state_pool: dtype {state_pool.dtype} is not the kernel's state_dtype "
                             f"{self.state_dtype}")
        if not _is_int_array(state_indices) or state_indices.ndim not in (1, 2):
            raise ValueError("state_indices: expected an integer array of shape [N] or [N, S], got "
                             f"{getattr(state_indices, 'dtype', type(state_indices).__name__)} "
                             f"{tuple(getattr(state_indices, 'shape', ()))}")
        if cu_seqlens is None:
            N, lmax = B, T
        else:
            if not _is_int_array(cu_seqlens) or cu_seqlens.ndim != 1 or cu_seqlens.shape[0] < 2:
                raise ValueError("cu_seqlens: expected an integer array [N + 1] with N >= 1, got "
                                 f"{getattr(cu_seqlens, 'dtype', type(cu_seqlens).__name__)} "
                                 f"{tuple(getattr(cu_seqlens, 'shape', ()))}")
            if B != 1:
                raise ValueError(f"cu_seqlens: packed sequences need batch size 1, got B = {B}")
            N, lmax = cu_seqlens.shape[0] - 1, None
        if state_indices.shape[0] != N:
            raise ValueError(f"state_indices: expected {N} rows (one per sequence), got {tuple(state_indices.shape)}")
        if state_indices.ndim == 2:
            if state_indices.shape[1] == 0:
                raise ValueError("state_indices: no draft columns")
            if cu_seqlens is None and state_indices.shape[1] < T:
                raise ValueError(f"state_indices: {T} tokens per sequence but only {state_indices.shape[1]} "
                                 "draft slots")
        if num_accepted_tokens is not None:
            if state_indices.ndim != 2:
                raise ValueError("num_accepted_tokens: needs state_indices of shape [N, S] (one slot per draft)")
            if not _is_int_array(num_accepted_tokens) or tuple(num_accepted_tokens.shape) != (N,):
                raise ValueError(f"num_accepted_tokens: expected an integer array of shape {(N,)}, got "
                                 f"{getattr(num_accepted_tokens, 'dtype', '?')} "
                                 f"{tuple(getattr(num_accepted_tokens, 'shape', ()))}")
        return shape, scale, lmax


def check_grouped(q, k, v, g, b, w, *, scale=None, initial_state=None, check_values=False):
    """``contract.check_inputs`` with grouped value heads: ``q, k [B, T, H, K]``, the rest and the state with
    ``HV`` (v's) heads, a multiple of ``H``. Returns ``((B, T, H, K, V), HV, scale)``; ValueError naming the
    argument."""
    for name, x in (("q", q), ("v", v)):
        if not hasattr(x, "shape") or len(x.shape) != 4:
            raise ValueError(f"{name}: expected rank 4 [B, T, heads, dim], got {tuple(getattr(x, 'shape', ()))}")
    H, HV = q.shape[2], v.shape[2]
    if H == 0 or HV % H:
        raise ValueError(f"v: {HV} value heads is not a positive multiple of q's {H} key heads")
    G = HV // H
    if G > 1:
        if not hasattr(k, "shape") or tuple(k.shape) != tuple(q.shape):
            raise ValueError(f"k: shape {tuple(getattr(k, 'shape', ()))} != q's {tuple(q.shape)}")
        grouped = tuple(q.shape[:2]) + (HV, q.shape[3])
        # the contract's checks on the value heads (values repeated only when they are checked)
        q, k = ((jnp.repeat(x, G, axis=2) if check_values else jax.ShapeDtypeStruct(grouped, x.dtype))
                for x in (q, k))
    (B, T, _, K, V), scale = check_inputs(q, k, v, g, b, w, scale=scale, initial_state=initial_state,
                                          check_values=check_values)
    return Shape(B, T, H, K, V), HV, scale


@partial(jax.jit, static_argnums=(0, 1, 2))
def _run(kern, scale, lmax, q, k, v, g, b, w, pool, indices, cu, accepted):
    """All sequences in parallel, one token position per loop step (``lmax`` static, else max T_n)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    P = pool.shape[0]
    N = indices.shape[0]
    g = floor_log_decay(g)
    xs = [x.astype(ACC_DTYPE).reshape(B * T, x.shape[2], x.shape[-1]) for x in (q, k, v, g, b, w)]
    xs[0], xs[1] = kern.key_heads(xs[0], HV // H), kern.key_heads(xs[1], HV // H)
    if cu is None:
        bos = jnp.arange(N, dtype=jnp.int32) * T
        length = jnp.full((N,), T, jnp.int32)
    else:
        cu = cu.astype(jnp.int32)
        bos, length = cu[:-1], cu[1:] - cu[:-1]
    indices = indices.astype(jnp.int32)
    start = kern.address(kern.read_slots(indices, accepted), P)
    live = (length > 0) & (start < P)
    S = jnp.where(live[:, None, None, None], pool[jnp.minimum(start, P - 1)].astype(ACC_DTYPE), 0.0)
    o = jnp.zeros((B * T, HV, V), ACC_DTYPE)

    def body(t, carry):
        S, o, pool = carry
        active = live & (t < length)
        pos = jnp.where(active, bos + t, 0)
        q_t, k_t, v_t, g_t, b_t, w_t = (x[pos] for x in xs)
        Sn = S * jnp.exp(g_t)[..., :, None]
        u = w_t * v_t - _mm("nhk,nhkv->nhv", b_t * k_t, Sn)
        Sn = kern.carry(Sn + k_t[..., :, None] * u[..., None, :])
        S = jnp.where(active[:, None, None, None], Sn, S)
        o = o.at[jnp.where(active, bos + t, B * T)].set(scale * _mm("nhk,nhkv->nhv", q_t, S), mode="drop")
        if indices.ndim == 2:  # one slot per draft token: the state after token t goes to idx[n, t]
            col = jnp.minimum(t, indices.shape[1] - 1)
            slots = jnp.where(active, kern.address(indices[:, col], P), P)
            pool = pool.at[slots].set(S.astype(pool.dtype), mode="drop")
        return S, o, pool

    stop = lmax if lmax is not None else jnp.max(jnp.where(live, length, 0))
    S, o, pool = jax.lax.fori_loop(0, stop, body, (S, o, pool))
    if indices.ndim == 1:  # one slot per sequence: its final state goes back to it
        pool = pool.at[jnp.where(live, kern.address(indices, P), P)].set(S.astype(pool.dtype), mode="drop")
    return o.reshape(B, T, HV, V).astype(v.dtype), pool


def check_values_host(shape, q, k, v, g, b, w, state_pool, state_indices, cu_seqlens=None,
                      num_accepted_tokens=None):
    """Value checks of a serving call (host sync): offsets, slot ranges and collisions, accepted counts,
    finiteness of what a live sequence reads, g <= 0. ValueError naming the argument."""
    B, T, H, K, V = shape
    P = state_pool.shape[0]
    idx = np.asarray(state_indices).astype(np.int64)
    if cu_seqlens is None:
        bounds = [(n, 0, T) for n in range(B)]
    else:
        cu = np.asarray(cu_seqlens).astype(np.int64)
        if cu[0] != 0 or cu[-1] != T or np.any(np.diff(cu) < 0):
            raise ValueError(f"cu_seqlens: expected nondecreasing offsets from 0 to T = {T}, got {cu.tolist()}")
        bounds = [(0, int(cu[n]), int(cu[n + 1])) for n in range(cu.size - 1)]
    if np.any(idx < PAD_SLOT) or np.any(idx >= P):
        bad = idx[(idx < PAD_SLOT) | (idx >= P)]
        raise ValueError(f"state_indices: slot {int(bad[0])} out of range (-1 for padding, else 0..{P - 1})")
    acc = None if num_accepted_tokens is None else np.asarray(num_accepted_tokens).astype(np.int64)
    arrays = dict(q=q, k=k, v=v, g=g, b=b, w=w)
    host = {name: np.asarray(jnp.asarray(x, ACC_DTYPE)) for name, x in arrays.items()}
    pool = np.asarray(jnp.asarray(state_pool, ACC_DTYPE))
    owner = {}
    for n, (row, lo, hi) in enumerate(bounds):
        if hi == lo:
            continue
        if idx.ndim == 2:
            a = 1 if acc is None else int(acc[n])
            if not 1 <= a <= idx.shape[1]:
                raise ValueError(f"num_accepted_tokens: sequence {n} has {a}; expected 1..{idx.shape[1]}")
            if hi - lo > idx.shape[1]:
                raise ValueError(f"state_indices: sequence {n} has {hi - lo} tokens but only {idx.shape[1]} "
                                 "draft slots")
            read = int(idx[n, a - 1])
            touched = {read, *(int(s) for s in idx[n, :hi - lo] if s != PAD_SLOT)}
        else:
            read = int(idx[n])
            touched = {read}
        if read == PAD_SLOT:
            continue
        for slot in touched:
            if owner.setdefault(slot, n) != n:
                raise ValueError(f"state_indices: slot {slot} is used by live sequences {owner[slot]} and {n}")
        if not np.all(np.isfinite(pool[read])):
            raise ValueError(f"state_pool: slot {read} (read by sequence {n}) contains NaN or inf")
        for name, x in host.items():
            seg = x[row, lo:hi]
            if idx.ndim == 1 and not np.all(np.isfinite(seg)):
                raise ValueError(f"{name}: contains NaN or inf (sequence {n})")
            if name == "g" and np.any(seg > 0):
                raise ValueError(f"g: log-decay must be <= 0 (found a positive entry in sequence {n})")


def decode_kernel(state_dtype="float32", o_dtype=None):
    """Factory (for ``kernels.register``): the decode kernel storing the state in ``state_dtype`` between calls
    (``"float32"``, ``"bfloat16"`` or ``"float16"``); ``o_dtype="float16"`` writes its serving outputs to a float16
    buffer (whose range, 65504, a large output overflows)."""
    return DecodeKernel(state_dtype, o_dtype)


_DEFAULT = DecodeKernel()


def decode(q, k, v, g, b, w, *, state_pool, state_indices, cu_seqlens=None, num_accepted_tokens=None, scale=None,
           check_values=False):
    """One decode call with a float32 state pool: ``(o [B, T, HV, V] in v.dtype, new_pool [P, HV, K, V])``."""
    return _DEFAULT(q, k, v, g, b, w, state_pool=state_pool, state_indices=state_indices, cu_seqlens=cu_seqlens,
                    num_accepted_tokens=num_accepted_tokens, scale=scale, check_values=check_values)
