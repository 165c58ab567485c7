"""The float64 oracle over slices of the batch (or heads) in worker processes, bit for bit the one-process result.

Every (batch, head) pair is an independent recurrence, so contiguous batch ranges (heads when B is smaller
than the number of jobs) are run by ``oracle.recurrence.forward_and_vjp`` in a process pool and concatenated.
Small problems (below ``MIN_WORK`` multiply-adds a token step) stay in this process: spawning costs more.
This module imports no JAX, so the spawned workers start quickly.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os

import numpy as np

from gdn2_oracle import oracle

# B * H * K * V * T below this: not worth the workers' start-up (about a second each).
MIN_WORK = 2**26
# Worker processes of the CLI's oracle (``--jobs``). 1 by default: on a loaded 2-core host, B=8, T=4096, H=6,
# K=V=128 took 42 s in one process and 63 s with 2 workers (the inputs and results, ~3 GB, are pickled).
JOBS = 1


def default_jobs():
    """The number of worker processes by default: the cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _check_jobs(jobs):
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs: expected a positive integer, got {jobs!r}")
    return jobs


def _cut(x, axis, lo, hi):
    return np.take(x, np.arange(lo, hi), axis=axis)


def _sub_problem(problem, do, dfs, axis, lo, hi):
    """The problem restricted to batch (axis 0) or head (axis 2) range [lo, hi), with its cotangents."""
    s_axis = 0 if axis == 0 else 1  # the same dimension in [B, H, K, V] states
    cut = lambda x: _cut(x, axis, lo, hi)  # noqa: E731
    sub = oracle.Problem(**{n: cut(x) for n, x in zip(oracle.INPUTS, problem.inputs())}, scale=problem.scale,
                         initial_state=_cut(problem.h0(), s_axis, lo, hi))
    return sub, cut(do), _cut(dfs, s_axis, lo, hi)


def _solve(args):
    """Worker: the float64 oracle's results of one sub-problem as a dict of arrays."""
    problem, do, dfs = args
    (o, S), grads = oracle.recurrence.forward_and_vjp(problem, do, dfs)
    return {"o": o, "final_state": S, **grads._asdict()}


def reference_results(problem, do, dfinal_state, jobs=None):
    """The float64 oracle's results (as ``ci.harness.reference_results``), computed by ``jobs`` processes."""
    jobs = default_jobs() if jobs is None else _check_jobs(jobs)
    B, T, H, K, V = problem.shape
    axis, n = (0, B) if B >= jobs or B >= H else (2, H)
    parts = min(jobs, n)
    if parts < 2 or B * H * K * V * T < MIN_WORK:
        return _solve((problem, do, dfinal_state))
    edges = np.linspace(0, n, parts + 1).round().astype(int)
    subs = [_sub_problem(problem, do, dfinal_state, axis, lo, hi) for lo, hi in zip(edges[:-1], edges[1:])]
    # spawn: never fork a process that has started JAX's threads
    with concurrent.futures.ProcessPoolExecutor(parts, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = list(pool.map(_solve, subs))
    state_like = ("final_state", "dh0")
    return {name: np.concatenate([r[name] for r in results], axis=(0 if axis == 0 else 1) if name in state_like
                                 else axis) for name in results[0]}
