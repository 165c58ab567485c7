"""Grouped value heads (GVA, docs/DESIGN.md §1): ``H`` key heads (q, k), ``HV = G H`` value heads (v, g, b, w, the
state and o), value head ``hv`` reading key head ``hv // G``. Checked against the per-value-head problem with q, k
repeated, central finite differences, mpmath, the chunked baseline and the b = 0 closed form; H == HV unchanged."""

from __future__ import annotations

import hashlib

import mpmath
import numpy as np
import pytest

from gdn2_oracle import oracle
from gdn2_oracle.oracle import GRADS, chunked32, mp, recurrence, reductions
from gdn2_oracle.oracle.problem import repeat_heads, sum_groups


def _gva(G, shape=(2, 7, 2, 3, 4), **kw):
    B, T, H, K, V = shape
    kw = {"decay": "moderate", "gates": "uniform", "initial_state": True, "seed": 10 + G, **kw}
    p = oracle.make_problem(B, T, H, K, V, HV=G * H, **kw)
    return p, *oracle.random_cotangents(p, seed=G)


def _group_sums(grads, G):
    """The repeated problem's gradients with dq, dk summed over each group: the GVA problem's."""
    return grads._replace(dq=sum_groups(grads.dq, G), dk=sum_groups(grads.dk, G))


def _equal(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("G", [2, 4])
def test_shapes_follow_the_value_heads(G):
    p, do, dfs = _gva(G)
    B, T, H, K, V = p.shape
    HV = G * H
    assert (p.HV, p.group_size) == (HV, G)
    assert p.q.shape == p.k.shape == (B, T, H, K)
    assert p.g.shape == p.b.shape == (B, T, HV, K) and p.v.shape == p.w.shape == (B, T, HV, V)
    assert p.h0().shape == dfs.shape == (B, HV, K, V) and do.shape == (B, T, HV, V)
    (o, S), grads = recurrence.forward_and_vjp(p, do, dfs)
    assert o.shape == (B, T, HV, V) and S.shape == (B, HV, K, V)
    for name, x in zip(GRADS, (*p.inputs(), p.h0())):
        assert getattr(grads, name).shape == x.shape, name


def test_value_head_hv_reads_key_head_hv_over_G():
    p = oracle.make_problem(1, 3, 2, 2, 2, HV=6, seed=0)
    r = p.per_value_head()
    assert r.HV == r.shape[2] == 6 and r.group_size == 1
    for hv in range(6):
        assert np.array_equal(r.q[:, :, hv], p.q[:, :, hv // 3]) and np.array_equal(r.k[:, :, hv], p.k[:, :, hv // 3])
    assert np.array_equal(sum_groups(repeat_heads(p.q, 3), 3), 3 * p.q)
    assert r.per_value_head() is r


@pytest.mark.parametrize("G", [2, 4])
def test_each_value_head_is_its_own_single_head_problem(G):
    """Value head hv, alone with key head hv // G (H = HV = 1), gives hv's output, state and v, g, b, w, h0
    gradients; key head h's dq, dk are the sums over its value heads hv = h G .. h G + G - 1."""
    p, do, dfs = _gva(G)
    (o, S), grads = recurrence.forward_and_vjp(p, do, dfs)
    dq, dk = np.zeros_like(p.q), np.zeros_like(p.k)
    for hv in range(p.HV):
        h, one = hv // G, slice(hv, hv + 1)
        single = oracle.Problem(p.q[:, :, h:h + 1], p.k[:, :, h:h + 1], p.v[:, :, one], p.g[:, :, one], p.b[:, :, one],
                                p.w[:, :, one], scale=p.scale, initial_state=p.h0()[:, one])
        (so, sS), sg = recurrence.forward_and_vjp(single, do[:, :, one], dfs[:, one])
        for got, ref in zip((so, sS, *sg[2:]), (o[:, :, one], S[:, one], *(x[:, :, one] for x in grads[2:6]),
                                                 grads.dh0[:, one]), strict=True):
            assert np.allclose(got, ref, rtol=1e-14, atol=1e-15)
        dq[:, :, h:h + 1] += sg.dq
        dk[:, :, h:h + 1] += sg.dk
    assert np.allclose(dq, grads.dq, rtol=1e-14, atol=1e-15) and np.allclose(dk, grads.dk, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("G", [2, 4])
def test_equals_the_per_value_head_problem_exactly(G, dtype):
    """Forward and every gradient but dq, dk bit for bit the repeated problem's; dq, dk its group sums."""
    p, do, dfs = _gva(G, decay="mixed", gates="negative")
    r = p.per_value_head()
    (o, S), grads = recurrence.forward_and_vjp(p, do, dfs, dtype)
    (ro, rS), rgrads = recurrence.forward_and_vjp(r, do, dfs, dtype)
    assert _equal((o, S), (ro, rS))
    assert _equal(grads, _group_sums(rgrads, G))
    assert _equal(recurrence.forward(p, dtype), (o, S))
    assert _equal(recurrence.vjp(p, do, dfs, dtype, checkpoint_every=3), _group_sums(
        recurrence.vjp(r, do, dfs, dtype, checkpoint_every=3), G))


@pytest.mark.parametrize("G", [2, 4])
def test_adjoint_matches_float64_central_differences(G):
    p, do, dfs = _gva(G, shape=(1, 4, 2, 2, 3))
    grads = recurrence.vjp(p, do, dfs)
    h = 1e-6

    def loss(**changes):
        o, S = recurrence.forward(p.replace(**changes))
        return np.sum(o * do) + np.sum(S * dfs)

    for name, grad in zip(oracle.INPUTS + ("initial_state",), GRADS):
        x = np.array(p.h0() if name == "initial_state" else getattr(p, name))
        g = getattr(grads, grad)
        assert g.shape == x.shape
        for idx in np.ndindex(x.shape):
            plus, minus = x.copy(), x.copy()
            plus[idx] += h
            minus[idx] -= h
            fd = (loss(**{name: plus}) - loss(**{name: minus})) / (2 * h)
            assert abs(fd - g[idx]) <= 1e-7 * (1 + abs(g[idx])), f"{grad}{idx}: adjoint {g[idx]} vs {fd}"


def test_adjoint_matches_mpmath_finite_differences():
    """As test_oracle's finite differences at 400 bits (>= 20 digits), on a grouped problem (G = 2)."""
    prec, step = 400, mpmath.mpf(2) ** -110
    p, do, dfs = _gva(2, shape=(1, 3, 1, 2, 2), decay="strong", gates="negative")
    ar = mp.MPArith()
    _, _, adj = mp.run_mpf(p, prec, do, dfs)
    base = {n: ar.array(getattr(p, n)) for n in oracle.INPUTS}
    base["initial_state"] = ar.array(p.h0())

    def loss(overrides):
        o, S = mp.run_mpf(p, prec, overrides=overrides)
        return np.sum(o * ar.array(do)) + np.sum(S * ar.array(dfs))

    with mpmath.workprec(prec):
        for name, grad in zip(oracle.INPUTS + ("initial_state",), GRADS):
            x = base[name]
            assert adj[grad].shape == x.shape, grad
            for idx in np.ndindex(x.shape):
                plus, minus = x.copy(), x.copy()
                plus[idx] += step
                minus[idx] -= step
                fd = (loss({**base, name: plus}) - loss({**base, name: minus})) / (2 * step)
                a = adj[grad][idx]
                floor = mpmath.mpf(10) ** -40 * max(abs(v) for v in adj[grad].flat)
                assert abs(fd - a) <= mpmath.mpf(10) ** -20 * abs(a) + floor, f"{grad}{idx}"


@pytest.mark.parametrize("G", [2, 4])
def test_mpmath_agrees_with_float64(G):
    p, do, dfs = _gva(G, shape=(1, 6, 2, 3, 2), decay="resets")
    fwd, grads = mp.forward_and_vjp(p, do, dfs, prec=128)
    (o, S), g64 = recurrence.forward_and_vjp(p, do, dfs)
    for ref, got in [(fwd.o, o), (fwd.final_state, S)] + [(getattr(grads, n), getattr(g64, n)) for n in GRADS]:
        assert ref.shape == got.shape
        assert np.max(np.abs(ref - got)) <= 1e-13 * max(1.0, np.max(np.abs(ref)))
    assert set(grads.errors) == set(GRADS) and grads.errors["dq"].shape == p.q.shape


@pytest.mark.parametrize("G", [2, 4])
def test_chunked_baseline_groups_like_the_recurrence(G):
    p, do, dfs = _gva(G, shape=(1, 11, 2, 3, 2))
    (o, S), grads = chunked32.forward_and_vjp(p, do, dfs, chunk_size=4, dtype=np.float64)
    (ro, rS), rgrads = recurrence.forward_and_vjp(p, do, dfs)
    for got, ref in zip((o, S, *grads), (ro, rS, *rgrads), strict=True):
        assert got.shape == ref.shape and np.allclose(got, ref, rtol=0, atol=1e-12)
    # float32: the repeated problem's results, dq and dk summed over each group
    r = p.per_value_head()
    assert _equal(chunked32.forward_and_vjp(p, do, dfs)[0], chunked32.forward_and_vjp(r, do, dfs)[0])
    assert _equal(chunked32.forward_and_vjp(p, do, dfs)[1], _group_sums(chunked32.forward_and_vjp(r, do, dfs)[1], G))


def test_gla_closed_form_and_reductions_take_grouped_heads():
    p, _, _ = _gva(2, shape=(1, 6, 2, 3, 2))
    pz = p.replace(b=np.zeros_like(p.b))
    for got, ref in zip(reductions.gla_forward(pz), recurrence.forward(pz), strict=True):
        assert np.allclose(got, ref, rtol=0, atol=1e-13)
    for kind in reductions.REDUCTIONS:
        red = reductions.reduce(p, kind)
        assert red.HV == 4 and np.all(red.b == red.b[..., :1]) and np.all(red.w[..., 0] == red.b[..., 0])
    r = oracle.Recipe(1, 5, 2, 3, 2, HV=4, reduction="gdn", seed=3)
    red = r.problem()
    assert red.HV == 4 and np.all(red.g == red.g[..., :1])
    with pytest.raises(ValueError, match=r"^beta:.*\[B, T, HV\]"):
        reductions.kda_problem(p.q, p.k, p.v, p.g, p.b[:, :, :2, 0])


def test_recipe_carries_HV_and_rebuilds_its_problem():
    r = oracle.Recipe(1, 5, 2, 3, 2, HV=6, initial_state=True, seed=4)
    assert r.shape == (1, 5, 2, 3, 2) and r.value_heads == 6
    p, do, dfs = r.build()
    assert p.HV == 6 and do.shape == (1, 5, 6, 2) and dfs.shape == (1, 6, 3, 2)
    assert "HV=6" in r.call()
    rebuilt = eval(r.call(), {"oracle": oracle})  # noqa: S307 - the recipe's own source
    assert _equal(rebuilt.inputs() + (rebuilt.h0(),), p.inputs() + (p.h0(),))
    assert r.replace(H=6).HV is None  # HV == H has one spelling


@pytest.mark.parametrize("HV", [3, 0, -2, 2.0, True, "4"])
def test_bad_HV_is_a_value_error_naming_it(HV):
    with pytest.raises(ValueError, match="^HV:"):
        oracle.make_problem(1, 3, 2, 2, 2, HV=HV)
    with pytest.raises(ValueError, match="^HV:"):
        oracle.Recipe(1, 3, 2, 2, 2, HV=HV)


def _arrays(G=2):
    p = oracle.make_problem(1, 3, 2, 2, 2, HV=2 * G, initial_state=True, seed=0)
    return {n: np.array(getattr(p, n)) for n in oracle.INPUTS}, p


@pytest.mark.parametrize("name,mutate,message", [
    ("v", lambda a: a[:, :, :3], "not a positive multiple"),
    ("v", lambda a: a[:, :, :0], "not a positive multiple"),
    ("g", lambda a: a[:, :, :2], "shape"),
    ("b", lambda a: np.concatenate([a, a], axis=2), "shape"),
    ("w", lambda a: a[:, :, :2], "shape"),
    ("k", lambda a: np.concatenate([a, a], axis=2), "shape"),
])
def test_disagreeing_heads_are_a_value_error_naming_the_input(name, mutate, message):
    arrays, _ = _arrays()
    arrays[name] = mutate(arrays[name])
    with pytest.raises(ValueError, match=f"^{name}:.*{message}"):
        oracle.Problem(**arrays)


def test_state_and_cotangents_have_the_value_heads():
    arrays, p = _arrays()
    with pytest.raises(ValueError, match=r"^initial_state:.*\[B, HV, K, V\]"):
        oracle.Problem(**arrays, initial_state=np.zeros((1, 2, 2, 2)))
    do, dfs = oracle.random_cotangents(p)
    with pytest.raises(ValueError, match="^do:"):
        recurrence.vjp(p, do[:, :, :2], dfs)
    with pytest.raises(ValueError, match="^dfinal_state:"):
        recurrence.vjp(p, do, dfs[:, :2])


# --- H == HV: unchanged ------------------------------------------------------------------

def _digest(arrays):
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a, dtype=np.float64)
        h.update(repr(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


# sha256 of the generated data and of the mpmath results (64 bits, rounded to float64; both independent of the
# machine's BLAS), as the oracle gave them before it took grouped value heads.
BEFORE_GVA = [
    (oracle.Recipe(2, 5, 2, 3, 4, decay="resets", gates="negative", initial_state=True, precision="bfloat16", seed=11),
     "129e0dbb1640d07f0f4ede2cebc586f089040c211d6e6f2c841f039a6c49d8b3",
     "43bcd170445acc9c564ab405237bd44b36db9408e8036606454c9acfcb56b422"),
    (oracle.Recipe(1, 6, 3, 2, 3, decay="mixed", reduction="kda", seed=12),
     "dbfbb0bdd2dc9d6edb634ad3390964c212533c6cbaa7be327a95de529fa80182",
     "dc17edbd85f3e0da2efde9bd868c4550a39e56bb2298a68f17030388bd18bff2"),
]


@pytest.mark.parametrize("recipe,data,results", BEFORE_GVA)
def test_H_equal_HV_gives_the_data_and_results_of_before(recipe, data, results):
    p, do, dfs = recipe.build()
    assert _digest([*p.inputs(), p.h0(), do, dfs]) == data
    f, g = mp.forward_and_vjp(p, do, dfs, prec=64)
    assert _digest([f.o, f.final_state, *(getattr(g, n) for n in GRADS)]) == results
    # HV = H spelled out is the same recipe, problem and results
    same = recipe.replace(HV=recipe.H)
    assert same == recipe and same.HV is None and "HV" not in same.call()
    explicit = oracle.make_problem(*recipe.shape, HV=recipe.H, **recipe.kwargs())
    default = oracle.make_problem(*recipe.shape, **recipe.kwargs())
    assert _equal(explicit.inputs() + (explicit.h0(),), default.inputs() + (default.h0(),))
    assert default.per_value_head() is default and default.group_size == 1


def test_H_equal_HV_float64_runs_the_specification_bit_for_bit():
    """No repetition and no group sum on H == HV: the float64 results are the specification's
    (``recurrence._spec_run``, the per-head recurrence of before) bit for bit."""
    p, do, dfs = BEFORE_GVA[0][0].build()
    ar = recurrence.Arith(np.float64)
    o, S, grads = recurrence.run(p, ar, *p.check_cotangents(do, dfs))
    so, sS, sgrads = recurrence._spec_run(p, ar, *p.check_cotangents(do, dfs))
    assert _equal((o, S), (so, sS)) and all(np.array_equal(grads[n], sgrads[n]) for n in GRADS)
