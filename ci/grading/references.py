"""The float64 oracle's results of a problem: the one ``reference_results``, in this process or in workers.

Every (batch, head) pair is an independent recurrence, so a large problem is split into contiguous batch
ranges (heads when B is smaller than the number of jobs) run in spawned worker processes, bit for bit the
one-process result. Inputs and results travel through memory-mapped files (``/dev/shm`` when it has room),
so nothing but paths and shapes is pickled. No JAX here, so workers start quickly; the multi-host variant
is ``ci/running/multihost.py``.
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import multiprocessing
import os
import tempfile
import warnings

import numpy as np

from gdn2_oracle import oracle
from gdn2_oracle.golden.processes import default_jobs, terminate_workers

# B * H * K * V * T below this (about a second of oracle work): not worth the workers' start-up.
MIN_WORK = 2**26
# Worker processes of the CLI's oracle (``--jobs``); None: one a core (``default_jobs``).
JOBS = None
STATES = ("initial_state", "dfinal_state", "final_state", "dh0")  # [B, H, K, V]: the head axis is 1, not 2


def _check_jobs(jobs):
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs: expected a positive integer, got {jobs!r}")
    return jobs


def _solve(problem, do, dfs):
    """The float64 oracle's forward and VJP of one problem in this process, by name (``oracle.RESULTS``)."""
    return oracle.named_results(*oracle.recurrence.forward_and_vjp(problem, do, dfs))


def slices(n, parts):
    """``parts`` contiguous ranges ``(lo, hi)`` covering ``range(n)`` as evenly as possible."""
    edges = np.linspace(0, n, parts + 1).round().astype(int)
    return [(int(lo), int(hi)) for lo, hi in zip(edges[:-1], edges[1:])]


def slice_dim(name, axis):
    """The dimension of input or result ``name`` that is the batch (``axis`` 0) or the heads (``axis`` 2):
    states ``[B, H, K, V]`` carry the heads on dimension 1."""
    return 1 if axis == 2 and name in STATES else axis


def slice_index(name, axis, lo, hi):
    """The index of batch (axis 0) or head (axis 2) range [lo, hi) in input or result ``name``."""
    return (slice(None),) * slice_dim(name, axis) + (slice(lo, hi),)


def _arrays(problem, do, dfs):
    """Every input array of the oracle by name (float64)."""
    named = dict(zip(oracle.INPUTS, problem.inputs()), initial_state=problem.h0(), do=do, dfinal_state=dfs)
    return {name: np.asarray(a, np.float64) for name, a in named.items()}


def result_shapes(shape):
    """Each result's shape for a ``(B, T, H, K, V)`` problem (``oracle.RESULTS`` order)."""
    B, T, H, K, V = shape
    keys, values, states = (B, T, H, K), (B, T, H, V), (B, H, K, V)
    own = {"o": values, "final_state": states, "dh0": states, "dv": values, "dw": values}
    return {name: own.get(name, keys) for name in oracle.RESULTS}


def _sub_problem(arrays, scale, axis, lo, hi):
    """``(problem, do, dfinal_state)`` restricted to batch or head range [lo, hi)."""
    cut = {name: arrays[name][slice_index(name, axis, lo, hi)] for name in arrays}
    problem = oracle.Problem(**{n: cut[n] for n in oracle.INPUTS}, scale=scale, initial_state=cut["initial_state"])
    return problem, cut["do"], cut["dfinal_state"]


def sub_problem(problem, do, dfinal_state, axis, lo, hi):
    """``(problem, do, dfinal_state)`` restricted to batch (``axis`` 0) or head (``axis`` 2) range [lo, hi)."""
    return _sub_problem(_arrays(problem, do, dfinal_state), problem.scale, axis, lo, hi)


def split_axis(shape, parts):
    """``(axis, n)``: split a ``(B, T, H, K, V)`` problem ``parts`` ways over the batch (axis 0), or over the
    heads (axis 2) when B is smaller than ``parts`` and than H."""
    B, _, H, _, _ = shape
    return (0, B) if B >= parts or B >= H else (2, H)


def _scratch_dir(nbytes):
    """A directory for ``nbytes`` of scratch arrays: ``/dev/shm`` (memory) when it has room, else the temp dir."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        st = os.statvfs(shm)
        if st.f_bavail * st.f_frsize > 1.1 * nbytes:
            return shm
    return None


def _files(directory, shapes):
    """``{name: (path, shape)}``: where each named float64 array lives in ``directory``."""
    return {name: (os.path.join(directory, f"{name}.f64"), shape) for name, shape in shapes.items()}


def _mapped(files, mode):
    """The named arrays of ``files`` mapped into memory (``np.memmap``; writes are seen by every process)."""
    return {name: np.memmap(path, np.float64, mode, shape=shape) for name, (path, shape) in files.items()}


def _solve_slice(task):
    """Worker: the oracle on one batch/head range, read from and written to the mapped files."""
    src_files, dst_files, scale, axis, lo, hi = task
    src, dst = _mapped(src_files, "r"), _mapped(dst_files, "r+")
    for name, a in _solve(*_sub_problem(src, scale, axis, lo, hi)).items():
        dst[name][slice_index(name, axis, lo, hi)] = a


class OracleWorkersFailed(RuntimeWarning):
    """The oracle's worker processes or their shared files failed; the reference was computed in this process."""


def reference_results(problem, do, dfinal_state, jobs=None):
    """The float64 oracle's results by name, computed by ``jobs`` worker processes (default :data:`JOBS`, else one a
    core); small problems stay in this process. A fault of the workers' machinery (a worker killed, shared memory
    missing or read-only) is the oracle's, never the kernel's: it warns (:class:`OracleWorkersFailed`) and computes
    the reference here instead, with the same bits."""
    jobs = (default_jobs() if JOBS is None else JOBS) if jobs is None else _check_jobs(jobs)
    B, T, H, K, V = problem.shape
    axis, n = split_axis(problem.shape, jobs)
    parts = min(jobs, n)
    if parts < 2 or B * H * K * V * T < MIN_WORK:
        return _solve(problem, do, dfinal_state)
    try:
        return _in_workers(problem, do, dfinal_state, axis, n, parts)
    except (OSError, concurrent.futures.process.BrokenProcessPool) as exc:
        warnings.warn(OracleWorkersFailed(f"the float64 oracle's {parts} worker processes failed "
                                          f"({type(exc).__name__}: {exc}); computing it in this process"),
                      stacklevel=2)
        return _solve(problem, do, dfinal_state)


def _in_workers(problem, do, dfinal_state, axis, n, parts):
    """The oracle over ``parts`` batch/head slices in spawned workers, through memory-mapped files."""
    arrays = _arrays(problem, do, dfinal_state)
    shapes = result_shapes(problem.shape)
    nbytes = 8 * sum(int(np.prod(shape)) for shape in [*shapes.values(), *(a.shape for a in arrays.values())])
    with tempfile.TemporaryDirectory(prefix="gdn2-oracle-", dir=_scratch_dir(nbytes),
                                     ignore_cleanup_errors=True) as directory:
        src_files = _files(directory, {name: a.shape for name, a in arrays.items()})
        for name, a in _mapped(src_files, "w+").items():
            a[...] = arrays[name]
        del arrays
        dst_files = _files(directory, shapes)
        results = _mapped(dst_files, "w+")
        tasks = [(src_files, dst_files, problem.scale, axis, lo, hi) for lo, hi in slices(n, parts)]
        # spawn: never fork a process that has started JAX's threads
        with concurrent.futures.ProcessPoolExecutor(parts, mp_context=multiprocessing.get_context("spawn")) as pool:
            try:
                list(pool.map(_solve_slice, tasks))
            except BaseException:  # Ctrl-C, SIGTERM or a failed worker: stop the others now, leave no orphan
                terminate_workers(pool)
                raise
    # plain arrays over the workers' pages, no copy: a mapping outlives its file's name (POSIX)
    return {name: a.view(np.ndarray) for name, a in results.items()}
