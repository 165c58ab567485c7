"""A watchdog over kernel calls: a per-case time limit, and Ctrl-C / SIGTERM while a kernel hangs.

A kernel can hang where Python cannot interrupt it: in XLA, or in a torch kernel run by a host callback on
another thread, while the main thread waits in C. Python's own signal handler then never runs. The watchdog is
a thread that does not need the main thread: it learns of signals from the wakeup file descriptor (written by the
C-level handler at once) and of the time from its clock. When the case in progress passes its limit, or a Ctrl-C or
SIGTERM has not stopped the run within a grace period -- a case is still in progress -- it calls
``stop(reason, case)``, which reports what was finished and ends the process (``os._exit``); nothing can return
from a hung kernel. A signal whose exception some code swallowed (a gc or host callback; ``golden.processes.
signalled``) counts too, even one that arrived before the watchdog started.
"""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import threading
import time

from gdn2_oracle.golden.processes import signalled

from . import supervised

GRACE = 2.0  # seconds a signal may take to stop the run before the watchdog acts on it
STOPPING = (signal.SIGINT, signal.SIGTERM)  # the signals that stop a run (others written to the wakeup fd do not)


class Watchdog:
    """``with Watchdog(limit, stop): ... with dog.case(name): <kernel call>``; ``limit`` 0 or None: no time limit
    (signals are still watched). ``stop(reason, case)``: ``reason`` is ``"timeout"``, ``"interrupt"`` or
    ``"terminate"``; it must end the process."""

    def __init__(self, limit, stop):
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit < 0):
            raise ValueError(f"case_timeout: expected a number of seconds >= 0, got {limit!r}")
        self.limit, self.stop = limit or None, stop
        self._case, self._started, self._signal, self._seen = None, None, None, None
        self._done = threading.Event()
        self._thread, self._socks, self._old_fd = None, None, None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._socks = socket.socketpair()
            for s in self._socks:
                s.setblocking(False)
            self._old_fd = signal.set_wakeup_fd(self._socks[1].fileno(), warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="gdn2-oracle watchdog", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join(timeout=1)
        if self._socks is not None:
            signal.set_wakeup_fd(self._old_fd)
            for s in self._socks:
                s.close()
        return False

    def _saw(self, signals):
        """Note the first Ctrl-C or SIGTERM among ``signals`` and when it was seen."""
        if signals and self._signal is None:
            self._signal, self._seen = signals[-1], time.monotonic()

    @contextlib.contextmanager
    def case(self, name):
        """Mark the kernel call of case ``name`` as in progress."""
        self._case, self._started = name, time.monotonic()
        try:
            yield
        finally:
            self._case, self._started = None, None

    def _watch(self):
        while not self._done.is_set():
            if self._socks is not None:
                ready, _, _ = select.select([self._socks[0]], [], [], 0.2)
                if ready:
                    with contextlib.suppress(OSError):
                        self._saw([s for s in self._socks[0].recv(64) if s in STOPPING])
            else:
                self._done.wait(0.2)
            self._saw([s for s in [signalled()] if s is not None])
            case, started = self._case, self._started
            if case is None:
                continue  # between cases the main thread stops the run itself; a case started later is stopped
            now = time.monotonic()
            if self._signal is not None and now - self._seen > GRACE:
                self.stop("terminate" if self._signal == signal.SIGTERM else "interrupt", case)
            if self.limit is not None and now - started > self.limit:
                self.stop("timeout", case)


def exit_now(code):
    """End the process at once (a hung kernel cannot be unwound), after flushing stdout and stderr."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    supervised.finished(code)  # the report was written before: this status is the verdict
    supervised.exit_process(code)
