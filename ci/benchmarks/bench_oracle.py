"""Benchmark of the exact oracles (a script, not a timed test).

NumPy float64 forward + VJP at the seed benchmark shape (B=8, T=4096, H=6, K=V=128) and
mpmath forward + VJP at T=64, K=V=16, 256 bits: wall time and peak resident memory.

    python -m gdn2_oracle.ci.benchmarks.bench_oracle [--numpy-shape 8,4096,6,128,128] [--skip-mp]
    python -m gdn2_oracle.ci.benchmarks.bench_oracle --jobs 1 2 --repeats 3 --skip-mp

``--jobs N ...``: the float64 forward + VJP through ``ci.references`` with each worker count, runs
interleaved (1, 2, 1, 2, ...) so that load on the machine hits every count alike; medians, the speed-up over
the first count, and a bit-for-bit check of every result against the first count's.
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from gdn2_oracle import oracle
from gdn2_oracle.ci.grading import references
from gdn2_oracle.oracle import mp, recurrence


def _peak_rss_gib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numpy-shape", default="8,4096,6,128,128", help="B,T,H,K,V")
    parser.add_argument("--mp-shape", default="1,64,1,16,16", help="B,T,H,K,V")
    parser.add_argument("--prec", type=int, default=256)
    parser.add_argument("--skip-mp", action="store_true")
    parser.add_argument("--skip-numpy", action="store_true")
    parser.add_argument("--jobs", type=int, nargs="+", metavar="N", help="compare these worker counts")
    parser.add_argument("--repeats", type=int, default=3, help="runs a worker count (with --jobs)")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.jobs and not args.skip_numpy:
        compare_jobs(tuple(int(x) for x in args.numpy_shape.split(",")), args.jobs, args.repeats)
    elif not args.skip_numpy:
        shape = tuple(int(x) for x in args.numpy_shape.split(","))
        p = oracle.make_problem(*shape, decay="moderate", initial_state=True, seed=0)
        do, dfs = oracle.random_cotangents(p)
        base = _peak_rss_gib()
        t0 = time.perf_counter()
        (o, S), grads = recurrence.forward_and_vjp(p, do, dfs)
        t1 = time.perf_counter()
        print(f"numpy float64 {shape}: forward + VJP {t1 - t0:.1f} s; peak RSS {_peak_rss_gib():.2f} GiB "
              f"(inputs and cotangents alone {base:.2f} GiB)")
        del o, S, grads
        t0 = time.perf_counter()
        recurrence.forward(p)
        print(f"numpy float64 {shape}: forward alone {time.perf_counter() - t0:.1f} s")
    if not args.skip_mp:
        shape = tuple(int(x) for x in args.mp_shape.split(","))
        p = oracle.make_problem(*shape, decay="moderate", initial_state=True, seed=0)
        do, dfs = oracle.random_cotangents(p)
        t0 = time.perf_counter()
        fwd = mp.forward(p, prec=args.prec)
        t1 = time.perf_counter()
        grads = mp.vjp(p, do, dfs, prec=args.prec)
        t2 = time.perf_counter()
        worst = max(float(np.max(e)) for e in list(fwd.errors.values()) + list(grads.errors.values()))
        print(f"mpmath {args.prec} bits {shape}: forward {t1 - t0:.1f} s, vjp {t2 - t1:.1f} s "
              f"(each includes the {2 * args.prec}-bit error-estimate run); largest error estimate {worst:.1e}")


def compare_jobs(shape, jobs, repeats):
    """Median wall time of ``references.reference_results`` per worker count, interleaved; bit-for-bit check."""
    p = oracle.make_problem(*shape, decay="moderate", initial_state=True, seed=0)
    do, dfs = oracle.random_cotangents(p)
    times, first = {n: [] for n in jobs}, None
    for _ in range(repeats):
        for n in jobs:
            t0 = time.perf_counter()
            results = references.reference_results(p, do, dfs, jobs=n)
            times[n].append(time.perf_counter() - t0)
            if first is None:
                first = results
            else:
                for name, a in results.items():
                    np.testing.assert_array_equal(a, first[name], err_msg=f"{name} with {n} workers")
            del results
    base = float(np.median(times[jobs[0]]))
    for n in jobs:
        med = float(np.median(times[n]))
        print(f"numpy float64 {shape} forward + VJP, {n} worker(s): median {med:.1f} s of "
              f"{', '.join(f'{t:.1f}' for t in times[n])}; speed-up over {jobs[0]}: {base / med:.2f}x")
    print("results identical bit for bit across worker counts")


if __name__ == "__main__":
    main()
