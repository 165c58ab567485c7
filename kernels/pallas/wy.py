"""The WY solve inside a chunk: ``A = (I + T)^{-1}`` for strictly lower ``T``, blocked along the split tree.

Inside each leaf (``leaf`` tokens) ``A`` is built by forward substitution, one row per step:
``A[r] = e_r - T[r, leaf window] @ A[leaf window]`` (rows not yet written are zero). Leaves are then
merged bottom-up along ``TileConfig.levels`` with the block formula
``A21 = -A22 T21 A11``: for a whole level at once, ``A <- A - A @ (T * cross) @ A`` -- two ``C x C x C``
MXU products per level, exact in structure because ``A`` is block diagonal on that level's children.

With ``A`` the chunk needs ``Y = A Ebar`` and ``U = A Z``; the scan uses ``R = U - Y S0 = A (Z - Ebar S0)``.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl

from ._ops import F32, as_f32, dot, iota, placement_t
from .config import TileConfig
from .score import for_rows


def cross_mask(C, level):
    ri, ci = iota((C, C), 0), iota((C, C), 1)
    cross = jnp.zeros((C, C), jnp.bool_)
    for lo, m, hi in level:
        cross = cross | ((ri >= m) & (ri < hi) & (ci >= lo) & (ci < m))
    return cross


def wy_inverse(cfg: TileConfig, T, t_ref, a_ref):
    """``(I + T)^{-1}`` of a strictly lower ``[C, C]`` value ``T``; ``t_ref``/``a_ref`` are [C, C] scratch."""
    C = cfg.chunk_size
    n = cfg.leaf
    t_ref[...] = T
    a_ref[...] = jnp.zeros((C, C), F32)

    def row(r, lo):
        t_win = dot(t_ref[pl.ds(r, 1), :], placement_t(lo, n, C))  # [1, n]: T[r, lo:lo+n]
        acc = dot(t_win, a_ref[pl.ds(lo, n), :])  # [1, C]
        e_r = as_f32(iota((1, C), 1) == r)
        a_ref[pl.ds(r, 1), :] = e_r - acc

    # Step j solves row j of every leaf at once (leaves are independent).
    for_rows(C, n, row)
    A = a_ref[...]
    for level in cfg.levels():  # deepest first: children are complete before their parent merges
        A = A - dot(A, dot(jnp.where(cross_mask(C, level), T, 0.0), A))
    return A
