"""The family properties' draws of FLA's flags: in the ``dev`` and ``ci`` profiles every draw of one mode recipe
sets the same flags (``family_strategies.mode_variants``: one compiled program a property), across the mode recipes
each call mode is still judged with every beta flag setting a kernel takes (plain, logits, logits with negative
eigenvalues), and the family-lens properties draw no flag or every flag the kernel takes (``recipes(extremes=True)``:
two programs a shape). No kernel runs here: the recipes' own ``flags()`` say which program a call compiles."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from gdn2_oracle.oracle import family_recipes
from gdn2_oracle.property_tests import family_strategies

BETA_FLAGS = ("use_beta_sigmoid_in_kernel", "allow_neg_eigval")
EVERY_FLAG = ("use_qk_l2norm_in_kernel", *BETA_FLAGS)
# What a kernel may take: FLA's three flags; only the q/k norm's; none.
ACCEPTED = {"every flag": EVERY_FLAG, "sigmoid only": ("use_qk_l2norm_in_kernel", "use_beta_sigmoid_in_kernel"),
            "no beta flag": ("use_qk_l2norm_in_kernel",)}


def _bases(accepted):
    return [r for r in map(family_recipes.get, family_strategies.mode_recipes())
            if family_strategies.takes(r, accepted)]


def _draws(strategy, n):
    """``n`` derandomized draws of ``strategy``."""
    out = []

    @given(strategy)
    @settings(max_examples=n, derandomize=True, database=None)
    def collect(r):
        out.append(r)

    collect()
    return out


def _variants(recipe, accepted, thorough=False, n=40):
    return _draws(family_strategies.mode_variants(recipe, accepted, thorough=thorough), n)


def _beta_flags(recipe):
    return frozenset(f for f in recipe.flags() if f in BETA_FLAGS)


@pytest.mark.parametrize("accepted", list(ACCEPTED.values()), ids=list(ACCEPTED))
def test_every_draw_of_a_mode_recipe_compiles_one_program(accepted):
    """Seeds, decay and beta regimes vary; the flags, shape, dtype and call structure (the program's key) do not."""
    for base in _bases(accepted):
        drawn = _variants(base, accepted, n=12)
        assert len({frozenset(r.flags()) for r in drawn}) == 1, base.mode
        values = dict(seed=base.seed, decay=base.decay, beta=base.beta, neg_eigval=base.neg_eigval)
        assert {r.replace(**values) for r in drawn} == {base}, base.mode  # shape, dtype, structure kept
        assert len({(r.seed, r.decay, r.beta) for r in drawn}) > 1, base.mode  # values are drawn
        assert set(drawn[0].flags()) <= set(accepted)


@pytest.mark.parametrize("accepted", list(ACCEPTED.values()), ids=list(ACCEPTED))
def test_each_call_mode_meets_every_beta_flag_setting_the_kernel_takes(accepted):
    """Over the mode recipes (each one's fixed example and its draws) every call mode the logit recipes hold is
    judged plain, with logits, and with logits and negative eigenvalues, as far as the kernel takes those flags."""
    settings_taken = {frozenset(), *(frozenset(BETA_FLAGS[:i]) for i in (1, 2) if set(BETA_FLAGS[:i]) <= set(accepted))}
    met = {}
    for base in _bases(accepted):
        for r in [base, *_variants(base, accepted, n=4)]:
            for mode in r.structure().modes:
                met.setdefault((r.family, mode), set()).add(_beta_flags(r))
    logit_modes = {(r.family, m) for r in _bases(EVERY_FLAG) if r.beta in family_recipes.LOGIT_BETAS
                   for m in r.structure().modes}
    assert logit_modes >= {(f, m) for f in ("gdn", "kda") for m in ("varlen", "gate", "l2norm", "state_v_first")}
    missing = {key: settings_taken - met.get(key, set()) for key in logit_modes}
    assert not {k: v for k, v in missing.items() if v}, missing


def test_thorough_draws_every_beta_flag_setting_on_one_recipe():
    """The ``thorough`` profile draws every beta regime on each recipe, each flag setting its own program."""
    base = family_recipes.get(family_strategies.mode_recipes()[0])
    drawn = _variants(base, EVERY_FLAG, thorough=True, n=60)
    assert {_beta_flags(r) for r in drawn} == {frozenset(), frozenset(BETA_FLAGS[:1]), frozenset(BETA_FLAGS)}


def _drawn_recipes(family, accepted, config, extremes, n=60):
    return _draws(family_strategies.recipes(family, config, accepted, extremes=extremes), n)


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("accepted", list(ACCEPTED.values()), ids=list(ACCEPTED))
def test_the_lens_draws_two_flag_settings_a_shape_no_flag_and_every_flag(family, accepted):
    """The family-lens properties' draws (``extremes``): on one shape, the recipes set either no flag or every flag
    the kernel takes, both drawn (two programs); without ``extremes`` (the oracle property, ``thorough``) every
    combination the kernel takes is drawn. Plain beta regimes are still drawn beside the flagged ones."""
    config = family_strategies.CORE[3]
    every = frozenset(accepted)
    lens = _drawn_recipes(family, accepted, config, extremes=True)
    assert {frozenset(r.flags()) for r in lens} == {frozenset(), every}
    assert {r.beta for r in lens if not r.flags()} == {"uniform", "small", "near_one", "near_two"}
    full = {frozenset(r.flags()) for r in _drawn_recipes(family, accepted, config, extremes=False, n=200)}
    # the q/k norm on or off, times: no beta flag, the sigmoid, the sigmoid with negative eigenvalues (as taken)
    assert len(full) == 2 * (1 + sum(f in accepted for f in BETA_FLAGS))
