"""Benchmark of the exact oracles (a script, not a timed test).

NumPy float64 forward + VJP at the seed benchmark shape (B=8, T=4096, H=6, K=V=128) and
mpmath forward + VJP at T=64, K=V=16, 256 bits: wall time and peak resident memory.

    python -m gdn2_oracle.ci.benchmarks.bench_oracle [--numpy-shape 8,4096,6,128,128] [--skip-mp]
    python -m gdn2_oracle.ci.benchmarks.bench_oracle --jobs 1 2 --repeats 3 --skip-mp

Every NumPy time is also given as a ratio to a pure-Python yardstick timed in the same run
(``python3 -c "sum(i*i for i in range(30_000_000))"``, median of ``--repeats``), so that runs on a
loaded or a different machine compare; and as traffic over the state: the passes over a state-sized
array each token makes (``recurrence.STATE_PASSES``) times the state's size and T, per second, next to
the machine's single-thread memory bandwidth (a NumPy copy of ``--bandwidth-mib`` MiB, median of 5).

``--jobs N ...``: the float64 forward + VJP through ``ci.grading.references`` with each worker count, runs
interleaved (yardstick, 1, 2, yardstick, 1, 2, ...) so that load on the machine hits every count alike;
medians, the speed-up over the first count, and a bit-for-bit check of every result against the first
count's.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time

import numpy as np

from gdn2_oracle import oracle
from gdn2_oracle.ci.grading import references
from gdn2_oracle.oracle import mp, recurrence

BANDWIDTH_RUNS = 5


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
    parser.add_argument("--repeats", type=int, default=3, help="runs a worker count (with --jobs), and of the "
                        "pure-Python yardstick")
    parser.add_argument("--yardstick", type=int, default=30_000_000, metavar="N",
                        help="the pure-Python yardstick: sum(i*i for i in range(N)) (0: none)")
    parser.add_argument("--bandwidth-mib", type=int, default=512, metavar="MIB",
                        help="array size of the memory-bandwidth measurement (0: none)")
    return parser


def yardstick(n):
    """Seconds of ``python3 -c "sum(i*i for i in range(n))"`` in a fresh interpreter (this one's executable)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"sum(i*i for i in range({n}))"], check=True)
    return time.perf_counter() - t0


def memory_bandwidth(mib, runs=BANDWIDTH_RUNS):
    """Single-thread memory bandwidth in GB/s (bytes read + written), median of ``runs`` NumPy copies of ``mib``
    MiB (far beyond the caches), with every run's figure."""
    src = np.ones(mib * 2**20 // 8)
    dst = np.ones_like(src)  # touched: no page faults in the timed copies
    rates = []
    for _ in range(runs):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        rates.append(2 * src.nbytes / (time.perf_counter() - t0) / 1e9)
    return float(np.median(rates)), rates


def state_traffic(shape, seconds, passes):
    """``(GB, GB/s)``: ``passes`` over the float64 state of every (batch, head) pair a token, over T tokens."""
    B, T, H, K, V = shape
    gb = passes * B * H * K * V * 8 * T / 1e9
    return gb, gb / seconds


def _traffic_line(shape, seconds, passes, bandwidth):
    gb, rate = state_traffic(shape, seconds, passes)
    vs = f" = {rate / bandwidth:.1f}x the measured memory bandwidth" if bandwidth else ""
    return f"{passes} passes over the state a token: {gb:.3g} GB of state traffic at {rate:.3g} GB/s{vs}"


def _ratio(seconds, yard):
    return f" = {seconds / yard:.2f}x the yardstick" if yard else ""


def _yardstick_line(n, times):
    return (f"pure-Python yardstick sum(i*i for i in range({n:_})): median {np.median(times):.2f} s of "
            f"{', '.join(f'{t:.2f}' for t in times)}")


def _bandwidth(mib):
    if not mib:
        return None
    rate, rates = memory_bandwidth(mib)
    print(f"memory bandwidth, one thread (NumPy copy of {mib} MiB, read + write; median of {len(rates)}): "
          f"{rate:.1f} GB/s of {', '.join(f'{r:.1f}' for r in rates)}")
    return rate


def main(argv=None):
    args = build_parser().parse_args(argv)
    if not args.skip_numpy:
        print("(the machine may be shared with other jobs: compare the ratios to the yardstick)")
        shape = tuple(int(x) for x in args.numpy_shape.split(","))
        if args.jobs:
            compare_jobs(shape, args.jobs, args.repeats, args.yardstick, args.bandwidth_mib)
        else:
            single_run(shape, args.repeats, args.yardstick, args.bandwidth_mib)
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


def single_run(shape, repeats, n_yard, bandwidth_mib):
    """One float64 forward + VJP and one forward in this process: time, peak memory, ratio and state traffic.
    The memory bandwidth is measured last (its arrays would count in the peak)."""
    yard = [yardstick(n_yard) for _ in range(repeats)] if n_yard else []
    p = oracle.make_problem(*shape, decay="moderate", initial_state=True, seed=0)
    do, dfs = oracle.random_cotangents(p)
    base = _peak_rss_gib()
    t0 = time.perf_counter()
    (o, S), grads = recurrence.forward_and_vjp(p, do, dfs)
    both = time.perf_counter() - t0
    peak = _peak_rss_gib()
    del o, S, grads
    t0 = time.perf_counter()
    recurrence.forward(p)
    fwd = time.perf_counter() - t0
    del p, do, dfs
    if yard:
        print(_yardstick_line(n_yard, yard))
    yard = float(np.median(yard)) if yard else None
    bandwidth = _bandwidth(bandwidth_mib)
    print(f"numpy float64 {shape}: forward + VJP {both:.1f} s{_ratio(both, yard)}; peak RSS {peak:.2f} GiB "
          f"(inputs and cotangents alone {base:.2f} GiB)\n    "
          + _traffic_line(shape, both, sum(recurrence.STATE_PASSES.values()), bandwidth))
    print(f"numpy float64 {shape}: forward alone {fwd:.1f} s{_ratio(fwd, yard)}\n    "
          + _traffic_line(shape, fwd, recurrence.STATE_PASSES["forward"], bandwidth))


def compare_jobs(shape, jobs, repeats, n_yard=0, bandwidth_mib=0):
    """Median wall time of ``references.reference_results`` per worker count, interleaved with the yardstick;
    bit-for-bit check."""
    p = oracle.make_problem(*shape, decay="moderate", initial_state=True, seed=0)
    do, dfs = oracle.random_cotangents(p)
    times, first, yard = {n: [] for n in jobs}, None, []
    for _ in range(repeats):
        if n_yard:
            yard.append(yardstick(n_yard))
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
    del first
    if yard:
        print(_yardstick_line(n_yard, yard))
    yard = float(np.median(yard)) if yard else None
    bandwidth = _bandwidth(bandwidth_mib)
    base = float(np.median(times[jobs[0]]))
    passes = sum(recurrence.STATE_PASSES.values())
    for n in jobs:
        med = float(np.median(times[n]))
        print(f"numpy float64 {shape} forward + VJP, {n} worker(s): median {med:.1f} s of "
              f"{', '.join(f'{t:.1f}' for t in times[n])}{_ratio(med, yard)}; speed-up over {jobs[0]}: "
              f"{base / med:.2f}x\n    " + _traffic_line(shape, med, passes, bandwidth))
    print("results identical bit for bit across worker counts")


if __name__ == "__main__":
    main()
