"""The matmul-only WY solve of the Pallas kernels (``kernels/pallas/wy.py``) against a float64 inverse."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from gdn2_oracle.kernels.pallas import SWEEP
from gdn2_oracle.kernels.pallas.wy import cross_mask, dyadic_cross, leaf_levels, solve_levels, wy_inverse

CONFIGS = sorted({(c.chunk_size, c.split, c.leaf): c for c in SWEEP}.values(), key=lambda c: c.name)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
def test_dyadic_masks_are_the_leaf_levels(cfg):
    C = cfg.chunk_size
    widths = [2 << j for j in range(len(leaf_levels(cfg)))]
    assert widths[-1] == cfg.leaf
    for w, level in zip(widths, leaf_levels(cfg)):
        np.testing.assert_array_equal(np.asarray(dyadic_cross(C, w)), np.asarray(cross_mask(C, level)))


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
def test_merge_levels_cover_the_strict_lower_triangle_once(cfg):
    C = cfg.chunk_size
    total = sum(np.asarray(cross_mask(C, level), int) for level in solve_levels(cfg))
    np.testing.assert_array_equal(total, np.tril(np.ones((C, C), int), -1))


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("scale", [0.05, 0.3])
def test_inverse_matches_float64(cfg, scale):
    C = cfg.chunk_size
    rng = np.random.default_rng(C + cfg.leaf)
    T = np.tril(rng.uniform(-scale, scale, (C, C)), -1)
    A = np.asarray(wy_inverse(cfg, jnp.asarray(T, jnp.float32)), np.float64)
    ref = np.linalg.inv(np.eye(C) + T)
    np.testing.assert_allclose(A, ref, rtol=0, atol=2e-6 * np.abs(ref).max())
