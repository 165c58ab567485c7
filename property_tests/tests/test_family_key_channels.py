"""The family lens's key-channel permutation (``property_tests/test_family_properties.py``) can fail: run in-process
on a small call, it grades FAIL a kernel whose key-channel loop stops one channel short (the last key channel of q and
k dropped, as a K tile loop that skips its tail), in both families, and passes our correct ``gdn-factorized`` /
``kda-factorized`` on the same call and permutation (no false alarm)."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import pytest

from gdn2_oracle import kernels
from gdn2_oracle.ci.grading.grades import FAIL
from gdn2_oracle.kernels.families import FamilyKernel
from gdn2_oracle.kernels.kernel import pairwise
from gdn2_oracle.oracle.family_recipes import FamilyRecipe
from gdn2_oracle.property_tests import test_family_properties as t


class LastKeyChannelDropped(FamilyKernel):
    """q and k reach the core without their last key channel."""

    def to_gdn2(self, q, k, v, g, beta, **kw):
        qm, km, vm, gm, b, w = super().to_gdn2(q, k, v, g, beta, **kw)
        kept = (jnp.arange(km.shape[-1]) < km.shape[-1] - 1).astype(km.dtype)
        return qm * kept, km * kept, vm, gm, b, w


@functools.cache
def mutant(family):
    """The mutant of ``family``, over the pairwise kernel (chunk 16), built once."""
    return LastKeyChannelDropped(f"{family}_last_key_channel_dropped", family, pairwise(chunk_size=16))


@pytest.mark.parametrize("family", ["gdn", pytest.param("kda", marks=pytest.mark.slow)])  # kda: the release group
def test_the_key_channel_permutation_fails_a_dropped_key_channel_and_passes_the_correct_kernel(family):
    recipe = FamilyRecipe(family, 1, 20, 1, 2, 8, 8, initial_state=True, seed=3)
    perm = np.roll(np.arange(recipe.K), 1)  # the dropped last channel moves to the front
    (what, bad), = t.check_key_channel_permutation(mutant(family), recipe, perm)
    assert bad.grade == FAIL, f"the {family} mutant was not caught by {what}\n{bad.format()}"
    (what, good), = t.check_key_channel_permutation(kernels.get(f"{family}-factorized"), recipe, perm)
    assert good.passed, f"a false alarm on {family}-factorized: {what}\n{good.format()}"
