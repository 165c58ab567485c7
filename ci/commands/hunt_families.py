"""What ``hunt`` draws for a family kernel (KDA, Gated DeltaNet in FLA's signature; docs/DESIGN.md §1, "Families"):
:class:`oracle.family_recipes.FamilyRecipe` s of the kernel's family -- shapes with grouped value heads, every decay
and beta regime, the FLA keywords the kernel's signature takes, initial state, data seed, dtype; with training-call
modes (``--modes gate``) the family's calls in a catalogued mode recipe's structure -- judged by the family judge
(``ci/grading/families.py``, with the family findings of ``ci/grading/family_diagnosis.py``), and the one-liner that
judges a kernel on one again.

Shapes come from small fixed sets, as the conformance suite's do (``property_tests/strategies.py``): every new
(shape, dtype, keywords) costs the kernel one compile, a new seed on a known one milliseconds.
"""

from __future__ import annotations

from typing import NamedTuple

from hypothesis import strategies as st

from gdn2_oracle.kernels.spec import KernelSpec, python_c, runnable
from gdn2_oracle.oracle import DECAYS, KERNEL_DTYPES, QK_MODES, call_modes, mode_recipes
from gdn2_oracle.oracle.family_recipes import BETAS, LOGIT_BETAS, FamilyRecipe

from ..grading import family_diagnosis
from ..grading.families import FamilyCase
from ..running import families as family_running

SHAPES = ("core", "all")
PLAIN = call_modes.BASE.name  # the dense call


class FamilyConfig(NamedTuple):
    """A fixed call shape (``HV = G H`` value heads) and input dtype: one compile per kernel and keywords."""

    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int
    dtype: str


# Simplest first (a shrunk recipe moves towards the front): one token without GVA; G = 2 and 4 on H = 2 key heads
# around the 64-token chunk and past it, K != V, bfloat16; the judge's quick shapes (oracle/family_recipes.py).
FAMILY_CORE = (
    FamilyConfig(1, 1, 1, 1, 16, 8, "float32"),
    FamilyConfig(2, 17, 2, 4, 16, 8, "float32"),
    FamilyConfig(1, 65, 2, 8, 16, 16, "float32"),
    FamilyConfig(1, 65, 2, 4, 16, 32, "bfloat16"),
    FamilyConfig(2, 100, 2, 4, 16, 32, "float32"),
    FamilyConfig(1, 130, 2, 8, 16, 16, "float32"),
)
# The small sets whose cross product ``shapes="all"`` draws from.
LENGTHS = (1, 2, 17, 63, 65, 130)
BATCHES = (1, 2)
KEY_HEADS = (1, 2)
GROUPS = (1, 2, 4)
KEY_DIMS = (16, 32)
VALUE_DIMS = (8, 16, 32)
DTYPES = tuple(KERNEL_DTYPES)
seeds = st.integers(min_value=0, max_value=2**32 - 1)


def _configs(shapes):
    if shapes not in SHAPES:
        raise ValueError(f"shapes: {shapes!r} not one of {SHAPES}")
    core = st.sampled_from(FAMILY_CORE)
    if shapes == "core":
        return core
    drawn = st.builds(lambda B, T, H, G, K, V, dt: FamilyConfig(B, T, H, G * H, K, V, dt),
                      *(st.sampled_from(s) for s in (BATCHES, LENGTHS, KEY_HEADS, GROUPS, KEY_DIMS, VALUE_DIMS,
                                                       DTYPES)))
    return st.one_of(core, drawn)


def _takes(family, accepted, **fields):
    """Whether a call with the recipe ``fields`` sets only FLA keywords among ``accepted``."""
    probe = FamilyRecipe(family, 1, 1, 1, 1, 1, 1, **fields)
    return set(probe.flags()) <= set(accepted)


def family_recipes(family, shapes="core", accepted=family_running.FLAGS):
    """The recipes searched for a kernel of ``family`` taking the FLA keywords ``accepted``: a config of
    :data:`FAMILY_CORE` (``"all"``: or of the small sets' cross product), a decay and beta regime, the flags the
    kernel takes (a beta regime needing one it does not take is not drawn), q/k, initial state, seed."""
    betas = [b for b in BETAS if _takes(family, accepted, beta=b)]
    neg = _takes(family, accepted, beta=LOGIT_BETAS[0], neg_eigval=True)
    l2 = _takes(family, accepted, qk_l2norm=True)

    @st.composite
    def recipe(draw, c):
        beta = draw(st.sampled_from(betas))
        qk_l2norm = l2 and draw(st.booleans())
        return FamilyRecipe(family, c.B, c.T, c.H, c.HV, c.K, c.V, decay=draw(st.sampled_from(DECAYS)), beta=beta,
                            neg_eigval=neg and beta in LOGIT_BETAS and draw(st.booleans()), qk_l2norm=qk_l2norm,
                            qk=QK_MODES[0] if qk_l2norm else draw(st.sampled_from(QK_MODES)),
                            initial_state=draw(st.booleans()), seed=draw(seeds), precision=c.dtype)

    return _configs(shapes).flatmap(recipe)


# The heads a drawn training call has, simplest first: (H key heads, HV value heads); K and V are the mode recipe's.
MODE_HEADS = ((1, 1), (2, 4), (2, 8))


def family_mode_recipes(family, modes, accepted=family_running.FLAGS):
    """The recipes searched in the training-call ``modes`` for a kernel of ``family`` taking FLA's keywords
    ``accepted``: the family's call in the structure of a catalogued mode recipe (``oracle.mode_recipes``: its
    lengths, packing, gate form) whose modes are all among ``modes`` (the simplest first: fewest modes, shortest),
    heads from :data:`MODE_HEADS`, a beta regime the kernel takes, seed; None when no recipe fits."""
    modes = set(modes)
    names = []
    for name in mode_recipes.names("full"):
        r = mode_recipes.get(name)
        if r.modes and set(r.modes) <= modes:
            try:
                FamilyRecipe.in_mode(family, name, 1, 1, r.K, r.V)
            except ValueError:
                continue  # a keyword the family lacks (gdn: lower_bound, the chunk states)
            names.append(name)
    names.sort(key=lambda n: (len(mode_recipes.get(n).modes), mode_recipes.get(n).shape[:2]))
    betas = [b for b in BETAS if _takes(family, accepted, beta=b)]
    if not names or not betas:
        return None

    @st.composite
    def recipe(draw, name):
        r = mode_recipes.get(name)
        H, HV = draw(st.sampled_from(MODE_HEADS))
        return FamilyRecipe.in_mode(family, name, H, HV, r.K, r.V, decay=r.decay, beta=draw(st.sampled_from(betas)),
                                    seed=draw(seeds), precision=r.precision)

    return st.sampled_from(names).flatmap(recipe)


def family_space(family, shapes="core", modes=(PLAIN,), accepted=family_running.FLAGS):
    """Everything searched for a kernel of ``family``: :func:`family_recipes` with ``dense`` among ``modes``,
    :func:`family_mode_recipes` for the training-call modes among them; ValueError naming ``modes`` when nothing
    is left to draw."""
    spaces = [family_recipes(family, shapes, accepted)] if PLAIN in modes else []
    calls = [m for m in modes if m != PLAIN]
    drawn = family_mode_recipes(family, calls, accepted) if calls else None
    spaces += [drawn] if drawn is not None else []
    if not spaces:
        raise ValueError(f"modes: no {family} call to draw in {tuple(modes)!r}")
    return spaces[0] if len(spaces) == 1 else st.one_of(*spaces)


def judge(fn, recipe: FamilyRecipe):
    """Family kernel ``fn`` on the recipe's call (with the FLA keywords it sets), graded by the family judge: the
    report (``tolerance.Report``)."""
    case = FamilyCase.from_recipe("hunt", recipe)
    fcall, do, dfs = case.data()
    family_running.check_representable(fcall, recipe.precision)
    got = family_running.family_results(fn, fcall, do, dfs, dtype=recipe.precision, flags=case.flags)
    return family_diagnosis.refine(case, got, case.judge(got))


def built_label(kernel):
    """The spec that builds kernel ``kernel`` (its ``family`` option taken out, as the run built it)."""
    try:
        spec = KernelSpec.parse(kernel)
    except ValueError:
        return kernel
    build_spec, _ = family_running.spec_family(spec)
    return spec.spec if build_spec is spec else build_spec.label()


def family_repro(recipe: FamilyRecipe, kernel) -> str:
    """A shell one-liner that judges ``kernel`` (a spec) on this family call again and prints the report."""
    return runnable(python_c("from gdn2_oracle import kernels; from gdn2_oracle.oracle.family_recipes import "
                             "FamilyRecipe; from gdn2_oracle.ci.commands.hunt_families import judge; "
                             f"print(judge(kernels.get({built_label(kernel)!r}), {recipe.call_source()}).format())"),
                    built_label(kernel))
