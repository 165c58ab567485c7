"""Pallas GDN-2 kernels (kernels/pallas) in interpret mode on CPU against the float64 oracle.

Judged by the suite's tolerance model (``ci.running.harness.validate``, docs/DESIGN.md §4): per output and gradient,
``err_ratio`` and the normalised max error within 32x (float32) / 8x (bfloat16) of what the plain
token-by-token recurrence in that working precision achieves on the same inputs, with a floor; NaN/inf
always fails. Agreement with the pure-JAX kernels uses the suite's tight agreement bound
(``ci.grading.tolerance.agreement``). Shapes are tiny: interpret mode is slow on two CPU cores.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn2_oracle import kernels, oracle
from gdn2_oracle.ci.grading import references, tolerance
from gdn2_oracle.ci.grading.tolerance import RESULTS
from gdn2_oracle.ci.running import harness
from gdn2_oracle.ci.testing import assert_matches_oracle, oracle_case
from gdn2_oracle.kernels.pallas import (
    SWEEP,
    TileConfig,
    make_kernel,
    pallas_factorized,
    pallas_pairwise,
    resolve_interpret,
    vmem_footprint,
)
from gdn2_oracle.kernels.pallas.config import DEFAULT_SCOPED_VMEM, VMEM_BUDGET
from gdn2_oracle.kernels.testing import without_initial_state

METHODS = ("pairwise", "factorized")


def _kernel(method, options=(), interpret="xla"):
    """One kernel object per option set, so the harness's jitted runner compiles once per shape."""
    return _build(method, tuple(options), interpret)


@functools.cache
def _build(method, options, interpret):
    return kernels.get(f"pallas-{method}", interpret=interpret, **dict(options))


@functools.cache
def _jax_kernel(method):
    """The pure-JAX kernel of the same method (defaults: chunk_size 64, leaf 16, as the Pallas ones)."""
    return kernels.get(method)


def recipe(B, T, H, K, V, decay, initial_state, precision, seed=0):
    """The recipe of an oracle problem (cotangent seed = data seed + 1)."""
    return oracle.Recipe(B, T, H, K, V, decay=decay, initial_state=initial_state, precision=precision, seed=seed,
                         cot_seed=seed + 1)


def reference(*case):
    """(problem, do, dfs, float64 oracle results), cached by recipe."""
    c = oracle_case(recipe(*case))
    return (*c.data(), c.reference())


def check(method, case, options=(), interpret="xla"):
    """Judge a Pallas kernel on ``recipe(*case)`` with the suite's tolerance model."""
    return assert_matches_oracle(_kernel(method, options, interpret), recipe(*case))


SHAPE = (1, 150, 2, 128, 128)  # T = 2 full chunks of 64 + a partial one


@pytest.mark.parametrize("decay", oracle.DECAYS)
@pytest.mark.parametrize("method", METHODS)
def test_forward_and_grads_every_decay(method, decay):
    check(method, (*SHAPE, decay, True, "float32"))


@pytest.mark.parametrize("method", METHODS)
def test_without_initial_state_and_custom_scale(method):
    """Called with ``initial_state=None`` and ``scale=0.3``: o, final_state and the six input gradients
    judged against the oracle (there is no initial state to differentiate: dh0 comes back zero)."""
    p, do, dfs, _ = reference(1, 100, 1, 128, 128, "mixed", False, "float32")
    p = p.replace(scale=0.3)
    got = harness.kernel_results(without_initial_state(_kernel(method)), p, do, dfs)
    report = tolerance.compare(p, do, dfs, got, references.reference_results(p, do, dfs))
    assert not [v for v in report.failures() if v.name != "dh0"], f"{method}/no-h0:\n{report.format()}"
    assert not np.any(got["dh0"])


@pytest.mark.parametrize("decay", ["moderate", "mixed"])
@pytest.mark.parametrize("method", METHODS)
def test_bfloat16_inputs(method, decay):
    # The oracle sees the bf16-rounded inputs and cotangents; o and input grads come back in bf16.
    check(method, (1, 100, 1, 128, 128, decay, True, "bfloat16"))


@pytest.mark.parametrize("method", METHODS)
def test_result_dtypes_follow_inputs(method):
    """o and the six input gradients in the input dtype (bfloat16 here), final_state and dh0 in float32."""
    p, do, dfs, _ = reference(1, 100, 1, 128, 128, "moderate", True, "bfloat16")
    got = harness.kernel_results(_kernel(method), p, do, dfs, dtype="bfloat16")
    dtypes = {n: tolerance.dtype_name(got[n]) for n in RESULTS}
    assert dtypes == {n: "float32" if n in ("final_state", "dh0") else "bfloat16" for n in RESULTS}, dtypes
    assert all(got[n].shape == x.shape for n, x in zip(("dq", "dk", "dv", "dg", "db", "dw"), p.inputs()))


@pytest.mark.parametrize("method", METHODS)
def test_padded_widths_k_ne_v(method):
    # K = 40 and V = 72 are zero-padded to 128 lanes inside; K != V.
    check(method, (1, 70, 2, 40, 72, "mixed", True, "float32", 3))


TILE_VARIANTS = [
    pytest.param(("factorized", dict(chunk_size=64, split=16, leaf=16)), id="fact-c64-s16-l16"),
    pytest.param(("factorized", dict(chunk_size=64, split=48, leaf=8)), id="fact-c64-s48-l8", marks=pytest.mark.slow),
    pytest.param(("factorized", dict(chunk_size=128, leaf=32)), id="fact-c128-l32", marks=pytest.mark.slow),
    pytest.param(("pairwise", dict(chunk_size=128, leaf=16)), id="pair-c128-l16", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("variant", TILE_VARIANTS)
def test_tile_variants(variant):
    method, cfg = variant
    for decay in ("extreme", "resets"):
        check(method, (1, 150, 1, 128, 128, decay, True, "float32", 5), tuple(sorted(cfg.items())))


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_tpu_interpreter(method):
    # pltpu.InterpretParams: TPU memory semantics (uninitialised VMEM reads are NaN, bounds checked).
    check(method, (1, 70, 1, 128, 128, "strong", True, "float32", 7), interpret=True)


@pytest.mark.parametrize("method", METHODS)
def test_matches_pure_jax_kernels(method):
    """Same algorithm family in pure JAX (kernels/chunked.py): within the suite's tight agreement bound."""
    p, do, dfs, ref = reference(*SHAPE, "moderate", True, "float32")
    got = harness.kernel_results(_kernel(method), p, do, dfs)
    jax_got = harness.kernel_results(_jax_kernel(method), p, do, dfs)
    base = tolerance.baseline(p, do, dfs, {n: tolerance.dtype_name(got[n]) for n in RESULTS})
    report = tolerance.agreement(p, got, jax_got, ref, base, "float32", what=f"pallas-{method}~{method}")
    assert report.passed, report.format()


# ---------------------------------------------------------------- configuration, VMEM, plumbing


@pytest.mark.parametrize("kwargs, field", [
    (dict(method="flash"), "method"),
    (dict(chunk_size=96), "chunk_size"),
    (dict(chunk_size=64.0), "chunk_size"),
    (dict(leaf=12), "leaf"),
    (dict(split=0), "split"),
    (dict(split=64), "split"),
    (dict(split=24, leaf=16), "split"),
    (dict(split="middle"), "split"),
])
def test_config_rejects_impossible(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}:"):
        TileConfig(**kwargs)


def test_config_is_frozen_and_hashable():
    cfg = TileConfig()
    with pytest.raises(AttributeError):
        cfg.chunk_size = 128  # type: ignore[misc]
    assert hash(cfg) == hash(TileConfig("factorized", 64, None, 16))
    assert len(set(SWEEP)) == len(SWEEP)


@pytest.mark.parametrize("cfg", [TileConfig("factorized", c, s, leaf) for c in (64, 128, 256)
                                 for leaf in (8, 16, 32) for s in (None, leaf, c - leaf)])
def test_split_tree_covers_lower_triangle(cfg):
    C = cfg.chunk_size
    covered = np.zeros((C, C), int)
    levels = cfg.levels()
    assert levels[-1] == [(0, cfg.boundary, C)]
    for level in levels:
        for lo, m, hi in level:
            covered[m:hi, lo:m] += 1
    leaves = np.zeros(C, bool)
    for r0 in range(0, C, cfg.leaf):  # leaves are the aligned leaf windows
        covered[r0:r0 + cfg.leaf, r0:r0 + cfg.leaf] += np.tril(np.ones((cfg.leaf, cfg.leaf), int))
        leaves[r0] = True
    assert np.array_equal(covered, np.tril(np.ones((C, C), int))), "cross tiles + leaves != lower triangle"


def vmem_table():
    rows = []
    for cfg in SWEEP:
        for itemsize, dt in ((4, "float32"), (2, "bfloat16")):
            for bwd in (False, True):
                fp = vmem_footprint(cfg, 128, 128, itemsize, backward=bwd)
                rows.append((cfg.name, dt, "bwd" if bwd else "fwd", fp["total"]))
    return rows


def test_vmem_footprint_of_sweep_fits():
    for name, dt, kind, total in vmem_table():
        assert total <= DEFAULT_SCOPED_VMEM, f"{name} {dt} {kind}: {total / 2**20:.2f} MiB > 16 MiB"
        assert total <= VMEM_BUDGET


def test_vmem_footprint_grows_with_chunk():
    small = vmem_footprint(TileConfig(chunk_size=64), backward=True)["total"]
    big = vmem_footprint(TileConfig(chunk_size=256, leaf=32), backward=True)["total"]
    assert big > small > 0


def test_registry_and_factories():
    from gdn2_oracle.kernels import spec

    assert spec.factory("pallas-pairwise") is pallas_pairwise and spec.factory("pallas-factorized") is pallas_factorized
    f = kernels.get("pallas-factorized", chunk_size=128, leaf=32, interpret="xla")
    assert f.config == TileConfig("factorized", 128, None, 32)
    assert f.config == TileConfig(method="factorized", chunk_size=128, leaf=32)
    assert kernels.get("pallas-pairwise[chunk_size=128]").config == TileConfig("pairwise", 128, None, 16)
    assert pallas_factorized(split=16).config.boundary == 16
    assert make_kernel("factorized").config == TileConfig()  # defaults: chunk_size 64, leaf 16


@pytest.mark.parametrize("options", [dict(chunk=128), dict(check_values=True)])
def test_factories_take_the_pure_jax_option_names(options):
    """One vocabulary: ``chunk_size`` (not ``chunk``); ``check_values`` is a call argument, not an option."""
    with pytest.raises(ValueError, match="^options:"):
        kernels.get("pallas-factorized", **options)
    with pytest.raises(TypeError):
        pallas_pairwise(**options)


@pytest.mark.parametrize("method", METHODS)
def test_value_checks_are_an_opt_in_call_argument(method):
    """As for the pure-JAX kernels: ``fn(..., check_values=True)`` raises naming the argument; the default
    does no value check (traced here with eval_shape: nothing runs, no host sync)."""
    fn = _kernel(method)
    r = np.random.default_rng(0)
    q, k, g, b = (jnp.asarray(r.standard_normal((1, 8, 1, 16)), jnp.float32) for _ in range(4))
    v, w = (jnp.asarray(r.standard_normal((1, 8, 1, 8)), jnp.float32) for _ in range(2))
    g = -jnp.abs(g)
    bad_g = g.at[0, 2, 0, 1].set(0.5)
    o, s = jax.eval_shape(fn, q, k, v, bad_g, b, w)
    assert o.shape == v.shape and s.shape == (1, 1, 16, 8)
    with pytest.raises(ValueError, match="^g: .*positive"):
        fn(q, k, v, bad_g, b, w, check_values=True)
    with pytest.raises(ValueError, match="^v: .*NaN"):
        fn(q, k, v.at[0, 0, 0, 0].set(jnp.nan), g, b, w, check_values=True)


def test_interpret_resolution():
    from jax.experimental.pallas import tpu as pltpu

    auto = resolve_interpret(None)
    if jax.default_backend() == "tpu":
        assert auto is False
    else:
        assert isinstance(auto, pltpu.InterpretParams)
    assert resolve_interpret("xla") is True
    assert resolve_interpret(False) is False
    assert isinstance(resolve_interpret(True), pltpu.InterpretParams)
    with pytest.raises(ValueError, match="^interpret:"):
        make_kernel("factorized", interpret="maybe")


def test_input_validation_names_the_argument():
    fn = make_kernel("factorized", interpret="xla")
    x = jnp.zeros((1, 8, 1, 16), jnp.float32)
    with pytest.raises(ValueError, match="^k:"):
        fn(x, jnp.zeros((1, 9, 1, 16)), x, x, x, x)
    with pytest.raises(ValueError, match="^q:"):
        fn(x.astype(jnp.float16), x, x, x, x, x)
    with pytest.raises(ValueError, match="^initial_state:"):
        fn(x, x, x, x, x, x, initial_state=jnp.zeros((1, 1, 16, 8)))
