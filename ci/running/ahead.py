"""Programs compiled ahead of time: each distinct program of a run traced once, compiled on a pool of threads.

``validate`` knows every case before it runs the first, so it need not trace and compile a kernel's program when
the case comes up. A lookahead thread traces and lowers the programs in the order the cases will need them (the
kernel's forward and gradients together, one program per distinct input shape, dtype and scale: cases that share
one share the program) and hands each to a pool of compile threads; XLA compiles outside the GIL, so programs
compile side by side and while earlier cases are judged (the oracle's NumPy work releases the GIL too).

What a kernel under test allows: a JAX kernel is traced inside our program (a user's own ``jax.jit`` is inlined),
so its compile is ours to schedule. A torch kernel runs in a host callback: only our small wrapper compiles. A
kernel that fails to trace (a contract breach, an exception, ``sys.exit``) fails in the lookahead thread; the
failure is kept and raised again when its case comes up, in the main thread, where the case is judged as before.
Programs run on a mesh are compiled on first call (sharding is decided there), as are the training-call modes'.

Keys and signatures hold a kernel by identity (:func:`job_key`, ``harness.program_signature``: ``per_kernel.Identity``):
two kernel objects that compare equal (a dataclass with a field left out of ``__eq__``) get programs of their own.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from . import supervised
from .per_kernel import Identity


def default_workers():
    """Compile threads by default: one per two cores. XLA's CPU compiler already keeps more than one core busy:
    measured on a 2-core host, two programs compiled side by side took 2.6x as long each as one alone, so there
    one compile thread, overlapping the lookahead's tracing and the judging of earlier cases, is the most."""
    return max(1, (os.cpu_count() or 1) // 2)


def job_key(fn, case):
    """The key of kernel ``fn``'s program on ``case``: both by identity (never ``==``), both held by the key."""
    return Identity(fn), Identity(case)


class Ahead:
    """``Ahead(jobs, workers)``: ``jobs`` is a list of ``(key, prepare)`` in the order the run needs them;
    ``prepare()`` returns ``(signature, lower)``: what decides the program, and a function returning its
    ``jax.stages.Lowered`` (it traces the kernel). Keys of one signature share one program, lowered and compiled
    once. :meth:`compiled` waits for a key's program. Use as a context manager (the threads stop at exit)."""

    def __init__(self, jobs, workers=None):
        workers = default_workers() if workers is None else workers
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers: expected an integer >= 1, got {workers!r}")
        self._jobs, self._futures, self._programs = [], {}, {}
        for key, prepare in jobs:
            if key not in self._futures:
                self._futures[key] = Future()
                self._jobs.append((key, prepare))
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="gdn2-compile")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._lookahead, name="gdn2-lookahead", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _lookahead(self):
        """Trace and lower each job's program in order (once a signature); its compile goes to the pool, a failure
        to the job's future."""
        for key, prepare in self._jobs:
            if self._stop.is_set():
                return
            future = self._futures[key]
            try:
                with supervised.kernel_call():  # tracing runs the kernel's Python (os._exit there raises)
                    signature, lower = prepare()
            except BaseException as exc:  # noqa: BLE001 - kept, raised again where the case is judged
                future.set_exception(exc)
                continue
            program = self._programs.get(signature)
            if program is None:
                program = self._programs[signature] = Future()
                try:
                    with supervised.kernel_call():
                        lowered = lower()
                except BaseException as exc:  # noqa: BLE001 - kept for every case of this program
                    program.set_exception(exc)
                else:
                    try:
                        self._pool.submit(_compile, lowered, program)
                    except RuntimeError:  # the pool was shut down: the run is over
                        return
            program.add_done_callback(lambda done, future=future: _copy(done, future))

    def __contains__(self, key):
        return key in self._futures

    def compiled(self, key, timeout=None):
        """The compiled program of ``key`` (waits for it, at most ``timeout`` seconds), or None when ``key`` was
        not prepared; raises what tracing or compiling it raised."""
        future = self._futures.get(key)
        return None if future is None else future.result(timeout)


def _copy(done, future):
    """Resolve ``future`` as ``done`` was resolved."""
    exc = done.exception()
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(done.result())


def _compile(lowered, future):
    """Compile ``lowered`` into ``future`` (its result or its exception)."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(lowered.compile())
    except BaseException as exc:  # noqa: BLE001 - kept, raised again where the case is judged
        future.set_exception(exc)
