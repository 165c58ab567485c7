"""Self-checks of the exact oracles: mpmath vs NumPy, adjoint vs finite differences,
closed forms, working precisions, and input validation. Kernel-independent: runs once."""

from __future__ import annotations

import itertools

import mpmath
import numpy as np
import pytest

from gdn2_oracle import oracle
from gdn2_oracle.ci.grading.tolerance import normalised_error
from gdn2_oracle.oracle import GRADS, mp, recurrence, reductions
from gdn2_oracle.oracle.generate import DECAYS, GATES


def _problem(decay, gates, **kw):
    shape = kw.pop("shape", (1, 9, 2, 4, 3))
    return oracle.make_problem(*shape, decay=decay, gates=gates, initial_state=True,
                               seed=hash((decay, gates)) % 2**32, **kw)


# --- mpmath vs NumPy float64 on every decay and gate regime ----------------------------------

@pytest.mark.parametrize("decay,gates", list(itertools.product(DECAYS, GATES)))
def test_mp_matches_numpy_float64(decay, gates):
    p = _problem(decay, gates)
    do, dfs = oracle.random_cotangents(p, seed=1)
    fwd, grads = mp.forward_and_vjp(p, do, dfs, prec=128)
    o, S = recurrence.forward(p)
    g64 = recurrence.vjp(p, do, dfs)
    assert normalised_error(o, fwd.o) <= 1e-12
    assert normalised_error(S, fwd.final_state) <= 1e-12
    for name in GRADS:
        err = normalised_error(getattr(g64, name), getattr(grads, name))
        assert err <= 1e-12, f"{name}: normalised error {err:.2e}"


def test_mp_error_estimate_is_tiny_and_reported():
    p = _problem("strong", "negative")
    do, dfs = oracle.random_cotangents(p)
    fwd = mp.forward(p, prec=256)
    grads = mp.vjp(p, do, dfs, prec=256)
    assert set(fwd.errors) == {"o", "final_state"} and set(grads.errors) == set(GRADS)
    for name, err in list(fwd.errors.items()) + list(grads.errors.items()):
        ref = getattr(fwd, name) if name in fwd.errors else getattr(grads, name)
        assert err.shape == ref.shape
        assert np.max(err) <= 1e-60 * max(np.max(np.abs(ref)), 1e-300), name


def test_mp_error_estimate_grows_at_low_precision():
    """The estimate is a real measurement: at 53 bits it is of float64 rounding size, not 0."""
    p = _problem("moderate", "uniform", shape=(1, 16, 1, 4, 4))
    fwd = mp.forward(p, prec=53)
    rel = np.max(fwd.errors["o"]) / np.max(np.abs(fwd.o))
    assert 1e-18 < rel < 1e-13


# --- adjoint vs central finite differences in mpmath ---------------------------------------

FD_PREC = 400
FD_STEP = mpmath.mpf(2) ** -110  # truncation ~h^2 ~ 1e-66; cancellation ~2^-400/h ~ 1e-87


def _loss(problem, overrides, do, dfs):
    o, S = mp.run_mpf(problem, FD_PREC, overrides=overrides)
    return np.sum(o * mp.MPArith().array(do)) + np.sum(S * mp.MPArith().array(dfs))


@pytest.mark.parametrize("decay,gates,shape,h0", [
    ("moderate", "uniform", (1, 5, 1, 3, 2), True),
    ("strong", "negative", (1, 6, 1, 2, 3), True),
    ("extreme", "one", (1, 4, 1, 3, 3), True),
    ("mixed", "erase_one", (1, 5, 1, 3, 2), False),
    ("resets", "uniform", (1, 6, 1, 2, 2), True),
])
def test_adjoint_matches_finite_differences(decay, gates, shape, h0):
    p = oracle.make_problem(*shape, decay=decay, gates=gates, initial_state=h0, seed=7)
    do, dfs = oracle.random_cotangents(p, seed=3)
    ar = mp.MPArith()
    _, _, adj = mp.run_mpf(p, FD_PREC, do, dfs)
    base = {n: ar.array(getattr(p, n)) for n in oracle.INPUTS}
    base["initial_state"] = ar.array(p.h0())
    with mpmath.workprec(FD_PREC):
        for name, grad in zip(oracle.INPUTS + ("initial_state",), GRADS):
            x = base[name]
            for idx in np.ndindex(x.shape):
                plus, minus = x.copy(), x.copy()
                plus[idx] += FD_STEP
                minus[idx] -= FD_STEP
                fd = (_loss(p, {**base, name: plus}, do, dfs)
                      - _loss(p, {**base, name: minus}, do, dfs)) / (2 * FD_STEP)
                a = adj[grad][idx]
                floor = mpmath.mpf(10) ** -40 * max(abs(v) for v in adj[grad].flat)
                assert abs(fd - a) <= mpmath.mpf(10) ** -20 * abs(a) + floor, (
                    f"{grad}{idx}: adjoint {mpmath.nstr(a, 25)} vs finite difference {mpmath.nstr(fd, 25)}")


# --- independent closed forms and other precisions -----------------------------------------

@pytest.mark.parametrize("decay", DECAYS)
def test_float64_matches_gla_closed_form_when_b_is_zero(decay):
    p = oracle.make_problem(2, 23, 2, 5, 3, decay=decay, gates="erase_zero", initial_state=True, seed=11)
    o, S = recurrence.forward(p)
    o_ref, S_ref = reductions.gla_forward(p)
    assert normalised_error(o, o_ref) <= 1e-12
    assert normalised_error(S, S_ref) <= 1e-12


def test_gla_closed_form_refuses_nonzero_erase_gate():
    with pytest.raises(ValueError, match="^b:"):
        reductions.gla_forward(_problem("weak", "uniform"))


def test_gated_deltanet_matches_matrix_delta_rule():
    """Scalar decay, b = w = beta: S_t = a_t (I - beta k k^T) S_{t-1} + beta k v^T, written out here."""
    rng = np.random.default_rng(5)
    B, T, H, K, V = 1, 12, 2, 4, 3
    base = oracle.make_problem(B, T, H, K, V, seed=5)
    g = -rng.uniform(0.01, 0.5, (B, T, H))
    beta = rng.uniform(0, 1, (B, T, H))
    h0 = rng.standard_normal((B, H, K, V))
    p = reductions.gated_deltanet_problem(base.q, base.k, base.v, g, beta, initial_state=h0)
    assert np.all(p.g == g[..., None]) and np.all(p.b == beta[..., None]) and np.all(p.w == beta[..., None])
    o, S = recurrence.forward(p)
    for bi, h in itertools.product(range(B), range(H)):
        St = h0[bi, h].copy()
        for t in range(T):
            kt, qt, vt, bt = p.k[bi, t, h], p.q[bi, t, h], p.v[bi, t, h], beta[bi, t, h]
            St = np.exp(g[bi, t, h]) * (np.eye(K) - bt * np.outer(kt, kt)) @ St + bt * np.outer(kt, vt)
            np.testing.assert_allclose(o[bi, t, h], p.scale * St.T @ qt, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(S[bi, h], St, rtol=1e-12, atol=1e-13)


def test_kda_problem_broadcasts_beta_to_both_gates():
    base = oracle.make_problem(1, 5, 2, 4, 3, seed=2)
    beta = np.linspace(0.1, 0.9, 10).reshape(1, 5, 2)
    p = reductions.kda_problem(base.q, base.k, base.v, base.g, beta)
    assert p.b.shape == (1, 5, 2, 4) and p.w.shape == (1, 5, 2, 3)
    assert np.all(p.b == beta[..., None]) and np.all(p.w == beta[..., None])
    with pytest.raises(ValueError, match="^beta:"):
        reductions.kda_problem(base.q, base.k, base.v, base.g, beta[:, :4])


@pytest.mark.parametrize("decay", DECAYS)
def test_longdouble_matches_float64(decay):
    p = oracle.make_problem(1, 40, 2, 6, 5, decay=decay, gates="negative", initial_state=True, seed=3)
    do, dfs = oracle.random_cotangents(p)
    (o, S), g = recurrence.forward_and_vjp(p, do, dfs, dtype=np.longdouble)
    (o64, S64), g64 = recurrence.forward_and_vjp(p, do, dfs)
    assert o.dtype == np.longdouble
    assert normalised_error(o64, o) <= 1e-13 and normalised_error(S64, S) <= 1e-13
    for name in GRADS:
        assert normalised_error(getattr(g64, name), getattr(g, name)) <= 1e-13, name


@pytest.mark.parametrize("decay", DECAYS)
def test_float32_recurrence_error_per_regime(decay, record_property):
    """Reports the plain float32 recurrence's error (the tolerance model's yardstick)."""
    p = oracle.make_problem(1, 200, 2, 16, 16, decay=decay, gates="uniform", initial_state=True, seed=4)
    do, dfs = oracle.random_cotangents(p)
    (o, S), g = recurrence.forward_and_vjp(p, do, dfs, dtype=np.float32)
    (o64, S64), g64 = recurrence.forward_and_vjp(p, do, dfs)
    assert o.dtype == np.float32 and g.dq.dtype == np.float32
    errors = {"o": normalised_error(o, o64), "final_state": normalised_error(S, S64)}
    errors.update({n: normalised_error(getattr(g, n), getattr(g64, n)) for n in GRADS})
    for name, err in errors.items():
        record_property(f"float32_err_{name}", float(err))  # a plain float: xdist serializes properties
        # Really float32 (not silently float64), and accurate as a float32 recurrence should be.
        assert 1e-10 < err < 1e-4, f"{decay}/{name}: {err:.2e}"
    print(f"float32 recurrence, {decay}: " + ", ".join(f"{n} {e:.1e}" for n, e in errors.items()))


def test_checkpoint_interval_does_not_change_results():
    p = _problem("resets", "negative", shape=(2, 37, 2, 4, 3))
    do, dfs = oracle.random_cotangents(p)
    ref = recurrence.vjp(p, do, dfs, checkpoint_every=1000)
    for every in (1, 5, 36):
        got = recurrence.vjp(p, do, dfs, checkpoint_every=every)
        for name in GRADS:
            np.testing.assert_array_equal(getattr(got, name), getattr(ref, name))


def test_make_problem_is_deterministic_and_rounds_inputs():
    a = oracle.make_problem(2, 7, 2, 4, 3, decay="mixed", initial_state=True, seed=9)
    b = oracle.make_problem(2, 7, 2, 4, 3, decay="mixed", initial_state=True, seed=9)
    for name in oracle.INPUTS + ("initial_state",):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        assert np.all(getattr(a, name) == getattr(a, name).astype(np.float32))
    c = oracle.make_problem(2, 7, 2, 4, 3, precision="bfloat16", seed=9)
    bits = c.q.astype(np.float32).view(np.uint32)
    assert np.all(bits & 0xFFFF == 0)


@pytest.mark.parametrize("decay", DECAYS)
def test_decay_regimes_have_their_documented_size(decay):
    g = oracle.make_problem(2, 200, 2, 8, 4, decay=decay, seed=1).g
    assert np.all(g <= 0)
    mag = -g
    expected = {"none": (0, 0), "weak": (5e-4, 1.5e-3), "moderate": (0.05, 0.15),
                "strong": (1, 5), "extreme": (20, 60)}
    if decay in expected:
        lo, hi = expected[decay]
        assert lo * 0.999 <= mag.min() and mag.max() <= hi * 1.001
    elif decay == "mixed":  # within a token some channels barely decay while others are extreme
        per_token = (mag.min(axis=-1) == 0) & (mag.max(axis=-1) > 20)
        assert per_token.mean() > 0.9
    else:  # resets: occasional hard resets on top of a mild background
        assert 0 < np.mean(mag > 500) < 0.1 and np.median(mag) < 0.1


# --- bad input ---------------------------------------------------------------------------

def _arrays():
    p = oracle.make_problem(1, 4, 1, 3, 2, seed=0)
    return {n: np.array(getattr(p, n)) for n in oracle.INPUTS}


@pytest.mark.parametrize("name,mutate,message", [
    ("q", lambda a: a[0], "rank 4"),
    ("k", lambda a: a[:, :, :, :2], "shape"),
    ("v", lambda a: a[:, :3], "shape"),
    ("w", lambda a: np.concatenate([a, a], axis=-1), "shape"),
    ("b", lambda a: np.where(a > 0.5, np.nan, a), "NaN"),
    ("v", lambda a: np.full_like(a, np.inf), "inf"),
    ("g", lambda a: a + 1.0, "log-decay"),
    ("k", lambda a: a.astype(np.int64), "floating"),
    ("q", lambda a: a[:, :0], "T == 0"),
])
def test_bad_input_raises_value_error_naming_argument(name, mutate, message):
    arrays = _arrays()
    arrays[name] = mutate(arrays[name])
    if message == "T == 0":
        arrays = {n: a[:, :0] for n, a in arrays.items()}
    with pytest.raises(ValueError, match=f"^{name}:.*{message}"):
        oracle.Problem(**arrays)


@pytest.mark.parametrize("kwargs,name", [
    (dict(initial_state=np.zeros((1, 1, 3, 3))), "initial_state"),
    (dict(initial_state=np.full((1, 1, 3, 2), np.nan)), "initial_state"),
    (dict(scale="big"), "scale"),
    (dict(scale=float("inf")), "scale"),
])
def test_bad_scale_or_initial_state(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        oracle.Problem(**_arrays(), **kwargs)


def test_bad_cotangents_dtype_and_precision():
    p = oracle.Problem(**_arrays())
    do, dfs = oracle.random_cotangents(p)
    with pytest.raises(ValueError, match="^do:"):
        recurrence.vjp(p, do[:, :2], dfs)
    with pytest.raises(ValueError, match="^dfinal_state:"):
        recurrence.vjp(p, do, dfs[..., :1])
    with pytest.raises(ValueError, match="^dtype:"):
        recurrence.forward(p, dtype=np.float16)
    with pytest.raises(ValueError, match="^checkpoint_every:"):
        recurrence.vjp(p, do, dfs, checkpoint_every=0)
    with pytest.raises(ValueError, match="^prec:"):
        mp.forward(p, prec=20)
    with pytest.raises(ValueError, match="^decay:"):
        oracle.make_problem(1, 2, 1, 2, 2, decay="huge")
    with pytest.raises(ValueError, match="^gates:"):
        oracle.make_problem(1, 2, 1, 2, 2, gates="half")
    with pytest.raises(ValueError, match="^T:"):
        oracle.make_problem(1, -1, 1, 2, 2)


def test_problem_is_immutable_and_default_scale():
    p = oracle.Problem(**_arrays())
    assert p.scale == 3 ** -0.5
    with pytest.raises(ValueError):
        p.q[0, 0, 0, 0] = 1.0
    assert p.initial_state is None and np.all(p.h0() == 0) and p.h0().shape == (1, 1, 3, 2)


@pytest.mark.parametrize("scale", ["0.5", True, np.bool_(False), [0.5], float("nan")])
def test_problem_refuses_a_scale_that_is_not_a_finite_real_number(scale):
    p = oracle.make_problem(1, 3, 1, 4, 2, seed=0)
    with pytest.raises(ValueError, match="^scale: "):
        p.replace(scale=scale)
