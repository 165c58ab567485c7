"""FLA ``chunk_gdn2``'s training-call modes for the chunked kernels (fla-core 0.6.0 semantics).

Keywords of ``ChunkedKernel.__call__`` (all keyword-only; the defaults are the plain contract, which never
comes here):

* ``cu_seqlens`` ``[N+1]`` ints: N sequences packed into B == 1; ``initial_state`` and the final state are
  ``[N, H, K, V]``; an empty sequence returns its initial state. Done as a reset inside the chunk form
  (kernels/varlen.py), not by padding sequences. N and T are static, the values may be traced (one program
  per N and T). They are checked (``0 = cu[0] <= ... <= cu[N] = T``) when given on the host (list, NumPy),
  for a device array only with ``check_values=True`` (a host sync), never when traced;
  ``return_intermediate_states`` needs them on the host.
* ``use_qk_l2norm_in_kernel``: ``x / sqrt(sum(x^2) + 1e-6)`` over K for q and k (FLA's l2norm_fwd: eps inside
  the square root, float32(1e-6), in float32). FLA rounds the result to the input dtype; here it stays float32.
* ``use_gate_in_kernel`` with ``A_log [H]``, ``dt_bias [H*K]`` (optional), ``lower_bound`` (optional, < 0):
  ``g`` is the raw gate and the log-decay is ``-exp(A_log) softplus(g + dt_bias)``, or with ``lower_bound``
  ``lower_bound * sigmoid(exp(A_log) (g + dt_bias))`` (``A_log`` may then be None: ``sigmoid(g + dt_bias)``),
  in float32 (FLA's kda_gate_chunk_cumsum).
* ``state_v_first``: initial, final and intermediate states in ``[..., V, K]`` layout.
* ``return_intermediate_states``: also return ``h [B, NT, H, K, V]``, the state before each C-token chunk
  (C = the kernel's ``chunk_size``; FLA's is 64), per sequence when packed (``NT = sum_n ceil(len_n / C)``,
  sequence after sequence); float32 and differentiable (FLA allows it only under inference mode and stores
  it in k's dtype).

The pre-processing is JAX before the core, so ``jax.vjp`` of the call gives the gradients w.r.t. the raw
gate, ``A_log``, ``dt_bias`` and the raw q and k by autodiff through it; the core keeps its hand-written
backward. Returns ``(o, final_state)``, or ``(o, final_state, h)`` with ``return_intermediate_states``.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import varlen
from .chunked import Config, affine_core, chunked_core, from_chunks, to_chunks
from .contract import ACC_DTYPE, STATE_DTYPE, check_finite_values, check_inputs, floor_log_decay

# FLA's l2norm_fwd default eps (chunk_gdn2 passes none); the Triton kernel adds it in float32.
L2NORM_EPS = float(np.float32(1e-6))
GATE_PARAMS = ("A_log", "dt_bias", "lower_bound")


def requested(*, cu_seqlens=None, A_log=None, dt_bias=None, lower_bound=None, **flags):
    """True when any mode keyword differs from its default (the plain contract otherwise)."""
    return any(x is not None for x in (cu_seqlens, A_log, dt_bias, lower_bound)) or any(
        f is not False for f in flags.values())


class Spec(NamedTuple):
    """The static part of a call (one compiled program each)."""

    l2norm: bool
    gate: bool
    lower_bound: float | None
    state_v_first: bool
    intermediate: bool


def l2norm(x):
    """FLA's l2norm_fwd over the last axis, in float32: ``x / sqrt(sum(x^2) + eps)``."""
    x = x.astype(ACC_DTYPE)
    return x * (1.0 / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True) + L2NORM_EPS))


def gated_log_decay(g, A_log, dt_bias, lower_bound):
    """FLA's in-kernel gate on the raw ``g [B, T, H, K]``, in float32 (module docstring)."""
    H, K = g.shape[-2:]
    x = g.astype(ACC_DTYPE)
    if dt_bias is not None:
        x = x + dt_bias.astype(ACC_DTYPE).reshape(H, K)
    A = None if A_log is None else jnp.exp(A_log.astype(ACC_DTYPE))[:, None]
    if lower_bound is None:
        return -A * jax.nn.softplus(x)
    return lower_bound * jax.nn.sigmoid(x if A is None else A * x)


def _swap(x):
    """[..., K, V] <-> [..., V, K] (None stays None)."""
    return None if x is None else jnp.swapaxes(x, -1, -2)


def _dense(cfg, intermediate, q, k, v, g, b, w, h0):
    """Unpacked call (as chunked.run), with the chunk starting states when ``intermediate``."""
    B, T, H, K = q.shape
    if h0 is None:
        h0 = jnp.zeros((B, H, K, v.shape[-1]), ACC_DTYPE)
    xs = [to_chunks(x, cfg.chunk_size) for x in (q, k, v, floor_log_decay(g), b, w)]
    if intermediate:
        o, hT, S0s, _ = affine_core(cfg, *xs, h0, None, None)
        h = jnp.moveaxis(S0s, 0, 1)
    else:
        (o, hT), h = chunked_core(cfg, *xs, h0), None
    return from_chunks(o, T).astype(v.dtype), hT, h


@partial(jax.jit, static_argnums=(0, 1))
def _run(cfg, spec, q, k, v, g, b, w, h0, A_log, dt_bias, cu, chunk_starts):
    """Pre-process, run the dense or packed core, lay out the states."""
    if spec.l2norm:
        q, k = l2norm(q), l2norm(k)
    if spec.gate:
        g = gated_log_decay(g, A_log, dt_bias, spec.lower_bound)
    if spec.state_v_first:
        h0 = _swap(h0)
    if cu is None:
        o, hT, h = _dense(cfg, spec.intermediate, q, k, v, g, b, w, h0)
    else:
        o, hT, h = varlen.run(cfg, q, k, v, g, b, w, h0, cu, chunk_starts)
    if spec.state_v_first:
        hT, h = _swap(hT), _swap(h)
    return (o, hT, h) if spec.intermediate else (o, hT)


def call(kernel, q, k, v, g, b, w, *, scale=None, initial_state=None, check_values=False, cu_seqlens=None,
         use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, A_log=None, dt_bias=None, lower_bound=None,
         state_v_first=False, return_intermediate_states=False):
    """A chunked kernel's call with FLA's modes (module docstring); validates, then runs one jitted program."""
    flags = dict(use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
                 state_v_first=state_v_first, return_intermediate_states=return_intermediate_states)
    for name, flag in flags.items():
        if not isinstance(flag, (bool, np.bool_)):
            raise ValueError(f"{name}: expected a bool, got {flag!r}")
    (B, T, H, K, V), scale = check_inputs(q, k, v, g, b, w, scale=scale)
    lower_bound = check_gate(use_gate_in_kernel, A_log, dt_bias, lower_bound, H, K)
    cu, chunk_starts = None, None
    if cu_seqlens is not None:
        cu = check_cu_seqlens(cu_seqlens, B, T, check_values or return_intermediate_states)
        if return_intermediate_states:
            chunk_starts = varlen.chunk_start_queries(np.asarray(cu), kernel.chunk_size)
        cu = jnp.asarray(cu, jnp.int32)
    N = B if cu is None else cu.shape[0] - 1
    check_state(initial_state, (N, H) + ((V, K) if state_v_first else (K, V)), cu is not None, state_v_first)
    if check_values:
        named = dict(q=q, k=k, v=v, g=g, b=b, w=w)
        if not use_gate_in_kernel:
            check_finite_values(named, initial_state)
        else:  # a raw gate may be positive: finiteness only
            for name, x in dict(named, A_log=A_log, dt_bias=dt_bias, initial_state=initial_state).items():
                if x is not None and not bool(jnp.all(jnp.isfinite(jnp.asarray(x, ACC_DTYPE)))):
                    raise ValueError(f"{name}: contains NaN or inf")
    spec = Spec(bool(use_qk_l2norm_in_kernel), bool(use_gate_in_kernel), lower_bound, bool(state_v_first),
                bool(return_intermediate_states))
    cfg = Config(kernel.chunk_size, scale, kernel.decay)
    return _run(cfg, spec, q, k, v, g, b, w, initial_state, A_log, dt_bias, cu, chunk_starts)


def check_gate(use_gate, A_log, dt_bias, lower_bound, H, K):
    """Gate parameters: only with ``use_gate_in_kernel``; ``A_log [H]``, ``dt_bias [H*K]``, ``lower_bound < 0``."""
    given = [n for n, x in zip(GATE_PARAMS, (A_log, dt_bias, lower_bound)) if x is not None]
    if not use_gate:
        if given:
            raise ValueError(f"{given[0]}: only used with use_gate_in_kernel=True (FLA ignores it otherwise)")
        return None
    if A_log is None and lower_bound is None:
        raise ValueError("A_log: required with use_gate_in_kernel=True unless lower_bound is set")
    for name, x, shape in (("A_log", A_log, (H,)), ("dt_bias", dt_bias, (H * K,))):
        check_gate_param(name, x, shape)
    return check_lower_bound(lower_bound)


def check_gate_param(name, x, shape, what=""):
    """ValueError naming ``name`` unless the gate parameter ``x`` (None: absent) is a floating array of ``shape``."""
    if x is None:
        return
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise ValueError(f"{name}: expected an array, got {type(x).__name__}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name}: shape {tuple(x.shape)} != {shape}{what}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name}: dtype {x.dtype} is not floating-point")


def check_lower_bound(lower_bound):
    """``lower_bound`` as a float (None: the softplus form); ValueError unless finite and < 0."""
    if lower_bound is None:
        return None
    try:
        lb = float(lower_bound)
    except (TypeError, ValueError):
        raise ValueError(f"lower_bound: expected a real number, got {lower_bound!r}") from None
    if not (np.isfinite(lb) and lb < 0):
        raise ValueError(f"lower_bound: must be finite and < 0 (a bound on the log-decay), got {lb}")
    return lb


def check_cu_seqlens(cu, B, T, read_values):
    """Static checks always; values (0 = cu[0] <= ... <= cu[N] = T) when host-readable or ``read_values``.

    Returns a NumPy array when the values were read, else the (possibly traced) array as given.
    """
    if isinstance(cu, (list, tuple)):
        cu = np.asarray(cu)
    if not hasattr(cu, "shape") or not hasattr(cu, "dtype"):
        raise ValueError(f"cu_seqlens: expected an array of N+1 offsets, got {type(cu).__name__}")
    if len(cu.shape) != 1 or cu.shape[0] < 2:
        raise ValueError(f"cu_seqlens: expected a 1-D array of N+1 >= 2 offsets, got shape {tuple(cu.shape)}")
    if not jnp.issubdtype(cu.dtype, jnp.integer):
        raise ValueError(f"cu_seqlens: expected integers, got dtype {cu.dtype}")
    if B != 1:
        raise ValueError(f"cu_seqlens: packed sequences need batch size 1, got B = {B}")
    if isinstance(cu, jax.core.Tracer):
        if read_values:
            raise ValueError("cu_seqlens: traced; return_intermediate_states and check_values need its values "
                             "(NT depends on them)")
        return cu
    if not isinstance(cu, np.ndarray) and not read_values:
        return cu  # a device array: reading it would force a host sync (check_values=True does)
    a = np.asarray(cu)
    if a[0] != 0 or a[-1] != T:
        raise ValueError(f"cu_seqlens: must start at 0 and end at T = {T}, got {a[0]} ... {a[-1]}")
    if np.any(np.diff(a) < 0):
        raise ValueError(f"cu_seqlens: offsets must be non-decreasing, got {a.tolist()}")
    return a


def check_state(h0, shape, packed, v_first):
    """``initial_state``: float32 of ``shape`` (N = sequences when packed, else B; [V, K] with state_v_first)."""
    if h0 is None:
        return
    if not hasattr(h0, "shape") or tuple(h0.shape) != shape:
        got = tuple(getattr(h0, "shape", ()))
        layout = ("[N, H, " if packed else "[B, H, ") + ("V, K]" if v_first else "K, V]")
        raise ValueError(f"initial_state: shape {got} != {shape} ({layout})")
    if jnp.dtype(h0.dtype) != jnp.dtype(STATE_DTYPE):
        raise ValueError(f"initial_state: dtype {h0.dtype} must be float32")
