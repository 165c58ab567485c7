"""Deterministic GDN-2 input generator with named decay and gate regimes."""

from __future__ import annotations

import numpy as np

from .problem import Problem

DECAYS = ("none", "weak", "moderate", "strong", "extreme", "mixed", "resets")
# Gate regimes: (erase b, write w). "uniform" draws both from [0, 1]; "negative" draws b from
# [0, 2], which lets I - k (b*k)^T have an eigenvalue down to -1 (negative-eigenvalue mode).
GATES = {
    "uniform": ("uniform", "uniform"),
    "zero": ("zero", "zero"),
    "one": ("one", "one"),
    "erase_zero": ("zero", "uniform"),
    "erase_one": ("one", "uniform"),
    "write_one": ("uniform", "one"),
    "negative": ("uniform2", "uniform"),
}
QK_MODES = ("l2", "raw")
INPUT_PRECISIONS = ("float32", "bfloat16", "float64")
RESET_LOG_DECAY = -1e3
RESET_PROBABILITY = 0.03


def round_to_bfloat16(x):
    """Round to the nearest bfloat16 (ties to even), returned as the exact float64 values."""
    f = np.asarray(x, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def round_to(x, precision):
    """The float64 values a kernel sees when fed ``x`` in ``precision`` (float32, bfloat16, float64)."""
    if precision == "float64":
        return np.asarray(x, dtype=np.float64)
    if precision == "float32":
        return np.asarray(x, dtype=np.float32).astype(np.float64)
    if precision == "bfloat16":
        return round_to_bfloat16(x)
    raise ValueError(f"precision: {precision!r} not one of {INPUT_PRECISIONS}")


def log_decay(rng, shape, regime):
    """Log-decay ``g <= 0`` of shape ``[B, T, H, K]`` for a named regime."""
    B, T, H, K = shape
    if regime == "none":
        return np.zeros(shape)
    if regime == "weak":
        return -1e-3 * rng.uniform(0.5, 1.5, shape)
    if regime == "moderate":
        return -0.1 * rng.uniform(0.5, 1.5, shape)
    if regime == "strong":
        return -rng.uniform(1.0, 5.0, shape)
    if regime == "extreme":
        return -rng.uniform(20.0, 60.0, shape)
    if regime == "mixed":
        # Per channel a fixed class (no decay / moderate / extreme), per token jitter within it.
        cls = rng.integers(0, 3, (B, 1, H, K))
        scale = np.choose(cls, [0.0, 0.1, 40.0])
        return -scale * rng.uniform(0.5, 1.5, shape)
    if regime == "resets":
        g = -0.05 * rng.uniform(0.5, 1.5, shape)
        reset = rng.random((B, T, H, 1)) < RESET_PROBABILITY
        return np.where(reset, RESET_LOG_DECAY * rng.uniform(0.9, 1.1, shape), g)
    raise ValueError(f"decay: {regime!r} not one of {DECAYS}")


def _gate(rng, shape, kind):
    if kind == "uniform":
        return rng.uniform(0.0, 1.0, shape)
    if kind == "uniform2":
        return rng.uniform(0.0, 2.0, shape)
    if kind == "zero":
        return np.zeros(shape)
    if kind == "one":
        return np.ones(shape)
    raise AssertionError(kind)


def _query_key(rng, shape, mode):
    x = rng.standard_normal(shape)
    if mode == "l2":
        return x / np.linalg.norm(x, axis=-1, keepdims=True)
    if mode == "raw":
        return x / np.sqrt(shape[-1])
    raise ValueError(f"qk: {mode!r} not one of {QK_MODES}")


def make_problem(B, T, H, K, V, *, decay="moderate", gates="uniform", qk="l2",
                 initial_state=False, scale=None, precision="float32", seed=0) -> Problem:
    """A deterministic Problem from ``seed``; inputs rounded to what a ``precision`` kernel sees."""
    for name, n in dict(B=B, T=T, H=H, K=K, V=V).items():
        if not isinstance(n, (int, np.integer)) or n < (0 if name == "T" else 1):
            raise ValueError(f"{name}: expected a positive integer, got {n!r}")
    if gates not in GATES:
        raise ValueError(f"gates: {gates!r} not one of {tuple(GATES)}")
    if precision not in INPUT_PRECISIONS:
        raise ValueError(f"precision: {precision!r} not one of {INPUT_PRECISIONS}")
    rng = np.random.default_rng(seed)
    kshape, vshape = (B, T, H, K), (B, T, H, V)
    erase, write = GATES[gates]
    # Each input is rounded as soon as it is drawn, so at most one raw array is alive at a time.
    arrays = {}
    arrays["q"] = round_to(_query_key(rng, kshape, qk), precision)
    arrays["k"] = round_to(_query_key(rng, kshape, qk), precision)
    arrays["v"] = round_to(rng.standard_normal(vshape), precision)
    arrays["g"] = np.minimum(round_to(log_decay(rng, kshape, decay), precision), 0.0)
    arrays["b"] = round_to(_gate(rng, kshape, erase), precision)
    arrays["w"] = round_to(_gate(rng, vshape, write), precision)
    # The state is float32 in every kernel.
    h0 = round_to(rng.standard_normal((B, H, K, V)), "float32") if initial_state else None
    return Problem(**arrays, scale=scale, initial_state=h0)


def random_cotangents(problem: Problem, seed=0, precision="float32"):
    """Deterministic standard-normal cotangents ``(do, dfinal_state)`` for a problem."""
    B, T, H, K, V = problem.shape
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x6D6E]))
    do = round_to(rng.standard_normal((B, T, H, V)), precision)
    dfs = round_to(rng.standard_normal((B, H, K, V)), "float32")
    return do, dfs
