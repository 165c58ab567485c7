"""Stopping long work cleanly: SIGTERM handled as Ctrl-C, and a process pool's workers stopped at once.

A cancelled CI job or ``timeout`` sends SIGTERM; by default Python dies at once, printing nothing and leaving
spawned workers orphaned. Inside :func:`terminate_as_interrupt` SIGTERM raises :class:`Terminated` (a
``KeyboardInterrupt``), so every command's interrupt path runs: it reports what was finished, stops its workers
(:func:`terminate_workers`) and exits with 128 + the signal (143), as a shell expects.
"""

from __future__ import annotations

import contextlib
import signal
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
        raise Terminated(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


def exit_status(exc):
    """The exit status of an interrupt: 143 for SIGTERM, 130 for Ctrl-C."""
    return TERMINATED if isinstance(exc, Terminated) else INTERRUPTED


def terminate_workers(pool):
    """Stop a ``ProcessPoolExecutor``'s workers now, without waiting for their current task."""
    stop = getattr(pool, "terminate_workers", None)  # Python >= 3.14
    if stop is not None:
        stop()
        return
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.terminate()
