"""Huge finite log-decays (down to -FLT_MAX) and denormal ones: a full reset, never NaN, in every kernel.

``g = -3e38`` is a valid float32 log-decay with ``exp(g) = 0``: the decayed state is wiped. Before the kernels
raised ``g`` to ``kernels.contract.LOG_DECAY_FLOOR``, the in-chunk cumulative sums of two such values overflowed
to -inf and every decay exponent became ``inf - inf = NaN``. Here the oracles are checked to give the reset
result (against the suffix problem started from a zero state), then every kernel, float32 and bfloat16, with and
without an initial state, is judged against the float64 oracle with the tolerance model (docs/DESIGN.md §4).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import pytest

from gdn2_oracle import kernels, oracle
from gdn2_oracle.ci.grading import references, tolerance
from gdn2_oracle.ci.running import harness
from gdn2_oracle.kernels.contract import LOG_DECAY_FLOOR
from gdn2_oracle.kernels.testing import without_initial_state
from gdn2_oracle.oracle.generate import round_to

T, RESET = 70, 40  # two Pallas chunks (64), five pure-JAX chunks (16); a full reset in a later chunk
KERNELS = {
    "pairwise": dict(chunk_size=16),
    "factorized": dict(chunk_size=16, leaf=4),
    "pallas-pairwise": dict(interpret="xla"),
    "pallas-factorized": dict(interpret="xla"),
}


def extremes(dtype):
    """(-max, -1e38, -3e38, -smallest denormal) as the exact values of ``dtype``."""
    info = jnp.finfo(jnp.dtype(dtype))
    return tuple(round_to(-float(x), dtype) for x in (info.max, 1e38, 3e38, info.smallest_subnormal))


def with_extremes(g, dtype):
    """``g [B, T, H, K]`` with extreme log-decays: several in one chunk and channel (their sum overflows
    float32), partial resets of some channels, a full reset at token RESET, denormals."""
    huge, e38, e3, tiny = extremes(dtype)
    g = np.array(g)
    g[:, 0, :, 0] = huge
    g[:, 5, :, :3] = huge
    g[:, 6, :, :2] = e38
    g[:, 20, :, 3] = tiny
    g[:, 20, :, 5] = e3
    g[:, 33, :, 1:] = tiny
    g[:, RESET, :, :] = e3
    g[:, T - 1, :, -1] = e38
    return g


@functools.cache
def reference(dtype, initial_state):
    """(problem with extreme g, cotangents, float64 oracle results)."""
    p = oracle.make_problem(1, T, 2, 8, 12, decay="moderate", initial_state=initial_state, precision=dtype, seed=5)
    p = p.replace(g=with_extremes(p.g, dtype))
    do, dfs = oracle.random_cotangents(p, seed=6, precision=dtype)
    return p, do, dfs, references.reference_results(p, do, dfs)


@functools.cache
def kernel(name, initial_state):
    """One kernel object per configuration (the harness compiles once per kernel object and shape)."""
    fn = kernels.get(name, **KERNELS[name])
    return fn if initial_state else without_initial_state(fn)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_problem_accepts_finite_extremes(dtype):
    """Every finite g <= 0 is a valid log-decay; inf, NaN and positive values are not."""
    p, *_ = reference(dtype, True)
    assert np.array_equal(p.g, with_extremes(p.g, dtype)) and np.min(p.g) == extremes(dtype)[0]
    for bad, match in ((-np.inf, "NaN or inf"), (np.nan, "NaN or inf"), (1e-45, "<= 0")):
        with pytest.raises(ValueError, match=f"^g: .*{match}"):
            p.replace(g=np.where(p.g == extremes(dtype)[0], bad, p.g))


@pytest.mark.parametrize("precision", [np.float64, np.float32])
def test_oracle_extreme_decay_is_a_reset(precision):
    """From the full reset on, the recurrence equals the suffix problem started from zero, gradients too:
    exactly, since exp(g) = 0 (dg at the reset token is d/dg exp(g) S = 0)."""
    p, do, dfs, _ = reference("float32", True)
    (o, S), grads = oracle.recurrence.forward_and_vjp(p, do, dfs, dtype=precision)
    tail = oracle.Problem(*(x[:, RESET:] for x in p.inputs()), scale=p.scale)
    (o_t, S_t), grads_t = oracle.recurrence.forward_and_vjp(tail, do[:, RESET:], dfs, dtype=precision)
    np.testing.assert_array_equal(o[:, RESET:], o_t)
    np.testing.assert_array_equal(S, S_t)
    for name, x, x_t in zip(oracle.GRADS[:6], grads[:6], grads_t[:6]):
        np.testing.assert_array_equal(x[:, RESET:], x_t, err_msg=name)
    assert np.all(grads.dg[p.g < LOG_DECAY_FLOOR] == 0) and all(np.all(np.isfinite(x)) for x in grads)


def test_mp_oracle_at_extremes():
    """The mpmath oracle agrees with the float64 one (exp(-FLT_MAX) is a tiny mpf, 0 in float64)."""
    p = oracle.make_problem(1, 6, 1, 3, 2, initial_state=True, seed=2, precision="float64")
    g = np.array(p.g)
    g[0, 1, 0, 0], g[0, 2, 0, :], g[0, 4, 0, 1] = extremes("float32")[1], extremes("float32")[0], -5e-324
    p = p.replace(g=g)
    do, dfs = oracle.random_cotangents(p, seed=1, precision="float64")
    fwd, grads = oracle.mp.forward_and_vjp(p, do, dfs)
    ref = references.reference_results(p, do, dfs)
    got = {"o": fwd.o, "final_state": fwd.final_state, **grads._asdict()}
    for name in oracle.RESULTS:
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-13, atol=1e-15, err_msg=name)
    assert np.all(grads.dg[0, 2] == 0)


# Every pure-JAX case; Pallas (a compile of ~5-10 s each in interpret mode) covers each method, dtype and
# initial-state mode once (the floor is applied outside its pallas_calls, the same for every tile setting).
CASES = [(n, d, h0) for n in ("pairwise", "factorized") for d in ("float32", "bfloat16") for h0 in (True, False)]
CASES += [("pallas-pairwise", "float32", True), ("pallas-factorized", "bfloat16", True),
          ("pallas-factorized", "float32", False)]


@pytest.mark.parametrize("name,dtype,initial_state", CASES)
def test_kernels_match_oracle_at_extremes(name, dtype, initial_state):
    """Finite results within the tolerance model; dg exactly 0 where g is below the floor (exp(g) = 0)."""
    p, do, dfs, ref = reference(dtype, initial_state)
    harness.check_representable(p, dtype)
    got = harness.kernel_results(kernel(name, initial_state), p, do, dfs, dtype=dtype)
    report = tolerance.compare(p, do, dfs, got, ref, dtype=dtype)
    failures = report.failures()
    if not initial_state:  # called with initial_state=None: no state to differentiate, dh0 comes back zero
        failures = [v for v in failures if v.name != "dh0"]
        assert not np.any(got["dh0"])
    assert not failures, f"{name} {dtype} initial_state={initial_state}:\n{report.format()}"
    assert np.all(got["dg"][p.g < LOG_DECAY_FLOOR] == 0)


def test_value_checks_accept_finite_extremes():
    """``check_values=True`` accepts any finite g <= 0 and still rejects inf, NaN and positive g (the check is
    ``kernels.contract.check_inputs``, shared by every kernel; the Pallas call argument is in test_pallas.py)."""
    p, *_ = reference("float32", True)
    q, k, v, g, b, w = (jnp.asarray(x, jnp.float32) for x in p.inputs())
    fn = kernels.get("pairwise", **KERNELS["pairwise"])
    o, S = fn(q, k, v, g, b, w, check_values=True)
    assert np.all(np.isfinite(np.asarray(o))) and np.all(np.isfinite(np.asarray(S)))
    for bad, match in ((-jnp.inf, "NaN or inf"), (jnp.inf, "NaN or inf"), (jnp.nan, "NaN or inf"),
                       (0.5, "positive")):
        with pytest.raises(ValueError, match=f"^g: .*{match}"):
            fn(q, k, v, g.at[0, 7, 0, 2].set(bad), b, w, check_values=True)
