"""The WY solve inside a chunk: ``A = (I + T)^{-1}`` for strictly lower ``T``, by recursive block doubling.

Matmul-only, no per-row loop. The chunk is split along a binary tree whose leaves are single tokens:
inside each ``TileConfig.leaf`` block a dyadic tree (blocks of 1, 2, 4, ... tokens), above the leaves
``TileConfig.levels``. Starting from the diagonal (``A = I``), each level merges all its sibling pairs
at once with the block formula ``A21 = -A22 T21 A11``: ``A <- A - A @ (T * cross) @ A``, two
``C x C x C`` MXU products per level, exact in structure because ``A`` is block diagonal on that
level's children. The first level (1 x 1 children, ``A = I``) needs no product: ``A = I - T * cross``.
A chunk of ``C`` tokens takes ``2 (log2 C - 1)`` whole-tile products in ``log2 C`` dependent levels.

Why this and not the Neumann product form ``(I - T)(I + T^2)(I + T^4)...``: the same number of
products (a leaf of ``n`` needs ``2 log2 n - 2`` for its powers and factors, this scheme ``2 log2 n - 2``
for its merges), but the merges are the blocked form of forward substitution (every entry of ``A`` is
built from entries of ``A`` and ``T`` that forward substitution also uses), whereas the product form
sums powers ``T^j`` whose entries grow like ``|T|^j`` and cancel when ``T`` is large (erase gate
``b`` near 2, raw ``q``/``k``).

With ``A`` the chunk needs ``Y = A Ebar`` and ``U = A Z``; the scan uses ``R = U - Y S0 = A (Z - Ebar S0)``.
"""

from __future__ import annotations

import jax.numpy as jnp

from ._ops import F32, dot, iota
from .config import TileConfig


def cross_mask(C, level):
    """``[C, C]`` mask of the cross tiles ``rows [m, hi) x cols [lo, m)`` of one tree level."""
    ri, ci = iota((C, C), 0), iota((C, C), 1)
    cross = jnp.zeros((C, C), jnp.bool_)
    for lo, m, hi in level:
        cross = cross | ((ri >= m) & (ri < hi) & (ci >= lo) & (ci < m))
    return cross


def dyadic_cross(C, width):
    """Cross mask of the dyadic level of ``width``-token blocks (bit tests, independent of the block count)."""
    ri, ci = iota((C, C), 0), iota((C, C), 1)
    half = width // 2
    return ((ri ^ ci) < width) & ((ri & half) != 0) & ((ci & half) == 0)


def leaf_widths(cfg: TileConfig):
    """Block widths of the dyadic tree inside a leaf, smallest first: 2, 4, ..., ``leaf``."""
    return [1 << j for j in range(1, cfg.leaf.bit_length())]


def leaf_levels(cfg: TileConfig):
    """The dyadic tree inside every leaf block, deepest (1 x 1 children) first, as ``(lo, m, hi)`` levels."""
    C = cfg.chunk_size
    return [[(lo, lo + w // 2, lo + w) for lo in range(0, C, w)] for w in leaf_widths(cfg)]


def solve_levels(cfg: TileConfig):
    """Every merge level of the solve, deepest first: inside the leaves, then ``cfg.levels()``."""
    return leaf_levels(cfg) + cfg.levels()


def solve_masks(cfg: TileConfig):
    """The cross mask of every merge level of the solve, deepest first (as ``solve_levels``)."""
    C = cfg.chunk_size
    return [dyadic_cross(C, w) for w in leaf_widths(cfg)] + [cross_mask(C, level) for level in cfg.levels()]


def wy_inverse(cfg: TileConfig, T):
    """``(I + T)^{-1}`` of a strictly lower ``[C, C]`` value ``T`` by recursive block doubling."""
    C = cfg.chunk_size
    first, *rest = solve_masks(cfg)
    eye = iota((C, C), 0) == iota((C, C), 1)
    A = jnp.where(eye, jnp.float32(1.0), jnp.where(first, -T, jnp.float32(0.0))).astype(F32)
    for cross in rest:  # deepest first: children are complete before their parent merges
        A = A - dot(A, dot(jnp.where(cross, T, 0.0), A))
    return A
