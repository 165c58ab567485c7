"""Hypothesis properties of FLA ``chunk_gdn2``'s training-call modes (docs/DESIGN.md §2, docs/modes.md).

A kernel is called with FLA's keywords (``cu_seqlens``, ``use_gate_in_kernel``, ``A_log``, ``dt_bias``,
``lower_bound``, ``use_qk_l2norm_in_kernel``, ``state_v_first``, ``return_intermediate_states``) by
``ci/running/modes.py`` and judged by ``ci/grading/modes.py``: against the float64 oracle
(``oracle.modes.forward_and_vjp_modes``) by the tolerance model, or, where two runs of the kernel should agree,
within the tight agreement bound (docs/DESIGN.md §4), every result normalised by the reference's scale (the
envelope for ``dg``, ``dA_log``, ``ddt_bias``).

Data are drawn as seeds and regime names into :class:`oracle.mode_recipes.ModeRecipe` s on fixed shapes (one
compile per kernel and recipe shape); a failure prints the recipe and a one-line reproduction. Tests marked
``gdn2_modes`` are deselected for a kernel whose signature does not accept the mode (conftest.py;
``--gdn2-modes`` narrows the modes further).

The checks are plain functions of a kernel (``check_*``, returning a graded report) so that the suite's own
tests can show that each mutant of ``kernels/testing_modes.py`` is caught (``ci/tests/test_modes_validate.py``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import example, given, note, settings
from hypothesis import strategies as st

from gdn2_oracle.ci.grading.families import GDN2
from gdn2_oracle.ci.grading.modes import ModeCase
from gdn2_oracle.ci.grading.tolerance import Report
from gdn2_oracle.ci.running import harness
from gdn2_oracle.ci.running import modes as running
from gdn2_oracle.oracle import INPUTS, Problem, call_modes, mode_recipes, modes, preprocess
from gdn2_oracle.oracle.generate import round_to
from gdn2_oracle.property_tests import grading
from gdn2_oracle.property_tests.strategies import mode_repro, seeds

# The plain contract's properties: a Gated DeltaNet or KDA kernel is skipped with the reason (conftest.py).
pytestmark = pytest.mark.gdn2_family(GDN2)

# --------------------------------------------------------------------------------------------
# recipes (fixed shapes: one compile per kernel and recipe)

# Every mode alone and all at once against the oracle (ids: the names), on packed sequences of lengths 2, C-1, 0, C+1,
# 2 or two rows of C+1 tokens, K != V; and the recipes of the properties of one mode, with the modes each needs
# (oracle/mode_recipes.py: the suite names no mode itself).
RECIPES = mode_recipes.SUITE
LENGTHS = mode_recipes.SUITE_LENGTHS
H, K, V = mode_recipes.SUITE_SHAPE
PROPERTIES = mode_recipes.PROPERTIES
PLAIN = call_modes.BASE.name  # the plain contract call a mode call is compared with
# Decay regimes drawn for calls whose log-decay is given (a gated call draws its raw gate instead).
DECAYS = ("none", "weak", "moderate", "strong", "mixed")
GATES = ("uniform", "negative", "erase_zero", "write_one")


def modes_mark(recipe):
    """The ``gdn2_modes`` mark of the modes ``recipe`` uses."""
    return pytest.mark.gdn2_modes(*recipe.modes)


def needs(prop):
    """The ``gdn2_modes`` mark of the modes property ``prop`` (of :data:`PROPERTIES`) needs."""
    return pytest.mark.gdn2_modes(*PROPERTIES[prop].modes)


def drawn(recipe):
    """Recipes on ``recipe``'s shape and modes with drawn seeds, decay and gate regimes."""
    decays = DECAYS if recipe.log_decay_given else ("moderate",)
    return st.builds(lambda s, c, d, g: recipe.replace(seed=s, cot_seed=c, decay=d, gates=g),
                     seeds, seeds, st.sampled_from(decays), st.sampled_from(GATES))


def case_of(recipe):
    return ModeCase.from_recipe("property", recipe)


def explain(recipe, kernel_name, report, what):
    return (f"{what}\n{report.format()}\n"
            f"recipe:    {recipe.call_source()}\n"
            f"reproduce: {mode_repro(recipe, kernel_name)}")


def check(report, recipe, kernel_name, what):
    """FAIL fails the test (with the recipe and a reproduction); PRECISION warns (fails under --gdn2-strict)."""
    note(f"recipe: {recipe.call_source()}")
    if not report.passed:
        grading.enforce(report, explain(recipe, kernel_name, report, what))


# --------------------------------------------------------------------------------------------
# the checks (plain functions of a kernel)


def check_oracle(fn, recipe) -> Report:
    """The call against the float64 oracle (tolerance model), every result it has."""
    return running.validate(fn, case_of(recipe))


def _dense_results(fn, call, arrays, h0, do, dfs, dtype):
    """A plain contract call (no mode keyword) on explicit arrays: the nine results by name."""
    p = Problem(*arrays, scale=call.scale, initial_state=h0)
    return harness.kernel_results(fn, p, do, dfs, dtype=dtype)


def _sub_call(call, t0, t1, n):
    """Sequence n of a packed call as a dense call of its own (the other modes kept)."""
    h0 = None if call.initial_state is None else call.initial_state[n:n + 1]
    return dataclasses.replace(call, **{x: getattr(call, x)[:, t0:t1] for x in INPUTS}, initial_state=h0,
                               cu_seqlens=None)


def alone_results(fn, call, do, dfs, dtype, names):
    """Each packed sequence run alone (its own dense call from ``h0[n]``), assembled into the packed layout: o and
    the per-token gradients of its tokens, ``final_state[n]``, ``dh0[n]``, its chunk-start states; ``dA_log`` /
    ``ddt_bias`` summed over the sequences. An empty sequence: ``final_state[n] = h0[n]``, ``dh0[n] = dfs[n]``."""
    h0 = call.initial_state if call.initial_state is not None else np.zeros(call.state_shape)
    B, T, heads, _, values = call.shape
    out = {"o": np.zeros((B, T, heads, values)), "final_state": np.array(h0), "dh0": np.array(dfs, np.float64)}
    for name, x in zip(("dq", "dk", "dv", "dg", "db", "dw"), call.inputs()):
        out[name] = np.zeros(x.shape)
    for name in ("dA_log", "ddt_bias"):
        if name in names:
            out[name] = 0.0
    inter = []
    dtypes = {}
    for _, t0, t1, states in call.segments():
        n = states.start
        if t1 == t0:
            continue
        sub = _sub_call(call, t0, t1, n)
        got = running.mode_results(fn, sub, do[:, t0:t1], dfs[n:n + 1], dtype=dtype)
        dtypes = {k: v.dtype for k, v in got.items()}
        out["o"][:, t0:t1] = got["o"]
        out["final_state"][n] = got["final_state"][0]
        out["dh0"][n] = got["dh0"][0]
        for name in ("dq", "dk", "dv", "dg", "db", "dw"):
            out[name][:, t0:t1] = got[name]
        for name in ("dA_log", "ddt_bias"):
            if name in names:
                out[name] = out[name] + np.asarray(got[name], np.float64)
        if "intermediate_states" in names:
            inter.append(got["intermediate_states"])
    if "intermediate_states" in names:
        out["intermediate_states"] = np.concatenate(inter, axis=1)
    # in the dtypes the kernel returned them in (so the agreement bound allows a bf16 result its ulp)
    return {k: np.asarray(v).astype(dtypes.get(k, np.float64)) if k in dtypes else v for k, v in out.items()}


def check_packed_alone(fn, recipe) -> Report:
    """Packed == each sequence run alone (agreement bound): outputs, final states and every gradient of each
    sequence's own tokens, ``dh0[n]`` included; an empty sequence returns ``h0[n]`` and passes ``dfs[n]`` on."""
    case = case_of(recipe)
    call, do, dfs = case.data()
    packed = running.mode_results(fn, call, do, dfs, dtype=case.dtype)
    alone = alone_results(fn, call, do, dfs, case.dtype, case.names())
    return case.agreement(packed, alone, what="packed~alone", chunk_size=running.kernel_chunk_size(fn))


def check_packed_dense(fn, recipe) -> Report:
    """Equal lengths packed == the same rows as a dense batch (agreement bound); ``recipe`` is the dense one."""
    assert not recipe.packed
    case = case_of(recipe)
    call, do, dfs = case.data()
    rows = running.mode_results(fn, call, do, dfs, dtype=case.dtype)
    B, T = call.shape[:2]
    flat = [x.reshape((1, B * T) + x.shape[2:]) for x in call.inputs()]
    packed_call = dataclasses.replace(call, **dict(zip(INPUTS, flat)), cu_seqlens=np.arange(B + 1) * T)
    packed = running.mode_results(fn, packed_call, do.reshape((1, B * T) + do.shape[2:]), dfs, dtype=case.dtype)
    back = {}
    for name, x in packed.items():
        if name in ("o", "dq", "dk", "dv", "dg", "db", "dw"):
            back[name] = x.reshape((B, T) + x.shape[2:])
        elif name == "intermediate_states":
            back[name] = x.reshape((B, -1) + x.shape[2:])
        else:
            back[name] = x
    return case.agreement(back, rows, what=f"packed~{PLAIN}", chunk_size=running.kernel_chunk_size(fn))


PERTURBED = ("k", "v", "g", "w")


def check_perturbation(fn, recipe, victim, seed=0) -> Report:
    """Perturbing packed sequence ``victim`` (its k, v, g, w and h0) leaves every other sequence's outputs, final
    state, gradients and dh0 within the agreement bound of the unperturbed call (the victim's own results are
    copied over, so only the others are compared)."""
    case = case_of(recipe)
    call, do, dfs = case.data()
    t0, t1 = (int(x) for x in call.cu_seqlens[victim:victim + 2])
    rng = np.random.default_rng(seed)
    arrays = {n: np.array(getattr(call, n)) for n in INPUTS}
    for name in PERTURBED:  # each value scaled by U[0.5, 1.5] (a log-decay stays <= 0), rounded like the inputs
        x = arrays[name]
        x[:, t0:t1] = round_to(x[:, t0:t1] * rng.uniform(0.5, 1.5, x[:, t0:t1].shape), case.dtype)
    h0 = np.array(call.initial_state) if call.initial_state is not None else np.zeros(call.state_shape)
    h0[victim] = round_to(rng.standard_normal(h0[victim].shape), "float32")
    other = dataclasses.replace(call, **arrays, initial_state=h0)
    a = running.mode_results(fn, call, do, dfs, dtype=case.dtype)
    b = running.mode_results(fn, other, do, dfs, dtype=case.dtype)
    return others_unchanged(case, a, b, victim, t0, t1)


def others_unchanged(case, a, b, victim, t0, t1):
    """The tight agreement of runs ``a`` and ``b`` on every result but the perturbed sequence's own (its tokens
    ``t0:t1``, its row ``victim`` of ``final_state`` and ``dh0``: taken from ``a``, not compared)."""
    names = [n for n in case.names() if n not in ("dA_log", "ddt_bias", "intermediate_states")]
    for name in names:
        b[name] = np.array(b[name])
        if name in ("final_state", "dh0"):
            b[name][victim] = a[name][victim]
        else:
            b[name][:, t0:t1] = a[name][:, t0:t1]
    return case.agreement(a, b, what="others unchanged", names=names)


def check_gate_dense(fn, recipe) -> Report:
    """The gated call == the dense call on the log-decay precomputed (float32, as the kernel's input), with
    ``dg``, ``dA_log``, ``ddt_bias`` chained from the dense call's ``dg`` through the gate's adjoint (float64)."""
    case = case_of(recipe)
    call, do, dfs = case.data()
    gated = running.mode_results(fn, call, do, dfs, dtype=case.dtype)
    g32 = modes.core_inputs(call, np.float32)[INPUTS.index("g")]  # the log-decay through the gate, in float32
    q, k, v, _, b, w = call.inputs()
    plain = _dense_results(fn, call, (q, k, v, np.minimum(g32.astype(np.float64), 0.0), b, w), call.initial_state,
                           do, dfs, case.dtype)
    dg, dA, dbias = preprocess.gate_vjp(call.g, call.A_log, call.dt_bias, call.lower_bound, 1.0,
                                        np.asarray(plain["dg"], np.float64))
    plain = dict(plain, dg=dg.astype(np.float32))
    if dA is not None:
        plain["dA_log"] = dA
    if dbias is not None:
        plain["ddt_bias"] = dbias
    return case.agreement(gated, plain, what=f"{PROPERTIES['gate_precomputed'].mode}~{PLAIN}")


def check_l2norm_dense(fn, recipe) -> Report:
    """The call with in-kernel q/k L2 norm == the dense call on q, k normalised beforehand (float32), with
    ``dq``, ``dk`` chained through the norm's adjoint (float64)."""
    case = case_of(recipe)
    call, do, dfs = case.data()
    normed = running.mode_results(fn, call, do, dfs, dtype=case.dtype)
    q, k, v, g, b, w = call.inputs()
    core = modes.core_inputs(call, np.float32)  # q, k normalised in float32
    qn, kn = (core[INPUTS.index(n)].astype(np.float64) for n in ("q", "k"))
    plain = _dense_results(fn, call, (qn, kn, v, g, b, w), call.initial_state, do, dfs, "float32")
    plain = dict(plain, **{n: preprocess.l2norm_vjp(x, preprocess.L2NORM_EPS, np.asarray(plain[n], np.float64))
                           .astype(np.float32) for n, x in (("dq", q), ("dk", k))})
    return case.agreement(normed, plain, what=f"{PROPERTIES['l2norm_precomputed'].mode}~{PLAIN}")


def check_state_v_first(fn, recipe) -> Report:
    """The ``[V, K]`` state layout is the transpose: initial, final and chunk-start states, dh0; nothing else
    changes (agreement bound)."""
    case = case_of(recipe)
    call, do, dfs = case.data()
    kcall = call.kv_layout()
    assert kcall is not call, "a recipe with [V, K] states"
    vk = running.mode_results(fn, call, do, dfs, dtype=case.dtype)
    kv = running.mode_results(fn, kcall, do, call.to_kv(dfs), dtype=case.dtype)
    for name in ("final_state", "dh0", "intermediate_states"):
        if name in kv:
            kv[name] = call.to_kv(kv[name])
    return case.agreement(vk, kv, what=f"{PROPERTIES['transposed_states'].mode}~transpose",
                          chunk_size=running.kernel_chunk_size(fn))


def check_intermediate(fn, recipe) -> Report:
    """The states at the chunk starts (the kernel's chunk) by value against the oracle, with the final state."""
    report = check_oracle(fn, recipe)
    keep = [v for v in report.verdicts if v.name in ("intermediate_states", "final_state")]
    return Report(verdicts=keep, dtype=report.dtype)


# --------------------------------------------------------------------------------------------
# the properties


ORACLE_RECIPES = [pytest.param(name, marks=modes_mark(r), id=name) for name, r in RECIPES.items()]


@pytest.mark.parametrize("name", ORACLE_RECIPES)
@given(data=st.data())
@settings(max_examples=max(2, settings().max_examples // 2))
def test_mode_call_matches_the_oracle(kernel, name, data):
    """Every mode (and all at once) against the float64 oracle: o, final state, the seven gradients and, where
    the call has them, the chunk-start states, dA_log and ddt_bias (tolerance model)."""
    recipe = data.draw(drawn(RECIPES[name]), label="recipe")
    check(check_oracle(kernel.fn, recipe), recipe, kernel.name, f"{kernel.name} [{name}] vs the float64 oracle")


PACKED = PROPERTIES["packed_alone"].recipe


@needs("packed_alone")
@given(recipe=drawn(PACKED))
@example(recipe=PACKED)
@settings(max_examples=max(2, settings().max_examples // 2))
def test_packed_equals_each_sequence_alone(kernel, recipe):
    """Packed == each sequence alone from its own h0[n]: outputs, final states and the gradients of every
    sequence, dh0[n] included; empty sequences return h0[n] and pass dfinal_state[n] to dh0[n]."""
    check(check_packed_alone(kernel.fn, recipe), recipe, kernel.name, "packed vs each sequence alone")


@needs("packed_rows")
@given(recipe=drawn(PROPERTIES["packed_rows"].recipe))
@settings(max_examples=max(2, settings().max_examples // 2))
def test_equal_lengths_packed_equals_the_dense_batch(kernel, recipe):
    """Rows of equal length packed into one row with cu_seqlens == the dense batch (agreement bound)."""
    check(check_packed_dense(kernel.fn, recipe), recipe, kernel.name, f"packed vs {PLAIN} batch")


@needs("packed_alone")
@given(recipe=drawn(PACKED), victim=st.sampled_from([i for i, n in enumerate(PACKED.lengths) if n]), seed=seeds)
@settings(max_examples=max(2, settings().max_examples // 2))
def test_perturbing_one_sequence_leaves_the_others(kernel, recipe, victim, seed):
    """Changing sequence n's inputs and h0[n] leaves every other sequence's outputs, final state, gradients and
    dh0 unchanged (within the agreement bound: chunk kernels need not be bitwise)."""
    check(check_perturbation(kernel.fn, recipe, victim, seed), recipe, kernel.name,
          f"perturbing sequence {victim} changed another sequence")


@pytest.mark.parametrize("form", list(PROPERTIES["gate_precomputed"].recipes))
@needs("gate_precomputed")
@given(data=st.data())
@settings(max_examples=max(2, settings().max_examples // 2))
def test_gate_equals_the_dense_call_on_the_precomputed_decay(kernel, form, data):
    """use_gate_in_kernel == the dense call on the log-decay computed beforehand, gradients chained through the
    gate (bounded form with lower_bound -5, and the softplus form)."""
    recipe = data.draw(drawn(PROPERTIES["gate_precomputed"].recipes[form]), label="recipe")
    check(check_gate_dense(kernel.fn, recipe), recipe, kernel.name, f"{form} vs the {PLAIN} call")


@needs("l2norm_precomputed")
@given(recipe=drawn(PROPERTIES["l2norm_precomputed"].recipe))
@settings(max_examples=max(2, settings().max_examples // 2))
def test_l2norm_equals_the_dense_call_on_normalised_q_k(kernel, recipe):
    """use_qk_l2norm_in_kernel == the dense call on q, k normalised beforehand (zero and sqrt(eps)-sized rows
    included), gradients chained through the norm."""
    check(check_l2norm_dense(kernel.fn, recipe), recipe, kernel.name,
          f"{PROPERTIES['l2norm_precomputed'].mode} vs the {PLAIN} call")


@needs("transposed_states")
@given(recipe=drawn(PROPERTIES["transposed_states"].recipe))
@settings(max_examples=max(2, settings().max_examples // 2))
def test_state_v_first_is_the_transpose(kernel, recipe):
    """state_v_first: initial, final states and dh0 are the [V, K] transposes; every other result unchanged."""
    check(check_state_v_first(kernel.fn, recipe), recipe, kernel.name,
          f"{PROPERTIES['transposed_states'].mode} vs the transpose")


@needs("chunk_starts")
@given(recipe=drawn(PROPERTIES["chunk_starts"].recipe))
@settings(max_examples=max(2, settings().max_examples // 2))
def test_intermediate_states_match_the_oracle(kernel, recipe):
    """return_intermediate_states: the state before each chunk of each sequence (FLA's packed offsets), by value."""
    check(check_intermediate(kernel.fn, recipe), recipe, kernel.name, "chunk-start states vs the oracle")
