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
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from . import chunked, kernel
from .contract import ACC_DTYPE, MATMUL_PRECISION, check_inputs, floor_log_decay

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


class ContextParallelKernel:
    """A chunked GDN-2 kernel run context-parallel on a mesh, with the contract ``fn(q, k, v, g, b, w, *, ...)``."""

    def __init__(self, name, inner, mesh=None):
        self.name, self.inner, self.mesh = name, inner, mesh

    def __call__(self, q, k, v, g, b, w, *, scale=None, initial_state=None, check_values=False):
        """Return (o [B,T,H,V] in v.dtype, final_state [B,H,K,V] float32), sharded over the current mesh."""
        _, scale = check_inputs(q, k, v, g, b, w, scale=scale, initial_state=initial_state, check_values=check_values)
        cfg = chunked.Config(self.inner.chunk_size, scale, self.inner.decay)
        mesh = current_mesh(self.mesh)
        if not mesh.are_all_axes_auto:
            raise ValueError(f"mesh: axes must be AxisType.Auto (e.g. jax.make_mesh(..., axis_types=(AxisType.Auto,)"
                             f" * n) or gdn2_oracle.ci.running.mesh.build_mesh), got {mesh.axis_types}")
        return _run(cfg, mesh, q, k, v, g, b, w, initial_state)

    def __repr__(self):
        return f"ContextParallelKernel({self.name!r}, inner={self.inner!r}, mesh={self.mesh})"


def cp_factorized(chunk_size=64, split=None, leaf=16, mesh=None):
    """The factorized chunked kernel, context-parallel over the ``seq`` axis of ``mesh`` (default: current)."""
    return ContextParallelKernel("cp-factorized", kernel.factorized(chunk_size, split, leaf), mesh)


def cp_pairwise(chunk_size=64, mesh=None):
    """The pairwise chunked kernel, context-parallel over the ``seq`` axis of ``mesh`` (default: current)."""
    return ContextParallelKernel("cp-pairwise", kernel.pairwise(chunk_size), mesh)

