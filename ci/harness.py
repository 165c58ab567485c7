"""Run a kernel with the contract of docs/DESIGN.md §2 on an oracle Problem: forward and all seven gradients."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from gdn2_oracle import oracle
from gdn2_oracle.oracle import KERNEL_DTYPES, RESULTS

from .tolerance import Report, baseline, compare, dtype_name


def _check_dtype(dtype):
    """The JAX dtype of a kernel input dtype name (one of ``oracle.KERNEL_DTYPES``)."""
    if dtype not in KERNEL_DTYPES:
        raise ValueError(f"dtype: {dtype!r} not one of {KERNEL_DTYPES}")
    return jnp.dtype(dtype)


@functools.lru_cache(maxsize=None)
def runner(fn):
    """A jitted ``(inputs, h0, do, dfs, scale) -> results`` for kernel ``fn`` (compiled once per shape)."""

    def run(inputs, h0, do, dfs, scale):
        def call(q, k, v, g, b, w, h0):
            return fn(q, k, v, g, b, w, scale=scale, initial_state=h0)

        (o, S), pullback = jax.vjp(call, *inputs, h0)
        grads = pullback((do.astype(o.dtype), dfs))
        return (o, S) + tuple(grads)

    return jax.jit(run, static_argnames="scale")


def device_inputs(problem: oracle.Problem, do, dfinal_state, dtype="float32"):
    """The problem's inputs and cotangents as JAX arrays in the kernel's input dtype."""
    jdt = _check_dtype(dtype)
    inputs = tuple(jnp.asarray(x, dtype=jdt) for x in problem.inputs())
    h0 = jnp.asarray(problem.h0(), dtype=jnp.float32)
    return inputs, h0, jnp.asarray(do, dtype=jdt), jnp.asarray(dfinal_state, dtype=jnp.float32)


def kernel_results(fn, problem: oracle.Problem, do, dfinal_state, *, dtype="float32"):
    """``{name: np.ndarray}`` for o, final_state and the seven gradients, in the dtypes the kernel returned.

    The kernel sees exactly the problem's values (they are representable in ``dtype`` when the
    problem was generated or rounded for it; otherwise the rounding is the caller's choice).
    """
    inputs, h0, jdo, jdfs = device_inputs(problem, do, dfinal_state, dtype)
    out = runner(fn)(inputs, h0, jdo, jdfs, problem.scale)
    out = jax.block_until_ready(out)
    return {name: np.asarray(x) for name, x in zip(RESULTS, out)}


def reference_results(problem: oracle.Problem, do, dfinal_state):
    """The NumPy float64 oracle's results as a mapping over RESULTS."""
    (o, S), grads = oracle.recurrence.forward_and_vjp(problem, do, dfinal_state)
    return {"o": o, "final_state": S, **grads._asdict()}


def check_representable(problem: oracle.Problem, dtype):
    """Raise ValueError if the problem's inputs are not exactly representable in ``dtype``."""
    jdt = _check_dtype(dtype)
    for name, x in zip(oracle.INPUTS, problem.inputs()):
        if not np.array_equal(np.asarray(jnp.asarray(x, dtype=jdt), dtype=np.float64), x):
            raise ValueError(f"{name}: values are not exactly representable in {dtype}; "
                             f"generate the problem with precision={dtype!r}")


def validate(fn, problem: oracle.Problem, do, dfinal_state, *, dtype="float32", ref=None) -> Report:
    """Run ``fn`` and judge it against the float64 oracle (or a given reference, e.g. a golden)."""
    check_representable(problem, dtype)
    got = kernel_results(fn, problem, do, dfinal_state, dtype=dtype)
    if ref is None:
        ref = reference_results(problem, do, dfinal_state)
    base = baseline(problem, do, dfinal_state, {n: dtype_name(got[n]) for n in RESULTS})
    return compare(problem, do, dfinal_state, got, ref, dtype=dtype, base=base)
