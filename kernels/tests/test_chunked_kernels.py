"""Fixed-case tests of the chunked kernels (kernels/chunked.py) against the float64 oracle.

Every case checks the forward output, the final state and all seven gradients with the project's
tolerance model (``ci.running.harness.validate``, docs/DESIGN.md §4): each result's ``err_ratio`` and normalised max
error must be within 32x (float32) / 8x (bfloat16) of what the plain token-by-token recurrence in that
working precision achieves on the same inputs, with a floor. No regime gets its own threshold: the
kernels form every decay exponent without cancellation (kernels/decay.py ``log_decay``/``gap``), so
resets (g ~ -1e3) and extreme decay are held to the same rule as everything else.

Kernel-vs-kernel (pairwise vs factorized, ``initial_state=None`` vs zeros): the suite's tight agreement
bound (``ci.grading.tolerance.agreement``), a third of the recurrence rule: they differ only by float32 rounding.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn2_oracle import kernels
from gdn2_oracle.ci.grading import tolerance
from gdn2_oracle.ci.grading.tolerance import RESULTS
from gdn2_oracle.ci.running import harness
from gdn2_oracle.ci.testing import assert_matches_oracle, oracle_case
from gdn2_oracle.kernels import chunked
from gdn2_oracle.kernels.testing import without_initial_state
from gdn2_oracle.oracle import DECAYS, Recipe


def recipe(shape, precision="float32", **kw):
    """The recipe of an oracle problem (cotangent seed 1)."""
    return Recipe(*shape, precision=precision, cot_seed=1, **kw)


def reference(shape, precision="float32", **kw):
    """Problem, cotangents and float64 oracle results (cached by recipe across kernels)."""
    case = oracle_case(recipe(shape, precision, **kw))
    return (*case.data(), case.reference())


def agreement(problem, do, dfs, a, b, ref, what, dtype="float32"):
    """The suite's agreement report of result mappings ``a`` and ``b`` (tight bound, docs/DESIGN.md §4)."""
    base = tolerance.baseline(problem, do, dfs, {n: tolerance.dtype_name(a[n]) for n in RESULTS})
    return tolerance.agreement(problem, a, b, ref, base, dtype, what=what)


@functools.cache
def _kernel(name, options):
    """One kernel object per configuration, so the harness's jitted runner is compiled once per shape."""
    return kernels.get(name, **dict(options))


def check(name, shape, options=(), precision="float32", **kw):
    """Judge a kernel on an oracle problem with the tolerance model; the report on failure."""
    return assert_matches_oracle(_kernel(name, tuple(options)), recipe(shape, precision, **kw))


# --- decay regimes: (B, T, H, K, V) = (2, 3C+5, 2, 16, 24), C = 32, with an initial state ---------------------
@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("name", ["pairwise", "factorized"])
def test_decay_regimes(name, decay):
    check(name, (2, 101, 2, 16, 24), (("chunk_size", 32),), decay=decay, initial_state=True, seed=3)


@pytest.mark.parametrize("gates", ["zero", "one", "negative"])
def test_gate_regimes(gates):
    check("factorized", (2, 101, 2, 16, 24), (("chunk_size", 32),), decay="moderate", gates=gates,
          initial_state=True, seed=4)


# --- lengths around the chunk and every chunk size ---------------------------------------------------------------
def _lengths(C):
    return (1, C - 1, C, C + 1, 3 * C + 5)


@pytest.mark.parametrize("name,T", [("factorized", T) for T in _lengths(16)] + [("pairwise", T) for T in (1, 16, 53)])
def test_lengths_chunk16(name, T):
    opts = (("chunk_size", 16), ("leaf", 4)) if name == "factorized" else (("chunk_size", 16),)
    check(name, (1, T, 2, 8, 12), opts, decay="strong", initial_state=True, seed=T)


# (C, T) around the larger chunks; T = 3C+5 at C = 32 is covered by the regime tests, C = 64 by the splits.
@pytest.mark.slow
@pytest.mark.parametrize("C,T", [(32, 31), (32, 33), (64, 63), (64, 64), (128, 129), (128, 389)])
def test_lengths_chunk_sizes(C, T):
    check("factorized", (1, T, 1, 8, 12), (("chunk_size", C),), decay="mixed", initial_state=True, seed=C + T)


@pytest.mark.parametrize("C", [64, 128])
def test_chunk_sizes_pairwise(C):
    check("pairwise", (1, C + 1, 1, 8, 12), (("chunk_size", C),), decay="mixed", initial_state=True, seed=C)


# --- split points and leaves of the factorized kernel -------------------------------------------------------------
@pytest.mark.parametrize("split,leaf", [(1, 16), (40, 8), (63, 4), (None, 1)])
def test_split_points(split, leaf):
    check("factorized", (1, 135, 2, 16, 8), (("chunk_size", 64), ("split", split), ("leaf", leaf)),
          decay="mixed", initial_state=True, seed=7)


# --- dtypes and the optional initial state -------------------------------------------------------------------------
@pytest.mark.parametrize("decay", ["moderate", "strong", "mixed"])
@pytest.mark.parametrize("name", ["pairwise", "factorized"])
def test_bfloat16(name, decay):
    check(name, (2, 101, 2, 16, 24), (("chunk_size", 32),), "bfloat16", decay=decay, initial_state=True, seed=5)


@pytest.mark.parametrize("name", ["pairwise", "factorized"])
def test_without_initial_state(name):
    """Judged with a zero initial state (the harness always passes one); ``initial_state=None`` gives the same."""
    shape, opts, kw = (2, 101, 2, 16, 24), (("chunk_size", 32),), dict(decay="moderate", initial_state=False, seed=6)
    check(name, shape, opts, **kw)
    problem, do, dfs, ref = reference(shape, **kw)
    with_zero = harness.kernel_results(_kernel(name, opts), problem, do, dfs)  # what check() judged: h0 = zeros
    got = harness.kernel_results(without_initial_state(_kernel(name, opts)), problem, do, dfs)
    assert not np.any(got["dh0"])  # nothing to differentiate: the state was not passed
    report = agreement(problem, do, dfs, got, with_zero, ref, "initial_state=None~zeros")
    assert not [v for v in report.failures() if v.name != "dh0"], f"{name}:\n{report.format()}"


@pytest.mark.parametrize("name", ["pairwise", "factorized"])
def test_result_dtypes_follow_inputs(name):
    """o and the six input gradients in the input dtype (bfloat16 here), final_state and dh0 in float32."""
    opts = (("chunk_size", 32),)
    problem, do, dfs, _ = reference((2, 101, 2, 16, 24), "bfloat16", decay="moderate", initial_state=True, seed=5)
    got = harness.kernel_results(_kernel(name, opts), problem, do, dfs, dtype="bfloat16")
    dtypes = {n: tolerance.dtype_name(got[n]) for n in RESULTS}
    assert dtypes == {n: "float32" if n in ("final_state", "dh0") else "bfloat16" for n in RESULTS}, dtypes


def test_default_options_match_oracle():
    """Defaults: chunk 64, factorized split 32, leaf 16; K = V = 32."""
    for name in ("pairwise", "factorized"):
        check(name, (1, 150, 1, 32, 32), decay="moderate", initial_state=True, seed=8)


# --- pairwise vs factorized ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("decay", ["none", "moderate", "extreme", "resets"])
def test_pairwise_matches_factorized(decay):
    problem, do, dfs, ref = reference((2, 101, 2, 16, 24), decay=decay, initial_state=True, seed=3)
    opts = (("chunk_size", 32),)
    pw = harness.kernel_results(_kernel("pairwise", opts), problem, do, dfs)
    fz = harness.kernel_results(_kernel("factorized", opts), problem, do, dfs)
    report = agreement(problem, do, dfs, fz, pw, ref, "factorized~pairwise")
    assert report.passed, f"factorized vs pairwise ({decay}):\n{report.format()}"


@pytest.mark.parametrize("name", ["pairwise", "factorized"])
def test_chunks_in_groups_match_all_chunks_at_once(monkeypatch, name):
    """A workspace too small for every chunk at once (5 chunks in groups of 2: two full groups and a remainder,
    ``lax.map``) gives what one pass over all chunks gives (the path every shape of the suite takes): the same
    math, so they agree within the tight bound, forward and gradients."""
    B, H, K, C = 2, 2, 16, 32
    problem, do, dfs, ref = reference((B, 5 * C - 3, H, K, 24), decay="moderate", initial_state=True, seed=5)
    opts = (("chunk_size", C),)
    at_once = harness.kernel_results(kernels.get(name, **dict(opts)), problem, do, dfs)
    jax.clear_caches()  # chunked.run's traces hold the workspace they were traced with
    monkeypatch.setattr(chunked, "WORKSPACE_FLOATS", 2 * B * H * _kernel(name, opts).decay.workspace(C, K))
    try:
        grouped = harness.kernel_results(kernels.get(name, **dict(opts)), problem, do, dfs)
    finally:
        jax.clear_caches()
    report = agreement(problem, do, dfs, grouped, at_once, ref, "grouped~at once")
    assert report.passed, report.format()


def test_a_shape_traces_its_chunk_passes_once_for_both_input_dtypes(monkeypatch):
    """The forward-and-gradients programs of one shape in float32 and in bfloat16 share the chunk passes' traces
    (``_forward`` and ``_backward`` are jitted on float32 chunk-major arrays): the bfloat16 program runs neither
    pass's Python again. (The float32 one runs the forward's twice: the custom_vjp's result and its forward rule
    are traced in two of JAX's contexts.)"""
    calls = {"forward": 0, "backward": 0}

    def counting(key, fn):
        def wrapped(*args, **kwargs):
            calls[key] += 1
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(chunked, "_fwd_local", counting("forward", chunked._fwd_local))
    monkeypatch.setattr(chunked, "_bwd_chunk", counting("backward", chunked._bwd_chunk))
    jax.clear_caches()  # a trace of this shape from an earlier test would be reused and count nothing
    fn = kernels.get("factorized", chunk_size=16)
    seen = []
    try:
        for dtype in (jnp.float32, jnp.bfloat16):
            xs = _inputs(T=37, K=12, V=20, dtype=dtype)
            jax.jit(lambda *a: (lambda out, pull: pull(out))(*jax.vjp(fn, *a))).trace(*xs)
            seen.append(dict(calls))
    finally:
        jax.clear_caches()
    assert seen[0]["backward"] == 1 and seen[0]["forward"] >= 1 and seen[1] == seen[0], seen


def _shapes_in_jaxpr(jaxpr):
    """Every intermediate shape of a closed jaxpr, sub-jaxprs (scan/map/custom_vjp bodies) included."""
    shapes = []
    for eqn in jaxpr.eqns:
        shapes += [tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape")]
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    shapes += _shapes_in_jaxpr(inner)
    return shapes


@pytest.mark.parametrize("name,expect_cck", [("pairwise", True), ("factorized", False)])
def test_factorized_never_builds_pair_tensor(name, expect_cck):
    """The factorized forward and backward never hold a C x C x K decay tensor (leaf 16 < C = 64); pairwise does."""
    C, K = 64, 24
    xs = [jnp.zeros((1, 2 * C, 1, K))] * 4
    vs = [jnp.zeros((1, 2 * C, 1, 8))] * 2
    fn = kernels.get(name, chunk_size=C)

    def run(q, k, v, g, b, w):
        out, pullback = jax.vjp(lambda *a: fn(*a), q, k, v, g, b, w)
        return pullback(out)

    shapes = _shapes_in_jaxpr(jax.make_jaxpr(run)(*xs[:2], vs[0], *xs[2:], vs[1]).jaxpr)
    assert any(s[-3:] == (C, C, K) for s in shapes) == expect_cck


# --- contract: shapes, dtypes, values, options ----------------------------------------------------------------------
def _inputs(B=1, T=5, H=1, K=4, V=3, dtype=jnp.float32):
    r = np.random.default_rng(0)
    kk = [jnp.asarray(r.standard_normal((B, T, H, K)), dtype) for _ in range(4)]
    vv = [jnp.asarray(r.standard_normal((B, T, H, V)), dtype) for _ in range(2)]
    q, k, g, b = kk
    return [q, k, vv[0], -jnp.abs(g), b, vv[1]]


@pytest.mark.parametrize("index,name,bad", [
    (0, "q", jnp.zeros((1, 5, 1))), (1, "k", jnp.zeros((1, 5, 1, 3))), (2, "v", jnp.zeros((1, 4, 1, 3))),
    (3, "g", jnp.zeros((1, 4, 1, 4))), (4, "b", jnp.zeros((1, 5, 1, 4), jnp.float16)),
    (5, "w", jnp.zeros((1, 5, 1, 3), jnp.int32)),
])
def test_bad_inputs_name_the_argument(index, name, bad):
    args = _inputs()
    args[index] = bad
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        kernels.get("factorized")(*args)


def test_bad_initial_state_and_scale():
    fn = kernels.get("pairwise", chunk_size=16)
    with pytest.raises(ValueError, match="initial_state"):
        fn(*_inputs(), initial_state=jnp.zeros((1, 1, 4, 4)))
    with pytest.raises(ValueError, match="initial_state"):
        fn(*_inputs(), initial_state=jnp.zeros((1, 1, 4, 3), jnp.bfloat16))
    with pytest.raises(ValueError, match="scale"):
        fn(*_inputs(), scale="big")


def test_value_checks_are_opt_in():
    fn = kernels.get("factorized", chunk_size=16)
    args = _inputs()
    args[3] = args[3].at[0, 2, 0, 1].set(0.5)
    fn(*args)  # no host sync, no check by default
    with pytest.raises(ValueError, match="^g: .*positive"):
        fn(*args, check_values=True)
    args = _inputs()
    args[2] = args[2].at[0, 0, 0, 0].set(jnp.nan)
    with pytest.raises(ValueError, match="^v: .*NaN"):
        fn(*args, check_values=True)


@pytest.mark.parametrize("name,options,option", [
    ("pairwise", dict(chunk_size=8), "chunk_size"), ("pairwise", dict(chunk_size=512), "chunk_size"),
    ("factorized", dict(chunk_size=64.0), "chunk_size"), ("factorized", dict(split=0), "split"),
    ("factorized", dict(chunk_size=32, split=32), "split"), ("factorized", dict(leaf=0), "leaf"),
    ("factorized", dict(chunk_size=32, leaf=33), "leaf"), ("pairwise", dict(leaf=4), "options"),
])
def test_bad_options(name, options, option):
    with pytest.raises(ValueError, match=f"^{option}"):
        kernels.get(name, **options)


def test_output_dtype_follows_v():
    args = _inputs(T=20, dtype=jnp.bfloat16)
    o, S = kernels.get("factorized", chunk_size=16)(*args)
    assert o.dtype == jnp.bfloat16 and o.shape == (1, 20, 1, 3) and S.dtype == jnp.float32 and S.shape == (1, 1, 4, 3)


def test_pallas_names_are_lazy_and_fail_cleanly():
    """pallas-* resolve through kernels.pallas on demand; if it cannot load, a ValueError says why."""
    for name in ("pallas-pairwise", "pallas-factorized"):
        try:
            fn = kernels.get(name)
        except ValueError as exc:
            assert name in str(exc)
        else:
            assert callable(fn)
