"""Family projections of GDN-2 recipes (oracle/family_recipes.py): a dense GDN-2 recipe seen through the GDN or KDA
lens keeps its shape, decay regime, initial state, q/k mode, scale, precision and seed, takes the beta regime nearest
its gates, and cycles the grouped value heads over the shapes; the mode recipes come in both dtypes and, for the gate,
norm and packed ones, at whole chunks too."""

from __future__ import annotations

import numpy as np
import pytest

from gdn2_oracle.oracle import Recipe, families, family_recipes, mode_recipes
from gdn2_oracle.oracle.generate import GATES, make_problem

C = family_recipes.C


def test_every_gate_regime_has_a_beta_regime():
    assert set(family_recipes.GATE_BETAS) == set(GATES)
    assert set(family_recipes.GATE_BETAS.values()) <= set(family_recipes.BETAS)
    # no logit regime: a projection sets no flag, so every kernel in FLA's signature takes it
    assert not set(family_recipes.GATE_BETAS.values()) & set(family_recipes.LOGIT_BETAS)


@pytest.mark.parametrize("family", families.MAPPED)
def test_a_projection_keeps_the_gdn2_recipes_inputs(family):
    r = Recipe(1, 40, 2, 8, 16, decay="strong", gates="uniform", qk="raw", scale=0.5, initial_state=True,
               precision="bfloat16", seed=7)
    [(name, p)] = family_recipes.projections(family, [("x_bf16", r)]).items()
    assert name == f"{family}_x_bf16" and (p.B, p.T, p.H, p.K, p.V) == (1, 40, 2, 8, 16) and p.HV == 2
    assert (p.decay, p.beta, p.qk, p.scale, p.initial_state, p.precision, p.seed) == (
        "strong", "uniform", "raw", 0.5, True, "bfloat16", 7)
    call, _, _ = p.build()
    base = make_problem(1, 40, 2, 8, 16, HV=2, decay="strong", gates="uniform", qk="raw", initial_state=True,
                        precision="bfloat16", seed=7)
    assert np.array_equal(call.q, base.q) and np.array_equal(call.v, base.v) and call.scale == 0.5
    np.testing.assert_array_equal(call.initial_state, base.initial_state)
    g = base.g if family == "kda" else base.g[..., 0]  # one log-decay per head for gdn
    assert np.array_equal(call.g, g)


def test_the_grouped_value_heads_cycle_with_each_new_shape():
    shapes = [(1, 40, 2, 16, 16), (1, 40, 2, 16, 16), (2, 24, 1, 16, 32), (1, 100, 2, 32, 32), (1, 9, 1, 8, 8),
              (2, 24, 1, 16, 32)]
    recipes = [(f"r{j}", Recipe(*s, seed=j)) for j, s in enumerate(shapes)]
    got = [p.HV // p.H for p in family_recipes.projections("gdn", recipes).values()]
    assert got == [1, 1, 2, 4, 1, 2]  # cases that differ only in values share a shape
    assert family_recipes.projections("kda", recipes, seed=5)["kda_r2"].seed == 2 + 5


def test_bad_projections_name_the_argument():
    with pytest.raises(ValueError, match="gates"):
        family_recipes.projection("gdn", (1, 4, 1, 4, 4), "moderate", "sideways")
    with pytest.raises(ValueError, match="G"):
        family_recipes.projection("gdn", (1, 4, 1, 4, 4), "moderate", "uniform", G=0)
    with pytest.raises(ValueError, match="scale"):
        family_recipes.projection("gdn", (1, 4, 1, 4, 4), "moderate", "uniform", scale=-1.0)
    with pytest.raises(ValueError, match="lengths"):
        family_recipes.FamilyRecipe("gdn", 1, 4, 1, 1, 4, 4, lengths=(4,))


@pytest.mark.parametrize("family", families.MAPPED)
def test_mode_recipes_come_in_both_dtypes_and_at_whole_chunks(family):
    quick = {n: family_recipes.get(n) for n in family_recipes.names("quick")
             if n.startswith(f"{family}_") and family_recipes.get(n).mode}
    for name, r in quick.items():
        twin = name.removesuffix("_bf16")
        if name.endswith("_bf16"):
            assert r.precision == "bfloat16" and quick[twin] == r.replace(precision="float32")
        else:
            assert r.precision == "float32" and f"{name}_bf16" in quick
    for mode in ("varlen", "gate", "l2norm"):
        tails = [r for r in quick.values() if mode in r.modes and r.lengths is None]
        whole = [r for r in quick.values() if mode in r.modes and r.lengths is not None]
        assert tails and whole, mode
        assert all(family_recipes.at_whole_chunks(r.structure()) for r in tails)
        assert all(sum(r.structure().lengths) % C for r in tails)  # a tail in every mode recipe
        assert all(n % C == 0 for r in whole for n in r.structure().lengths)
    gate = quick[f"{family}_gate_softplus_T128"]
    assert gate.shape[:2] == (2, 2 * C) and gate.structure().gate == "softplus"
    call, do, _ = gate.build()
    assert call.shape[:2] == (2, 2 * C) and do.shape[:2] == (2, 2 * C)


def test_whole_chunk_lengths_keep_the_packing():
    packed, dense = mode_recipes.get("varlen_quick"), mode_recipes.get("gate_softplus")
    assert family_recipes.whole_chunk_lengths(packed) == (C, C)
    assert family_recipes.whole_chunk_lengths(dense) == (2 * C,) * len(dense.lengths)
