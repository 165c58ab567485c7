"""Small in-kernel helpers shared by the Pallas GDN-2 kernels (Mosaic-friendly 2-D operations only)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..contract import MATMUL_PRECISION

F32 = jnp.float32


def _dg(a, b, ca, cb):
    return jax.lax.dot_general(a, b, (((ca,), (cb,)), ((), ())), precision=MATMUL_PRECISION,
                               preferred_element_type=F32)


def dot(a, b):
    """``a @ b`` in float32 at HIGHEST precision."""
    return _dg(a, b, 1, 0)


def dot_nt(a, b):
    """``a @ b.T`` (contract the minor dims)."""
    return _dg(a, b, 1, 1)


def dot_tn(a, b):
    """``a.T @ b`` (contract the major dims)."""
    return _dg(a, b, 0, 0)


def iota(shape, dim):
    return jax.lax.broadcasted_iota(jnp.int32, shape, dim)


def as_f32(mask):
    """0/1 float32 from a boolean mask (a select, not an i1 -> f32 conversion)."""
    return jnp.where(mask, jnp.float32(1.0), jnp.float32(0.0))


def row_to_col(x):
    """``[1, n]`` row -> ``[n, 1]`` column through an identity mask and a lane reduction."""
    n = x.shape[-1]
    eye = iota((n, n), 0) == iota((n, n), 1)
    return jnp.sum(jnp.where(eye, jnp.broadcast_to(x, (n, n)), 0.0), axis=1, keepdims=True)


def col_to_row(x):
    """``[n, 1]`` column -> ``[1, n]`` row through an identity mask and a sublane reduction."""
    n = x.shape[0]
    eye = iota((n, n), 0) == iota((n, n), 1)
    return jnp.sum(jnp.where(eye, jnp.broadcast_to(x, (n, n)), 0.0), axis=0, keepdims=True)


def placement(lo, n, C):
    """One-hot ``[n, C]`` matrix that moves a length-``n`` row window to lanes ``[lo, lo + n)``."""
    return as_f32(iota((n, C), 1) == iota((n, C), 0) + lo)


def placement_t(lo, n, C):
    """One-hot ``[C, n]`` matrix that extracts lanes ``[lo, lo + n)`` of a row."""
    return as_f32(iota((C, n), 0) == iota((C, n), 1) + lo)


def tri_masks(C):
    r, c = iota((C, C), 0), iota((C, C), 1)
    return dict(strict_lower=c < r, lower=c <= r, strict_upper=c > r, upper=c >= r)
