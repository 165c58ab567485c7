"""Self-checks of the training-call modes (oracle/call.py, oracle/modes.py, oracle/preprocess.py):
adjoints vs central finite differences (float64 and mpmath), packing vs separate runs and the dense
batch, empty sequences, chunk-start states, the [V, K] layout, the in-kernel gate and L2 norm vs the
dense oracle, bad input, and (when torch and fla-core are installed) FLA's own PyTorch references."""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import importlib.util
from pathlib import Path

import mpmath
import numpy as np
import pytest

from gdn2_oracle import oracle
from gdn2_oracle.oracle import GRADS, INPUTS, Call, modes, preprocess, recurrence
from gdn2_oracle.oracle.modes import MODE_GRADS

# Which input each gradient of a call belongs to.
GRAD_INPUTS = dict(zip(MODE_GRADS, INPUTS + ("initial_state", "A_log", "dt_bias")))


def _nerr(got, ref):
    """rms(got - ref) / rms(ref) (0 when both vanish)."""
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    scale = np.sqrt(np.mean(ref ** 2)) if ref.size else 0.0
    diff = np.sqrt(np.mean((got - ref) ** 2)) if ref.size else 0.0
    return diff / scale if scale else diff


def _call(B, T, H, K, V, *, seed=0, cu_seqlens=None, gate=None, h0=True, **modes_kw):
    """A random call; ``gate`` is None (log-decay g), "softplus", "bounded" or "bounded_no_A"."""
    rng = np.random.default_rng(seed)
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    arrays = dict(q=rng.standard_normal((B, T, H, K)), k=rng.standard_normal((B, T, H, K)),
                  v=rng.standard_normal((B, T, H, V)), b=rng.uniform(0, 1.5, (B, T, H, K)),
                  w=rng.uniform(0, 1, (B, T, H, V)))
    kw = dict(cu_seqlens=cu_seqlens, **modes_kw)
    if gate is None:
        arrays["g"] = -rng.uniform(0.05, 1.0, (B, T, H, K))
    else:
        arrays["g"] = rng.standard_normal((B, T, H, K)) * 1.5
        kw.update(gate_in_kernel=True, dt_bias=rng.standard_normal(H * K) * 0.5)
        if gate != "bounded_no_A":
            kw["A_log"] = rng.uniform(-1, 0.5, H)
        if gate != "softplus":
            kw["lower_bound"] = -5.0 if gate == "bounded" else -2.0
    state = (N, H, V, K) if modes_kw.get("state_v_first") else (N, H, K, V)
    if h0:
        kw["initial_state"] = rng.standard_normal(state)
    do = rng.standard_normal((B, T, H, V))
    dfs = rng.standard_normal(state)
    return Call(**arrays, **kw), do, dfs


def _loss(call, do, dfs):
    fwd = modes.forward_modes(call)
    return np.sum(fwd.o * do) + np.sum(fwd.final_state * dfs)


# --- adjoint vs central finite differences --------------------------------------------------

FD_CASES = {
    "packed_softplus_l2norm_vfirst": dict(B=1, T=7, cu_seqlens=[0, 3, 3, 7], gate="softplus", qk_l2norm=True,
                                          state_v_first=True),
    "dense_bounded": dict(B=2, T=5, gate="bounded"),
    "packed_bounded_without_A_log_no_h0": dict(B=1, T=6, cu_seqlens=[0, 4, 6], gate="bounded_no_A",
                                               qk_l2norm=True, h0=False),
    "packed_log_decay": dict(B=1, T=6, cu_seqlens=[0, 1, 5, 6]),
}


@pytest.mark.parametrize("case", list(FD_CASES))
def test_adjoint_matches_finite_differences_float64(case):
    kw = dict(FD_CASES[case])
    call, do, dfs = _call(kw.pop("B"), kw.pop("T"), 2, 3, 2, seed=len(case), **kw)
    _, grads = modes.forward_and_vjp_modes(call, do, dfs)
    h = 1e-5
    for gname, iname in GRAD_INPUTS.items():
        adj = getattr(grads, gname)
        base = getattr(call, iname)
        if base is None and iname == "initial_state":
            base = np.zeros(call.state_shape)
        if base is None:
            assert adj is None, gname
            continue
        assert adj.shape == base.shape, gname
        fd = np.empty_like(adj)
        for idx in np.ndindex(base.shape):
            plus, minus = np.array(base), np.array(base)
            plus[idx] += h
            minus[idx] -= h
            fd[idx] = (_loss(dataclasses.replace(call, **{iname: plus}), do, dfs)
                       - _loss(dataclasses.replace(call, **{iname: minus}), do, dfs)) / (2 * h)
        tol = 5e-9 * (np.abs(adj) + np.max(np.abs(adj)))
        worst = np.max(np.abs(fd - adj))
        assert np.all(np.abs(fd - adj) <= tol), (
            f"{gname}: max |adjoint - finite difference| {worst:.2e} (|adj| max {np.max(np.abs(adj)):.2e})")


FD_PREC = 256
FD_STEP = mpmath.mpf(2) ** -70  # truncation ~h^2 ~ 1e-42 (x 1e9 near a zero q/k row); cancellation ~2^-186


@pytest.mark.parametrize("gate", ["softplus", "bounded"])
def test_mp_adjoint_matches_finite_differences(gate):
    """At 256 bits, >= 25 significant digits, including a zero query and a near-zero key token."""
    call, do, dfs = _call(1, 5, 2, 2, 2, seed=3, cu_seqlens=[0, 2, 2, 5], gate=gate, qk_l2norm=True,
                          state_v_first=True)
    q, k = np.array(call.q), np.array(call.k)
    q[0, 1, 0] = 0.0
    k[0, 3, 1] = [1e-4, -2e-4]
    call = dataclasses.replace(call, q=q, k=k)
    adj = modes.run_mpf_modes(call, FD_PREC, do, dfs)
    ar = oracle.mp.MPArith()
    base = {n: ar.array(getattr(call, n)) for n in GRAD_INPUTS.values()}
    do_mp, dfs_mp = ar.array(do), ar.array(dfs)

    def loss(overrides):
        out = modes.run_mpf_modes(call, FD_PREC, overrides=overrides)
        return np.sum(out["o"] * do_mp) + np.sum(out["final_state"] * dfs_mp)

    with mpmath.workprec(FD_PREC):
        for gname, iname in GRAD_INPUTS.items():
            x = base[iname]
            scale = max(abs(v) for v in adj[gname].flat)
            for idx in np.ndindex(x.shape):
                plus, minus = x.copy(), x.copy()
                plus[idx] += FD_STEP
                minus[idx] -= FD_STEP
                fd = (loss({**base, iname: plus}) - loss({**base, iname: minus})) / (2 * FD_STEP)
                a = adj[gname][idx]
                assert abs(fd - a) <= mpmath.mpf(10) ** -25 * (abs(a) + scale), (
                    f"{gname}{idx}: adjoint {mpmath.nstr(a, 30)} vs finite difference {mpmath.nstr(fd, 30)}")


def test_mp_matches_float64_and_reports_errors():
    call, do, dfs = _call(1, 9, 2, 3, 2, seed=5, cu_seqlens=[0, 4, 4, 9], gate="softplus", qk_l2norm=True,
                          intermediate_chunk_size=2)
    fwd, grads = modes.forward_and_vjp_modes(call, do, dfs)
    mfwd, mgrads = modes.mp_forward_and_vjp_modes(call, do, dfs, prec=128)
    for name in ("o", "final_state", "intermediate_states"):
        assert _nerr(getattr(fwd, name), getattr(mfwd, name)) <= 1e-13, name
        assert np.max(mfwd.errors[name]) <= 1e-30
    for name in MODE_GRADS:
        assert _nerr(getattr(grads, name), getattr(mgrads, name)) <= 1e-13, name
        assert mgrads.errors[name].shape == getattr(mgrads, name).shape
        assert np.max(mgrads.errors[name]) <= 1e-30 * max(np.max(np.abs(getattr(mgrads, name))), 1e-300), name
    only_fwd = modes.mp_forward_modes(call, prec=64)
    assert set(only_fwd.errors) == {"o", "final_state", "intermediate_states"}
    assert 0 < np.max(only_fwd.errors["o"]) < 1e-15


# --- packing -----------------------------------------------------------------------------------

def test_packed_equals_each_sequence_alone():
    cu = [0, 3, 3, 8, 9]
    call, do, dfs = _call(1, 9, 2, 3, 2, seed=1, cu_seqlens=cu, gate="softplus", qk_l2norm=True)
    fwd, grads = modes.forward_and_vjp_modes(call, do, dfs)
    dA, ddt = 0, 0
    for n in range(len(cu) - 1):
        t0, t1 = cu[n], cu[n + 1]
        if t0 == t1:
            continue
        one = dataclasses.replace(call, cu_seqlens=None, **{x: getattr(call, x)[:, t0:t1] for x in INPUTS},
                                  initial_state=call.initial_state[n:n + 1])
        f1, g1 = modes.forward_and_vjp_modes(one, do[:, t0:t1], dfs[n:n + 1])
        np.testing.assert_array_equal(fwd.o[:, t0:t1], f1.o)
        np.testing.assert_array_equal(fwd.final_state[n], f1.final_state[0])
        np.testing.assert_array_equal(grads.dh0[n], g1.dh0[0])
        for name in GRADS[:-1]:
            np.testing.assert_array_equal(getattr(grads, name)[:, t0:t1], getattr(g1, name), err_msg=name)
        dA, ddt = dA + g1.dA_log, ddt + g1.ddt_bias
    np.testing.assert_allclose(grads.dA_log, dA, rtol=1e-13)
    np.testing.assert_allclose(grads.ddt_bias, ddt, rtol=1e-13)


def test_packed_sequence_equals_plain_oracle():
    """Without gate or L2 norm each packed sequence is exactly the dense oracle's Problem."""
    cu = [0, 4, 7]
    call, do, dfs = _call(1, 7, 2, 3, 2, seed=2, cu_seqlens=cu)
    fwd, grads = modes.forward_and_vjp_modes(call, do, dfs)
    for n in range(2):
        t0, t1 = cu[n], cu[n + 1]
        p = oracle.Problem(*(getattr(call, x)[:, t0:t1] for x in INPUTS), initial_state=call.initial_state[n:n + 1])
        (o, S), g = recurrence.forward_and_vjp(p, do[:, t0:t1], dfs[n:n + 1])
        np.testing.assert_array_equal(fwd.o[:, t0:t1], o)
        np.testing.assert_array_equal(fwd.final_state[n:n + 1], S)
        for name in GRADS[:-1]:
            np.testing.assert_array_equal(getattr(grads, name)[:, t0:t1], getattr(g, name))
        np.testing.assert_array_equal(grads.dh0[n:n + 1], g.dh0)


def test_equal_lengths_packed_equals_dense_batch():
    B, T, H, K, V = 3, 4, 2, 3, 2
    dense, do, dfs = _call(B, T, H, K, V, seed=4, gate="bounded", qk_l2norm=True, intermediate_chunk_size=3)
    def flat(x):
        return x.reshape((1, B * T) + x.shape[2:])

    packed = dataclasses.replace(dense, cu_seqlens=np.arange(B + 1) * T, **{n: flat(getattr(dense, n)) for n in INPUTS})
    fd, gd = modes.forward_and_vjp_modes(dense, do, dfs)
    fp, gp = modes.forward_and_vjp_modes(packed, flat(do), dfs)
    np.testing.assert_allclose(flat(fd.o), fp.o, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(fd.final_state, fp.final_state, rtol=1e-13, atol=1e-15)
    assert fd.intermediate_states.shape == (B, 2, H, K, V) and fp.intermediate_states.shape == (1, B * 2, H, K, V)
    np.testing.assert_allclose(fd.intermediate_states.reshape(fp.intermediate_states.shape), fp.intermediate_states,
                               rtol=1e-13, atol=1e-15)
    for name in MODE_GRADS:
        a, b = getattr(gd, name), getattr(gp, name)
        a = a if name in ("dh0", "dA_log", "ddt_bias") else flat(a)
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14, err_msg=name)


@pytest.mark.parametrize("state_v_first", [False, True])
def test_empty_sequences_return_initial_state(state_v_first):
    cu = [0, 0, 3, 3, 5, 5]
    call, do, dfs = _call(1, 5, 2, 3, 2, seed=6, cu_seqlens=cu, gate="softplus", state_v_first=state_v_first,
                          intermediate_chunk_size=2)
    fwd, grads = modes.forward_and_vjp_modes(call, do, dfs)
    for n in (0, 2, 4):
        np.testing.assert_array_equal(fwd.final_state[n], call.initial_state[n])
        np.testing.assert_array_equal(grads.dh0[n], dfs[n])
    assert fwd.intermediate_states.shape[1] == 2 + 1  # ceil(3/2) + ceil(2/2); empty sequences have no chunk
    # all sequences empty (T == 0): the final states are the initial ones, every token gradient is empty
    empty = dataclasses.replace(call, cu_seqlens=[0, 0], initial_state=call.initial_state[:1],
                                **{n: getattr(call, n)[:, :0] for n in INPUTS})
    fwd, grads = modes.forward_and_vjp_modes(empty, do[:, :0], dfs[:1])
    np.testing.assert_array_equal(fwd.final_state, call.initial_state[:1])
    np.testing.assert_array_equal(grads.dh0, dfs[:1])
    assert fwd.o.shape == (1, 0, 2, 2) and grads.dq.shape == (1, 0, 2, 3)
    assert np.all(grads.dA_log == 0) and fwd.intermediate_states.shape[1] == 0


# --- intermediate states and state layout ---------------------------------------------------

@pytest.mark.parametrize("C", [1, 3, 64])
def test_intermediate_states_are_dense_states_at_chunk_starts(C):
    B, T = 2, 7
    call, _, _ = _call(B, T, 2, 3, 2, seed=8, intermediate_chunk_size=C)
    states = modes.forward_modes(call).intermediate_states
    starts = list(range(0, T, C))
    assert states.shape == (B, len(starts), 2, 3, 2)
    for i, t in enumerate(starts):
        if t == 0:
            np.testing.assert_array_equal(states[:, i], call.initial_state)
            continue
        prefix = oracle.Problem(*(getattr(call, x)[:, :t] for x in INPUTS), initial_state=call.initial_state)
        np.testing.assert_array_equal(states[:, i], recurrence.forward(prefix)[1])
    without = dataclasses.replace(call, intermediate_chunk_size=None)
    np.testing.assert_array_equal(modes.forward_modes(call).final_state, modes.forward_modes(without).final_state)


def test_packed_intermediate_states_follow_chunk_offsets():
    cu, C = [0, 5, 5, 9], 2
    call, _, _ = _call(1, 9, 2, 3, 2, seed=9, cu_seqlens=cu, intermediate_chunk_size=C)
    states = modes.forward_modes(call).intermediate_states
    assert states.shape == (1, 3 + 0 + 2, 2, 3, 2)  # chunk offsets 0, 3, 3, 5
    slot = 0
    for n in range(3):
        for t in range(cu[n], cu[n + 1], C):
            if t == cu[n]:
                ref = call.initial_state[n]
            else:
                p = oracle.Problem(*(getattr(call, x)[:, cu[n]:t] for x in INPUTS),
                                   initial_state=call.initial_state[n:n + 1])
                ref = recurrence.forward(p)[1][0]
            np.testing.assert_array_equal(states[0, slot], ref)
            slot += 1


def test_state_v_first_is_the_transpose():
    kv, do, dfs = _call(1, 8, 2, 3, 2, seed=10, cu_seqlens=[0, 5, 8], gate="softplus", intermediate_chunk_size=3)
    def t(x):
        return np.swapaxes(x, -1, -2)

    vk = dataclasses.replace(kv, state_v_first=True, initial_state=t(kv.initial_state))
    f1, g1 = modes.forward_and_vjp_modes(kv, do, dfs)
    f2, g2 = modes.forward_and_vjp_modes(vk, do, t(dfs))
    assert f2.final_state.shape == (2, 2, 2, 3) and f2.intermediate_states.shape == (1, 3, 2, 2, 3)
    np.testing.assert_array_equal(f1.o, f2.o)
    np.testing.assert_array_equal(t(f1.final_state), f2.final_state)
    np.testing.assert_array_equal(t(f1.intermediate_states), f2.intermediate_states)
    np.testing.assert_array_equal(t(g1.dh0), g2.dh0)
    for name in MODE_GRADS:
        if name != "dh0":
            np.testing.assert_array_equal(getattr(g1, name), getattr(g2, name))


# --- gate and L2 norm vs the dense oracle -------------------------------------------------

@pytest.mark.parametrize("gate", ["softplus", "bounded", "bounded_no_A"])
def test_gate_mode_equals_dense_oracle_fed_the_gate(gate):
    call, do, dfs = _call(2, 6, 2, 3, 2, seed=11, gate=gate)
    H, K = 2, 3
    x = call.g + call.dt_bias.reshape(H, K)
    A = 1.0 if call.A_log is None else np.exp(call.A_log)[:, None]
    if call.lower_bound is None:
        g = -A * np.logaddexp(0, x)
        dg_dx, dg_dA_log = -A / (1 + np.exp(-x)), g
    else:
        s = 1 / (1 + np.exp(-A * x))
        g = call.lower_bound * s
        dg_dx = call.lower_bound * s * (1 - s) * A
        dg_dA_log = dg_dx * x
        assert np.all((g < 0) & (g > call.lower_bound))
    p = oracle.Problem(call.q, call.k, call.v, g, call.b, call.w, initial_state=call.initial_state)
    (o, S), ref = recurrence.forward_and_vjp(p, do, dfs)
    fwd, grads = modes.forward_and_vjp_modes(call, do, dfs)
    np.testing.assert_allclose(fwd.o, o, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(fwd.final_state, S, rtol=1e-12, atol=1e-14)
    for name in ("dq", "dk", "dv", "db", "dw", "dh0"):
        np.testing.assert_allclose(getattr(grads, name), getattr(ref, name), rtol=1e-11, atol=1e-13, err_msg=name)
    np.testing.assert_allclose(grads.dg, ref.dg * dg_dx, rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(grads.ddt_bias, np.sum(ref.dg * dg_dx, axis=(0, 1)).ravel(), rtol=1e-11)
    if call.A_log is None:
        assert grads.dA_log is None
    else:
        np.testing.assert_allclose(grads.dA_log, np.sum(ref.dg * dg_dA_log, axis=(0, 1, 3)), rtol=1e-11)


def test_l2norm_puts_eps_inside_the_square_root():
    """FLA 0.6.0: x / sqrt(sum x^2 + eps), eps = float32(1e-6) - not x / (||x|| + eps)."""
    assert preprocess.L2NORM_EPS == float(np.float32(1e-6))
    eps = preprocess.L2NORM_EPS
    call, do, dfs = _call(1, 4, 1, 2, 2, seed=12, qk_l2norm=True)
    q, k = np.array(call.q), np.array(call.k)
    q[0, 1] = 0.0  # zero query: normalises to 0 (no NaN), and dq = dq_hat / sqrt(eps)
    k[0, 2] = [1e-3, 0.0]  # ||k|| = sqrt(eps): normalises to 1/sqrt(2), where ||x|| + eps would give ~0.999
    call = dataclasses.replace(call, q=q, k=k)
    def norm(x):
        return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)

    k_hat = norm(k)
    np.testing.assert_allclose(k_hat[0, 2, 0], [1e-3 / np.sqrt(1e-6 + eps), 0], rtol=1e-15)
    assert abs(k_hat[0, 2, 0, 0] - 2 ** -0.5) < 1e-7
    p = oracle.Problem(norm(q), k_hat, call.v, call.g, call.b, call.w, initial_state=call.initial_state)
    (o, S), ref = recurrence.forward_and_vjp(p, do, dfs)
    fwd, grads = modes.forward_and_vjp_modes(call, do, dfs)
    np.testing.assert_allclose(fwd.o, o, rtol=1e-13, atol=1e-15)
    assert np.all(fwd.o[0, 1] == 0)
    np.testing.assert_allclose(grads.dq[0, 1], ref.dq[0, 1] / np.sqrt(eps), rtol=1e-13)
    # away from 0 the L2 norm's Jacobian annihilates the radial direction: q . dq ~ eps-sized
    radial = np.sum(call.q[0, 0] * grads.dq[0, 0], axis=-1)
    norms = np.linalg.norm(grads.dq[0, 0], axis=-1) * np.linalg.norm(call.q[0, 0], axis=-1)
    assert np.all(np.abs(radial) <= 1e-5 * norms)


def test_lower_working_precision_runs_in_that_dtype():
    call, do, dfs = _call(1, 9, 2, 4, 3, seed=13, cu_seqlens=[0, 6, 9], gate="softplus", qk_l2norm=True)
    f32, g32 = modes.forward_and_vjp_modes(call, do, dfs, dtype=np.float32)
    f64, g64 = modes.forward_and_vjp_modes(call, do, dfs)
    assert f32.o.dtype == np.float32 and g32.dA_log.dtype == np.float32 and g32.dq.dtype == np.float32
    assert 1e-10 < _nerr(f32.o, f64.o) < 1e-5
    for name in MODE_GRADS:
        assert _nerr(getattr(g32, name), getattr(g64, name)) < 1e-4, name


# --- bad input -----------------------------------------------------------------------------

@pytest.mark.parametrize("change,name,message", [
    (dict(cu_seqlens=[1, 3, 6]), "cu_seqlens", "start at 0"),
    (dict(cu_seqlens=[0, 3, 5]), "cu_seqlens", "end at T"),
    (dict(cu_seqlens=[0, 4, 3, 6]), "cu_seqlens", "non-decreasing"),
    (dict(cu_seqlens=[0.0, 6.0]), "cu_seqlens", "integers"),
    (dict(cu_seqlens=[6]), "cu_seqlens", "1-D"),
    (dict(cu_seqlens=[[0, 6]]), "cu_seqlens", "1-D"),
    (dict(initial_state=np.zeros((3, 1, 2, 2))), "initial_state", "shape"),
    (dict(initial_state=np.zeros((2, 1, 3, 2)), state_v_first=True), "initial_state", r"\[N, HV, V, K\]"),
    (dict(gate_in_kernel=True, lower_bound=0.0), "lower_bound", "< 0"),
    (dict(gate_in_kernel=True, lower_bound=1.0), "lower_bound", "< 0"),
    (dict(gate_in_kernel=True, lower_bound=float("nan")), "lower_bound", "finite"),
    (dict(gate_in_kernel=True, lower_bound="low"), "lower_bound", "real number"),
    (dict(gate_in_kernel=True), "A_log", "required"),
    (dict(gate_in_kernel=True, A_log=np.zeros(2)), "A_log", "shape"),
    (dict(gate_in_kernel=True, A_log=np.zeros(1), dt_bias=np.zeros((1, 3))), "dt_bias", "shape"),
    (dict(gate_in_kernel=True, A_log=np.array([np.inf])), "A_log", "inf"),
    (dict(A_log=np.zeros(1)), "A_log", "gate_in_kernel"),
    (dict(lower_bound=-5.0), "lower_bound", "gate_in_kernel"),
    (dict(gate_in_kernel=1), "gate_in_kernel", "bool"),
    (dict(intermediate_chunk_size=0), "intermediate_chunk_size", "positive"),
    (dict(scale=float("inf")), "scale", "finite"),
])
def test_bad_call_raises_value_error_naming_argument(change, name, message):
    call, _, _ = _call(1, 6, 1, 3, 2, seed=0, cu_seqlens=[0, 2, 6])
    fields = {f.name: getattr(call, f.name) for f in dataclasses.fields(call)}
    fields.update(change)
    with pytest.raises(ValueError, match=f"^{name}:.*{message}"):
        Call(**fields)


def test_bad_shapes_and_cotangents():
    call, do, dfs = _call(2, 4, 1, 3, 2, seed=0)
    with pytest.raises(ValueError, match="^cu_seqlens:.*batch size 1"):
        dataclasses.replace(call, cu_seqlens=[0, 4])
    with pytest.raises(ValueError, match="^g:.*log-decay"):
        dataclasses.replace(call, g=np.abs(call.g))
    dataclasses.replace(call, g=np.abs(call.g), gate_in_kernel=True, A_log=np.zeros(1))  # raw gate may be > 0
    with pytest.raises(ValueError, match="^g:.*does not match"):  # grouped value heads: g, b have v's heads
        dataclasses.replace(call, v=np.concatenate([call.v, call.v], axis=2),
                            w=np.concatenate([call.w, call.w], axis=2))
    with pytest.raises(ValueError, match="^q:.*T == 0"):
        dataclasses.replace(call, **{n: getattr(call, n)[:, :0] for n in INPUTS})
    with pytest.raises(ValueError, match="^do:"):
        modes.forward_and_vjp_modes(call, do[:, 1:], dfs)
    with pytest.raises(ValueError, match="^dfinal_state:"):
        modes.forward_and_vjp_modes(call, do, dfs[:1])
    with pytest.raises(ValueError, match="^dfinal_state:"):
        modes.forward_and_vjp_modes(dataclasses.replace(call, state_v_first=True, initial_state=None), do, dfs)
    with pytest.raises(ValueError, match="^dtype:"):
        modes.forward_modes(call, dtype=np.float16)
    with pytest.raises(ValueError, match="^prec:"):
        modes.mp_forward_modes(call, prec=10)


def test_call_is_immutable_copy():
    call, _, _ = _call(1, 4, 1, 2, 2, seed=0, cu_seqlens=[0, 4])
    with pytest.raises(ValueError):
        call.q[0, 0, 0, 0] = 1.0
    with pytest.raises(ValueError):
        call.cu_seqlens[0] = 1
    assert call.scale == 2 ** -0.5 and call.num_sequences == 1


# --- FLA's own PyTorch references (fla-core, pinned 0.6.0) ------------------------------------

def _fla_references():
    """FLA's naive_recurrent_gdn2 and naive KDA gates, loaded from their files (fla's package import
    needs triton, which a CPU venv lacks; these two files' functions need only torch)."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        pytest.skip("torch is not importable: no cross-check against FLA's PyTorch reference")
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("fla-core is not installed: no cross-check against FLA's PyTorch reference")
    root = Path(list(spec.submodule_search_locations)[0])
    naive_spec = importlib.util.spec_from_file_location("_fla_gdn2_naive", root / "ops" / "gdn2" / "naive.py")
    naive = importlib.util.module_from_spec(naive_spec)
    naive_spec.loader.exec_module(naive)
    gate_file = root / "ops" / "kda" / "gate.py"
    tree = ast.parse(gate_file.read_text())
    wanted = [n for n in tree.body if isinstance(n, ast.FunctionDef)
              and n.name in ("naive_kda_gate", "naive_kda_lowerbound_gate")]
    namespace = {"torch": torch, "F": F}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(gate_file), "exec"), namespace)  # noqa: S102 - FLA's own gate functions
    return torch, naive.naive_recurrent_gdn2, namespace["naive_kda_gate"], namespace["naive_kda_lowerbound_gate"]


@pytest.mark.parametrize("case", [
    dict(cu_seqlens=[0, 3, 3, 8], gate="softplus", qk_l2norm=True, state_v_first=True),
    dict(cu_seqlens=[0, 5, 8], gate="bounded"),
    dict(cu_seqlens=[0, 2, 8], gate="bounded_no_A", qk_l2norm=True, h0=False),
    dict(B=2, gate="softplus"),
])
def test_matches_fla_pytorch_reference(case):
    """FLA's references compute in float32: agreement to float32 accuracy, all gradients included."""
    torch, naive_recurrent, naive_gate, naive_lowerbound_gate = _fla_references()
    case = dict(case)
    call, do, dfs = _call(case.pop("B", 1), 8, 2, 4, 3, seed=14, **case)
    fwd, grads = modes.forward_and_vjp_modes(call, do, dfs)
    def leaf(x):
        return None if x is None else torch.tensor(np.array(x), dtype=torch.float64, requires_grad=True)

    t = {n: leaf(getattr(call, n)) for n in GRAD_INPUTS.values()}
    if t["initial_state"] is None:
        t["initial_state"] = leaf(np.zeros(call.state_shape))
    q, k, g = t["q"], t["k"], t["g"]
    if call.qk_l2norm:  # l2norm_fwd_kernel (Triton only in FLA), transcribed: x * rsqrt(sum x^2 + eps)
        q, k = (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + preprocess.L2NORM_EPS) for x in (q, k))
    if call.lower_bound is None:
        g = naive_gate(g, t["A_log"], t["dt_bias"])
    else:
        g = naive_lowerbound_gate(g, t["A_log"], t["dt_bias"], lower_bound=call.lower_bound)
    h0 = t["initial_state"].transpose(-1, -2) if call.state_v_first else t["initial_state"]
    loss, outs, finals = 0, [], []
    for rows, t0, t1, states in call.segments():
        def sl(x, rows=rows, t0=t0, t1=t1):
            return x[rows, t0:t1]

        o, S = naive_recurrent(sl(q), sl(k), sl(t["v"]), sl(g), sl(t["b"]), sl(t["w"]), scale=call.scale,
                               initial_state=h0[states], output_final_state=True)
        loss = loss + (o.double() * torch.tensor(do[rows, t0:t1])).sum()
        outs.append(o.double())
        finals.append(S.double())
    final = torch.cat(finals)
    final = final.transpose(-1, -2) if call.state_v_first else final
    loss = loss + (final * torch.tensor(dfs)).sum()
    loss.backward()
    version = importlib.metadata.version("fla-core")
    assert _nerr(torch.cat(outs, dim=1).detach().numpy(), fwd.o) < 2e-6, f"o vs fla-core {version}"
    assert _nerr(final.detach().numpy(), fwd.final_state) < 2e-6, f"final_state vs fla-core {version}"
    for gname, iname in GRAD_INPUTS.items():
        ours = getattr(grads, gname)
        if ours is None:
            assert t[iname] is None, gname
            continue
        err = _nerr(t[iname].grad.numpy(), ours)
        assert err < 2e-6, f"{gname}: {err:.1e} vs fla-core {version}"
