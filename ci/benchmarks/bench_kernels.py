"""Benchmark (not a test): forward+backward time of the chunked kernels vs the machine's matmul floor.

    python -m gdn2_oracle.ci.benchmarks.bench_kernels --batch 4 --seq 4096 --heads 6 --dim 128 --chunk 64 --repeats 5

Times the harness's jitted ``jax.vjp`` + pullback (all seven gradients; ``ci.running.harness.runner``), float32,
median of synchronized calls after compilation; FLOPs of the chunked algorithm are counted analytically
(``chunked_flops``). ``--chunk`` defaults to the kernels' default chunk size.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

from gdn2_oracle import kernels
from gdn2_oracle.ci.running import harness
from gdn2_oracle.oracle import Recipe


def chunked_flops(B, T, H, K, V, C):
    """Matmul FLOPs (2 per multiply-add) of forward + backward, triangular tiles counted as triangles.

    Per chunk, forward: score tiles T, Aqk 2C(C+1)K; Ebar S0, (gamma q) S0, Kd^T R 6CKV; WY solve C(C-1)V;
    Aqk R C(C+1)V. Backward: recompute (tiles, Ebar S0, solve) then Aqk^T dO, dO R^T, A^T dR, dX R^T
    (~5C^2 V), Kd dS, dO S0^T, R dS^T, Qg^T dO, dX S0^T, Ebar^T dX (12CKV) and the tile VJPs 4C(C+1)K.
    """
    fwd = 2 * C * (C + 1) * K + 6 * C * K * V + 2 * C * C * V
    bwd = 6 * C * (C + 1) * K + 14 * C * K * V + (5 * C * C - C) * V
    return B * H * (-(-T // C)) * (fwd + bwd)


def median_time(fn, args, repeats):
    """Median wall time of ``fn(*args)`` (synchronized) over ``repeats`` calls after one warm-up call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_rate(shape, repeats):
    """FLOP/s of a jitted float32 HIGHEST batched matmul [b, m, n] @ [b, n, p]."""
    b, m, n, p = shape
    x = jnp.ones((b, m, n), jnp.float32)
    y = jnp.ones((b, n, p), jnp.float32)
    f = jax.jit(lambda x, y: jnp.einsum("bmn,bnp->bmp", x, y, precision=jax.lax.Precision.HIGHEST))
    return 2 * b * m * n * p / median_time(f, (x, y), repeats)


def make_args(B, T, H, K, V, seed=0):
    """The runner's arguments for a moderate-decay float32 problem with an initial state and random cotangents."""
    p, do, dfs = Recipe(B, T, H, K, V, decay="moderate", initial_state=True, seed=seed).build()
    return (*harness.device_inputs(p, do, dfs, "float32"), p.scale)


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--dim", type=int, default=128, help="key width K (and value width V unless --vdim)")
    p.add_argument("--vdim", type=int, default=None)
    p.add_argument("--chunk", type=int, default=kernels.get("pairwise").chunk_size)
    p.add_argument("--leaf", type=int, default=None, help="factorized leaf (default: the kernel's default)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--kernels", default="pairwise,factorized")
    return p


def main(argv=None):
    a = build_parser().parse_args(argv)
    B, T, H, K, C = a.batch, a.seq, a.heads, a.dim, a.chunk
    V = a.vdim or K
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; B={B} T={T} H={H} K={K} V={V} C={C}")
    peak = matmul_rate((1, 2048, 2048, 2048), a.repeats)
    tile = matmul_rate((B * H * 8, C, K, V), a.repeats)
    flops = chunked_flops(B, T, H, K, V, C)
    floor = flops / peak
    print(f"matmul rate: {peak / 1e9:.1f} GFLOP/s (2048^3), {tile / 1e9:.1f} GFLOP/s (batched {C}x{K}x{V})")
    print(f"chunked fwd+bwd matmul FLOPs: {flops / 1e9:.2f} G -> floor {floor * 1e3:.1f} ms at peak rate")
    args = make_args(B, T, H, K, V)
    medians = {}
    for name in a.kernels.split(","):
        opts = dict(chunk_size=C)
        if name == "factorized" and a.leaf is not None:
            opts["leaf"] = a.leaf
        fn = harness.runner(kernels.get(name, **opts))
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        compile_s = time.perf_counter() - t0
        medians[name] = median_time(fn, args, a.repeats)
        print(f"{name:>11}: median {medians[name] * 1e3:9.1f} ms  ({medians[name] / floor:5.1f}x floor, "
              f"{flops / medians[name] / 1e9:5.1f} GFLOP/s; first call incl. compile {compile_s:.1f} s)")
    if {"pairwise", "factorized"} <= set(medians):
        print(f"speed-up factorized vs pairwise: {medians['pairwise'] / medians['factorized']:.2f}x")


if __name__ == "__main__":
    main()
