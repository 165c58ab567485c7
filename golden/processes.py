"""Worker processes of long work: how many (one a core), stopping them at once, and SIGTERM handled as Ctrl-C.

A cancelled CI job or ``timeout`` sends SIGTERM; by default Python dies at once, printing nothing and leaving
spawned workers orphaned. Inside :func:`terminate_as_interrupt` SIGTERM raises :class:`Terminated` (a
``KeyboardInterrupt``), so every command's interrupt path runs: it reports what was finished, stops its workers
(:func:`terminate_workers`) and exits with 128 + the signal (143), as a shell expects.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading

INTERRUPTED, TERMINATED = 130, 143  # 128 + SIGINT, 128 + SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be."""


class Received:
    """What :func:`terminate_as_interrupt` saw: ``terminated`` once a SIGTERM arrived."""

    terminated = False

    def status(self, code):
        """An interrupted command's exit status (130) made 143 when the interrupt was a SIGTERM."""
        return TERMINATED if code == INTERRUPTED and self.terminated else code


@contextlib.contextmanager
def terminate_as_interrupt():
    """While inside: SIGTERM raises :class:`Terminated` in the main thread (a no-op in other threads); yields a
    :class:`Received` that remembers it."""
    received = Received()
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handler(signum, frame):
        received.terminated = True
        _record(signum)
        raise Terminated(f"signal {signum}")

    def ctrl_c(signum, frame):
        _record(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    ours = signal.getsignal(signal.SIGINT) is signal.default_int_handler  # else someone else handles Ctrl-C
    previous_int = signal.signal(signal.SIGINT, ctrl_c) if ours else None
    if not _WATCHING:  # the outermost: a signal an inner one (golden regenerate) sees stays recorded
        _forget()
    _WATCHING.append(ours)
    previous_hook = sys.unraisablehook
    sys.unraisablehook = functools.partial(_unraisable, previous_hook)
    try:
        yield received
    finally:
        _WATCHING.pop()
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGTERM, previous)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)
        if not _WATCHING:
            _forget()


def _unraisable(previous, info):
    """``sys.unraisablehook``: the interrupt of a recorded signal, raised where it could not propagate (a gc
    callback), is not printed as a traceback (the run reports it as interrupted); anything else goes to ``previous``."""
    if not (isinstance(info.exc_value, KeyboardInterrupt) and _RECEIVED):
        previous(info)


# Set when a real Ctrl-C or SIGTERM arrived inside terminate_as_interrupt: a KeyboardInterrupt without it was
# raised by code (a kernel), not by the user. _WATCHING: whether our Ctrl-C handler is the one installed.
_SIGNALLED = threading.Event()
_WATCHING = []
_RECEIVED = []  # the number of the first such signal (SIGINT or SIGTERM)


def _record(signum):
    """Remember a real Ctrl-C or SIGTERM (before raising it: code may swallow the exception, not the record)."""
    if not _RECEIVED:
        _RECEIVED.append(signum)
    _SIGNALLED.set()


def _forget():
    _SIGNALLED.clear()
    _RECEIVED.clear()


def signalled():
    """The Ctrl-C (SIGINT) or SIGTERM that arrived inside :func:`terminate_as_interrupt`, None when none did.

    Recorded even when the exception it raised was swallowed -- an exception raised in a gc callback (JAX has one,
    run during start-up) or in a host callback is printed or made a kernel's error, not passed on -- so a command
    asks this before its final report: a run a signal reached is interrupted, whatever else it saw."""
    return _RECEIVED[0] if _RECEIVED else None


def by_signal():
    """Whether the KeyboardInterrupt being handled came from a signal; True unless our handler is installed and
    saw none (then a kernel raised it itself). Outside :func:`terminate_as_interrupt` every one counts as real."""
    return not (_WATCHING and _WATCHING[-1]) or _SIGNALLED.is_set()


def exit_status(exc):
    """The exit status of an interrupt: 143 for SIGTERM, 130 for Ctrl-C (an interrupt's echo: the signal recorded)."""
    if isinstance(exc, KeyboardInterrupt):
        return TERMINATED if isinstance(exc, Terminated) else INTERRUPTED
    return signal_status(signalled()) if signalled() is not None else INTERRUPTED


def is_interrupt(exc):
    """Whether ``exc`` ends a run as a signal's interrupt: a KeyboardInterrupt, or an exception raised after a recorded
    signal (its KeyboardInterrupt struck library internals -- an mpmath C call, an executor starting its thread --
    and came out as a SystemError or RuntimeError)."""
    return isinstance(exc, KeyboardInterrupt) or (isinstance(exc, Exception) and signalled() is not None)


def signal_status(signum):
    """The exit status of a run stopped by signal ``signum``: 143 for SIGTERM, else 130."""
    return TERMINATED if signum == signal.SIGTERM else INTERRUPTED


def terminate_workers(pool):
    """Stop a ``ProcessPoolExecutor``'s workers now, without waiting for their current task.

    Only for pools whose results are short (under ``PIPE_BUF``): a worker stopped while writing a longer one leaves
    the pool's manager thread waiting for the rest, and ``shutdown`` hangs. Send large results through files."""
    stop = getattr(pool, "terminate_workers", None)  # Python >= 3.14
    if stop is not None:
        stop()
        return
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.terminate()


def default_jobs():
    """The number of worker processes by default: the cores this process may use (its CPU affinity)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
