"""Benchmark (not a test): the ``ci.cost`` counter + roofline on this CPU vs measured time.

    python ci/benchmarks/cost_cpu_sanity.py [--shape 1,1024,2,128,128] [--repeats 5]

Measures this machine's matmul rate (float32, HIGHEST), fused vector rate, ``exp`` rate and memory
bandwidth; counts the pure-JAX kernels' forward + backward jaxpr with ``cost_model.count_jaxpr``; turns
the counts into a roofline time (the slowest unit; memory bytes bracketed between the program's own
inputs/outputs and every unfused intermediate written and read once) and prints it beside the median
measured time. The ratio measured / estimate is how far the model is off on a machine we can time.
"""

from __future__ import annotations

import argparse
import math

import jax
import jax.numpy as jnp

from gdn2_oracle import kernels
from gdn2_oracle.ci.benchmarks.bench_kernels import median_time
from gdn2_oracle.ci.commands.cost import parse_shape
from gdn2_oracle.ci.running import cost_model as cost
from gdn2_oracle.kernels.contract import MATMUL_PRECISION


def machine_rates(repeats=5) -> dict:
    """Measured float32 matmul FLOP/s, fused vector op/s, exp/s and memory bytes/s of this device."""
    n = 1024
    a = jnp.ones((n, n), jnp.float32)
    mm = jax.jit(lambda x, y: jnp.dot(x, y, precision=MATMUL_PRECISION))
    t_mm = median_time(mm, (a, a), repeats)
    big = jnp.ones((1 << 25,), jnp.float32)  # 128 MiB: out of cache
    t_bw = median_time(jax.jit(lambda x: x + 1.0), (big,), repeats)
    small = jnp.ones((1 << 20,), jnp.float32)
    chain = 32

    def fma(x):
        for _ in range(chain):
            x = x * 1.0001 + 0.5
        return x

    def exps(x):
        for _ in range(chain):
            x = jnp.exp(x * -0.001)
        return x

    t_vec = median_time(jax.jit(fma), (small,), repeats)
    t_exp = median_time(jax.jit(exps), (small,), repeats)
    return dict(matmul=2 * n**3 / t_mm, memory=2 * big.nbytes / t_bw, vector=2 * chain * small.size / t_vec,
                exp=chain * small.size / t_exp)


def _bytes(avals):
    return sum(math.prod(a.shape) * jnp.dtype(a.dtype).itemsize for a in avals if hasattr(a, "shape"))


def unfused_bytes(jaxpr) -> float:
    """Every non-move intermediate written once and read once (scan bodies times their length)."""
    total = 0.0
    for eqn in jaxpr.eqns:
        inner = list(cost.inner_jaxprs(eqn))
        if eqn.primitive.name == "scan":
            total += eqn.params["length"] * unfused_bytes(eqn.params["jaxpr"].jaxpr)
        elif inner and eqn.primitive.name != "cond":
            total += unfused_bytes(inner[0])
        elif eqn.primitive.name not in cost.MOVES:
            total += 2 * _bytes(v.aval for v in eqn.outvars)
    return total


def inputs(shape, seed=0):
    B, T, H, K, V = shape
    ks = jax.random.split(jax.random.PRNGKey(seed), 7)
    def nrm(x):
        return x / jnp.linalg.norm(x, axis=-1, keepdims=True)

    q = nrm(jax.random.normal(ks[0], (B, T, H, K)))
    k = nrm(jax.random.normal(ks[1], (B, T, H, K)))
    v = jax.random.normal(ks[2], (B, T, H, V))
    g = -0.05 * jax.random.uniform(ks[3], (B, T, H, K))
    b = jax.random.uniform(ks[4], (B, T, H, K))
    w = jax.random.uniform(ks[5], (B, T, H, V))
    h0 = jnp.zeros((B, H, K, V))
    do = jax.random.normal(ks[6], (B, T, H, V))
    return q, k, v, g, b, w, h0, do, jnp.zeros((B, H, K, V))


def compare(name, shape, rates, repeats=5) -> dict:
    """Counted roofline estimate vs measured forward + backward seconds of one pure-JAX kernel."""
    fn = kernels.get(name)
    closed = cost.fwd_bwd_jaxpr(fn, shape, "float32")
    c = cost.count_jaxpr(closed.jaxpr)
    io = _bytes(v.aval for v in closed.jaxpr.invars) + _bytes(v.aval for v in closed.jaxpr.outvars)
    unf = unfused_bytes(closed.jaxpr)
    parts = dict(mxu=c.flops / rates["matmul"], vpu=c.vector_ops / rates["vector"],
                 exp=c.transcendentals / rates["exp"])
    low = max(*parts.values(), io / rates["memory"])
    high = sum(parts.values()) + unf / rates["memory"]

    def fwd_bwd(q, k, v, g, b, w, h0, do, dfs):
        out, vjp = jax.vjp(lambda *a: fn(*a[:6], initial_state=a[6]), q, k, v, g, b, w, h0)
        return vjp((do, dfs))

    measured = median_time(jax.jit(fwd_bwd), tuple(inputs(shape)), repeats)
    return dict(kernel=name, flops=c.flops, vector_ops=c.vector_ops, exps=c.transcendentals, io_bytes=io,
                unfused_bytes=unf, roofline=low, serial=high, measured=measured, parts=parts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=parse_shape, default=(1, 1024, 2, 128, 128), metavar="B,T,H,K,V")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    rates = machine_rates(args.repeats)
    print(f"device {jax.devices()[0].device_kind}: matmul {rates['matmul'] / 1e9:.1f} GFLOP/s, vector "
          f"{rates['vector'] / 1e9:.2f} Gop/s, exp {rates['exp'] / 1e9:.2f} G/s, "
          f"memory {rates['memory'] / 1e9:.1f} GB/s")
    print(f"{'kernel':<11} {'GFLOP':>7} {'Gvec':>7} {'Gexp':>7} {'roofline ms':>12} {'serial ms':>10} "
          f"{'measured ms':>12} {'meas/roof':>9} {'meas/serial':>11}")
    for name in ("pairwise", "factorized"):
        r = compare(name, args.shape, rates, args.repeats)
        print(f"{name:<11} {r['flops'] / 1e9:7.2f} {r['vector_ops'] / 1e9:7.2f} {r['exps'] / 1e9:7.3f} "
              f"{r['roofline'] * 1e3:12.2f} {r['serial'] * 1e3:10.2f} {r['measured'] * 1e3:12.2f} "
              f"{r['measured'] / r['roofline']:9.2f} {r['measured'] / r['serial']:11.2f}")


if __name__ == "__main__":
    main()
