"""Hypothesis properties of Gated DeltaNet and KDA kernels in FLA's signature (docs/DESIGN.md §1, "Families"; §2,
"Families in FLA"; §6).

A family kernel is called like ``chunk_gated_delta_rule`` / ``chunk_kda`` (``fn(q, k, v, g, beta, scale=,
initial_state=, output_final_state=True, [flags])``, ``HV = G H`` value heads) by ``ci/running/families.py``, and
judged by ``ci/grading/families.py: FamilyCase.judge`` -- the rule ``validate`` applies to family kernels -- against
the float64 family oracle (``oracle/families.py``) on its own results ``o, final_state, dq, dk, dv, dg, dbeta,
dh0``.

Data are drawn as :class:`oracle.family_recipes.FamilyRecipe` s (``family_strategies.py``): grouped value heads,
lengths across chunk edges, every decay and beta regime, the in-kernel q/k norm, the initial state, float32 and
bfloat16; fixed examples cover each regime in every profile. A flag the kernel does not take is not drawn. A failure
prints the verdict table, the recipe and a one-line reproduction.

Only family kernels (``gdn``, ``kda``) are judged here: a GDN-2 kernel is skipped with the reason (conftest.py reads
each kernel's family as ``validate`` does). The check is a plain function of a kernel (:func:`check_oracle`) so the
plugin's own tests can show which recipe catches each mutant of ``kernels/testing_families.py``.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, note, settings

from gdn2_oracle.ci.grading.tolerance import Report
from gdn2_oracle.ci.running.cases import FamilyRunCase
from gdn2_oracle.ci.running.families import accepted_flags
from gdn2_oracle.kernels.spec import python_c, runnable
from gdn2_oracle.oracle import family_recipes
from gdn2_oracle.oracle.families import MAPPED
from gdn2_oracle.oracle.family_recipes import FamilyRecipe
from gdn2_oracle.property_tests import family_strategies, grading
from gdn2_oracle.property_tests.strategies import target_ratios

# FLA's families: a GDN-2 kernel is skipped with the reason (conftest.py).
pytestmark = pytest.mark.gdn2_family(*MAPPED)


def check_oracle(fn, recipe: FamilyRecipe) -> Report:
    """Kernel ``fn`` on the family call of ``recipe`` against the float64 family oracle (``FamilyCase.judge``)."""
    case = FamilyRunCase.from_recipe("property", recipe)
    return case.graded(fn, case.results(fn, case.data(), None, None))


def repro(recipe: FamilyRecipe, kernel_name) -> str:
    """A shell one-liner that judges ``kernel_name`` on ``recipe`` and prints the report."""
    return runnable(python_c("from gdn2_oracle import kernels; from gdn2_oracle.oracle.family_recipes import "
                             "FamilyRecipe; from gdn2_oracle.property_tests.test_families import check_oracle; "
                             f"print(check_oracle(kernels.get({kernel_name!r}), {recipe.call_source()}).format())"),
                    kernel_name)


def check(report, recipe, kernel_name):
    """FAIL fails the test (with the recipe and a reproduction); PRECISION warns (fails under --gdn2-strict)."""
    note(f"recipe: {recipe.call_source()}")
    if not report.passed:
        grading.enforce(report, f"{recipe.family} kernel {kernel_name!r} vs the float64 family oracle\n"
                                f"{report.format()}\nrecipe:    {recipe.call_source()}\n"
                                f"reproduce: {repro(recipe, kernel_name)}")


def test_family_kernel_matches_the_oracle(kernel, kernel_families):
    """o, the final state and the gradients w.r.t. q, k, v, g, beta and h0 match the float64 family oracle, on drawn
    family calls of the kernel's family (the flags it takes only) and on the fixed examples of every regime."""
    family, accepted = kernel_families[kernel.name], accepted_flags(kernel.fn)

    @given(recipe=family_strategies.drawn_recipes(family, accepted, thorough=family_strategies.thorough()))
    def matches(recipe):
        report = check_oracle(kernel.fn, recipe)
        target_ratios(report)  # hypothesis.target on error / tolerance: steers the thorough profile's search
        check(report, recipe, kernel.name)

    for recipe in reversed(family_strategies.examples(family, accepted)):  # run in EXAMPLES' order
        matches = example(recipe=recipe)(matches)
    matches()


def _mode_param(name):
    """The parameter of catalogued family recipe ``name``: its family (conftest.py deselects it for a kernel of the
    other family) and the ``gdn2_modes`` mark of its call modes (deselected for a kernel that does not take them)."""
    r = family_recipes.get(name)
    return pytest.param(r.family, name, marks=pytest.mark.gdn2_modes(*r.modes), id=name)


MODE_RECIPES = family_strategies.mode_recipes(family_strategies.thorough())


@pytest.mark.parametrize("family,name", [_mode_param(n) for n in MODE_RECIPES])
def test_family_mode_call_matches_the_oracle(kernel, family, name):
    """A family call in a training-call recipe's structure (packed sequences, the in-kernel gate's forms with A_log
    and dt_bias, the q/k norm, the state layout, the chunk states) against the float64 family oracle, every result
    it has; the catalogued recipe, then drawn seeds, decay and beta regimes that set one flag setting
    (``family_strategies.variant_betas``: a recipe with beta logits adds negative eigenvalues), one program for them."""
    accepted = accepted_flags(kernel.fn)
    base = family_recipes.get(name)

    @given(recipe=family_strategies.mode_variants(base, accepted, thorough=family_strategies.thorough()))
    @settings(max_examples=max(1, settings().max_examples // 4))  # ~16 (GDN) to ~28 (KDA) recipes
    def matches(recipe):
        check(check_oracle(kernel.fn, recipe), recipe, kernel.name)

    if family_strategies.takes(base, accepted):
        matches = example(recipe=base)(matches)
    matches()
