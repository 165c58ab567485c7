"""Context-parallel GDN-2: the sequence sharded over a mesh axis, the state handed from device to device exactly.

Per device (``shard_map``; ``seq`` shards T, ``data`` shards B, ``heads`` shards H, other axes replicate):

1. **Augmented pass.** The chunked kernel (kernels/chunked.py) runs once on the device's slice with the
   augmented state ``[I | 0]`` (``K x (K + V)``) and values ``[0 | v]``, gates ``[0 | w]``. Every column of the
   state obeys the same recurrence, linear in the state (``S_C = (Diag(gamma_C) - Kd^T Y) S0 + Kd^T U``), so the
   leaving state is ``[M | S_local]`` and the outputs are ``[Qin | o_local]``: ``M`` the product of the slice's
   WY chunk transitions (the identity basis pushed through the chunk recurrence; every factor is an ``exp`` of
   a non-positive exponent, so it stays finite under any decay and resets), ``Qin`` (``L x K``) each token's
   output response to the entering state (in a chunk ``scale (gamma q - Aqk Y)`` times the transitions of the
   chunks before it), ``S_local`` and ``o_local`` the slice's state and outputs from zero.
   Cost: one chunked pass of width ``K + V`` (the score tiles and the WY solve once).
2. **Combine.** ``all_gather`` of ``(M, S_local)`` over ``seq``, then a sequential prefix
   ``S_in(p) = M_{p-1} S_in(p-1) + S_local(p-1)`` from ``S_in(0) = h0`` on every device (terms of devices at or
   after its own are masked out): one collective round instead of ``P - 1`` dependent ``ppermute`` hops, at
   ``P (K^2 V)`` flops and ``P K (K + V)`` floats per (batch, head) — small next to the chunk work while
   ``P K`` is below the slice length.
3. **Affine correction.** ``o = o_local + Qin S_in`` and ``S_out = M S_in + S_local`` (the final state is the
   last device's): two matrix products, ``L K V + K^2 V`` flops per (batch, head), exact up to rounding.

Backward: JAX differentiates through ``shard_map``, the chunked kernel's own ``custom_vjp`` (one pass of
width ``K + V``), ``all_gather`` (transposed to a reduce-scatter), the prefix scan and the two products.
T is padded at the end to ``P * ceil(T / P)`` with identity tokens (all-zero inputs: g = 0, k = b = w = 0
leave the state unchanged); B and H are padded with zero elements to multiples of their axes' sizes.

**Packed sequences** (``cu_seqlens [N+1]``, B == 1, ``initial_state`` and final state ``[N, H, K, V]``; FLA's
convention, the only mode keyword these kernels accept). Each slice runs kernels/varlen.py's packed chunk pass
(``varlen.packed_pass``: a reset in the chunk form, not padding) in the augmented form above on its local offsets
``clip(cu - t_p, 0, L)``: a sequence that began before the slice, or begins at its first token, continues from the
entering state; one that begins inside gets ``RESET`` and its ``h0[n]`` by linearity (``[0 | h0[n]]``, a constant,
no ``S_in`` column), so from a local start on the ``Qin`` rows and ``M`` are exactly 0. The combine takes
``S_in(p) = h0[n]`` where the slice's first token ``t_p`` starts sequence n (``S_in(0)`` too), else the prefix
above, so a sequence spanning any number of devices is chained. Final states: sequence n's ``[M_e | S_e]`` after its
last token e, read on the device holding e (``varlen.states_after``), is ``M_e S_in + S_e``; summed over ``seq``
(each end is on one device; an empty sequence returns ``h0[n]``). The identity tokens padding T belong to the
sequence holding token T - 1. Each device handles only the sequences starting or ending in its slice (consecutive
in n; a static slot count from host offsets, N for device or traced ones), so one program serves every packing with
the same N, T and slot count. B is not sharded (``data`` replicates); ``heads`` shards H as above.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from . import chunked, kernel, varlen
from .contract import ACC_DTYPE, CHUNK_SIZE, MATMUL_PRECISION, check_finite_values, check_inputs, floor_log_decay
from .modes import check_cu_seqlens, check_state

# Mesh axis names and the dimension each shards (other axes of a mesh replicate the work).
SEQ_AXIS, BATCH_AXIS, HEAD_AXIS = "seq", "data", "heads"
AXIS_ROLES = {SEQ_AXIS: "T (sequence)", BATCH_AXIS: "B (batch)", HEAD_AXIS: "H (heads)"}


def current_mesh(mesh=None):
    """``mesh`` if given, else the mesh set by ``jax.set_mesh``, else a 1-D ``seq`` mesh over every device."""
    if mesh is not None:
        return mesh
    ctx = jax.sharding.get_abstract_mesh()
    if not ctx.empty:
        return ctx
    return jax.make_mesh((jax.device_count(),), (SEQ_AXIS,), axis_types=(jax.sharding.AxisType.Auto,))


def _axis(mesh, name):
    """``name`` if the mesh has that axis with more than one device, else None (not sharded)."""
    return name if dict(mesh.shape).get(name, 1) > 1 else None


def _size(mesh, name):
    """Number of devices along axis ``name`` (1 if the mesh has no such axis)."""
    return dict(mesh.shape).get(name, 1)


def _pad_to(x, axis, n):
    """Zero-pad ``x`` at the end of ``axis`` to length ``n``."""
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, n - x.shape[axis])
    return jnp.pad(x, pad)


def _entering_state(h0, M, S_local):
    """S_in of this device: the prefix S <- M_j S + S_local_j over the devices j before it, from h0."""
    Ms = jax.lax.all_gather(M, SEQ_AXIS)  # [P, b, h, K, K]
    Ss = jax.lax.all_gather(S_local, SEQ_AXIS)  # [P, b, h, K, V]
    me = jax.lax.axis_index(SEQ_AXIS)

    def step(S, inp):
        j, Mj, Sj = inp
        return jnp.where(j < me, _leaving_state(Mj, Sj, S), S), None

    S_in, _ = jax.lax.scan(step, h0, (jnp.arange(Ms.shape[0]), Ms, Ss))
    return S_in


def _slice(cfg, seq_sharded, q, k, v, g, b, w, h0):
    """One device's slice ``[b, L, h, dim]``: augmented pass, combine over ``seq``, affine correction."""
    L = q.shape[1]
    xs = [chunked.to_chunks(x, cfg.chunk_size) for x in (q, k, v, g, b, w)]
    if not seq_sharded:
        o, hT = chunked.chunked_core(cfg, *xs, h0)
        return chunked.from_chunks(o, L), hT[None]
    qc, kc, vc, gc, bc, wc = xs
    K = kc.shape[-1]
    zk = jnp.zeros_like(kc)
    eye = jnp.broadcast_to(jnp.eye(K, dtype=ACC_DTYPE), h0.shape[:-1] + (K,))
    basis = jnp.concatenate([eye, jnp.zeros(h0.shape, ACC_DTYPE)], axis=-1)
    QO, MS = chunked.chunked_core(cfg, qc, kc, jnp.concatenate([zk, vc], -1), gc, bc,
                                  jnp.concatenate([zk, wc], -1), basis)
    M, S_local = MS[..., :K], MS[..., K:]
    S_in = _entering_state(h0, M, S_local)
    o = _correct_outputs(QO[..., :K], QO[..., K:], S_in)
    return chunked.from_chunks(o, L), _leaving_state(M, S_local, S_in)[None]


def _correct_outputs(Qin, o_local, S_in):
    """o = o_local + Qin S_in: the outputs are affine in the entering state (``Qin``: [N, b, h, C, K])."""
    return o_local + jnp.einsum("nbhck,bhkv->nbhcv", Qin, S_in, precision=MATMUL_PRECISION)


def _leaving_state(M, S_local, S_in):
    """S_out = M S_in + S_local: a slice's leaving state from its entering state."""
    return jnp.einsum("...ij,...jv->...iv", M, S_in, precision=MATMUL_PRECISION) + S_local


@partial(jax.jit, static_argnums=(0, 1))
def _run(cfg, mesh, q, k, v, g, b, w, h0):
    """Floor g, pad T/B/H to the mesh, run ``_slice`` under shard_map, unpad; o in v.dtype, state float32."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    if h0 is None:
        h0 = jnp.zeros((B, H, K, V), ACC_DTYPE)
    g = floor_log_decay(g)
    P = _size(mesh, SEQ_AXIS)
    Tp = P * -(-T // P)
    Bp = _size(mesh, BATCH_AXIS) * -(-B // _size(mesh, BATCH_AXIS))
    Hp = _size(mesh, HEAD_AXIS) * -(-H // _size(mesh, HEAD_AXIS))
    xs = [_pad_to(_pad_to(_pad_to(x.astype(ACC_DTYPE), 1, Tp), 0, Bp), 2, Hp) for x in (q, k, v, g, b, w)]
    h0p = _pad_to(_pad_to(h0.astype(ACC_DTYPE), 0, Bp), 1, Hp)
    seq, data, heads = (_axis(mesh, a) for a in (SEQ_AXIS, BATCH_AXIS, HEAD_AXIS))
    x_spec, h_spec = PartitionSpec(data, seq, heads, None), PartitionSpec(data, heads, None, None)
    # check_vma=False: the chunked kernel's loops (kernels/wy.py) start from constants, not typed per axis
    f = jax.shard_map(partial(_slice, cfg, seq is not None), mesh=mesh, in_specs=(x_spec,) * 6 + (h_spec,),
                      out_specs=(x_spec, PartitionSpec(seq, data, heads, None, None)), check_vma=False)
    o, hT = f(*xs, h0p)
    return o[:B, :T, :H].astype(v.dtype), hT[-1, :B, :H]


def _holder(cu, t):
    """The sequence holding token ``t`` (a non-empty one: ``cu[n] <= t < cu[n+1]``), for ``t < cu[N]``."""
    return jnp.minimum(jnp.searchsorted(cu[1:], t, side="right"), cu.shape[0] - 2)


def _packed_entering_state(cu, L, h0, M, S_local):
    """S_in of this device with packed sequences: a device whose first token starts a sequence n takes ``h0[n]``,
    any other the prefix ``M_{p-1} S_in(p-1) + S_local(p-1)`` (``cu`` padded to the slices: :func:`_run_packed`)."""
    Ms = jax.lax.all_gather(M, SEQ_AXIS)  # [P, 1, h, K, K]
    Ss = jax.lax.all_gather(S_local, SEQ_AXIS)  # [P, 1, h, K, V]
    me = jax.lax.axis_index(SEQ_AXIS)
    t = jnp.arange(Ms.shape[0]) * L  # each device's first token
    n = _holder(cu, t)
    starts = cu[n] == t  # always on device 0
    H0 = jnp.zeros((t.shape[0],) + S_local.shape, ACC_DTYPE) if h0 is None else h0[n][:, None]

    def step(S, inp):
        j, start, Hj, Mp, Sp = inp  # Mp, Sp: device j - 1's
        return jnp.where(j <= me, jnp.where(start, Hj, _leaving_state(Mp, Sp, S)), S), None

    rolled = (jnp.roll(Ms, 1, axis=0), jnp.roll(Ss, 1, axis=0))
    S_in, _ = jax.lax.scan(step, jnp.zeros_like(S_local), (jnp.arange(t.shape[0]), starts, H0, *rolled))
    return S_in


def _packed_slice(cfg, T, slots, cu, cu_pad, q, k, v, g, b, w, h0=None):
    """One device's slice ``[1, L, h, dim]`` of a packed row: ``(o, F [1, N, h, K, V])``, F the final states of the
    sequences whose last token is here (zeros elsewhere). ``cu_pad``: ``cu`` padded to the slices; h0 ``[N, h, K, V]``;
    ``slots``: at most this many sequences start inside a slice, and as many end in one (:func:`_slots`).
    """
    L = q.shape[1]
    C = cfg.chunk_size
    N = cu.shape[0] - 1
    t0 = jax.lax.axis_index(SEQ_AXIS) * L
    cu_local = jnp.clip(cu_pad - t0, 0, L)  # a sequence entering from before the slice or at its start: 0
    pk = varlen.packing(cu_local, L, C)
    qc, kc, vc, gc, bc, wc = (chunked.to_chunks(x, C) for x in (q, k, v, g, b, w))
    K = kc.shape[-1]
    zk = jnp.zeros_like(kc)
    basis = jnp.concatenate([jnp.broadcast_to(jnp.eye(K, dtype=ACC_DTYPE), (1, q.shape[2], K, K)),
                             jnp.zeros((1, q.shape[2], K, v.shape[-1]), ACC_DTYPE)], axis=-1)
    h0a = None if h0 is None else jnp.concatenate([jnp.zeros(h0.shape[:-1] + (K,), ACC_DTYPE), h0], axis=-1)
    # the sequences starting inside the slice (t0 < cu[n] < t0 + L) are consecutive; -1 matches no token
    first = jnp.searchsorted(cu_pad[:-1], t0, side="right") + jnp.arange(slots)
    starting = jnp.where(first < N, first, -1)
    QO, MS, S0s, R, G = varlen.packed_pass(cfg, pk, cu_local, qc, kc, jnp.concatenate([zk, vc], -1), gc, bc,
                                           jnp.concatenate([zk, wc], -1), basis, h0a, starting)
    M, S_local = MS[..., :K], MS[..., K:]
    S_in = _packed_entering_state(cu_pad, L, h0, M, S_local)
    o = _correct_outputs(QO[..., :K], QO[..., K:], S_in)
    # final states: [M_e | S_e] after the last token e of each sequence ending here (consecutive ones), M_e S_in + S_e
    ending = jnp.searchsorted(cu[1:], t0 + 1, side="left") + jnp.arange(slots)
    n = jnp.minimum(ending, N - 1)
    e = cu[n + 1] - 1 - t0
    here = (ending < N) & (cu[n + 1] > cu[n]) & (e >= 0) & (e < L)
    ME = varlen.states_after(jnp.clip(e, 0, L - 1), n, cu_local, pk, G, kc, R, S0s, h0a)
    F = jnp.where(here[:, None, None, None], _leaving_state(ME[..., :K], ME[..., K:], S_in[0]), 0.0)
    return chunked.from_chunks(o, L), jnp.zeros((N,) + F.shape[1:], F.dtype).at[n].add(F)[None]


def _slots(cu, T, P):
    """Static bound on the sequences starting inside, or ending in, one of P slices: counted from host offsets
    (rounded up to a power of two, so few programs compile), else N (``cu`` on a device or traced)."""
    N = cu.shape[0] - 1
    if not isinstance(cu, np.ndarray) or P == 1:
        return N
    L = -(-T // P)
    cu_pad = np.where(cu >= T, P * L, cu)
    t = np.arange(P) * L
    starting = np.searchsorted(cu_pad[:-1], t + L, "left") - np.searchsorted(cu_pad[:-1], t, "right")
    ending = np.searchsorted(cu[1:], t + L, "right") - np.searchsorted(cu[1:], t + 1, "left")
    most = max(1, int(starting.max()), int(ending.max()))
    return min(N, 1 << (most - 1).bit_length())


def _unsharded_packed(cfg, T, slots, cu, cu_pad, q, k, v, g, b, w, h0=None):
    """A mesh without ``seq``: the packed chunked kernel (kernels/varlen.py) on this device's heads."""
    o, final, _ = varlen.run(cfg, q, k, v, g, b, w, h0, cu)
    return o, final[None]


@partial(jax.jit, static_argnums=(0, 1, 2))
def _run_packed(cfg, mesh, slots, q, k, v, g, b, w, h0, cu):
    """Packed sequences (B == 1): pad T/H to the mesh, run :func:`_packed_slice` under shard_map, sum the final
    states over the devices (each sequence's is on one device), empty sequences return ``h0[n]``."""
    T, H = q.shape[1:3]
    P = _size(mesh, SEQ_AXIS)
    Tp = P * -(-T // P)
    Hp = _size(mesh, HEAD_AXIS) * -(-H // _size(mesh, HEAD_AXIS))
    g = floor_log_decay(g)
    xs = [_pad_to(_pad_to(x.astype(ACC_DTYPE), 1, Tp), 2, Hp) for x in (q, k, v, g, b, w)]
    # the identity tokens padding T belong to the sequence holding token T - 1; the empty ones at T start after
    cu_pad = jnp.where(cu >= T, Tp, cu)
    seq, heads = _axis(mesh, SEQ_AXIS), _axis(mesh, HEAD_AXIS)
    x_spec, h_spec = PartitionSpec(None, seq, heads, None), PartitionSpec(None, heads, None, None)
    hs = () if h0 is None else (_pad_to(h0.astype(ACC_DTYPE), 1, Hp),)
    body = partial(_packed_slice if seq is not None else _unsharded_packed, cfg, T, slots)
    f = jax.shard_map(body, mesh=mesh, in_specs=(PartitionSpec(),) * 2 + (x_spec,) * 6 + (h_spec,) * len(hs),
                      out_specs=(x_spec, PartitionSpec(seq, None, heads, None, None)), check_vma=False)
    o, F = f(cu, cu_pad, *xs, *hs)
    final = jnp.sum(F, axis=0)[:, :H]
    empty = (cu[1:] == cu[:-1])[:, None, None, None]
    final = jnp.where(empty, 0.0 if h0 is None else h0, final)
    return o[:, :T, :H].astype(v.dtype), final


class ContextParallelKernel:
    """A chunked GDN-2 kernel run context-parallel on a mesh, with the contract ``fn(q, k, v, g, b, w, *, ...)``."""

    def __init__(self, name, inner, mesh=None):
        self.name, self.inner, self.mesh = name, inner, mesh

    def __call__(self, q, k, v, g, b, w, *, scale=None, initial_state=None, check_values=False, cu_seqlens=None):
        """Return (o [B,T,H,V] in v.dtype, final_state [B,H,K,V] float32), sharded over the current mesh.

        ``cu_seqlens [N+1]`` (FLA's packed sequences, B == 1): ``initial_state`` and the final state are
        ``[N, H, K, V]`` (kernels/modes.py checks them); the only mode keyword these kernels take.
        """
        if cu_seqlens is None:
            _, scale = check_inputs(q, k, v, g, b, w, scale=scale, initial_state=initial_state,
                                    check_values=check_values)
            return _run(self._config(scale), self._mesh(), q, k, v, g, b, w, initial_state)
        (B, T, H, K, V), scale = check_inputs(q, k, v, g, b, w, scale=scale)
        cu = check_cu_seqlens(cu_seqlens, B, T, check_values)
        check_state(initial_state, (cu.shape[0] - 1, H, K, V), True, False)
        if check_values:
            check_finite_values(dict(q=q, k=k, v=v, g=g, b=b, w=w), initial_state)
        mesh = self._mesh()
        return _run_packed(self._config(scale), mesh, _slots(cu, T, _size(mesh, SEQ_AXIS)), q, k, v, g, b, w,
                           initial_state, jnp.asarray(cu, jnp.int32))

    def _config(self, scale):
        """The chunked core's static configuration for a resolved ``scale``."""
        return chunked.Config(self.inner.chunk_size, scale, self.inner.decay)

    def _mesh(self):
        """The mesh to run on (:func:`current_mesh`); ValueError unless its axes are all ``AxisType.Auto``."""
        mesh = current_mesh(self.mesh)
        if not mesh.are_all_axes_auto:
            raise ValueError(f"mesh: axes must be AxisType.Auto (e.g. jax.make_mesh(..., axis_types=(AxisType.Auto,)"
                             f" * n) or gdn2_oracle.ci.running.mesh.build_mesh), got {mesh.axis_types}")
        return mesh

    def __repr__(self):
        return f"ContextParallelKernel({self.name!r}, inner={self.inner!r}, mesh={self.mesh})"


def cp_factorized(chunk_size=CHUNK_SIZE, split=None, leaf=16, mesh=None):
    """The factorized chunked kernel, context-parallel over the ``seq`` axis of ``mesh`` (default: current)."""
    return ContextParallelKernel("cp-factorized", kernel.factorized(chunk_size, split, leaf), mesh)


def cp_pairwise(chunk_size=CHUNK_SIZE, mesh=None):
    """The pairwise chunked kernel, context-parallel over the ``seq`` axis of ``mesh`` (default: current)."""
    return ContextParallelKernel("cp-pairwise", kernel.pairwise(chunk_size), mesh)

