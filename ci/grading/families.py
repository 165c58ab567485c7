"""The judge of FLA family kernels: KDA and Gated DeltaNet in FLA's signature (docs/DESIGN.md §1, "Families"; §2,
"Families in FLA"; §4), in every training-call mode.

A :class:`FamilyCase` is a :class:`ci.grading.modes.ModeCase` whose call is a family call
(:class:`oracle.families.FamilyCall`, built from an :class:`oracle.family_recipes.FamilyRecipe`: dense, or in a mode
recipe's structure -- packed sequences, the in-kernel gate, the q/k norm, the ``[V, K]`` layout, the chunk states),
judged like a GDN-2 call on the family's own results ``o, final_state, dq, dk, dv, dg, dbeta, dh0`` (plus the modes'
``intermediate_states``, ``dA_log``, ``ddt_bias``). Only the pipeline differs (``oracle.families.run``: the call
mapped onto its GDN-2 :class:`oracle.call.Call`, ``oracle.modes.run_call``, the results projected back):

* reference: the pipeline in float64;
* ``e_rec``: in float32 (beta's sigmoid, the recurrence, the projection in float32), each result rounded to the
  dtype the kernel returned it in; ``e_cum``: each sequence by the float32 cumulative-sum chunked algorithm;
* envelopes: the mapped call's (``oracle.preprocess.envelopes``, per value head) projected like the gradients --
  Gated DeltaNet's scalar ``dg`` (and ``ddt_bias``) is the sum over K of GDN-2's, so its envelope is the sum over K;
* grades: the grading rule (``ci/grading/rule.py``) through ``ci.grading.modes.compare``, nothing new.

NumPy and the oracle only (docs/DESIGN.md §3): the kernel is run by ``ci/running/modes.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from gdn2_oracle.oracle import call_modes, families, family_recipes
from gdn2_oracle.oracle.family_recipes import FamilyRecipe
from gdn2_oracle.oracle.generate import KERNEL_DTYPES as DTYPES

from .modes import GOLDEN_SETS, MODES, ModeCase, envelopes

# The results a family kernel is judged on without the modes' extra ones, in report order.
FAMILY_RESULTS = families.FAMILY_RESULTS
# The family a kernel in the plain contract (q, k, v, g, b, w) is.
GDN2 = families.GDN2.name


@dataclass(eq=False)
class FamilyCase(ModeCase):
    """One family call in one input dtype; ``build()`` returns ``(fcall, do, dfinal_state)``. ``family``: ``gdn`` or
    ``kda``; ``flags``: FLA's beta and q/k keywords the call sets (True), which a kernel must accept."""

    family: str = ""
    flags: tuple = ()

    @classmethod
    def from_recipe(cls, name, recipe: FamilyRecipe):
        """The case of a :class:`oracle.family_recipes.FamilyRecipe`, in the recipe's precision."""
        case = cls(name, "generated", recipe.precision, recipe.shape, recipe.build, recipe.modes, recipe.regime(),
                   key={"family_recipe": recipe.fields()}, family=recipe.family, flags=tuple(recipe.flags()))
        case.recipe = recipe
        return case

    @classmethod
    def named(cls, name, *, precision=None, seed=0):
        """The catalogued recipe ``name`` (``oracle.family_recipes``), its seed shifted by ``seed``; a dense recipe in
        ``precision`` (default float32; a ``_bf16`` suffix for bfloat16), a mode recipe in its own."""
        r = family_recipes.get(name)
        if r.mode is None:
            precision = precision or "float32"
            r = r.replace(precision=precision)
            name = name if precision == "float32" else f"{name}_bf16"
        return cls.from_recipe(name, r.replace(seed=r.seed + seed))

    def run_pipeline(self, call, dtype, do=None, dfs=None, *, core="recurrence", inner=None):
        """The family call's results by name in working precision ``dtype`` (``oracle.families.run``)."""
        return families.run(call, dtype, do, dfs, core=core, inner=inner)

    def envelopes_of(self, call, inner):
        """The mapped GDN-2 call's envelopes projected onto the family's results (sums over K for Gated DeltaNet)."""
        return call.project_sums(envelopes(call.to_call(), inner))

    def core_call(self):
        """The GDN-2 call the family call maps to (what the diagnosis reads: its log-decay per channel)."""
        return self.call.to_call()

    def describe(self):
        """The case's identity in a report: a mode case's keys and the family."""
        return {**super().describe(), "family": self.family}


def cases(kind="quick", dtypes=DTYPES, *, seed=0, families_selected=families.MAPPED, modes_selected=MODES,
          plain=True, case_type=None, projected=()):
    """The family cases of a case set (``oracle.family_recipes.names(kind)``) for the families in
    ``families_selected``: the plain recipes in each of ``dtypes`` (with ``plain``) and the family projections of
    the GDN-2 dense recipes ``projected`` (``(name, oracle.Recipe)`` pairs, each in its own precision:
    ``oracle.family_recipes.projections``) whose precision is in ``dtypes``, the mode recipes in their own precision
    when it is in ``dtypes`` and their modes are all in ``modes_selected``. ``case_type``: the :class:`FamilyCase`
    subclass built (the running floor's)."""
    case_type = case_type or FamilyCase
    out = []
    chosen = [n for n in family_recipes.names(kind) if family_recipes.get(n).family in families_selected]
    if plain:
        out += [case_type.named(n, precision=d, seed=seed) for d in dtypes for n in chosen
                if family_recipes.get(n).mode is None]
        from gdn2_oracle.golden import family_catalogue  # names only, no data read

        # a projection with a family golden of its name is judged once, as the golden (its 256-bit twin)
        goldens = set(family_catalogue.names()) if kind in GOLDEN_SETS else set()
        out += [case_type.from_recipe(n, r) for fam in families_selected
                for n, r in family_recipes.projections(fam, projected, seed).items()
                if r.precision in dtypes and n not in goldens]
    for n in chosen:
        r = family_recipes.get(n)
        if r.mode is not None and r.precision in dtypes and set(r.modes) <= set(modes_selected):
            out.append(case_type.named(n, seed=seed))
    if kind in GOLDEN_SETS:
        out += golden_cases(families_selected, dtypes, modes_selected, plain, case_type)
    return out


def golden_cases(families_selected, dtypes, modes_selected=MODES, plain=True, case_type=None):
    """The family goldens (``golden/family_catalogue.py``; 256-bit references, hash-checked when first loaded) of
    ``families_selected`` in ``dtypes`` whose modes are all in ``modes_selected`` (a plain one only with ``plain``),
    each judged against its stored results (:attr:`ModeCase.stored_reference`)."""
    from gdn2_oracle.golden.load import family_judged_cases  # the corpus is read only when a set has it

    case_type = case_type or FamilyCase
    out = []
    for e in family_judged_cases(families_selected, dtypes):
        if set(e.modes) <= set(modes_selected) and (plain or e.modes):
            flags = tuple(f for f in e.flags if not any(f in call_modes.get(m).keywords for m in e.modes))
            out.append(case_type(e.name, "golden", e.dtype, e.shape, e.build, e.modes, dict(e.regime),
                                 stored_reference=e.reference, family=e.family, flags=flags))
    return out
