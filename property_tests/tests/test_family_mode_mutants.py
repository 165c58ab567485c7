"""The family call-mode properties (``property_tests/test_family_modes.py``) can fail: each check, run in-process on a
small call, grades FAIL a kernel with the bug it targets -- a mutant of ``kernels/testing_families.py`` where one
fits (the gate applied to the padding of T up to 64 tokens), else a small local one here (a state leaking across
packed sequences, the q/k norm ignored, the ``[V, K]`` state reshaped instead of transposed, the chunk-start states
one chunk late) -- and passes our correct ``gdn-factorized`` / ``kda-factorized`` on the same call (no false alarm).
Plain function calls (no subprocess pytest); two cases in ``make test``, the others in the release group.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import pytest

from gdn2_oracle import kernels
from gdn2_oracle.ci.grading.grades import FAIL
from gdn2_oracle.kernels import testing_families
from gdn2_oracle.kernels.families import FamilyKernel
from gdn2_oracle.kernels.kernel import pairwise
from gdn2_oracle.property_tests import test_family_modes as t

_CORE = pairwise(chunk_size=16)


class LeaksAcrossSequences(FamilyKernel):
    """Packed sequences: o as if the whole row were one sequence from ``h0[0]`` (the state runs on across the
    boundaries); the final states the correct ones."""

    def run_core(self, q, k, v, g, b, w, scale, h0, structure=None):
        out = super().run_core(q, k, v, g, b, w, scale, h0, structure)
        if not structure or "cu_seqlens" not in structure:
            return out
        rest = {n: x for n, x in structure.items() if n != "cu_seqlens"}
        o, *_ = self.core(q, k, v, g, b, w, scale=scale, initial_state=h0[:1], **rest)
        return (o, *out[1:])


class IgnoresQkNorm(FamilyKernel):
    """``use_qk_l2norm_in_kernel`` accepted and ignored: q, k reach the core as given."""

    def to_gdn2(self, q, k, v, g, beta, **kw):
        return super().to_gdn2(q, k, v, g, beta, **{**kw, "l2norm_qk": False})


class ReshapedState(FamilyKernel):
    """The ``[V, K]`` layout: the initial state read right (transposed), the final state returned reshaped from
    ``[K, V]`` to ``[V, K]`` instead of transposed."""

    def run_core(self, q, k, v, g, b, w, scale, h0, structure=None):
        if not structure or not structure.get(t.LAYOUT):
            return super().run_core(q, k, v, g, b, w, scale, h0, structure)
        rest = {n: x for n, x in structure.items() if n != t.LAYOUT}
        o, S, *more = self.core(q, k, v, g, b, w, scale=scale, initial_state=jnp.swapaxes(h0, -1, -2), **rest)
        return (o, S.reshape(S.shape[:-2] + (S.shape[-1], S.shape[-2])), *more)


class LateChunkStates(FamilyKernel):
    """``return_intermediate_states``: the state after each chunk in place of the state before it (rolled by one)."""

    def run_core(self, q, k, v, g, b, w, scale, h0, structure=None):
        out = super().run_core(q, k, v, g, b, w, scale, h0, structure)
        if not structure or not structure.get("return_intermediate_states"):
            return out
        o, S, states = out
        return (o, S, jnp.roll(states, -1, axis=1))


LOCAL = {"leaks": LeaksAcrossSequences, "ignores_norm": IgnoresQkNorm, "reshaped_state": ReshapedState,
         "late_chunk_states": LateChunkStates}


@functools.cache
def mutant(name, family):
    """The mutant ``name`` of ``family``: a local one (:data:`LOCAL`, over the pairwise kernel, chunk 16) or one of
    ``kernels/testing_families.py`` (``<family>_<name>``); built once, so its programs compile once."""
    if name in LOCAL:
        return LOCAL[name](f"{family}_{name}", family, _CORE)
    return getattr(testing_families, f"{family}_{name}")


@functools.cache
def correct(family):
    """Our ``<family>-factorized`` kernel, built once."""
    return kernels.get(f"{family}-factorized")


PACKED = (3, 0, 3)  # an empty sequence; every sequence alone is one program
ROWS = (5, 5)  # T not a multiple of 64 (the padded gate's bug shows)

# (family, check, recipe, mutant): the check grades the mutant FAIL and the correct kernel PASS on the recipe.
CASES = {
    "packed_alone": ("gdn", t.check_packed_alone, lambda f: t.recipe_for(f, "packed_alone", 2, lengths=PACKED),
                     "leaks"),
    "packed_dense": ("kda", t.check_packed_dense, lambda f: t.dense_rows(f, T=ROWS[0]), "leaks"),
    "perturbation": ("gdn", functools.partial(t.check_perturbation, victim=0),
                     lambda f: t.recipe_for(f, "packed_alone", 2, lengths=PACKED), "leaks"),
    "gate_softplus": ("gdn", t.check_gate_dense,
                      lambda f: t.recipe_for(f, "gate_precomputed", 4, bounded=False, lengths=ROWS),
                      "padded_tail_gate"),
    "gate_bounded": ("kda", t.check_gate_dense,
                     lambda f: t.recipe_for(f, "gate_precomputed", 4, bounded=True, lengths=ROWS),
                     "padded_tail_gate"),
    "qk_norm": ("kda", t.check_l2norm_dense, lambda f: t.recipe_for(f, "l2norm_precomputed", 4, lengths=ROWS),
                "ignores_norm"),
    "v_first": ("gdn", t.check_state_v_first, lambda f: t.recipe_for(f, "transposed_states", 2, lengths=PACKED),
                "reshaped_state"),
    "chunk_states": ("kda", t.check_intermediate,
                     lambda f: t.recipe_for(f, "chunk_starts", 2, lengths=(3, 0, 130)), "late_chunk_states"),
}


# In make test (one per family, the cheapest); the others in the release group (each compiles four programs, ~30 s).
QUICK = ("qk_norm", "v_first")


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in QUICK else (pytest.mark.slow,)) for n in CASES])
def test_family_mode_check_fails_its_mutant_and_passes_the_correct_kernel(name):
    """The check grades its mutant FAIL and the correct family kernel PASS on the same small call."""
    family, check, build, bug = CASES[name]
    recipe = build(family)
    bad = check(mutant(bug, family), recipe)
    assert bad.grade == FAIL, f"{name}: the {family}_{bug} mutant was not caught\n{bad.format()}"
    good = check(correct(family), recipe)
    assert good.passed, f"{name}: a false alarm on {family}-factorized\n{good.format()}"
