"""Pallas GDN-2 kernels (kernels/pallas) in interpret mode on CPU against the float64 oracle.

Verdict rule (DESIGN.md §4): per output and gradient, ``err_ratio = rms(got - ref) / rms(ref)``
against the float64 token-by-token recurrence must stay within
``max(MULT * err_ratio(float32 token recurrence), floor)`` -- the float32 recurrence on the same
inputs is the model of what float32 working precision achieves. Outputs the kernel returns in
bfloat16 (``o`` and the gradients of bfloat16 inputs) get the bfloat16 rounding floor on top.
NaN/inf is always a failure. Shapes are tiny: interpret mode is slow on two CPU cores.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn2_oracle import oracle
from gdn2_oracle.oracle import recurrence

from gdn2_oracle import kernels
from gdn2_oracle.kernels.pallas import (REGISTRY, SWEEP, TileConfig, make_kernel, pallas_factorized, pallas_pairwise,
                            resolve_interpret, vmem_footprint)
from gdn2_oracle.kernels.pallas.config import DEFAULT_SCOPED_VMEM, VMEM_BUDGET

MULT = 16.0
FLOOR_F32 = 1e-6
FLOOR_BF16 = 2.0 ** -8  # rounding a float32 result to bfloat16 (8 mantissa bits)
NAMES = ("o", "S") + oracle.GRADS
METHODS = ("pairwise", "factorized")


def err_ratio(got, ref):
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    den = np.sqrt(np.mean(ref ** 2))
    num = np.sqrt(np.mean((got - ref) ** 2))
    return float(num / den) if den > 0 else float(num)


@functools.lru_cache(maxsize=None)
def _jitted(method, cfg_items, dtype_name, with_h0, interpret):
    """One jitted forward+vjp per build (shapes are cached by jit, so regimes share the compile)."""
    fn = make_kernel(method, interpret=interpret, **dict(cfg_items))

    def run(q, k, v, g, b, w, h0, do, dfs):
        if with_h0:
            (o, s), vjp = jax.vjp(lambda *a: fn(*a[:6], initial_state=a[6]), q, k, v, g, b, w, h0)
        else:
            (o, s), vjp = jax.vjp(fn, q, k, v, g, b, w)
        grads = vjp((do, dfs))
        if not with_h0:
            grads = tuple(grads) + (jnp.zeros_like(h0),)
        return o, s, grads

    return jax.jit(run)


def run_pallas(method, problem, do, dfs, *, dtype=jnp.float32, interpret="xla", **cfg):
    jdt = jnp.dtype(dtype)
    ins = [jnp.asarray(x, jnp.float32).astype(jdt) for x in problem.inputs()]
    with_h0 = problem.initial_state is not None
    h0 = jnp.asarray(problem.h0(), jnp.float32)
    f = _jitted(method, tuple(sorted(cfg.items())), jdt.name, with_h0, interpret)
    o, s, grads = f(*ins, h0, jnp.asarray(do, jnp.float32).astype(jdt), jnp.asarray(dfs, jnp.float32))
    assert o.dtype == jdt and s.dtype == jnp.float32
    for x, g in zip(ins, grads[:6]):
        assert g.dtype == x.dtype and g.shape == x.shape
    return (o, s) + tuple(grads)


@functools.lru_cache(maxsize=None)
def reference(B, T, H, K, V, decay, initial_state, precision, seed=0):
    """(problem, do, dfs, ref64 outputs, ref32 outputs) -- outputs ordered as NAMES."""
    p = oracle.make_problem(B, T, H, K, V, decay=decay, initial_state=initial_state, precision=precision,
                            seed=seed)
    do, dfs = oracle.random_cotangents(p, seed=seed + 1, precision=precision)
    (o, s), g = recurrence.forward_and_vjp(p, do, dfs)
    (o32, s32), g32 = recurrence.forward_and_vjp(p, do, dfs, dtype=np.float32)
    return p, do, dfs, (o, s) + tuple(g), (o32, s32) + tuple(g32)


def check(got, ref, ref32, *, bf16_names=(), label=""):
    """Assert every output within its model tolerance; return {name: (err_ratio, allowed)}."""
    report = {}
    for name, x, r, r32 in zip(NAMES, got, ref, ref32):
        x = np.asarray(jnp.asarray(x, jnp.float32), np.float64)
        assert np.all(np.isfinite(x)), f"{label} {name}: NaN/inf"
        e = err_ratio(x, r)
        base = err_ratio(np.nan_to_num(r32), r)
        allowed = max(MULT * base, FLOOR_F32)
        if name in bf16_names:
            allowed = max(allowed, FLOOR_BF16)
        report[name] = (e, allowed)
    bad = {n: v for n, v in report.items() if not v[0] <= v[1]}
    assert not bad, f"{label}: err_ratio over the model tolerance (got, allowed): {bad}"
    return report


SHAPE = dict(B=1, T=150, H=2, K=128, V=128)  # T = 2 full chunks of 64 + a partial one


@pytest.mark.parametrize("decay", oracle.DECAYS)
@pytest.mark.parametrize("method", METHODS)
def test_forward_and_grads_every_decay(method, decay):
    p, do, dfs, ref, ref32 = reference(*SHAPE.values(), decay, True, "float32")
    got = run_pallas(method, p, do, dfs)
    check(got, ref, ref32, label=f"{method}/{decay}")


@pytest.mark.parametrize("method", METHODS)
def test_without_initial_state_and_custom_scale(method):
    p, do, dfs, _, _ = reference(1, 100, 1, 128, 128, "mixed", False, "float32")
    p = p.replace(scale=0.3)
    (o, s), g = recurrence.forward_and_vjp(p, do, dfs)
    (o32, s32), g32 = recurrence.forward_and_vjp(p, do, dfs, dtype=np.float32)
    fn = make_kernel(method, interpret="xla")
    ins = [jnp.asarray(x, jnp.float32) for x in p.inputs()]
    (ko, ks), vjp = jax.vjp(lambda *a: fn(*a, scale=0.3), *ins)
    kg = vjp((jnp.asarray(do, jnp.float32), jnp.asarray(dfs, jnp.float32)))
    # Six gradients (no initial state to differentiate); zip in check() stops before dh0.
    check((ko, ks) + tuple(kg), (o, s) + tuple(g)[:6], (o32, s32) + tuple(g32)[:6], label=f"{method}/no-h0")


@pytest.mark.parametrize("decay", ["moderate", "mixed"])
@pytest.mark.parametrize("method", METHODS)
def test_bfloat16_inputs(method, decay):
    # The oracle sees the bf16-rounded inputs and cotangents; o and input grads come back in bf16.
    p, do, dfs, ref, ref32 = reference(1, 100, 1, 128, 128, decay, True, "bfloat16")
    got = run_pallas(method, p, do, dfs, dtype=jnp.bfloat16)
    check(got, ref, ref32, bf16_names=("o", "dq", "dk", "dv", "dg", "db", "dw"), label=f"{method}/bf16/{decay}")


@pytest.mark.parametrize("method", METHODS)
def test_padded_widths_k_ne_v(method):
    # K = 40 and V = 72 are zero-padded to 128 lanes inside; K != V.
    p, do, dfs, ref, ref32 = reference(1, 70, 2, 40, 72, "mixed", True, "float32", seed=3)
    got = run_pallas(method, p, do, dfs)
    check(got, ref, ref32, label=f"{method}/K40V72")


TILE_VARIANTS = [
    pytest.param(("factorized", dict(chunk=64, split=16, leaf=16)), id="fact-c64-s16-l16"),
    pytest.param(("factorized", dict(chunk=64, split=48, leaf=8)), id="fact-c64-s48-l8", marks=pytest.mark.slow),
    pytest.param(("factorized", dict(chunk=128, leaf=32)), id="fact-c128-l32", marks=pytest.mark.slow),
    pytest.param(("pairwise", dict(chunk=128, leaf=16)), id="pair-c128-l16", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("variant", TILE_VARIANTS)
def test_tile_variants(variant):
    method, cfg = variant
    for decay in ("extreme", "resets"):
        p, do, dfs, ref, ref32 = reference(1, 150, 1, 128, 128, decay, True, "float32", seed=5)
        got = run_pallas(method, p, do, dfs, **cfg)
        check(got, ref, ref32, label=f"{method}{cfg}/{decay}")


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_tpu_interpreter(method):
    # pltpu.InterpretParams: TPU memory semantics (uninitialised VMEM reads are NaN, bounds checked).
    p, do, dfs, ref, ref32 = reference(1, 70, 1, 128, 128, "strong", True, "float32", seed=7)
    got = run_pallas(method, p, do, dfs, interpret=True)
    check(got, ref, ref32, label=f"{method}/tpu-interpret")


@pytest.mark.parametrize("method", METHODS)
def test_matches_pure_jax_kernels(method):
    # Same algorithm family in pure JAX (kernels/chunked.py): agreement to float32 rounding.
    p, do, dfs, ref, _ = reference(*SHAPE.values(), "moderate", True, "float32")
    got = run_pallas(method, p, do, dfs)
    jfn = kernels.get(method)
    ins = [jnp.asarray(x, jnp.float32) for x in p.inputs()]
    h0 = jnp.asarray(p.h0(), jnp.float32)
    (o, s), vjp = jax.vjp(lambda *a: jfn(*a[:6], initial_state=a[6]), *ins, h0)
    jax_out = (o, s) + tuple(vjp((jnp.asarray(do, jnp.float32), jnp.asarray(dfs, jnp.float32))))
    for name, a, bref in zip(NAMES, got, jax_out):
        assert err_ratio(a, bref) < 1e-5, name


# ---------------------------------------------------------------- configuration, VMEM, plumbing


@pytest.mark.parametrize("kwargs, field", [
    (dict(method="flash"), "method"),
    (dict(chunk=96), "chunk"),
    (dict(chunk=64.0), "chunk"),
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
    with pytest.raises(Exception):
        cfg.chunk = 128  # type: ignore[misc]
    assert hash(cfg) == hash(TileConfig("factorized", 64, None, 16))
    assert len(set(SWEEP)) == len(SWEEP)


@pytest.mark.parametrize("cfg", [TileConfig("factorized", c, s, l) for c in (64, 128, 256) for l in (8, 16, 32)
                                 for s in (None, l, c - l)])
def test_split_tree_covers_lower_triangle(cfg):
    C = cfg.chunk
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
    small = vmem_footprint(TileConfig(chunk=64), backward=True)["total"]
    big = vmem_footprint(TileConfig(chunk=256, leaf=32), backward=True)["total"]
    assert big > small > 0


def test_registry_and_factories():
    assert set(REGISTRY) == {"pallas-pairwise", "pallas-factorized"}
    assert REGISTRY["pallas-pairwise"] is pallas_pairwise
    f = kernels.get("pallas-factorized", chunk=128, leaf=32, interpret="xla")
    assert f.config == TileConfig("factorized", 128, None, 32)
    assert kernels.get("pallas-pairwise", chunk_size=64).config.method == "pairwise"
    assert pallas_factorized(split=16).config.boundary == 16


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
