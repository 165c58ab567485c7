"""Family calls in every training-call mode (oracle/families.py: FamilyCall.to_call, run; oracle/modes.py with grouped
value heads; oracle/family_recipes.py in a mode recipe's structure): each mode checked against the same family call
written another way -- packed sequences against each sequence alone, the [V, K] layout against the [K, V] one, the
states at chunk starts against the prefixes' final states, GDN's per-head gate against the dense map with the gate in
the family layer, grouped value heads against every value head with its own copy of q and k."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gdn2_oracle.oracle import families, family_recipes, modes
from gdn2_oracle.oracle.call import Call
from gdn2_oracle.oracle.problem import repeat_heads, sum_groups

RNG = np.random.default_rng(7)


def _family_inputs(family, B, T, H=2, HV=4, K=8, V=8, rng=RNG):
    q, k = rng.standard_normal((B, T, H, K)), rng.standard_normal((B, T, H, K))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((B, T, HV, V))
    g = -rng.uniform(0.0, 0.5, (B, T, HV, K) if family == "kda" else (B, T, HV))
    beta = rng.standard_normal((B, T, HV))
    return q, k, v, g, beta


def _close(a, b, what):
    np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12 * max(1.0, float(np.max(np.abs(b)))), err_msg=what)


def test_a_grouped_call_is_every_value_head_on_its_own_copy_of_q_and_k():
    q, k, v, g, beta = _family_inputs("kda", 2, 30)
    g4, b, w = g, np.broadcast_to(beta[..., None] ** 2, g.shape), np.broadcast_to(beta[..., None] ** 2, v.shape)
    h0 = RNG.standard_normal((2, 4, 8, 8))
    grouped = Call(q, k, v, g4, b, w, initial_state=h0, qk_l2norm=True)
    apart = dataclasses.replace(grouped, q=repeat_heads(q, 2), k=repeat_heads(k, 2))
    do, dfs = RNG.standard_normal(v.shape), RNG.standard_normal(h0.shape)
    fa, ga = modes.forward_and_vjp_modes(grouped, do, dfs)
    fb, gb = modes.forward_and_vjp_modes(apart, do, dfs)
    _close(fa.o, fb.o, "o")
    _close(ga.dq, sum_groups(gb.dq, 2), "dq")
    _close(ga.dk, sum_groups(gb.dk, 2), "dk")
    for n in ("dv", "dg", "db", "dw", "dh0"):
        _close(getattr(ga, n), getattr(gb, n), n)
    assert grouped.state_shape == (2, 4, 8, 8) and grouped.group_size == 2


@pytest.mark.parametrize("family", families.MAPPED)
def test_packed_sequences_are_each_sequence_alone(family):
    lengths = (5, 0, 17, 1)
    cu = np.concatenate([[0], np.cumsum(lengths)])
    q, k, v, g, beta = _family_inputs(family, 1, int(cu[-1]))
    h0 = RNG.standard_normal((len(lengths), 4, 8, 8))
    flags = dict(use_beta_sigmoid_in_kernel=True, use_qk_l2norm_in_kernel=True)
    packed = families.call(family, q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, **flags)
    do, dfs = RNG.standard_normal(v.shape), RNG.standard_normal(h0.shape)
    got = families.run(packed, np.float64, do, dfs)
    for n, (t0, t1) in enumerate(zip(cu[:-1], cu[1:])):
        if t1 == t0:
            _close(got["final_state"][n], h0[n], "an empty sequence keeps its state")
            _close(got["dh0"][n], dfs[n], "an empty sequence passes dfinal_state to dh0")
            continue
        one = families.call(family, *(x[:, t0:t1] for x in (q, k, v, g, beta)), initial_state=h0[n:n + 1], **flags)
        want = families.run(one, np.float64, do[:, t0:t1], dfs[n:n + 1])
        for name in ("o", "dq", "dk", "dv", "dg", "dbeta"):
            _close(got[name][:, t0:t1], want[name], f"{name} of sequence {n}")
        for name in ("final_state", "dh0"):
            _close(got[name][n:n + 1], want[name], f"{name} of sequence {n}")


@pytest.mark.parametrize("family", families.MAPPED)
def test_the_v_k_layout_is_the_transposed_state(family):
    xs = _family_inputs(family, 2, 20)
    h0 = RNG.standard_normal((2, 4, 8, 8))
    do, dfs = RNG.standard_normal(xs[2].shape), RNG.standard_normal(h0.shape)
    kv = families.run(families.call(family, *xs, initial_state=h0), np.float64, do, dfs)
    vk_call = families.call(family, *xs, initial_state=np.swapaxes(h0, -1, -2), state_v_first=True)
    assert vk_call.state_v_first and vk_call.state_shape == (2, 4, 8, 8)
    vk = families.run(vk_call, np.float64, do, np.swapaxes(dfs, -1, -2))
    for name in ("o", "dq", "dk", "dv", "dg", "dbeta"):
        _close(vk[name], kv[name], name)
    for name in ("final_state", "dh0"):
        _close(np.swapaxes(vk[name], -1, -2), kv[name], name)


def test_the_states_at_chunk_starts_are_the_prefixes_final_states():
    xs = _family_inputs("kda", 2, 21)
    h0 = RNG.standard_normal((2, 4, 8, 8))
    C = 8
    call = families.call("kda", *xs, initial_state=h0, intermediate_chunk_size=C)
    states = families.run(call, np.float64)["intermediate_states"]
    assert states.shape == call.chunk_states_shape(C) == (2, 3, 4, 8, 8)
    _close(states[:, 0], h0, "the first chunk starts from h0")
    for c in (1, 2):
        prefix = families.call("kda", *(x[:, :c * C] for x in xs), initial_state=h0)
        _close(states[:, c], families.forward(prefix)[1], f"chunk {c}")


def test_gdns_gate_per_head_is_the_broadcast_gdn2_gate():
    q, k, v, g, beta = _family_inputs("gdn", 2, 16)
    g = RNG.standard_normal(g.shape)  # a raw pre-activation
    A_log, dt_bias = np.log(RNG.uniform(1, 4, 4)), RNG.standard_normal(4)
    call = families.call("gdn", q, k, v, g, beta, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                         use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
    mapped = call.to_call()
    assert mapped.gate_in_kernel and mapped.dt_bias.shape == (4 * 8,) and np.array_equal(mapped.g[..., 3], g)
    do, dfs = RNG.standard_normal(v.shape), RNG.standard_normal((2, 4, 8, 8))
    got = families.run(call, np.float64, do, dfs)
    # the dense map with the gate in the family layer (FamilyCall.to_gdn2 / project: one gate per head)
    from gdn2_oracle.oracle import recurrence

    (o, S), grads = recurrence.forward_and_vjp(call.to_gdn2(), do, dfs)
    want = call.project(grads)
    _close(got["o"], o, "o")
    _close(got["final_state"], S, "final_state")
    for name in ("dq", "dk", "dv", "dg", "dbeta", "dh0", "dA_log", "ddt_bias"):
        _close(got[name], getattr(want, name), name)
    assert got["ddt_bias"].shape == (4,) and got["dg"].shape == g.shape


def test_family_recipes_in_a_mode_recipes_structure():
    for name in family_recipes.names("full"):
        r = family_recipes.get(name)
        if r.mode is None:
            continue
        call, do, dfs = r.build()
        assert call.family.name == r.family and set(r.modes) == set(families.call_modes.active(call)), name
        assert call.shape[:2] == r.shape[:2] and do.shape == (*r.shape[:2], r.HV, r.V)
        assert dfs.shape == call.state_shape
    quick = [family_recipes.get(n) for n in family_recipes.names("quick") if family_recipes.get(n).mode]
    for family in families.MAPPED:
        covered = {m for r in quick if r.family == family for m in r.modes}
        takes = {m for m in families.call_modes.names("training")
                 if family == "kda" or m != "intermediate"}
        assert covered == takes, (family, covered)
    with pytest.raises(ValueError, match="mode"):
        family_recipes.FamilyRecipe.in_mode("gdn", "intermediate", 2, 4, 16, 16)
    with pytest.raises(ValueError, match="mode"):
        family_recipes.FamilyRecipe.in_mode("gdn", "gate_bounded", 2, 4, 16, 16)
    with pytest.raises(ValueError, match="B"):
        family_recipes.FamilyRecipe("kda", 3, 10, 2, 4, 16, 16, mode="intermediate")


def test_the_standard_algorithm_differentiates_the_sigmoid_as_y_one_minus_y():
    rng = np.random.default_rng(11)
    xs = list(_family_inputs("gdn", 1, 12, rng=rng))
    xs[4] = rng.uniform(6.0, 9.0, xs[4].shape)  # large logits: 1 - y cancels in float32
    call = families.call("gdn", *xs, use_beta_sigmoid_in_kernel=True)
    do, dfs = rng.standard_normal(xs[2].shape), rng.standard_normal((1, 4, 8, 8))
    mapped = call.to_call()
    results = modes.run_call(mapped, families.recurrence.Arith(np.float64), *mapped.check_cotangents(do, dfs))
    ref = call.project_results(results)["dbeta"]
    err = {}
    for name, standard in (("exact", False), ("standard", True)):
        got = call.project_results(results, np.float32, standard=standard)["dbeta"]
        err[name] = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err["standard"] > 30 * err["exact"], err
    standard = families.run(call, np.float32, do, dfs, core="chunked32")["dbeta"]
    assert np.linalg.norm(standard - ref) / np.linalg.norm(ref) > 30 * err["exact"]


@pytest.mark.parametrize("family", families.MAPPED)
def test_mpmath_family_calls_in_every_mode_agree_with_float64(family):
    lengths = (3, 0, 9)
    cu = np.concatenate([[0], np.cumsum(lengths)])
    q, k, v, g, beta = _family_inputs(family, 1, int(cu[-1]), K=4, V=4)
    g = RNG.standard_normal(g.shape)  # a raw gate
    A_log = np.log(RNG.uniform(1, 4, 4))
    dt_bias = RNG.standard_normal(4 * 4 if family == "kda" else 4)
    h0 = RNG.standard_normal((3, 4, 4, 4))
    call = families.call(family, q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, state_v_first=True,
                         use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True,
                         allow_neg_eigval=True, use_qk_l2norm_in_kernel=True)
    do, dfs = RNG.standard_normal(v.shape), RNG.standard_normal(h0.shape)
    got, errors = families.mp_run(call, do, dfs, prec=80)
    want = families.run(call, np.float64, do, dfs)
    for name, x in want.items():
        if x is None:
            assert got[name] is None, name
            continue
        _close(got[name], x, name)
        assert np.max(errors[name]) <= 1e-18 * max(1.0, float(np.max(np.abs(x)))), name
