"""The stand-in for vLLM's ``fused_recurrent_replayssm``: one token per row on replay states (package docstring).

:func:`fused_recurrent_gated_delta_rule_replayssm` has vLLM's signature and in-place semantics; the helpers below
(tensor checks, the packed ``mixed_qkv``, the gate arithmetic, the storage as our ``ReplayCache``) are shared with
``gdn_replayssm_spec_decode.py``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from gdn2_oracle.kernels import replay_decode
from gdn2_oracle.kernels.torch_bridge import import_torch, to_numpy, to_torch

SOFTPLUS_THRESHOLD = 20.0  # softplus(x) = x above it, as vLLM's kernels
NORM_EPS = 1e-6  # q / sqrt(sum q^2 + eps) with use_qk_l2norm_in_kernel
F32 = np.float32


# --- shared helpers -----------------------------------------------------------------------------------------------


def host(t):
    """An exact NumPy copy of torch tensor ``t`` (bfloat16 as ``jnp.bfloat16``)."""
    return to_numpy(t)


def put_back(t, values):
    """``t.copy_(values)`` in place (``values`` any array; cast to ``t``'s dtype by torch)."""
    t.copy_(to_torch(np.asarray(values), t.device))


def check_tensor(name, t, shape=None, ndim=None):
    """A torch tensor of ``shape`` (``None`` entries free) or ``ndim`` dimensions; ValueError naming ``name``."""
    torch = import_torch()
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if shape is not None and (t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape))):
        want = ", ".join("?" if s is None else str(s) for s in shape)
        raise ValueError(f"{name}: expected shape [{want}], got {tuple(t.shape)}")
    return t


def check_int(name, t, shape, dtype=None):
    """An integer tensor of ``shape`` (and ``dtype`` when given); ValueError naming ``name``."""
    torch = import_torch()
    check_tensor(name, t, shape)
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name}: expected an integer tensor, got {t.dtype}")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name}: expected {dtype}, got {t.dtype}")
    return t


def storage_dims(checkpoint_name, checkpoint, d_cache, k_cache, g_cache):
    """``(P, H, HV, K, V, L)`` of a checkpoint ``[P, HV, V, K]`` and rings ``d [P, HV, L, V]``, ``k [P, H, L, K]``,
    ``g [P, HV, L]`` (float32); ValueError naming the tensor that does not fit."""
    torch = import_torch()
    P, HV, V, K = check_tensor(checkpoint_name, checkpoint, ndim=4).shape
    L = check_tensor("d_cache", d_cache, (P, HV, None, V)).shape[2]
    H = check_tensor("k_cache", k_cache, (P, None, L, K)).shape[1]
    check_tensor("g_cache", g_cache, (P, HV, L))
    if g_cache.dtype != torch.float32:
        raise ValueError(f"g_cache: expected torch.float32, got {g_cache.dtype}")
    if H == 0 or HV % H:
        raise ValueError(f"k_cache: {H} key heads do not divide HV = {HV} value heads")
    return P, H, HV, K, V, L


def key_heads(mixed_qkv, HV, V, K):
    """``H``, as vLLM's wrappers get it: ``(qkv_dim - HV V) // 2 // K``; ValueError naming ``mixed_qkv``."""
    check_tensor("mixed_qkv", mixed_qkv, ndim=2)
    if mixed_qkv.stride(-1) != 1:
        raise ValueError("mixed_qkv: its last dimension must have stride 1")
    width = mixed_qkv.shape[1]
    H = (width - HV * V) // 2 // K
    if H <= 0 or width != 2 * H * K + HV * V or HV % H:
        raise ValueError(f"mixed_qkv: {width} columns is not 2 H K + HV V with HV = {HV}, V = {V}, K = {K} "
                         "and H dividing HV")
    return H


def unpacked(mixed_qkv, H, HV, K, V):
    """``(q [N, H, K], k [N, H, K], v [N, HV, V])`` float32 of the packed ``q | k | v`` columns."""
    x = host(mixed_qkv).astype(F32)
    N = x.shape[0]
    return (x[:, :H * K].reshape(N, H, K), x[:, H * K:2 * H * K].reshape(N, H, K),
            x[:, 2 * H * K:].reshape(N, HV, V))


def gdn_terms(a, b, A_log, dt_bias, rows, HV, beta_dtype=None):
    """``(g, beta)`` float32 ``[rows, HV]`` from the raw gates: ``g = -exp(A_log) softplus(a + dt_bias)`` (softplus
    linear above 20), ``beta = sigmoid(b)`` (rounded to ``beta_dtype`` first when given, as vLLM's one-token kernel
    rounds it to b's dtype)."""
    check_tensor("a", a, (rows, HV))
    check_tensor("b", b, (rows, HV))
    check_tensor("A_log", A_log, (HV,))
    check_tensor("dt_bias", dt_bias, (HV,))
    x = host(a).astype(F32) + host(dt_bias).astype(F32)[None, :]
    with np.errstate(over="ignore"):
        soft = np.where(x <= SOFTPLUS_THRESHOLD, np.log1p(np.exp(np.minimum(x, SOFTPLUS_THRESHOLD))), x)
        g = (-np.exp(host(A_log).astype(F32))[None, :] * soft).astype(F32)
        beta = (F32(1) / (F32(1) + np.exp(-host(b).astype(F32)))).astype(F32)
    if beta_dtype is not None:
        beta = beta.astype(beta_dtype).astype(F32)
    return g, beta


def normalised(x):
    """``x / sqrt(sum x^2 + 1e-6)`` over the last axis, float32."""
    x = x.astype(F32)
    return (x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + F32(NORM_EPS))).astype(F32)


def replay_storage(checkpoint, d_cache, k_cache, g_cache, write_pos=None, cache_base=None, is_flush=None):
    """The torch storage as our :class:`replay_decode.ReplayCache` (JAX arrays; cursors zero where not given)."""
    P = checkpoint.shape[0]
    arrays = [jnp.asarray(host(t)) for t in (checkpoint, d_cache, k_cache, g_cache)]
    cursors = [jnp.zeros((P,), jnp.int32) if t is None else jnp.asarray(host(t).astype(np.int32))
               for t in (write_pos, cache_base, is_flush)]
    return replay_decode.ReplayCache(*arrays, *cursors)


def store(cache, checkpoint, d_cache, k_cache, g_cache):
    """Our kernel's new storage copied into the caller's tensors, in place."""
    for t, x in zip((checkpoint, d_cache, k_cache, g_cache), cache[:4]):
        put_back(t, x)


def padding_ids(name, ids, null_block_id, P):
    """Slot ids as our kernel reads them: ``-1`` for ids ``<= null_block_id`` (padding), else the id (``< P``;
    ValueError naming ``name`` otherwise)."""
    if isinstance(null_block_id, bool) or not isinstance(null_block_id, (int, np.integer)) or null_block_id < 0:
        raise ValueError(f"null_block_id: the stand-in supports an integer >= 0, got {null_block_id!r}")
    ids = host(ids).astype(np.int64)
    slots = np.where(ids > null_block_id, ids, -1)
    if (slots >= P).any():
        raise ValueError(f"{name}: slot ids {sorted(set(slots[slots >= P].tolist()))} are beyond the {P} slots")
    return slots.astype(np.int32)


# --- the function -------------------------------------------------------------------------------------------------


def fused_recurrent_gated_delta_rule_replayssm(
    mixed_qkv,
    a,
    b,
    A_log,
    dt_bias,
    scale,
    initial_state,
    d_cache,
    k_cache,
    g_cache,
    out,
    ssm_state_indices,
    write_pos,
    use_qk_l2norm_in_kernel: bool = False,
    block_v: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    nk: int | None = None,
):
    """One token per row on replay states ``-> (out, initial_state)``, both updated in place.

    ``mixed_qkv [B, 2 H K + HV V]`` (q | k | v), ``a, b [B, HV]``, ``A_log, dt_bias [HV]``, ``initial_state [P, HV,
    V, K]`` (the checkpoint read and, on a flush, written), rings ``d_cache [P, HV, L, V]``, ``k_cache [P, H, L,
    K]``, ``g_cache [P, HV, L]`` float32, ``out`` (contiguous, ``B HV V`` elements), ``ssm_state_indices [B]`` (ids
    ``<= 0`` are padding: zero output, nothing read or written), ``write_pos [B]`` int32 per row (the row's history
    is ring entries ``0..write_pos-1``; its entry goes to ``write_pos``; ``write_pos == L - 1`` is a flush: the
    state after the token goes to the checkpoint, no entry is written). Launch parameters are ignored.
    """
    torch = import_torch()
    P, H, HV, K, V, L = storage_dims("initial_state", initial_state, d_cache, k_cache, g_cache)
    if key_heads(mixed_qkv, HV, V, K) != H:
        raise ValueError(f"mixed_qkv: its q / k columns make {key_heads(mixed_qkv, HV, V, K)} key heads, "
                         f"k_cache has {H}")
    B = mixed_qkv.shape[0]
    check_int("ssm_state_indices", ssm_state_indices, (B,))
    check_int("write_pos", write_pos, (B,), torch.int32)
    check_tensor("out", out)
    if not out.is_contiguous() or out.numel() != B * HV * V:
        raise ValueError(f"out: expected a contiguous tensor of {B} x {HV} x {V} elements, got {tuple(out.shape)}")
    if B == 0:
        return out, initial_state
    q, k, v = unpacked(mixed_qkv, H, HV, K, V)
    g, beta = gdn_terms(a, b, A_log, dt_bias, B, HV, beta_dtype=host(b).dtype)
    if use_qk_l2norm_in_kernel:
        q, k = normalised(q), normalised(k)
    cache = replay_storage(initial_state, d_cache, k_cache, g_cache)
    slots = padding_ids("ssm_state_indices", ssm_state_indices, 0, P)
    o, new = replay_decode.recurrent_step(q, k, v, g, beta, cache, slots, host(write_pos).astype(np.int32),
                                          capacity=L, scale=float(scale))
    store(new, initial_state, d_cache, k_cache, g_cache)
    out.view(B, HV, V).copy_(to_torch(np.asarray(o), out.device))
    return out, initial_state
