"""FLA chunk_gdn2's training-call modes in the chunked kernels (kernels/modes.py, kernels/varlen.py).

References are the float64 token-by-token oracle (``oracle.recurrence.forward_and_vjp``) run on each sequence
alone, with the gate and the q/k L2 norm precomputed (and their adjoints chained) in float64 here. Results are
judged like test_chunked_kernels.py (docs/DESIGN.md §4): per result, ``err_ratio`` and the normalised max error
must be within 32x what the float32 recurrence achieves on the same inputs (floor 2^-20), ``dg`` on its
envelope; two kernel results that should agree (packed vs dense batch) within a third of that.

Shapes are small (H=2, K=8, V=6, C=16) and shared between tests, so each kernel compiles a handful of times.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn2_oracle.kernels import kernel as chunked_kernels
from gdn2_oracle.oracle import Problem, make_problem, recurrence

C, H, K, V = 16, 2, 8, 6
MULTIPLE, FLOOR = 32, 2.0**-20
GRAD_NAMES = ("dq", "dk", "dv", "dg", "db", "dw")
# Lengths 0, 1, C-1, C, C+1, many short ones, boundaries inside chunks and on chunk edges (16, 32, 64), one long.
LENGTHS = (0, 1, C - 1, C, C + 1, 0, 2, 3, 1, 1, 2, 5, 1, 3, 1, 9, 1030, 4, 1, 2, 0)
EPS = float(np.float32(1e-6))  # FLA's l2norm eps


@functools.cache
def kernel(name):
    if name == "pairwise":
        return chunked_kernels.pairwise(chunk_size=C)
    return chunked_kernels.factorized(chunk_size=C, leaf=4)


def exact32(x):
    """The float64 values of float32(x)."""
    return np.float32(x).astype(np.float64)


def dev(x):
    """A float32 device array (None stays None)."""
    return None if x is None else jnp.asarray(x, jnp.float32)


def offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def inputs(B, T, N, decay="moderate", seed=0):
    """Float32-exact float64 inputs ``(q, k, v, g, b, w)``, initial states ``[N, H, K, V]`` and cotangents."""
    p = make_problem(B, T, H, K, V, decay=decay, seed=seed)
    r = np.random.default_rng(seed + 100)
    h0, dfs = exact32(r.standard_normal((N, H, K, V))), exact32(r.standard_normal((N, H, K, V)))
    return p.inputs(), h0, exact32(r.standard_normal((B, T, H, V))), dfs


def runs_of(B, T, cu):
    """Independent runs ``(row, t0, t1, state)``: each batch row, or each packed sequence."""
    if cu is None:
        return [(b, 0, T, b) for b in range(B)]
    return [(0, int(cu[n]), int(cu[n + 1]), n) for n in range(len(cu) - 1)]


def oracle(xs, h0, runs, do, dfs, dtype=np.float64, dh=None):
    """Oracle results of each run alone, in the call's layout: o, final_state, the seven gradients.

    With ``dh`` (a cotangent of the states before each run's C-token chunks, ``[B', NT, H, K, V]``) also
    ``intermediate`` and its share of the gradients: each chunk's starting state is the final state of the
    run's prefix.
    """
    out = {"o": np.zeros(xs[2].shape), "final_state": h0.copy(), "dh0": np.zeros(h0.shape)}
    out.update({n: np.zeros(x.shape) for n, x in zip(GRAD_NAMES, xs)})
    inter, count = {}, {}

    def run(row, t0, t1, n, do_, dS):
        """The run's tokens [t0, t1) from h0[n] with cotangents (do_, dS): adds its gradients, returns (o, S)."""
        if t1 == t0:
            out["dh0"][n] += dS
            return None, h0[n]
        p = Problem(*(x[row:row + 1, t0:t1] for x in xs), initial_state=h0[n:n + 1])
        (o, S), g = recurrence.forward_and_vjp(p, do_[row:row + 1, t0:t1], dS[None], dtype)
        for name in GRAD_NAMES:
            out[name][row, t0:t1] += getattr(g, name)[0]
        out["dh0"][n] += g.dh0[0]
        return o[0], S[0]

    for row, t0, t1, n in runs:
        o, out["final_state"][n] = run(row, t0, t1, n, do, dfs[n])
        if t1 > t0:
            out["o"][row, t0:t1] = o
        for c0 in range(t0, t1, C) if dh is not None else ():
            i = count[row] = count.get(row, -1) + 1
            _, inter[row, i] = run(row, t0, c0, n, np.zeros_like(do), dh[row, i])
    if dh is not None:
        out["intermediate"] = np.stack([np.stack([inter[r, i] for i in range(count[r] + 1)]) for r in sorted(count)])
    return out


def _metrics(x, ref, scales):
    """(err_ratio, normalised max error) of ``x`` against ``ref`` for ``scales = (rms scale, max scale)``."""
    return np.sqrt(np.mean((x - ref) ** 2)) / scales[0], np.max(np.abs(x - ref), initial=0.0) / scales[1]


def judge(got, ref, rec, xs=None, fraction=1.0):
    """Failures (name, err, tol) of ``got`` against float64 ``ref``: within ``fraction * 32`` x the float32
    recurrence ``rec``'s error (floor 2^-20), both err_ratio and normalised max error; ``dg`` on its envelope."""
    fails = []
    for name, r in ref.items():
        d = np.asarray(got[name], np.float64)
        scale_rms, scale_max = np.sqrt(np.mean(r**2)), np.max(np.abs(r), initial=0.0)
        if name == "dg" and xs is not None:
            q, k, _, _, b, _ = xs
            E = np.abs(q * ref["dq"]) + np.abs(k * ref["dk"]) + np.abs(b * ref["db"])
            scale_rms, scale_max = max(scale_rms, np.sqrt(np.mean(E**2))), max(scale_max, np.max(E))
        scales = max(scale_rms, 1e-30), max(scale_max, 1e-30)
        err, base = _metrics(d, r, scales), _metrics(np.asarray(rec[name], np.float64), r, scales)
        tol = [max(fraction * MULTIPLE * e, FLOOR) for e in base]
        if not np.all(np.isfinite(d)) or err[0] > tol[0] or err[1] > tol[1]:
            fails.append((name, err, tol))
    return fails


def call(name, xs, h0, do, dfs, **modes):
    """Kernel forward and VJP: ``(results dict, intermediate or None)``; jax arrays in, float64 out."""
    fn = kernel(name)

    def f(q, k, v, g, b, w, h):
        out = fn(q, k, v, g, b, w, initial_state=h, **modes)
        return out[:2], (out[2] if len(out) == 3 else None)

    (o, S), pullback, inter = jax.vjp(f, *map(dev, xs), dev(h0), has_aux=True)
    grads = pullback((dev(do), dev(dfs)))
    res = dict(o=o, final_state=S, **dict(zip(GRAD_NAMES + ("dh0",), grads)))
    return {n: np.asarray(x, np.float64) for n, x in res.items()}, inter


# --- packed sequences against each sequence alone -------------------------------------------------------------
@pytest.mark.parametrize("decay", ["none", "weak", "moderate", "strong", "extreme", "mixed", "resets"])
@pytest.mark.parametrize("name", ["pairwise", "factorized"])
def test_packed_matches_each_sequence(name, decay):
    """Forward, final states and every gradient (dh0[n] included) of each packed sequence, as if run alone."""
    cu = offsets(LENGTHS)
    T, N = int(cu[-1]), len(LENGTHS)
    xs, h0, do, dfs = inputs(1, T, N, decay, seed=1)
    runs = runs_of(1, T, cu)
    got, _ = call(name, xs, h0, do, dfs, cu_seqlens=cu)
    ref = oracle(xs, h0, runs, do, dfs)
    fails = judge(got, ref, oracle(xs, h0, runs, do, dfs, np.float32), xs)
    assert not fails, f"{name} {decay}: {fails}"
    empty = [n for n, L in enumerate(LENGTHS) if L == 0]
    np.testing.assert_array_equal(got["final_state"][empty], np.float32(h0[empty]))
    np.testing.assert_array_equal(got["dh0"][empty], np.float32(dfs[empty]))


@pytest.mark.parametrize("name", ["pairwise", "factorized"])
def test_packed_without_initial_state(name):
    """No initial state: every sequence starts from zeros (the cheaper path without entering-state terms)."""
    lengths = (C + 3, 0, 7, 2 * C, 1, C - 2)
    cu = offsets(lengths)
    T, N = int(cu[-1]), len(lengths)
    xs, _, do, dfs = inputs(1, T, N, seed=2)
    zeros = np.zeros((N, H, K, V))
    fn = kernel(name)
    out, pullback = jax.vjp(lambda *a: fn(*a, cu_seqlens=cu), *map(dev, xs))
    got = dict(o=out[0], final_state=out[1], **dict(zip(GRAD_NAMES, pullback((dev(do), dev(dfs))))))
    runs = runs_of(1, T, cu)
    ref, rec = oracle(xs, zeros, runs, do, dfs), oracle(xs, zeros, runs, do, dfs, np.float32)
    del ref["dh0"]
    assert not judge(got, ref, rec, xs)


@pytest.mark.parametrize("name", ["pairwise", "factorized"])
def test_equal_lengths_match_dense_batch(name):
    """N equal sequences packed give the dense batch-of-N call's results (tight agreement bound)."""
    N, L = 3, 2 * C + 5
    xs, h0, do, dfs = inputs(N, L, N, seed=3)
    dense, _ = call(name, xs, h0, do, dfs)
    packed, _ = call(name, [x.reshape((1, N * L) + x.shape[2:]) for x in xs], h0, do.reshape(1, N * L, H, V), dfs,
                     cu_seqlens=offsets([L] * N))
    packed = {n: x.reshape(dense[n].shape) for n, x in packed.items()}
    runs = runs_of(N, L, None)
    ref, rec = oracle(xs, h0, runs, do, dfs), oracle(xs, h0, runs, do, dfs, np.float32)
    assert not judge(packed, ref, rec, xs) and not judge(dense, ref, rec, xs)
    assert not judge(packed, dense, rec, xs, fraction=1 / 3), "packed vs dense batch"


# --- in-kernel gate and L2 norm against precomputed inputs ---------------------------------------------------------
def softplus(x):
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


def sigmoid(x):
    return 0.5 * (1 + np.tanh(x / 2))


def l2norm(x):
    return x / np.sqrt(np.sum(x * x, -1, keepdims=True) + EPS)


def l2norm_vjp(x, dy):
    r = 1 / np.sqrt(np.sum(x * x, -1, keepdims=True) + EPS)
    y = x * r
    return r * (dy - y * np.sum(y * dy, -1, keepdims=True))


def gate_and_vjp(raw, A_log, dt_bias, lb, dg=None):
    """FLA's gate (float64) and, given ``dg``, ``(d raw, dA_log, ddt_bias)``."""
    x = raw + dt_bias.reshape(H, K)
    A = 1.0 if A_log is None else np.exp(A_log)[:, None]
    g = -A * softplus(x) if lb is None else lb * sigmoid(A * x)
    if dg is None:
        return g
    dx = -A * sigmoid(x) * dg if lb is None else lb * sigmoid(A * x) * (1 - sigmoid(A * x)) * A * dg
    dA = None if A_log is None else np.sum((dg * g) if lb is None else dx * x, axis=(0, 1, 3))
    return dx, dA, np.sum(dx, axis=(0, 1)).reshape(-1)


@pytest.mark.parametrize("name,lb,has_A", [("factorized", None, True), ("pairwise", -4.0, True),
                                           ("factorized", -2.0, False)])
def test_gate_and_l2norm_in_kernel(name, lb, has_A):
    """use_gate_in_kernel + use_qk_l2norm_in_kernel: the oracle on precomputed gate and normalised q, k; gradients
    w.r.t. raw q, k, g, A_log, dt_bias by the chained float64 adjoints."""
    B, T = 2, 2 * C + 5
    (q, k, v, _, b, w), h0, do, dfs = inputs(B, T, B, seed=4)
    r = np.random.default_rng(5)
    q, k = exact32(3 * q + 0.2 * r.standard_normal(q.shape)), exact32(2 * k)  # not unit norm
    raw, dt_bias = exact32(r.standard_normal(q.shape)), exact32(r.standard_normal(H * K))
    A_log = exact32(0.5 * r.standard_normal(H)) if has_A else None
    gated = gate_and_vjp(raw, A_log, dt_bias, lb)
    runs = runs_of(B, T, None)
    results = {}
    for dtype, cast in ((np.float64, np.asarray), (np.float32, exact32)):
        pre = (cast(l2norm(q)), cast(l2norm(k)), v, cast(gated), b, w)
        res = oracle(pre, h0, runs, do, dfs, dtype)
        res["dq"], res["dk"] = l2norm_vjp(q, res["dq"]), l2norm_vjp(k, res["dk"])
        res["dg"], dA, res["ddt_bias"] = gate_and_vjp(raw, A_log, dt_bias, lb, res["dg"])
        if has_A:
            res["dA_log"] = dA
        results[dtype] = res
    fn = kernel(name)
    modes = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, lower_bound=lb)

    def f(q, k, v, g, b, w, h, A, dt):
        return fn(q, k, v, g, b, w, initial_state=h, A_log=A, dt_bias=dt, **modes)

    out, pullback = jax.vjp(f, *map(dev, (q, k, v, raw, b, w, h0, A_log, dt_bias)))
    names = GRAD_NAMES + ("dh0", "dA_log", "ddt_bias")
    got = dict(o=out[0], final_state=out[1], **dict(zip(names, pullback((dev(do), dev(dfs))))))
    assert (got["dA_log"] is None) == (not has_A)
    fails = judge(got, results[np.float64], results[np.float32])
    assert not fails, f"{name} lower_bound={lb} A_log={has_A}: {fails}"


# --- state layout and intermediate states ------------------------------------------------------------------------
def test_state_v_first_is_the_transpose():
    """[V, K] initial and final states (and their gradients) are the transposes of the [K, V] call's."""
    cu = offsets(LENGTHS)
    T, N = int(cu[-1]), len(LENGTHS)
    xs, h0, do, dfs = inputs(1, T, N, seed=1)
    kv, _ = call("pairwise", xs, h0, do, dfs, cu_seqlens=cu)
    vk, _ = call("pairwise", xs, np.swapaxes(h0, -1, -2), do, np.swapaxes(dfs, -1, -2), cu_seqlens=cu,
                 state_v_first=True)
    for n in kv:
        want = np.swapaxes(kv[n], -1, -2) if n in ("final_state", "dh0") else kv[n]
        np.testing.assert_allclose(vk[n], want, rtol=1e-6, atol=1e-6 * np.max(np.abs(want)), err_msg=n)


@pytest.mark.parametrize("name,packed", [("factorized", False), ("pairwise", True)])
def test_intermediate_states(name, packed):
    """FLA's h: the state before each C-token chunk of each run, ``[B, NT, H, K, V]`` (``NT = sum ceil(L/C)``
    packed); forward against the oracle's prefix states and gradients with a cotangent on h too."""
    if packed:
        lengths = (5, 0, 2 * C + 3, C, 1, C - 1, 0)
        cu, B, N = offsets(lengths), 1, len(lengths)
        T, NT = int(cu[-1]), sum(-(-L // C) for L in lengths)
    else:
        cu, B, T = None, 2, 3 * C + 5
        N, NT = B, -(-T // C)
    xs, h0, do, dfs = inputs(B, T, N, seed=6)
    dh = exact32(np.random.default_rng(7).standard_normal((1 if packed else B, NT, H, K, V)))
    fn = kernel(name)
    out, pullback = jax.vjp(lambda *a: fn(*a[:6], initial_state=a[6], cu_seqlens=cu, return_intermediate_states=True),
                            *map(dev, xs), dev(h0))
    assert out[2].shape == dh.shape and out[2].dtype == jnp.float32
    grads = pullback((dev(do), dev(dfs), dev(dh)))
    got = dict(o=out[0], final_state=out[1], intermediate=out[2], **dict(zip(GRAD_NAMES + ("dh0",), grads)))
    runs = runs_of(B, T, cu)
    ref = oracle(xs, h0, runs, do, dfs, dh=dh)
    rec = oracle(xs, h0, runs, do, dfs, np.float32, dh=dh)
    fails = judge(got, ref, rec, xs)
    assert not fails, f"{name} packed={packed}: {fails}"


# --- cu_seqlens traced, defaults, validation -----------------------------------------------------------------------
def test_traced_cu_seqlens_one_program_per_N():
    """cu_seqlens may be traced: one jitted program serves every packing with the same N and T."""
    fn = kernel("factorized")
    T, N = 3 * C, 4
    xs, h0, _, _ = inputs(1, T, N, seed=8)
    args = [dev(x) for x in (*xs, h0)]
    traces = []

    @jax.jit
    def packed(cu, *a):
        traces.append(1)
        return fn(*a[:6], initial_state=a[6], cu_seqlens=cu)

    for lengths in ((1, C, 2 * C - 3, 2), (0, 3 * C - 1, 0, 1)):
        cu = offsets(lengths)
        o, S = packed(jnp.asarray(cu, jnp.int32), *args)
        o_ref, S_ref = fn(*args[:6], initial_state=args[6], cu_seqlens=cu)
        np.testing.assert_allclose(np.asarray(o), np.asarray(o_ref), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(np.asarray(S), np.asarray(S_ref), rtol=1e-6, atol=1e-6)
    assert len(traces) == 1


def test_default_keywords_are_the_plain_call():
    """Every mode keyword at its default is the plain contract call, bit for bit."""
    fn = kernel("pairwise")
    xs, h0, _, _ = inputs(2, C + 3, 2, seed=9)
    args = [dev(x) for x in xs]
    plain = fn(*args, initial_state=dev(h0))
    explicit = fn(*args, initial_state=dev(h0), cu_seqlens=None, use_qk_l2norm_in_kernel=False,
                  use_gate_in_kernel=False, A_log=None, dt_bias=None, lower_bound=None, state_v_first=False,
                  return_intermediate_states=False)
    for a, b in zip(plain, explicit):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _small(B=1, T=10):
    xs, _, _, _ = inputs(B, T, 1, seed=10)
    return [dev(x) for x in xs]


@pytest.mark.parametrize("kw,match", [
    (dict(cu_seqlens=[0, 4, 3, 10]), "^cu_seqlens: .*non-decreasing"),
    (dict(cu_seqlens=[1, 4, 10]), "^cu_seqlens: must start at 0"),
    (dict(cu_seqlens=[0, 4, 9]), "^cu_seqlens: .*end at T"),
    (dict(cu_seqlens=[[0, 10]]), "^cu_seqlens: expected a 1-D"),
    (dict(cu_seqlens=[0]), "^cu_seqlens: expected a 1-D"),
    (dict(cu_seqlens=np.array([0.0, 10.0])), "^cu_seqlens: expected integers"),
    (dict(cu_seqlens=[0, 4, 10], initial_state=jnp.zeros((1, H, K, V))), "^initial_state: shape"),
    (dict(cu_seqlens=[0, 4, 10], initial_state=jnp.zeros((2, H, K, V), jnp.bfloat16)), "^initial_state: dtype"),
    (dict(state_v_first=True, initial_state=jnp.zeros((1, H, K, V))), r"^initial_state: .*\[B, H, V, K\]"),
    (dict(use_gate_in_kernel=True), "^A_log: required"),
    (dict(use_gate_in_kernel=True, A_log=jnp.zeros((H + 1,))), "^A_log: shape"),
    (dict(use_gate_in_kernel=True, A_log=jnp.zeros((H,)), dt_bias=jnp.zeros((H, K + 1))), "^dt_bias: shape"),
    (dict(use_gate_in_kernel=True, lower_bound=0.0), "^lower_bound: must be finite and < 0"),
    (dict(use_gate_in_kernel=True, lower_bound=float("nan")), "^lower_bound: must be finite"),
    (dict(use_gate_in_kernel=True, lower_bound="low"), "^lower_bound: expected a real number"),
    (dict(A_log=jnp.zeros((H,))), "^A_log: only used with use_gate_in_kernel"),
    (dict(lower_bound=-1.0), "^lower_bound: only used with use_gate_in_kernel"),
    (dict(state_v_first=1), "^state_v_first: expected a bool"),
])
def test_bad_mode_arguments_name_the_argument(kw, match):
    with pytest.raises(ValueError, match=match):
        kernel("factorized")(*_small(), **kw)


def test_packed_needs_batch_one_and_host_offsets_for_intermediate_states():
    with pytest.raises(ValueError, match="^cu_seqlens: packed sequences need batch size 1"):
        kernel("factorized")(*_small(B=2), cu_seqlens=[0, 10])
    with pytest.raises(ValueError, match="^cu_seqlens: traced"):
        jax.jit(lambda cu: kernel("factorized")(*_small(), cu_seqlens=cu, return_intermediate_states=True))(
            jnp.asarray([0, 10], jnp.int32))
    with pytest.raises(ValueError, match="^cu_seqlens: must start at 0"):  # device array: read with check_values
        kernel("factorized")(*_small(), cu_seqlens=jnp.asarray([2, 10]), check_values=True)


def test_value_checks_with_raw_gate():
    """check_values: a raw gate may be positive (only NaN/inf is rejected); a log-decay may not."""
    args = _small()
    args[3] = jnp.abs(args[3]) + 0.5
    gate = dict(use_gate_in_kernel=True, A_log=jnp.zeros((H,)), check_values=True)
    kernel("factorized")(*args, **gate)
    with pytest.raises(ValueError, match="^g: .*positive"):
        kernel("factorized")(*args, cu_seqlens=[0, 3, 10], check_values=True)
    with pytest.raises(ValueError, match="^A_log: contains NaN"):
        kernel("factorized")(*args, **dict(gate, A_log=jnp.full((H,), jnp.nan)))
