"""The float64 oracle split over the processes (hosts) of a multi-host run, each host computing its share.

Under ``jax.distributed.initialize()`` every host holds the same seed-determined problem. Host ``i`` of ``n``
computes the oracle of the ``i``-th contiguous range of batch entries (of heads when B is smaller than ``n``
and than H) with its own worker processes (``ci.grading.references``), and the hosts exchange their results with
``multihost_utils.process_allgather`` (the float64 bits travel as uint32 pairs, so no precision is lost and
x64 need not be on). Every host ends with the whole reference, bit for bit a one-process run's, at ``1/n``
of the oracle's cost; on one process this is ``ci.grading.references.reference_results``.
"""

from __future__ import annotations

import jax
import numpy as np

from ..grading import references


def initialize(coordinator=None, num_processes=None, process_id=None):
    """``jax.distributed.initialize``: auto-detected on Cloud TPU, SLURM, Open MPI, ... when nothing is given;
    else ``coordinator`` (or env ``JAX_COORDINATOR_ADDRESS``) with ``num_processes`` and ``process_id``."""
    if (num_processes is None) != (process_id is None):
        raise ValueError("process_id: --num-processes and --process-id go together")
    if num_processes is not None:
        if num_processes < 1:
            raise ValueError(f"num_processes: expected a positive integer, got {num_processes}")
        if not 0 <= process_id < num_processes:
            raise ValueError(f"process_id: expected 0 <= process_id < {num_processes}, got {process_id}")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)


def _allgather_bits(a):
    """``[n, *a.shape]``: every process's float64 array ``a``, bit for bit."""
    from jax.experimental import multihost_utils

    bits = np.ascontiguousarray(a, np.float64).view(np.uint32)
    return np.asarray(multihost_utils.process_allgather(bits, tiled=False)).view(np.float64)


def reference_results(problem, do, dfinal_state):
    """The float64 oracle's results by name (as ``references.reference_results``), each host computing its share."""
    count = jax.process_count()
    if count == 1:
        return references.reference_results(problem, do, dfinal_state)
    axis, n = references.split_axis(problem.shape, count)
    ranges = references.slices(n, count)
    lo, hi = ranges[jax.process_index()]
    width = max(b - a for a, b in ranges)  # every process sends the same shape; short shares are padded
    mine = (references.reference_results(*references.sub_problem(problem, do, dfinal_state, axis, lo, hi))
            if hi > lo else None)
    results = {}
    for name, shape in references.result_shapes(problem.shape).items():
        dim = references.slice_dim(name, axis)
        padded = np.zeros(shape[:dim] + (width,) + shape[dim + 1:])
        if mine is not None:
            padded[references.slice_index(name, axis, 0, hi - lo)] = mine[name]
        gathered = _allgather_bits(padded)
        results[name] = np.concatenate([g[references.slice_index(name, axis, 0, b - a)]
                                        for g, (a, b) in zip(gathered, ranges)], axis=dim)
    return results
