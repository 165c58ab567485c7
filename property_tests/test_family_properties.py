"""The GDN-2 properties through the family lens: state carry, chunk and split invariance, permutations, scaling and
reductions for a Gated DeltaNet or KDA kernel in FLA's signature (docs/DESIGN.md §1, "Families"; §6).

GDN and KDA are exact restrictions of GDN-2 (``oracle/families.py``: ``b = beta 1_K``, ``w = beta 1_V``, GDN's decay
broadcast over K), so each property of ``test_conformance.py`` holds for a family call: the problems are drawn in the
family's restriction (:class:`oracle.family_recipes.FamilyRecipe`, ``family_strategies.py``: grouped value heads G in
{1, 2, 4}, float32 and bfloat16, only the flags the kernel takes) and the kernel's own results ``o, final_state, dq,
dk, dv, dg, dbeta, dh0`` are judged against the float64 family oracle (``FamilyCase.judge``) or against its own
results on a transformed call (``FamilyCase.agreement``: the tight agreement bound).

Each property is a plain function of a kernel (``check_*``, returning ``[(what, report)]``) so a failure prints a
one-line reproduction and the plugin's own tests can show which property catches each mutant.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, note, settings
from hypothesis import strategies as st

from gdn2_oracle.ci.running import families as family_running
from gdn2_oracle.ci.running.cases import FamilyRunCase
from gdn2_oracle.kernels.spec import python_c, runnable
from gdn2_oracle.oracle import families, family_recipes
from gdn2_oracle.oracle.families import FAMILY_RESULTS, MAPPED
from gdn2_oracle.oracle.family_recipes import FamilyRecipe
from gdn2_oracle.property_tests import family_strategies, grading
from gdn2_oracle.property_tests.family_strategies import CORE, FamilyConfig
from gdn2_oracle.property_tests.strategies import CHUNK, target_ratios

# FLA's families: a GDN-2 kernel is skipped with the reason (conftest.py).
pytestmark = pytest.mark.gdn2_family(*MAPPED)

# --------------------------------------------------------------------------------------------
# a family call, transformed, run and judged

FLAG_NAMES = ("use_qk_l2norm_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "use_gate_in_kernel")


def rebuilt(fcall: families.FamilyCall, **changes) -> families.FamilyCall:
    """The dense family call ``fcall`` with some arguments replaced (``oracle.families.call``'s keywords)."""
    args = {n: getattr(fcall, n) for n in (*fcall.input_names, "scale", "initial_state", *FLAG_NAMES, "A_log",
                                           "dt_bias", "lower_bound")}
    return families.call(fcall.family, **{**args, **changes})


def case_of(fcall, do, dfs, dtype) -> FamilyRunCase:
    """The family case of a given call and cotangents in input dtype ``dtype`` (its reference: the float64 oracle)."""
    flags = tuple(n for n in FLAG_NAMES[:3] if getattr(fcall, n))
    return FamilyRunCase("family-property", "given", dtype, fcall.shape, lambda: (fcall, do, dfs), (),
                         family=fcall.family.name, flags=flags)


def results(fn, fcall, do, dfs, dtype):
    """Kernel ``fn``'s results on the family call (``ci/running/families.py: family_results``)."""
    return family_running.family_results(fn, fcall, do, dfs, dtype=dtype)


def _judged(fn, fcall, do, dfs, dtype, what):
    case = case_of(fcall, do, dfs, dtype)
    return case, results(fn, fcall, do, dfs, dtype), what


def check_matches(fn, fcall, do, dfs, dtype, what):
    """``[(what, report)]``: ``fn`` on the family call against the float64 family oracle."""
    case, got, what = _judged(fn, fcall, do, dfs, dtype, what)
    return [(what, case.graded(fn, got))]


# --------------------------------------------------------------------------------------------
# state carry


def piece(fcall, t0, t1, h0):
    """Tokens ``[t0, t1)`` of the dense family call, from initial state ``h0``."""
    return rebuilt(fcall, **{n: getattr(fcall, n)[:, t0:t1] for n in fcall.input_names}, initial_state=h0)


def carried_results(fn, fcall, do, dfs, t, dtype):
    """The family results as two calls give them: ``[0, t)``, then ``[t, T)`` from the first call's final state;
    outputs and per-token gradients concatenated along T, the final state the second call's, the VJPs chained (the
    second call's ``dh0`` is the first call's final-state cotangent), ``dh0`` the first call's."""
    first_fwd = results(fn, piece(fcall, 0, t, fcall.initial_state), do[:, :t], dfs, dtype)
    second = results(fn, piece(fcall, t, None, first_fwd["final_state"].astype(np.float64)), do[:, t:], dfs, dtype)
    first = results(fn, piece(fcall, 0, t, fcall.initial_state), do[:, :t], second["dh0"].astype(np.float64), dtype)
    out = {"final_state": second["final_state"], "dh0": first["dh0"]}
    for name in FAMILY_RESULTS:
        if name not in out:
            out[name] = np.concatenate([first[name], second[name]], axis=1)
    return out


def check_state_carry(fn, recipe: FamilyRecipe, t):
    """``[0, t)`` then ``[t, T)`` with the carried state: against the float64 family oracle, and against one call."""
    fcall, do, dfs = recipe.build()
    case = case_of(fcall, do, dfs, recipe.precision)
    got = carried_results(fn, fcall, do, dfs, t, recipe.precision)
    whole = results(fn, fcall, do, dfs, recipe.precision)
    return [(f"[0,{t}) + [{t},{recipe.T}) with carried state vs the float64 family oracle", case.graded(fn, got)),
            (f"split at {t} with carried state vs one call (tight agreement)",
             case.agreement(got, whole, what="carried~one call"))]


# --------------------------------------------------------------------------------------------
# chunk and split invariance (our family kernels: other chunk_size / split / leaf)


def check_options(fn, variant, recipe: FamilyRecipe):
    """The kernel built with other options against the float64 family oracle and against its default options."""
    fcall, do, dfs = recipe.build()
    case = case_of(fcall, do, dfs, recipe.precision)
    got = results(variant, fcall, do, dfs, recipe.precision)
    default = results(fn, fcall, do, dfs, recipe.precision)
    return [("other options vs the float64 family oracle", case.graded(variant, got)),
            ("other options vs the default options (tight agreement)",
             case.agreement(got, default, what="options~default"))]


# --------------------------------------------------------------------------------------------
# scaling: linearity in (v, h0); the scale argument

SCALED = {"o", "final_state", "dq", "dk", "dg", "dbeta"}  # linear in (v, h0); dv, dh0 do not change
TINY = 2.0 ** -90  # below this, flush-to-zero of subnormals may differ between the two calls


def _inexact(name, got, want, scaled):
    got, want = got.astype(np.float64), want.astype(np.float64)
    diff = np.max(np.abs(got - want)) if np.all(np.isfinite(got)) else np.inf
    if diff <= TINY * max(scaled, 1.0):
        return None
    return f"{name}: max|difference| = {diff:.3e} (max|want| = {np.max(np.abs(want)):.3e})"


def check_scaling(fn, recipe: FamilyRecipe, c):
    """Lines naming each result that is not exact when ``v`` and ``h0`` are scaled by the power of two ``c``: o, the
    final state, dq, dk, dg, dbeta scale by ``c``; dv, dh0 do not change. Empty: exact."""
    fcall, do, dfs = recipe.build()
    h0 = fcall.initial_state
    scaled = rebuilt(fcall, v=c * fcall.v, initial_state=None if h0 is None else c * h0)
    a = results(fn, fcall, do, dfs, recipe.precision)
    b = results(fn, scaled, do, dfs, recipe.precision)
    lines = [_inexact(n, b[n], (c if n in SCALED else 1.0) * a[n].astype(np.float64), c) for n in FAMILY_RESULTS]
    return [line for line in lines if line]


def check_scale_argument(fn, recipe: FamilyRecipe, c):
    """``scale = c K^-1/2``: every result against the float64 family oracle, and (lines, empty when exact) o scaled by
    exactly ``c`` (a power of two) with the final state unchanged against the default scale."""
    fcall, do, dfs = recipe.build()
    other = rebuilt(fcall, scale=c * fcall.scale)
    checks = check_matches(fn, other, do, dfs, recipe.precision, f"scale = {c} K^-1/2 vs the float64 family oracle")
    a = results(fn, fcall, do, dfs, recipe.precision)
    b = results(fn, other, do, dfs, recipe.precision)
    lines = [_inexact("o", b["o"], c * a["o"].astype(np.float64), c),
             _inexact("final_state", b["final_state"], a["final_state"], 1.0)]
    return checks, [line for line in lines if line]


# --------------------------------------------------------------------------------------------
# permutations: batch rows; value heads within their group; key heads with their groups

PER_KEY_HEAD = ("q", "k", "dq", "dk")  # [B, T, H, K]: the key heads' arrays
STATES = ("initial_state", "final_state", "dh0", "dfs")  # [B, HV, K, V]: heads on axis 1


def head_permutations(H, G):
    """``{what: (key-head permutation, value-head permutation)}`` (each an involution) for H key heads with G value
    heads each: value heads reversed within every group (G > 1); key heads reversed, each with its group (H > 1)."""
    out = {}
    if G > 1:
        out["value heads within their group"] = (np.arange(H), np.arange(H * G).reshape(H, G)[:, ::-1].ravel())
    if H > 1:
        kh = np.arange(H)[::-1]
        out["key heads with their groups"] = (kh, (kh[:, None] * G + np.arange(G)).ravel())
    return out


def _take(x, axis, perm):
    return None if x is None else np.take(x, perm, axis=axis)


def permuted(fcall, do, dfs, batch=None, heads=None):
    """The call and cotangents with batch rows permuted by ``batch`` or heads by ``heads`` = (key, value) perms."""
    if batch is not None:
        arrays = {n: _take(getattr(fcall, n), 0, batch) for n in fcall.input_names}
        return (rebuilt(fcall, **arrays, initial_state=_take(fcall.initial_state, 0, batch)),
                do[batch], dfs[batch])
    kh, vh = heads
    arrays = {n: _take(getattr(fcall, n), 2, kh if n in PER_KEY_HEAD else vh) for n in fcall.input_names}
    return (rebuilt(fcall, **arrays, initial_state=_take(fcall.initial_state, 1, vh)),
            np.take(do, vh, axis=2), np.take(dfs, vh, axis=1))


def unpermuted(got, batch=None, heads=None):
    """The results of a permuted call put back in the original order (the permutations are involutions)."""
    if batch is not None:
        return {n: np.take(x, batch, axis=0) for n, x in got.items()}
    kh, vh = heads
    return {n: np.take(x, kh if n in PER_KEY_HEAD else vh, axis=1 if n in STATES else 2) for n, x in got.items()}


def check_permutations(fn, recipe: FamilyRecipe):
    """``[(what, report)]``: each permutation of the call's batch rows and heads permutes every result the same way
    (the kernel's results on the permuted call, put back, against its results on the call: tight agreement)."""
    fcall, do, dfs = recipe.build()
    case = case_of(fcall, do, dfs, recipe.precision)
    a = results(fn, fcall, do, dfs, recipe.precision)
    moves = {f"heads: {what}": dict(heads=p) for what, p in head_permutations(recipe.H, recipe.HV // recipe.H).items()}
    if recipe.B > 1:
        moves["batch rows reversed"] = dict(batch=np.arange(recipe.B)[::-1])
    out = []
    for what, move in moves.items():
        b = unpermuted(results(fn, *permuted(fcall, do, dfs, **move), recipe.precision), **move)
        out.append((f"{what}: permuted results vs the original (tight agreement)",
                    case.agreement(b, a, what="permuted~original")))
    return out


# key channels: the decay of GDN is shared by every key channel, KDA's is per channel and moves with it

KEYED = {"gdn": ("q", "k"), "kda": ("q", "k", "g")}  # the inputs with a key-channel last axis
KEYED_RESULTS = {"gdn": ("dq", "dk"), "kda": ("dq", "dk", "dg")}


def check_key_channel_permutation(fn, recipe: FamilyRecipe, perm):
    """``[(what, report)]``: permuting the key channels of q, k (KDA: and g) and the K rows of h0 and of the
    final-state cotangent by ``perm`` permutes dq, dk (dg), the final state and dh0 the same way and leaves o, dv,
    dbeta (GDN: dg) unchanged (the permuted call's results put back, against the call's: tight agreement)."""
    perm = np.asarray(perm)
    fcall, do, dfs = recipe.build()
    case = case_of(fcall, do, dfs, recipe.precision)
    family, h0 = recipe.family, fcall.initial_state
    moved = rebuilt(fcall, **{n: getattr(fcall, n)[..., perm] for n in KEYED[family]},
                    initial_state=None if h0 is None else h0[:, :, perm])
    got = results(fn, moved, do, dfs[:, :, perm], recipe.precision)
    inv = np.argsort(perm)
    back = {n: x[..., inv] if n in KEYED_RESULTS[family] else x[:, :, inv] if n in ("final_state", "dh0") else x
            for n, x in got.items()}
    return [(f"key channels permuted by {list(map(int, perm))}: results put back vs the original (tight agreement)",
             case.agreement(back, results(fn, fcall, do, dfs, recipe.precision), what="permuted~original"))]


# --------------------------------------------------------------------------------------------
# reductions: beta = 0 (gated linear attention), no decay (the delta rule), G = 1 with q, k repeated


def check_gated_linear_attention(fn, recipe: FamilyRecipe):
    """``[(what, report)]``: the ``beta = 0`` call (gated linear attention) against the float64 family oracle; none
    for beta logits (a logit of 0 is beta = 1/2, not 0)."""
    fcall, do, dfs = recipe.build()
    if fcall.use_beta_sigmoid_in_kernel:
        return []
    return check_matches(fn, rebuilt(fcall, beta=np.zeros_like(fcall.beta)), do, dfs, recipe.precision,
                         "beta = 0 (gated linear attention) vs the float64 family oracle")


def check_delta_rule(fn, recipe: FamilyRecipe):
    """``[(what, report)]``: the ``g = 0`` call (no decay: the delta rule) against the float64 family oracle."""
    fcall, do, dfs = recipe.build()
    return check_matches(fn, rebuilt(fcall, g=np.zeros_like(fcall.g)), do, dfs, recipe.precision,
                         "g = 0 (no decay: the delta rule) vs the float64 family oracle")


def check_grouped_heads(fn, recipe: FamilyRecipe):
    """``[(what, report)]``: with G > 1, the call against the G = 1 call on q and k repeated per value head (dq, dk
    summed over each group; tight agreement); none when G = 1."""
    fcall, do, dfs = recipe.build()
    dtype = recipe.precision
    B, T, H, HV, K, V = fcall.shape
    G = HV // H
    if G == 1:
        return []
    grouped = results(fn, fcall, do, dfs, dtype)
    repeated = rebuilt(fcall, q=np.repeat(fcall.q, G, axis=2), k=np.repeat(fcall.k, G, axis=2))
    flat = results(fn, repeated, do, dfs, dtype)
    for n in ("dq", "dk"):  # summed in float64, then rounded to the kernel's result dtype
        flat[n] = flat[n].astype(np.float64).reshape(B, T, H, G, K).sum(axis=3).astype(grouped[n].dtype)
    case = case_of(fcall, do, dfs, dtype)
    return [(f"G = {G} vs G = 1 on q, k repeated per value head (tight agreement)",
             case.agreement(grouped, flat, what="grouped~repeated"))]


# reduction -> its check
REDUCTIONS = {"gated_linear_attention": check_gated_linear_attention, "delta_rule": check_delta_rule,
              "grouped_heads": check_grouped_heads}


# --------------------------------------------------------------------------------------------
# reporting


def repro(call_source, kernel_name) -> str:
    """A shell one-liner running ``call_source`` (a ``check_*`` call on ``fn``, the kernel) and printing it."""
    return runnable(python_c("from gdn2_oracle import kernels; from gdn2_oracle.oracle.family_recipes import "
                             "FamilyRecipe; from gdn2_oracle.property_tests import test_family_properties as t; "
                             f"fn = kernels.get({kernel_name!r}); print(t.shown({call_source}))"), kernel_name)


def shown(checks):
    """The checks' reports (or inexact lines) as text."""
    if isinstance(checks, tuple):  # check_scale_argument: (checks, lines)
        return shown(checks[0]) + "\n" + "\n".join(checks[1] or ["exact"])
    if checks and isinstance(checks[0], str) or not checks:
        return "\n".join(checks or ["exact"])
    return "\n\n".join(f"{what}\n{report.format()}" for what, report in checks)


def enforce(checks, recipe, kernel_name, call_source):
    """FAIL fails the test (the verdict table, the recipe, a reproduction); PRECISION warns (fails under strict)."""
    note(f"recipe: {recipe.call_source()}")
    if checks:
        target_ratios(checks[0][1])  # hypothesis.target on the first judgement's error / tolerance (one per label)
    for what, report in checks:
        if not report.passed:
            grading.enforce(report, f"{recipe.family} kernel {kernel_name!r}: {what}\n{report.format()}\n"
                                    f"recipe:    {recipe.call_source()}\nreproduce: {repro(call_source, kernel_name)}")


def fail_inexact(lines, recipe, kernel_name, what, call_source):
    """Fail naming each inexact result (an exact property: no tolerance)."""
    note(f"recipe: {recipe.call_source()}")
    if lines:
        pytest.fail(f"{recipe.family} kernel {kernel_name!r}: {what} is not exact\n" + "\n".join(lines)
                    + f"\nrecipe:    {recipe.call_source()}\nreproduce: {repro(call_source, kernel_name)}",
                    pytrace=False)


# --------------------------------------------------------------------------------------------
# the properties


def _accepted(kernel, kernel_families):
    return kernel_families[kernel.name], family_running.accepted_flags(kernel.fn)


def _drawn(family, accepted, configs, **fixed):
    """Recipes of ``family`` on ``configs`` (the flags the kernel takes), ``fixed`` fields replaced: with no flag or
    with every flag the kernel takes (``family_strategies.extreme_activations``: two programs a shape; ``thorough``:
    every combination, as the oracle property draws in every profile)."""
    def on(config):
        return family_strategies.recipes(family, config, accepted, extremes=not family_strategies.thorough()).map(
            lambda r: r.replace(**fixed) if fixed else r)

    return st.sampled_from(configs).flatmap(on)


def _first_example(family, accepted, config, **fields):
    """A fixed recipe on ``config`` (every profile runs it): moderate decay, beta uniform, initial state, seed 900."""
    r = config.recipe(family, decay="moderate", beta="uniform", initial_state=True, seed=900)
    return r.replace(**fields)


# split -> the configuration it splits: inside the first chunk (T = C + 1, H = 2, G = 2, K != V, float32), and on
# FLA's 64-token chunk edge itself (T = 2 C + 2: the second call starts on a chunk boundary, one whole chunk then a
# tail of two tokens)
CARRIES = {CHUNK - 1: CORE[3], 2: CORE[3], family_recipes.C: FamilyConfig(1, 2 * family_recipes.C + 2, 1, 2, 16, 8,
                                                                         "float32")}


@pytest.mark.parametrize("t", list(CARRIES), ids=[f"split{t}" for t in CARRIES])
def test_family_state_carry(kernel, kernel_families, t):
    """[0, t) then [t, T) with the carried final state equals one call: forward, and every gradient by chaining the
    two calls' VJPs (the second call's dh0 is the first call's final-state cotangent)."""
    family, accepted = _accepted(kernel, kernel_families)

    @given(recipe=_drawn(family, accepted, (CARRIES[t],)))
    @example(recipe=_first_example(family, accepted, CARRIES[t], decay="weak"))
    def carries(recipe):
        enforce(check_state_carry(kernel.fn, recipe, t), recipe, kernel.name,
                f"t.check_state_carry(fn, {recipe.call_source()}, {t})")

    carries()


VARIANTS = [(f"{family}-factorized", options) for family in MAPPED for options in (
    dict(chunk_size=16, leaf=8), dict(chunk_size=32), dict(split=1), dict(split=48))]
VARIANT_CONFIGS = (CORE[3],)


def _variant_id(opts):
    return ",".join(f"{k}={v}" for k, v in opts.items())


@pytest.mark.parametrize("owner,options", VARIANTS, ids=[f"{n}({_variant_id(o)})" for n, o in VARIANTS])
def test_family_chunk_and_split_invariance(kernel, kernel_families, owner, options):
    """Our family kernel with another chunk_size / split / leaf: matches the float64 family oracle and agrees tightly
    with its default options (the chunking is an implementation detail, not a numerical choice)."""
    assert kernel.name == owner  # other combinations are deselected (conftest.py)
    family, accepted = _accepted(kernel, kernel_families)
    variant = kernel.variant(**options)

    @given(recipe=_drawn(family, accepted, VARIANT_CONFIGS))
    @settings(max_examples=max(1, settings().max_examples // 3))
    def invariant(recipe):
        enforce(check_options(kernel.fn, variant.fn, recipe), recipe, kernel.name,
                f"t.check_options(fn, kernels.get({kernel.name!r}, **{options!r}), {recipe.call_source()})")

    invariant()


POWERS = (2.0 ** -3, 2.0, 2.0 ** 5)


def test_family_scaling_v_and_initial_state(kernel, kernel_families):
    """Scaling v and h0 by a power of two c scales o, the final state and dq, dk, dg, dbeta by c exactly and leaves
    dv, dh0 unchanged."""
    family, accepted = _accepted(kernel, kernel_families)

    @given(recipe=_drawn(family, accepted, CORE), c=st.sampled_from(POWERS))
    @example(recipe=_first_example(family, accepted, CORE[4]), c=POWERS[0])
    def linear(recipe, c):
        fail_inexact(check_scaling(kernel.fn, recipe, c), recipe, kernel.name, f"scaling v, h0 by c = {c}",
                     f"t.check_scaling(fn, {recipe.call_source()}, {c!r})")

    linear()


SCALE_CONFIGS = (CORE[2], CORE[4])  # T = C - 1 float32 (G = 4, H = 2), T = C + 1 bfloat16 (G = 4, B = 2)


def test_family_scale_argument(kernel, kernel_families):
    """``scale = c K^-1/2`` (c a power of two): every result matches the float64 family oracle, o is the default
    scale's times c exactly and the final state does not change."""
    family, accepted = _accepted(kernel, kernel_families)

    @given(recipe=_drawn(family, accepted, SCALE_CONFIGS), c=st.sampled_from(POWERS))
    @example(recipe=_first_example(family, accepted, SCALE_CONFIGS[0]), c=POWERS[1])
    @settings(max_examples=max(1, settings().max_examples // 3))  # each scale is its own compile (a static argument)
    def scaled(recipe, c):
        source = f"t.check_scale_argument(fn, {recipe.call_source()}, {c!r})"
        checks, lines = check_scale_argument(kernel.fn, recipe, c)
        enforce(checks, recipe, kernel.name, source)
        fail_inexact(lines, recipe, kernel.name, f"o and the final state at scale = {c} K^-1/2", source)

    scaled()


PERMUTABLE = tuple(c for c in CORE if c.B > 1 or c.H > 1 or c.G > 1)


def test_family_batch_and_head_permutation(kernel, kernel_families):
    """Permuting the batch rows, the value heads within their group, or the key heads with their groups permutes
    every result the same way (dq, dk by key head; the others by value head)."""
    family, accepted = _accepted(kernel, kernel_families)

    @given(recipe=_drawn(family, accepted, PERMUTABLE))
    @example(recipe=_first_example(family, accepted, FamilyConfig(2, CHUNK + 1, 2, 2, 16, 8, "bfloat16")))
    def equivariant(recipe):
        enforce(check_permutations(kernel.fn, recipe), recipe, kernel.name,
                f"t.check_permutations(fn, {recipe.call_source()})")

    equivariant()


def test_family_key_channel_permutation(kernel, kernel_families):
    """Permuting the key channels of q, k (KDA: and of g, its decay being per key channel) and the K rows of h0
    permutes dq, dk (dg), the final state and dh0 the same way and leaves o, dv, dbeta unchanged."""
    family, accepted = _accepted(kernel, kernel_families)

    @given(recipe=_drawn(family, accepted, CORE), seed=st.integers(0, 2**16))
    @example(recipe=_first_example(family, accepted, CORE[3]), seed=1)
    @settings(max_examples=max(1, settings().max_examples // 2))  # two kernel calls an example
    def equivariant(recipe, seed):
        perm = np.random.default_rng(seed).permutation(recipe.K)
        enforce(check_key_channel_permutation(kernel.fn, recipe, perm), recipe, kernel.name,
                f"t.check_key_channel_permutation(fn, {recipe.call_source()}, {perm.tolist()})")

    equivariant()


GROUPED = tuple(c for c in CORE if c.G > 1)


@pytest.mark.parametrize("reduction", list(REDUCTIONS))
def test_family_reductions(kernel, kernel_families, reduction):
    """beta = 0 (gated linear attention) and g = 0 (the delta rule) match the float64 family oracle; G > 1 equals
    G = 1 with q, k repeated per value head (their gradients summed over each group)."""
    family, accepted = _accepted(kernel, kernel_families)
    check_reduction = REDUCTIONS[reduction]

    @given(recipe=_drawn(family, accepted, GROUPED))
    @example(recipe=_first_example(family, accepted, CORE[3]))
    @settings(max_examples=max(1, settings().max_examples // 3))
    def reduces(recipe):
        enforce(check_reduction(kernel.fn, recipe), recipe, kernel.name,
                f"t.{check_reduction.__name__}(fn, {recipe.call_source()})")

    reduces()
