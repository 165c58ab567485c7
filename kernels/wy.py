"""The WY chunk solve: A = (I + T)^{-1} for strictly lower T, so R = A X and (backward) dX = A^T dR.

Blocked inversion: leaf diagonal blocks by forward substitution (row by row, all leaves at once), then
merged pairwise upward with A21 = -A22 T21 A11 (batched matmuls at HIGHEST precision).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .contract import MATMUL_PRECISION

LEAF = 16


def diagonal_blocks(M, n):
    """The diagonal n x n blocks of ``M [..., P, P]`` as ``[..., P/n, n, n]``."""
    P = M.shape[-1]
    blocks = M.reshape(M.shape[:-2] + (P // n, n, P // n, n))
    return jnp.moveaxis(jnp.diagonal(blocks, axis1=-4, axis2=-2), -1, -3)


def _substitute(T):
    """(I + T)^{-1} of small strictly lower blocks ``[..., n, n]``: row i = e_i - T[i, :] A (rows > i still e_j)."""
    n = T.shape[-1]

    def row(i, A):
        Ti = jax.lax.dynamic_index_in_dim(T, i, axis=-2, keepdims=False)
        Ai = jax.lax.dynamic_index_in_dim(A, i, axis=-2, keepdims=False)
        new = Ai - jnp.einsum("...j,...jk->...k", Ti, A, precision=MATMUL_PRECISION)
        return jax.lax.dynamic_update_index_in_dim(A, new, i, axis=-2)

    return jax.lax.fori_loop(1, n, row, jnp.broadcast_to(jnp.eye(n, dtype=T.dtype), T.shape))


def inverse(T, leaf=LEAF):
    """A = (I + T)^{-1}, T strictly lower ``[..., C, C]`` (padded internally to leaf * 2^j with identity)."""
    C = T.shape[-1]
    n = min(leaf, C)
    P = n
    while P < C:
        P *= 2
    Tp = jnp.pad(T, [(0, 0)] * (T.ndim - 2) + [(0, P - C), (0, P - C)])
    A = _substitute(diagonal_blocks(Tp, n))
    while n < P:
        T21 = diagonal_blocks(Tp, 2 * n)[..., n:, :n]
        A11, A22 = A[..., 0::2, :, :], A[..., 1::2, :, :]
        A21 = -jnp.matmul(jnp.matmul(A22, T21, precision=MATMUL_PRECISION), A11, precision=MATMUL_PRECISION)
        top = jnp.concatenate([A11, jnp.zeros_like(A11)], axis=-1)
        A = jnp.concatenate([top, jnp.concatenate([A21, A22], axis=-1)], axis=-2)
        n *= 2
    return A[..., 0, :C, :C]
