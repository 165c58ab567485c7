"""The golden catalogue of FLA family calls: KDA and Gated DeltaNet in their own parametrisation (docs/DESIGN.md §1,
"Families"; ``oracle/families.py``), their references from ``oracle/families_mp.py``.

A :class:`FamilyGoldenCase` is a name, a free-text ``purpose``, an :class:`oracle.family_recipes.FamilyRecipe`
(family, dimensions with grouped value heads, decay and beta regimes, FLA's beta and q/k flags, seed, precision) and
the in-kernel log-decay (``use_gate_in_kernel``): ``decay_form`` None (``g`` is the recipe's log-decay),
``"softplus"`` (``g = -exp(A_log) softplus(g_raw + dt_bias)``) or ``"bounded"`` (``g = lower_bound
sigmoid(exp(A_log)(g_raw + dt_bias))``, KDA only). With a decay form, ``g_raw ~ N(0, 1)`` (rounded like the inputs),
``A_log = log U[1, 16]`` per value head and ``dt_bias ~ N(0, 1)`` (``[HV]`` for Gated DeltaNet, ``[HV*K]`` for KDA),
both float32 as FLA's parameters, each from its own seeded stream. :meth:`FamilyGoldenCase.build` rebuilds the exact
``oracle.families.FamilyCall`` and cotangents bit for bit; :meth:`FamilyGoldenCase.checksum` is
``golden.catalogue.recipe_checksum`` of :data:`RECIPE_FIELDS` (named, so a field added to ``FamilyRecipe`` later
with a default leaves every checksum as it is).

Files share ``golden/data/`` (names start with the family, unique across every catalogue and the family recipes),
with their own member list (``golden/load.py``: :data:`FAMILY_ARRAY_ORDER`) and one manifest section per family
(``gdn_cases``, ``kda_cases``), so the dense and mode files and entries stay byte-identical. Sizes are what the
256-bit run (and its 512-bit estimate) affords in a few seconds a case.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from gdn2_oracle.oracle import families, family_recipes
from gdn2_oracle.oracle.family_recipes import FamilyRecipe
from gdn2_oracle.oracle.generate import round_to

from . import catalogue
from .catalogue import recipe_checksum

# Bump when anything that determines a family golden's bytes changes outside the recipes (oracle.families_mp,
# the recipes' generators, the family file format, the mpmath precision). Separate from the other catalogues'.
GENERATOR_VERSION = "1"
# The in-kernel log-decay forms (None: the log-decay is given).
DECAY_FORMS = ("softplus", "bounded")
# The FamilyRecipe fields a case's checksum covers, then the case's own.
RECIPE_FIELDS = ("family", "B", "T", "H", "HV", "K", "V", "decay", "beta", "neg_eigval", "qk_l2norm", "qk",
                 "initial_state", "seed", "precision")
CASE_FIELDS = ("decay_form", "lower_bound")
# The reference's results by name: the family call's (oracle.families.FamilyGrads), dA_log / ddt_bias with A_log /
# dt_bias.
RESULTS = ("o", "final_state") + families.FAMILY_GRADS
# Tags of the seeded streams (FamilyRecipe uses 11 and 12).
_TAGS = {"g_raw": 21, "params": 22}


@dataclass(frozen=True)
class FamilyGoldenCase:
    """One family golden: a name, what it is for, a :class:`FamilyRecipe` and the in-kernel log-decay form."""

    name: str
    recipe: FamilyRecipe
    purpose: str = ""
    decay_form: str | None = None
    lower_bound: float | None = None

    def __post_init__(self):
        if not isinstance(self.recipe, FamilyRecipe):
            raise ValueError(f"{self.name}: recipe must be an oracle.family_recipes.FamilyRecipe, got {self.recipe!r}")
        if self.decay_form is not None and self.decay_form not in DECAY_FORMS:
            raise ValueError(f"{self.name}: decay_form: {self.decay_form!r} not one of {DECAY_FORMS} or None")
        if (self.decay_form == "bounded") != (self.lower_bound is not None):
            raise ValueError(f"{self.name}: lower_bound: given exactly with decay_form='bounded', got "
                             f"{self.lower_bound!r} with decay_form={self.decay_form!r}")
        if self.decay_form == "bounded" and self.recipe.family != families.KDA.name:
            raise ValueError(f"{self.name}: decay_form: the bounded form is KDA's only "
                             f"({dict(families.GDN.refused)['lower_bound']})")

    @property
    def family(self) -> str:
        return self.recipe.family

    @property
    def shape(self):
        """``(B, T, H, HV, K, V)``."""
        return self.recipe.shape

    @property
    def precision(self) -> str:
        """The input precision (``float32`` or ``bfloat16``): what to feed a kernel."""
        return self.recipe.precision

    def flags(self) -> dict:
        """FLA's keywords the call sets (only those that are True)."""
        return {**self.recipe.flags(), **({"use_gate_in_kernel": True} if self.decay_form else {})}

    def fields(self) -> dict:
        """The case as a JSON-ready dict: :data:`RECIPE_FIELDS` of the recipe, then :data:`CASE_FIELDS`."""
        return {**{f: getattr(self.recipe, f) for f in RECIPE_FIELDS}, **{f: getattr(self, f) for f in CASE_FIELDS}}

    def checksum(self) -> str:
        """sha256 of the case's canonical JSON (:meth:`fields`)."""
        return recipe_checksum(self.fields())

    def cost(self) -> int:
        """Rough relative cost of the mpmath run (token x state elements per value head), for scheduling."""
        B, T, H, HV, K, V = self.shape
        return B * HV * T * (K * V + K + V)

    def regime(self) -> dict:
        """The case's regime as a report describes it."""
        return {**self.recipe.regime(), "decay_form": self.decay_form, "lower_bound": self.lower_bound,
                "purpose": self.purpose}

    def _rng(self, what):
        return np.random.default_rng(np.random.SeedSequence([self.recipe.seed, _TAGS[what]]))

    def build(self):
        """``(fcall, do, dfinal_state)``: the exact family call (``oracle.families.call``) and its cotangents."""
        fcall, do, dfs = self.recipe.build()
        if self.decay_form is None:
            return fcall, do, dfs
        shapes = families.get(self.family).shapes(*self.shape)
        g_raw = round_to(self._rng("g_raw").standard_normal(shapes["g"]), self.precision)
        rng = self._rng("params")
        A_log = round_to(np.log(rng.uniform(1.0, 16.0, shapes["A_log"])), "float32")
        dt_bias = round_to(rng.standard_normal(shapes["dt_bias"]), "float32")
        fcall = families.call(self.family, fcall.q, fcall.k, fcall.v, g_raw, fcall.beta,
                              initial_state=fcall.initial_state, **self.flags(), A_log=A_log, dt_bias=dt_bias,
                              lower_bound=self.lower_bound)
        return fcall, do, dfs


def _f(name, family, shape, purpose, decay_form=None, lower_bound=None, **kw):
    try:
        recipe = FamilyRecipe(family, *shape, **kw)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    return FamilyGoldenCase(name, recipe, purpose, decay_form, lower_bound)


CASES: tuple[FamilyGoldenCase, ...] = (
    # --- Gated DeltaNet: a scalar log-decay per value head ----------------------------------------------------
    _f("gdn_gva2_softplus_logits_h0", "gdn", (1, 24, 2, 4, 16, 16),
       "GVA G = 2, beta logits through the sigmoid, in-kernel softplus log-decay (A_log, dt_bias per head), "
       "initial state", decay_form="softplus", beta="logits", initial_state=True, seed=1101),
    _f("gdn_gva4_neg_eigval_softplus_qk_norm", "gdn", (1, 20, 2, 8, 8, 16),
       "GVA G = 4, K != V, beta = 2 sigmoid near 2 (allow_neg_eigval), softplus log-decay, in-kernel q/k norm",
       decay_form="softplus", beta="logits_high", neg_eigval=True, qk_l2norm=True, seed=1102),
    _f("gdn_gva2_resets_beta_two_bf16", "gdn", (1, 33, 1, 2, 16, 16),
       "GVA G = 2, bf16 inputs, given log-decay with hard resets, beta near 2", decay="resets", beta="near_two",
       precision="bfloat16", initial_state=True, seed=1103),
    # --- KDA: a log-decay per value head and key channel ------------------------------------------------------
    _f("kda_gva2_bounded_logits_h0", "kda", (1, 24, 2, 4, 16, 16),
       "GVA G = 2, beta logits through the sigmoid, in-kernel bounded log-decay lower_bound = -5 (A_log, dt_bias), "
       "initial state", decay_form="bounded", lower_bound=-5.0, beta="logits", initial_state=True, seed=1201),
    _f("kda_gva4_bounded_neg_eigval_qk_norm", "kda", (1, 20, 2, 8, 8, 16),
       "GVA G = 4, K != V, bounded log-decay lower_bound = -5, beta = 2 sigmoid near 2 (allow_neg_eigval), "
       "in-kernel q/k norm", decay_form="bounded", lower_bound=-5.0, beta="logits_high", neg_eigval=True,
       qk_l2norm=True, seed=1202),
    _f("kda_gva4_softplus_bf16", "kda", (1, 17, 1, 4, 16, 8),
       "GVA G = 4, bf16 inputs, in-kernel softplus log-decay, beta U[0, 1], initial state", decay_form="softplus",
       precision="bfloat16", initial_state=True, seed=1203),
)

# The mpmath cost a family golden may have (FamilyGoldenCase.cost): a few seconds at 256 bits and its 512-bit
# estimate, and a file of ~100-200 KB; the GDN-2 corpus's 53-token ``decay_resets`` (H = 2) fits at G = 1.
MAX_COST = 56000


def _within_budget(name, r):
    """``(name, recipe)`` of the family golden projecting ``r``: ``r`` itself when its cost is within
    :data:`MAX_COST`, else ``r`` at the largest smaller G of ``family_recipes.GROUPS`` that is, named
    ``<name>_g<G>`` (its projection at the original G stays a float64-judged case of ``validate``'s sets); None
    when no G fits."""
    H, G = r.H, r.HV // r.H
    for g in [G] + sorted((x for x in family_recipes.GROUPS if x < G), reverse=True):
        candidate = r if g == G else r.replace(HV=H * g)
        if FamilyGoldenCase(name, candidate, "").cost() <= MAX_COST:
            return (name if g == G else f"{name}_g{g}"), candidate
    return None


def _projected_cases():
    """The family projections of the GDN-2 dense catalogue (``golden/catalogue.py``;
    ``oracle.family_recipes.projections``: each gate regime as its beta regime, G cycling over GROUPS per distinct
    shape), named ``<family>_<GDN-2 name>``, each family in turn. A reduction case (``reduction`` kda or gdn) is
    projected into its own family only. A projection over :data:`MAX_COST` (the shapes with G = 2 or 4 beyond ~30
    tokens: ``decay_resets``, the ``WIDE`` shapes, ``len_c16_x3_tail``, ``len_c64``, the ``C64_TAIL`` ones,
    ``kv_32x8``) is kept at the largest smaller G within it
    (``<family>_<GDN-2 name>_g<G>``), so every GDN-2 golden has a family golden but two: the K = V = 128
    ``tpu128_moderate`` and ``tpu128_bf16_strong``, over it at G = 1 (``tpu128_len1`` is in). The catalogue is
    projected in its order, as validate's sets project it (their generated recipes come after it), so each golden's G
    is the one validate's projection of its name has. Left out as well: a projection
    that coincides with an earlier one of its family in all but the seed (``gates_erase_zero``, ``gates_erase_one``,
    ``gdn_moderate``, ``kda_moderate``: the family has one beta for b and w)."""
    out = []
    for family in families.MAPPED:
        mine = [(c.name, c.recipe) for c in catalogue.CASES if c.recipe.reduction in (None, family)]
        seen = set()
        for name, r in family_recipes.projections(family, mine).items():
            structure = dataclasses.replace(r, seed=0)
            kept = None if structure in seen else _within_budget(name, r)
            if kept is None:
                continue
            seen.add(structure)
            gdn2_name = name.removeprefix(family + "_")
            out.append(FamilyGoldenCase(kept[0], kept[1], f"projection of GDN-2 golden {gdn2_name}"
                                        f"{'' if kept[1] is r else f' at G = {kept[1].HV // kept[1].H}'}: "
                                        f"{catalogue.get(gdn2_name).purpose}"))
    return tuple(out)


# The projections (also in CASES, after the hand-made cases above).
PROJECTED: tuple[FamilyGoldenCase, ...] = _projected_cases()
CASES += PROJECTED

_BY_NAME = {c.name: c for c in CASES}
if len(_BY_NAME) != len(CASES):  # pragma: no cover - guards edits to the table above
    raise AssertionError("duplicate case names in golden.family_catalogue.CASES")


def names(family=None) -> list[str]:
    """Family case names in catalogue order (of one family, ``"gdn"`` or ``"kda"``, when given)."""
    if family is not None and family not in families.MAPPED:
        raise ValueError(f"family: {family!r} not one of {families.MAPPED}")
    return [c.name for c in CASES if family is None or c.family == family]


def get(name: str) -> FamilyGoldenCase:
    """The family case called ``name``; ValueError naming it if there is none."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise ValueError(f"golden: unknown family case {name!r} ({len(CASES)} family cases; see "
                         f"golden.family_catalogue.names())") from None


__all__ = ["FamilyGoldenCase", "CASES", "PROJECTED", "GENERATOR_VERSION", "MAX_COST", "DECAY_FORMS", "RECIPE_FIELDS",
           "RESULTS", "names", "get"]
