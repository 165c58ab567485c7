"""The float64 oracle split over the processes (hosts) of a multi-host run, each host computing its share.

Under ``jax.distributed.initialize()`` every host holds the same seed-determined problem. Host ``i`` of ``n``
computes the oracle of the ``i``-th contiguous range of batch entries (of heads when B is smaller than ``n``
and than H) with its own worker processes (``ci.grading.references``), and the hosts exchange their results with
``multihost_utils.process_allgather`` (the float64 bits travel as uint32 pairs, so no precision is lost and
x64 need not be on). Every host ends with the whole reference, bit for bit a one-process run's, at ``1/n``
of the oracle's cost; on one process this is ``ci.grading.references.reference_results``.
"""

from __future__ import annotations

import os
import socket
import threading

import jax
import numpy as np

from ..grading import references

# Seconds a process waits for the others to join (``--init-timeout``).
INIT_TIMEOUT = 300
JOINING = "jax.distributed.initialize"  # the name of the thread that waits in JAX


def joining():
    """Whether a start-up is still blocked in JAX (then the process must end without interpreter teardown)."""
    return any(t.name == JOINING and t.is_alive() for t in threading.enumerate())


def parse_coordinator(text):
    """``"HOST:PORT"`` -> ``(host, port)``; ValueError naming ``coordinator`` unless PORT is 1..65535."""
    host, colon, port = str(text).rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"coordinator: expected HOST:PORT (a port 1..65535), got {text!r}")
    return host.strip("[]"), int(port)


def _port_in_use(host, port):
    """Whether something already listens at ``host:port`` (then a second process 0 would abort in JAX)."""
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def initialize(coordinator=None, num_processes=None, process_id=None, timeout=INIT_TIMEOUT):
    """``jax.distributed.initialize``: auto-detected on Cloud TPU, SLURM, Open MPI, ... when nothing is given;
    else ``coordinator`` (or env ``JAX_COORDINATOR_ADDRESS``) with ``num_processes`` and ``process_id``.

    Every argument is checked before JAX is called (ValueError naming it); a process 0 whose coordinator port
    is already served is refused (two processes with ``--process-id 0``). JAX waits in another thread, so
    Ctrl-C is honoured while the others are awaited, and at most ``timeout`` seconds (ValueError after it).
    """
    if (num_processes is None) != (process_id is None):
        raise ValueError("process_id: --num-processes and --process-id go together")
    if num_processes is not None:
        if num_processes < 1:
            raise ValueError(f"num_processes: expected a positive integer, got {num_processes}")
        if not 0 <= process_id < num_processes:
            raise ValueError(f"process_id: expected 0 <= process_id < {num_processes}, got {process_id}")
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
        raise ValueError(f"init_timeout: expected a positive number of seconds, got {timeout!r}")
    coordinator = coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if coordinator is not None:
        host, port = parse_coordinator(coordinator)
        if process_id == 0 and _port_in_use(host, port):
            raise ValueError(f"coordinator: {coordinator} is already served: another process 0 (two processes "
                             "with --process-id 0?) or another program holds that port")
    elif num_processes is not None:
        raise ValueError("coordinator: --num-processes and --process-id need --coordinator HOST:PORT (or env "
                         "JAX_COORDINATOR_ADDRESS)")
    done, failed = threading.Event(), []

    def join():
        try:
            # JAX's own limit is later than ours: its timeout aborts the process from C++, ours is a message
            jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                                       process_id=process_id, initialization_timeout=timeout + 3600)
        except Exception as exc:  # noqa: BLE001 - reported in the main thread with what to do
            failed.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=join, name=JOINING, daemon=True)
    thread.start()
    if not done.wait(timeout):  # a KeyboardInterrupt arrives here, in the main thread
        raise ValueError(f"init_timeout: the other processes did not join within {timeout} s (coordinator "
                         f"{coordinator or 'auto-detected'})")
    if failed:
        exc = failed[0]
        if coordinator is None and "coordinator" in str(exc).lower():
            raise ValueError("coordinator: no cluster was detected (Cloud TPU, SLURM, Open MPI); give --coordinator "
                             "HOST:PORT --num-processes N --process-id I") from None
        raise ValueError(f"init_timeout: joining the distributed run failed ({type(exc).__name__}: "
                         f"{str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''})") from None


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
