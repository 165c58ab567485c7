"""The kernel contract of docs/DESIGN.md §2: argument layout, dtype rules and input checks.

Every kernel in this package is called as
``fn(q, k, v, g, b, w, *, scale=None, initial_state=None) -> (o, final_state)`` with
``q, k, g, b: [B, T, H, K]``, ``v, w: [B, T, H, V]``, ``initial_state: [B, H, K, V]`` float32.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# Input dtypes a kernel accepts; all work is accumulated in float32 (docs/DESIGN.md §1, numerical rules).
INPUT_DTYPES = (jnp.float32, jnp.bfloat16)
ACC_DTYPE = jnp.float32
STATE_DTYPE = jnp.float32
MATMUL_PRECISION = jax.lax.Precision.HIGHEST
# Log-decays below this are raised to it before any cumulative sum (every kernel, :func:`floor_log_decay`).
# exp underflows to exactly 0 in float32 from ~-104 on, so every factor spanning such a token is 0 either way;
# without the floor, sums of huge finite g (-3e38) overflow to -inf and the decay exponents become inf - inf.
# -2^11 is exact in bfloat16 and below the generator's resets (~-1e3), which stay untouched.
LOG_DECAY_FLOOR = -2048.0
# Tokens per chunk: the default of every chunked kernel here (FLA's chunk_gdn2 chunk).
CHUNK_SIZE = 64


class Shape(NamedTuple):
    """Sizes of one call: batch, length, heads, key width, value width."""

    B: int
    T: int
    H: int
    K: int
    V: int


def check_inputs(q, k, v, g, b, w, *, scale=None, initial_state=None, check_values=False):
    """Validate a call against the contract; return its Shape and the resolved scale.

    Shape and dtype checks are static (no device sync). Value checks (NaN/inf, positive
    log-decay) force a host sync and run only with ``check_values=True``.
    """
    named = dict(q=q, k=k, v=v, g=g, b=b, w=w)
    for name, x in named.items():
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise ValueError(f"{name}: expected an array, got {type(x).__name__}")
        if x.ndim != 4:
            raise ValueError(f"{name}: expected rank 4 [B, T, H, dim], got shape {tuple(x.shape)}")
        if jnp.dtype(x.dtype) not in [jnp.dtype(d) for d in INPUT_DTYPES]:
            raise ValueError(f"{name}: dtype {x.dtype} not supported (float32 or bfloat16)")
    B, T, H, K = q.shape
    V = v.shape[-1]
    if T == 0:
        raise ValueError("q: empty sequence (T == 0)")
    if B == 0 or H == 0 or K == 0 or V == 0:
        raise ValueError(f"q/v: zero-sized dimension in shape q={tuple(q.shape)} v={tuple(v.shape)}")
    for name in ("k", "g", "b"):
        if tuple(named[name].shape) != (B, T, H, K):
            raise ValueError(f"{name}: shape {tuple(named[name].shape)} != q's {(B, T, H, K)}")
    for name in ("v", "w"):
        if tuple(named[name].shape) != (B, T, H, V):
            raise ValueError(f"{name}: shape {tuple(named[name].shape)} != {(B, T, H, V)} ([B, T, H, V])")
    if initial_state is not None:
        if not hasattr(initial_state, "shape") or tuple(initial_state.shape) != (B, H, K, V):
            got = tuple(getattr(initial_state, "shape", ()))
            raise ValueError(f"initial_state: shape {got} != {(B, H, K, V)} ([B, H, K, V])")
        if jnp.dtype(initial_state.dtype) != jnp.dtype(STATE_DTYPE):
            raise ValueError(f"initial_state: dtype {initial_state.dtype} must be float32")
    if scale is None:
        scale = float(K) ** -0.5
    else:
        try:
            scale = float(scale)
        except (TypeError, ValueError):
            raise ValueError(f"scale: expected a real number, got {scale!r}") from None
        if not np.isfinite(scale):
            raise ValueError(f"scale: must be finite, got {scale}")
    if check_values:
        check_finite_values(named, initial_state)
    return Shape(B, T, H, K, V), scale


def floor_log_decay(g):
    """max(g, LOG_DECAY_FLOOR) in g's dtype, with gradient 0 below the floor (as d/dg of exp(g) S there)."""
    return jnp.where(g < LOG_DECAY_FLOOR, jnp.asarray(LOG_DECAY_FLOOR, g.dtype), g)


def check_finite_values(named, initial_state=None):
    """Opt-in value checks: NaN/inf anywhere, positive log-decay g (forces a host sync)."""
    items = dict(named)
    if initial_state is not None:
        items["initial_state"] = initial_state
    for name, x in items.items():
        if not bool(jnp.all(jnp.isfinite(x.astype(jnp.float32)))):
            raise ValueError(f"{name}: contains NaN or inf")
    if bool(jnp.any(named["g"].astype(jnp.float32) > 0)):
        raise ValueError("g: log-decay must be <= 0 (found a positive entry)")


# What a serving kernel may store its states (a pool, a replay checkpoint and caches) in.
STORAGE_DTYPES = ("float32", "bfloat16", "float16")


def storage_dtype(name, value):
    """Option ``name`` (``state_dtype``, ``cache_dtype``): a name or dtype among :data:`STORAGE_DTYPES`, as its name;
    ValueError naming ``name`` otherwise."""
    try:
        dt = jnp.dtype(value).name
    except Exception:  # noqa: BLE001 - jnp.dtype raises TypeError on junk
        dt = None
    if dt not in STORAGE_DTYPES:
        raise ValueError(f"{name}: expected one of {STORAGE_DTYPES}, got {value!r}")
    return dt
