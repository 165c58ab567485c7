"""The call-mode properties of ``test_modes.py`` through the family lens: packed sequences, the in-kernel gate, the
in-kernel q/k norm, the ``[V, K]`` state layout and the chunk-start states of a Gated DeltaNet or KDA kernel in FLA's
signature (docs/DESIGN.md §1, "Families"; §2, "Families in FLA"; §6).

A family kernel is called with FLA's keywords of each mode (``cu_seqlens``; ``use_gate_in_kernel`` with ``A_log``,
``dt_bias`` and, for KDA, ``lower_bound``; ``use_qk_l2norm_in_kernel``; the ``[V, K]`` layout's keyword;
``return_intermediate_states``) by ``ci/running/families.py`` and its results ``o, final_state, dq, dk, dv, dg,
dbeta, dh0`` (and the modes' ``dA_log``, ``ddt_bias``, ``intermediate_states``) are judged as the family properties
judge them (``test_family_properties.py``): against its own results on an equivalent call within the tight
agreement bound (``FamilyCase.agreement``, docs/DESIGN.md §4), or against the float64 family oracle
(``FamilyCase.graded``) for the chunk-start states.

Data are :class:`oracle.family_recipes.FamilyRecipe` s in the structure of a catalogued mode recipe
(``family_strategies.structure_of``) on fixed shapes (one compile per kernel and property), grouped value heads with
G = 2 (packed calls), 4 (rows) and 1 (rows packed); drawn are the seed, decay and a beta regime that sets no flag
(``family_strategies.value_variants``). Each property is marked with the modes it needs (``gdn2_modes``), so a kernel
whose signature lacks a keyword has it deselected. FLA's Gated DeltaNet has no ``return_intermediate_states`` (and no
``lower_bound``): its kernels are judged on the chunk-start states (and the bounded gate) nowhere, KDA's are.

The checks are plain functions of a kernel (``check_*``, returning a graded report) so the plugin's own tests can
show that each fails on a mutant (``property_tests/tests/test_family_mode_mutants.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, note, settings
from hypothesis import strategies as st

from gdn2_oracle.ci.grading.tolerance import Report
from gdn2_oracle.ci.running import families as family_running
from gdn2_oracle.ci.running.cases import FamilyRunCase
from gdn2_oracle.ci.running.modes import kernel_chunk_size
from gdn2_oracle.kernels.spec import python_c, runnable
from gdn2_oracle.oracle import call_modes, families, mode_recipes, preprocess
from gdn2_oracle.oracle.families import MAPPED
from gdn2_oracle.oracle.family_recipes import FamilyRecipe
from gdn2_oracle.oracle.generate import round_to
from gdn2_oracle.property_tests import family_strategies, grading
from gdn2_oracle.property_tests.strategies import seeds
from gdn2_oracle.property_tests.test_modes import others_unchanged

# FLA's families: a GDN-2 kernel is skipped with the reason (conftest.py).
pytestmark = pytest.mark.gdn2_family(*MAPPED)

PROPERTIES = mode_recipes.PROPERTIES
C = mode_recipes.C
LENGTHS = mode_recipes.SUITE_LENGTHS  # packed: 2, C-1, an empty sequence, C+1, 2 (as the GDN-2 properties)
ROWS = (C + 1, C + 1)  # not packed: two rows of C+1 tokens
H, K, V = 2, 16, 8  # key heads, K != V
PACKED_G, ROWS_G, FLAT_G = 2, 4, 1  # value heads per key head: packed calls, rows, rows packed
# The [V, K] state layout's keyword (the registry's: this module names no mode).
LAYOUT = call_modes.get(PROPERTIES["transposed_states"].mode).keywords[0]
GATE_OFF = dict(use_gate_in_kernel=False, A_log=None, dt_bias=None, lower_bound=None)
ARGUMENTS = ("scale", "initial_state", "use_qk_l2norm_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval",
             "use_gate_in_kernel", "A_log", "dt_bias", "lower_bound", "cu_seqlens", "intermediate_chunk_size")

# --------------------------------------------------------------------------------------------
# recipes (fixed shapes: one compile per kernel and property)


def recipe_for(family, prop, G, rows=False, bounded=None, lengths=None):
    """The family recipe of property ``prop`` (of :data:`PROPERTIES`) in the structure of the first mode recipe using
    its modes, H = 2 key heads with G value heads each, on :data:`LENGTHS` (``rows``: :data:`ROWS`; or ``lengths``),
    initial state; None where ``family`` takes no such call."""
    mode = family_strategies.structure_of(family, PROPERTIES[prop].modes, bounded=bounded)
    if mode is None:
        return None
    lengths = lengths or (ROWS if rows else LENGTHS)
    return FamilyRecipe.in_mode(family, mode, H, G * H, K, V, lengths=lengths, initial_state=True, seed=900)


def dense_rows(family, T=ROWS[0]):
    """The dense family recipe whose rows the packed-rows property packs: two rows of ``T`` tokens (C+1), G = 1."""
    return FamilyRecipe(family, len(ROWS), T, H, FLAT_G * H, K, V, initial_state=True, seed=900)


# --------------------------------------------------------------------------------------------
# calls and results


def rebuilt(fcall: families.FamilyCall, **changes) -> families.FamilyCall:
    """The family call ``fcall`` (its modes included) with some arguments of ``oracle.families.call`` replaced."""
    args = {n: getattr(fcall, n) for n in (*fcall.input_names, *ARGUMENTS)}
    return families.call(fcall.family, **{**args, **dict(fcall.call_keywords), **changes})


def case_of(recipe: FamilyRecipe) -> FamilyRunCase:
    """The family case of ``recipe`` (data, the float64 reference, the agreement bound)."""
    return FamilyRunCase.from_recipe("property", recipe)


def results(fn, fcall, do, dfs, dtype):
    """Kernel ``fn``'s results on the family call (``ci/running/families.py: family_results``)."""
    return family_running.family_results(fn, fcall, do, dfs, dtype=dtype)


def _grads(fcall):
    """The per-token gradients' names (``dq, dk, dv, dg, dbeta``)."""
    return tuple("d" + n for n in fcall.input_names)


def _states(fcall):
    h0 = fcall.initial_state
    return np.zeros(fcall.state_shape) if h0 is None else np.asarray(h0)


# --------------------------------------------------------------------------------------------
# the checks (plain functions of a kernel)


def alone_results(fn, fcall, do, dfs, dtype, names):
    """Each packed sequence of ``fcall`` run alone (a dense call from ``h0[n]``), assembled into the packed layout: o
    and the per-token gradients of its tokens, ``final_state[n]``, ``dh0[n]``; ``dA_log`` / ``ddt_bias`` summed over
    the sequences. An empty sequence: ``final_state[n] = h0[n]``, ``dh0[n] = dfs[n]``."""
    h0 = _states(fcall)
    out = {"o": np.zeros(do.shape), "final_state": np.array(h0), "dh0": np.array(dfs, np.float64)}
    out.update({d: np.zeros(x.shape) for d, x in zip(_grads(fcall), fcall.inputs())})
    out.update({n: 0.0 for n in ("dA_log", "ddt_bias") if n in names})
    dtypes = {}
    cu = fcall.cu_seqlens
    for n in range(len(cu) - 1):
        t0, t1 = int(cu[n]), int(cu[n + 1])
        if t1 == t0:
            continue
        sub = rebuilt(fcall, **{x: getattr(fcall, x)[:, t0:t1] for x in fcall.input_names}, initial_state=h0[n:n + 1],
                      cu_seqlens=None)
        got = results(fn, sub, do[:, t0:t1], dfs[n:n + 1], dtype)
        dtypes = {name: x.dtype for name, x in got.items()}
        out["o"][:, t0:t1] = got["o"]
        out["final_state"][n], out["dh0"][n] = got["final_state"][0], got["dh0"][0]
        for d in _grads(fcall):
            out[d][:, t0:t1] = got[d]
        for name in ("dA_log", "ddt_bias"):
            if name in names:
                out[name] = out[name] + np.asarray(got[name], np.float64)
    # in the dtypes the kernel returned (so the agreement bound allows a bfloat16 result its ulp)
    return {n: np.asarray(x).astype(dtypes.get(n, np.float64)) for n, x in out.items()}


def check_packed_alone(fn, recipe: FamilyRecipe) -> Report:
    """Packed == each sequence run alone (agreement bound): outputs, final states and every gradient of each
    sequence's own tokens, ``dh0[n]`` included; an empty sequence returns ``h0[n]`` and passes ``dfs[n]`` on."""
    case = case_of(recipe)
    fcall, do, dfs = case.data()
    packed = results(fn, fcall, do, dfs, case.dtype)
    alone = alone_results(fn, fcall, do, dfs, case.dtype, case.names())
    return case.agreement(packed, alone, what="packed~alone", chunk_size=kernel_chunk_size(fn))


def check_packed_dense(fn, recipe: FamilyRecipe) -> Report:
    """Rows of equal length packed into one row with ``cu_seqlens`` == the dense batch (agreement bound);
    ``recipe`` is the dense one."""
    if recipe.mode is not None:
        raise ValueError(f"recipe: a recipe without a mode is packed here, got mode={recipe.mode!r}")
    case = case_of(recipe)
    fcall, do, dfs = case.data()
    rows = results(fn, fcall, do, dfs, case.dtype)
    B, T = recipe.B, recipe.T
    flat = {n: getattr(fcall, n).reshape((1, B * T) + getattr(fcall, n).shape[2:]) for n in fcall.input_names}
    packed_call = rebuilt(fcall, **flat, cu_seqlens=np.arange(B + 1) * T)
    packed = results(fn, packed_call, do.reshape((1, B * T) + do.shape[2:]), dfs, case.dtype)
    per_token = ("o",) + _grads(fcall)
    back = {n: x.reshape((B, T) + x.shape[2:]) if n in per_token else x for n, x in packed.items()}
    return case.agreement(back, rows, what="packed~rows")


PERTURBED = ("k", "v", "g", "beta")


def check_perturbation(fn, recipe: FamilyRecipe, victim, seed=0) -> Report:
    """Perturbing packed sequence ``victim`` (its k, v, g, beta and h0) leaves every other sequence's outputs, final
    state, gradients and dh0 within the agreement bound of the unperturbed call (the victim's own results are copied
    over, so only the others are compared)."""
    case = case_of(recipe)
    fcall, do, dfs = case.data()
    t0, t1 = (int(x) for x in fcall.cu_seqlens[victim:victim + 2])
    rng = np.random.default_rng(seed)
    arrays = {n: np.array(getattr(fcall, n)) for n in PERTURBED}
    for x in arrays.values():  # each value scaled by U[0.5, 1.5] (a log-decay stays <= 0), rounded like the inputs
        x[:, t0:t1] = round_to(x[:, t0:t1] * rng.uniform(0.5, 1.5, x[:, t0:t1].shape), case.dtype)
    h0 = np.array(_states(fcall))
    h0[victim] = round_to(rng.standard_normal(h0[victim].shape), "float32")
    a = results(fn, fcall, do, dfs, case.dtype)
    b = results(fn, rebuilt(fcall, **arrays, initial_state=h0), do, dfs, case.dtype)
    return others_unchanged(case, a, b, victim, t0, t1)


def _gate_view(fcall, x):
    """GDN's per-head gate ``[B, T, HV]`` as a one-channel per-key gate ``[B, T, HV, 1]`` (KDA's as it is)."""
    return x[..., None] if fcall.family.name == "gdn" else x


def check_gate_dense(fn, recipe: FamilyRecipe) -> Report:
    """The gated call == the plain call on the log-decay computed beforehand (float32, as a kernel's input), with
    ``dg``, ``dA_log``, ``ddt_bias`` chained from the plain call's ``dg`` through the gate's adjoint (float64)."""
    case = case_of(recipe)
    fcall, do, dfs = case.data()
    gated = results(fn, fcall, do, dfs, case.dtype)
    g32 = np.minimum(np.asarray(fcall.log_decay(np.float32), np.float64), 0.0)
    plain = results(fn, rebuilt(fcall, g=g32, **GATE_OFF), do, dfs, case.dtype)
    dg, dA, dbias = preprocess.gate_vjp(_gate_view(fcall, fcall.g), fcall.A_log, fcall.dt_bias, fcall.lower_bound,
                                        1.0, _gate_view(fcall, np.asarray(plain["dg"], np.float64)))
    plain["dg"] = dg.reshape(fcall.g.shape).astype(np.float32)
    for name, x in (("dA_log", dA), ("ddt_bias", dbias)):
        if x is not None:
            plain[name] = x
    return case.agreement(gated, plain, what="gated~precomputed decay")


def check_l2norm_dense(fn, recipe: FamilyRecipe) -> Report:
    """The call with the in-kernel q/k L2 norm == the plain call on q, k normalised beforehand (float32), with
    ``dq``, ``dk`` chained through the norm's adjoint (float64)."""
    case = case_of(recipe)
    fcall, do, dfs = case.data()
    normed = results(fn, fcall, do, dfs, case.dtype)
    eps = preprocess.L2NORM_EPS
    normalised = fcall.to_gdn2(np.float32)  # q, k normalised in float32 (the other inputs: not used)
    qn, kn = np.asarray(normalised.q, np.float64), np.asarray(normalised.k, np.float64)
    plain = results(fn, rebuilt(fcall, q=qn, k=kn, use_qk_l2norm_in_kernel=False), do, dfs, "float32")
    for name, x in (("dq", fcall.q), ("dk", fcall.k)):
        plain[name] = preprocess.l2norm_vjp(x, eps, np.asarray(plain[name], np.float64)).astype(np.float32)
    return case.agreement(normed, plain, what="in-kernel norm~normalised beforehand")


def check_state_v_first(fn, recipe: FamilyRecipe) -> Report:
    """The ``[V, K]`` state layout is the transpose: initial, final and chunk-start states, dh0; nothing else changes
    (agreement bound)."""
    case = case_of(recipe)
    fcall, do, dfs = case.data()
    if not dict(fcall.call_keywords).get(LAYOUT):
        raise ValueError(f"recipe: a call with [V, K] states ({LAYOUT}=True), got {recipe.mode!r}")
    vk = results(fn, fcall, do, dfs, case.dtype)
    kcall = rebuilt(fcall, initial_state=np.swapaxes(_states(fcall), -1, -2), **{LAYOUT: False})
    kv = results(fn, kcall, do, np.swapaxes(dfs, -1, -2), case.dtype)
    for name in ("final_state", "dh0", "intermediate_states"):
        if name in kv:
            kv[name] = np.swapaxes(kv[name], -1, -2)
    return case.agreement(vk, kv, what="[V, K]~transpose", chunk_size=kernel_chunk_size(fn))


def check_intermediate(fn, recipe: FamilyRecipe) -> Report:
    """The states at the chunk starts (the kernel's chunk) against the float64 family oracle, with the final state."""
    case = case_of(recipe)
    report = case.graded(fn, case.results(fn, case.data(), None, None))
    keep = [v for v in report.verdicts if v.name in ("intermediate_states", "final_state")]
    return Report(verdicts=keep, dtype=report.dtype)


# --------------------------------------------------------------------------------------------
# reporting


def repro(call_source, kernel_name) -> str:
    """A shell one-liner running ``call_source`` (a ``check_*`` call on ``fn``, the kernel) and printing its report."""
    return runnable(python_c("from gdn2_oracle import kernels; from gdn2_oracle.oracle.family_recipes import "
                             "FamilyRecipe; from gdn2_oracle.property_tests import test_family_modes as t; "
                             f"fn = kernels.get({kernel_name!r}); print({call_source}.format())"), kernel_name)


def check(report, recipe, kernel_name, what, call_source):
    """FAIL fails the test (the verdict table, the recipe, a reproduction); PRECISION warns (fails under strict)."""
    note(f"recipe: {recipe.call_source()}")
    if not report.passed:
        grading.enforce(report, f"{recipe.family} kernel {kernel_name!r}: {what}\n{report.format()}\n"
                                f"recipe:    {recipe.call_source()}\nreproduce: {repro(call_source, kernel_name)}")


def needs(prop):
    """The ``gdn2_modes`` mark of the modes property ``prop`` (of :data:`PROPERTIES`) needs."""
    return pytest.mark.gdn2_modes(*PROPERTIES[prop].modes)


def _examples():
    """A fifth of the profile's examples (at least 2) for a property; its fixed recipe runs besides."""
    return settings(max_examples=max(2, settings().max_examples // 5))


def _run(kernel, kernel_families, base, check_fn, what, **extra):
    """``check_fn(kernel.fn, recipe, **extra)`` on ``base`` and on its drawn value variants."""
    if base is None:
        pytest.skip(f"the {kernel_families[kernel.name]} family takes no such call")
    args = "".join(f", {k}={v!r}" for k, v in extra.items())

    @given(recipe=family_strategies.value_variants(base))
    @example(recipe=base)
    @_examples()
    def holds(recipe):
        check(check_fn(kernel.fn, recipe, **extra), recipe, kernel.name, what,
              f"t.{check_fn.__name__}(fn, {recipe.call_source()}{args})")

    holds()


# --------------------------------------------------------------------------------------------
# the properties


@needs("packed_alone")
def test_family_packed_equals_each_sequence_alone(kernel, kernel_families):
    """Packed == each sequence alone from its own h0[n]: outputs, final states and the gradients of every sequence,
    dh0[n] included; empty sequences return h0[n] and pass dfinal_state[n] to dh0[n]."""
    base = recipe_for(kernel_families[kernel.name], "packed_alone", PACKED_G)
    _run(kernel, kernel_families, base, check_packed_alone, "packed vs each sequence alone")


@needs("packed_rows")
def test_family_equal_lengths_packed_equals_the_dense_batch(kernel, kernel_families):
    """Rows of equal length packed into one row with cu_seqlens == the dense batch (agreement bound)."""
    base = dense_rows(kernel_families[kernel.name])
    _run(kernel, kernel_families, base, check_packed_dense, "packed vs the rows as a batch")


VICTIMS = [i for i, n in enumerate(LENGTHS) if n]


@needs("packed_alone")
@given(victim=st.sampled_from(VICTIMS), seed=seeds)
@settings(max_examples=max(2, settings().max_examples // 5))
def test_family_perturbing_one_sequence_leaves_the_others(kernel, kernel_families, victim, seed):
    """Changing sequence n's k, v, g, beta and h0[n] leaves every other sequence's outputs, final state, gradients and
    dh0 unchanged (within the agreement bound)."""
    recipe = recipe_for(kernel_families[kernel.name], "packed_alone", PACKED_G).replace(seed=seed)
    check(check_perturbation(kernel.fn, recipe, victim, seed), recipe, kernel.name,
          f"perturbing sequence {victim} changed another sequence",
          f"t.check_perturbation(fn, {recipe.call_source()}, {victim}, {seed})")


@pytest.mark.parametrize("bounded", [False, True], ids=["softplus", "bounded"])
@needs("gate_precomputed")
def test_family_gate_equals_the_dense_call_on_the_precomputed_decay(kernel, kernel_families, bounded):
    """use_gate_in_kernel (A_log, dt_bias; KDA's bounded form with lower_bound) == the plain call on the log-decay
    computed beforehand, gradients chained through the gate (Gated DeltaNet has no bounded form: skipped)."""
    family = kernel_families[kernel.name]
    refused = dict(families.get(family).refused).get("lower_bound")
    if bounded and refused:
        pytest.skip(f"lower_bound: not a keyword of the {family} family: {refused}")
    base = recipe_for(family, "gate_precomputed", ROWS_G, rows=True, bounded=bounded)
    _run(kernel, kernel_families, base, check_gate_dense, "use_gate_in_kernel vs the precomputed decay")


@needs("l2norm_precomputed")
def test_family_l2norm_equals_the_dense_call_on_normalised_q_k(kernel, kernel_families):
    """use_qk_l2norm_in_kernel == the plain call on q, k normalised beforehand (zero and sqrt(eps)-sized rows
    included), gradients chained through the norm."""
    base = recipe_for(kernel_families[kernel.name], "l2norm_precomputed", ROWS_G, rows=True)
    _run(kernel, kernel_families, base, check_l2norm_dense, "the in-kernel q/k norm vs q, k normalised beforehand")


@needs("transposed_states")
def test_family_state_v_first_is_the_transpose(kernel, kernel_families):
    """The [V, K] state layout: initial, final states and dh0 are the transposes; every other result unchanged."""
    base = recipe_for(kernel_families[kernel.name], "transposed_states", PACKED_G)
    _run(kernel, kernel_families, base, check_state_v_first, "[V, K] states vs the transpose")


@needs("chunk_starts")
def test_family_intermediate_states_match_the_oracle(kernel, kernel_families):
    """return_intermediate_states (KDA's only): the state before each chunk of each sequence, by value."""
    base = recipe_for(kernel_families[kernel.name], "chunk_starts", PACKED_G)
    _run(kernel, kernel_families, base, check_intermediate, "chunk-start states vs the float64 family oracle")
