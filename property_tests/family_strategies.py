"""Hypothesis strategies for the family properties (``property_tests/test_families.py``): drawn
:class:`oracle.family_recipes.FamilyRecipe` s.

As for the GDN-2 properties (``strategies.py``), data are drawn as seeds and regime names, never raw arrays, so a
counterexample is a one-line ``FamilyRecipe(...)``; shapes come from small fixed sets (:data:`CORE`: every profile;
``any_config()``: the full cross product, ``thorough``) because each new shape costs a JIT compile:

* grouped value heads ``HV = G H`` with ``G`` in :data:`GROUPS` and ``H`` in :data:`KEY_HEADS`;
* ``T`` across the chunk edges of our kernels (1, 2, C-1, C+1 and two chunks with a tail, C = 64);
* every decay regime of ``make_problem`` (long memory: ``none`` / ``weak`` and ``mixed``'s undecayed heads; hard
  resets) and every beta regime of the recipes (near 0, 1 and 2, logits, logits with negative eigenvalues);
* the in-kernel q/k norm, the initial state, float32 and bfloat16.

A flag of FLA's the kernel does not take (``ci/running/families.py: takes_flags``) is never drawn: the regimes that
would set it are left out of the choices, not drawn and rejected.
"""

from __future__ import annotations

from typing import NamedTuple

from hypothesis import settings
from hypothesis import strategies as st

from gdn2_oracle import oracle
from gdn2_oracle.oracle import family_recipes
from gdn2_oracle.oracle.family_recipes import BETAS, LOGIT_BETAS, FamilyRecipe

from .strategies import CHUNK, seeds

GROUPS = (1, 2, 4)  # G: value heads per key head
KEY_HEADS = (1, 2)
LENGTHS = (1, 2, CHUNK - 1, CHUNK + 1, 2 * CHUNK + 2)
BATCHES = (1, 2)
KEY_DIMS = (16, 32)
VALUE_DIMS = (8, 16)
DTYPES = oracle.KERNEL_DTYPES
DECAYS = oracle.DECAYS


class FamilyConfig(NamedTuple):
    """A fixed family-call shape and input dtype (one JIT compile per kernel and flags)."""

    B: int
    T: int
    H: int
    G: int
    K: int
    V: int
    dtype: str

    @property
    def HV(self):
        return self.G * self.H

    def recipe(self, family, **fields):
        """The :class:`FamilyRecipe` of ``family`` on this shape and dtype with ``fields``."""
        return FamilyRecipe(family, self.B, self.T, self.H, self.HV, self.K, self.V, precision=self.dtype, **fields)


# Every G and H, T at 1, 2, C-1, C+1 and 2C+2, K != V, B = 2, both dtypes.
CORE = (
    FamilyConfig(2, 1, 1, 1, 16, 8, "float32"),
    FamilyConfig(1, 2, 2, 2, 16, 8, "bfloat16"),
    FamilyConfig(1, CHUNK - 1, 2, 4, 16, 16, "float32"),
    FamilyConfig(1, CHUNK + 1, 2, 2, 32, 16, "float32"),
    FamilyConfig(2, CHUNK + 1, 1, 4, 16, 8, "bfloat16"),
    FamilyConfig(1, 2 * CHUNK + 2, 2, 2, 16, 16, "float32"),
)

# The fixed examples (CORE index, decay, beta, extra fields): every decay regime, every beta regime (negative
# eigenvalues included), the in-kernel q/k norm and the initial state, each at least once, in every profile.
EXAMPLES = (
    (0, "none", "uniform", {"initial_state": True}),
    (1, "weak", "small", {}),
    (2, "moderate", "near_one", {"qk_l2norm": True, "initial_state": True}),
    (3, "strong", "near_two", {"initial_state": True}),
    (4, "mixed", "logits", {}),
    (5, "resets", "logits_high", {"neg_eigval": True, "initial_state": True}),
    (3, "extreme", "logits", {"qk_l2norm": True}),
    (5, "weak", "uniform", {"initial_state": True}),  # long memory across two chunk edges
)


def thorough():
    """Whether the Hypothesis profile in force is ``thorough`` (every flag combination drawn, every mode recipe)."""
    return getattr(settings, "_current_profile", None) == "thorough"


def takes(recipe, accepted):
    """Whether a kernel taking FLA's flags ``accepted`` can be called on ``recipe`` (every flag it sets is taken)."""
    return set(recipe.flags()) <= set(accepted)


def examples(family, accepted):
    """The :data:`EXAMPLES` as recipes of ``family``, those whose flags are all in ``accepted``."""
    out = []
    for i, (ci, decay, beta, extra) in enumerate(EXAMPLES):
        r = CORE[ci].recipe(family, decay=decay, beta=beta, qk=oracle.QK_MODES[i % 2], seed=700 + i, **extra)
        if takes(r, accepted):
            out.append(r)
    return out


def activations(family, accepted):
    """``[(beta, neg_eigval, qk_l2norm), ...]``: the beta regimes and q/k norm a ``family`` kernel taking the flags
    ``accepted`` can be called with (the recipes' own rule for which flags each sets: ``FamilyRecipe.flags``)."""
    probe = CORE[0]
    out = []
    for beta in BETAS:
        for neg in (False, True) if beta in LOGIT_BETAS else (False,):
            for norm in (False, True):
                if takes(probe.recipe(family, beta=beta, neg_eigval=neg, qk_l2norm=norm), accepted):
                    out.append((beta, neg, norm))
    return out


def extreme_activations(family, accepted):
    """The :func:`activations` that set no flag and those that set every flag the kernel takes (``accepted``): two
    flag settings, so two compiled programs a shape."""
    probe = CORE[0]
    options = activations(family, accepted)
    flags = [frozenset(probe.recipe(family, beta=b, neg_eigval=n, qk_l2norm=q).flags()) for b, n, q in options]
    every = frozenset().union(*flags)
    return [a for a, f in zip(options, flags) if f in (frozenset(), every)]


@st.composite
def recipes(draw, family, config, accepted, *, extremes=False):
    """A :class:`FamilyRecipe` of ``family`` on ``config``: decay and beta regimes, negative eigenvalues, in-kernel
    q/k norm, q/k mode, initial state and seed, drawn among what a kernel taking the flags ``accepted`` takes;
    ``extremes``: among :func:`extreme_activations` only (no flag, or every flag the kernel takes)."""
    options = extreme_activations(family, accepted) if extremes else activations(family, accepted)
    beta, neg, norm = draw(st.sampled_from(options))
    return config.recipe(family, decay=draw(st.sampled_from(DECAYS)), beta=beta, neg_eigval=neg, qk_l2norm=norm,
                         qk=draw(st.sampled_from(oracle.QK_MODES)), initial_state=draw(st.booleans()),
                         seed=draw(seeds))


def any_config():
    """Any config of the full cross product of the small sets (``thorough``)."""
    return st.builds(FamilyConfig, st.sampled_from(BATCHES), st.sampled_from(LENGTHS), st.sampled_from(KEY_HEADS),
                     st.sampled_from(GROUPS), st.sampled_from(KEY_DIMS), st.sampled_from(VALUE_DIMS),
                     st.sampled_from(DTYPES))


def drawn_recipes(family, accepted, *, thorough=False):
    """A recipe of ``family`` on a :data:`CORE` config (``thorough``: or on any config of the small sets)."""
    configs = st.sampled_from(CORE)
    if thorough:
        configs = st.one_of(configs, any_config())
    return configs.flatmap(lambda c: recipes(family, c, accepted))


# --------------------------------------------------------------------------------------------
# family calls in the structure of a training-call recipe (``FamilyRecipe.mode``)


def mode_recipes(thorough=False):
    """The catalogued family recipes in a training-call recipe's structure (``oracle.family_recipes``) the family
    properties run: per family, the first recipe of each call mode alone in each dtype and each in-kernel gate form
    (softplus or bounded, with or without ``A_log`` / ``dt_bias``), its float32 twin at whole chunks where it has one
    (``_T128``: a bug in the tail of T fails one of the pair only), and the first float32 one of each combination of
    modes together; ``thorough``: every one of the ``full`` set."""
    names = [n for n in family_recipes.names("full") if family_recipes.get(n).mode is not None]
    if thorough:
        return names
    chosen, seen = [], set()
    for name in names:
        r = family_recipes.get(name)
        s = r.structure()
        whole = all(n % family_recipes.C == 0 for n in s.lengths)
        if len(s.modes) > 1:  # modes together: float32, with a tail
            key = (r.family, s.modes)
            if r.precision != "float32" or whole:
                continue
        else:
            key = (r.family, s.modes, s.lower_bound is None, s.A_log, s.dt_bias, r.precision, whole)
            if whole and r.precision != "float32":
                continue
        if key not in seen:
            seen.add(key)
            chosen.append(name)
    return chosen


def _betas(recipe, accepted):
    """``[(beta, neg_eigval), ...]``: every beta regime a kernel taking ``accepted`` takes on ``recipe``'s family."""
    return [(b, n) for b, n, norm in activations(recipe.family, accepted) if not norm]


def variant_betas(recipe, accepted):
    """``[(beta, neg_eigval), ...]``: the beta regimes of :func:`mode_variants` on ``recipe`` for a kernel taking the
    flags ``accepted``, all setting the same flags, so one compiled program serves every drawn variant: a recipe with
    beta logits keeps logits and adds ``allow_neg_eigval`` where the kernel takes it (each logit structure is judged
    with and without negative eigenvalues: the recipe itself is the fixed example); any other keeps plain betas."""
    options = _betas(recipe, accepted)
    logits = [(b, n) for b, n in options if b in LOGIT_BETAS]
    if recipe.beta in LOGIT_BETAS and logits:
        neg = any(n for _, n in logits)
        return [(b, n) for b, n in logits if n == neg]
    return [(b, n) for b, n in options if b not in LOGIT_BETAS]


@st.composite
def mode_variants(draw, recipe, accepted, *, thorough=False):
    """``recipe`` (in a training-call recipe's structure) with drawn seed, decay and beta regime among those a kernel
    taking the flags ``accepted`` takes; its structure kept. The beta regimes are :func:`variant_betas` (one program
    for every draw); ``thorough``: any of them, negative eigenvalues included, each flag setting its own program."""
    beta, neg = draw(st.sampled_from(_betas(recipe, accepted) if thorough else variant_betas(recipe, accepted)))
    out = recipe.replace(seed=draw(seeds), decay=draw(st.sampled_from(DECAYS)), beta=beta, neg_eigval=neg)
    return out if takes(out, accepted) else recipe.replace(seed=out.seed, decay=out.decay)


# --------------------------------------------------------------------------------------------
# the call-mode properties through the family lens (``test_family_modes.py``)


def structure_of(family, modes, *, bounded=None):
    """The name of the first mode recipe (``oracle.mode_recipes``) whose float32 family recipe of ``family``
    (``oracle.family_recipes.FULL_MODES``) uses exactly the call modes ``modes``; ``bounded``: its in-kernel gate
    with (True) or without (False) ``lower_bound``. None where the family takes no such call."""
    for r in family_recipes.FULL_MODES.values():
        if r.family != family or r.precision != "float32" or set(r.modes) != set(modes):
            continue
        if bounded is None or (r.structure().lower_bound is not None) == bounded:
            return r.mode
    return None


@st.composite
def value_variants(draw, recipe):
    """``recipe`` with drawn seed, decay regime and a beta regime that sets no flag: values only, so the kernel's
    program compiled for ``recipe`` serves every draw."""
    plain = [b for b in BETAS if b not in LOGIT_BETAS]
    return recipe.replace(seed=draw(seeds), decay=draw(st.sampled_from(DECAYS)), beta=draw(st.sampled_from(plain)),
                          neg_eigval=False)
