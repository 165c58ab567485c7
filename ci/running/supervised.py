"""The child's side of the supervised command: what it tells the ``gdn2-oracle`` parent (``ci/supervisor.py``).

The console script runs each command in a child process and takes its exit status from what the child *says*, not
from how it ended, so a kernel that ends the process (``os._exit(0)``, a segfault, an abort) can never yield exit 0
or leave an earlier run's PASS behind. The child writes one line per event to the file descriptor named by
:data:`ENV` (absent: not supervised, and every function here does nothing):

* ``ready`` -- start-up is over (signal handlers installed, the command and JAX imported): from now on the parent
  forwards Ctrl-C and SIGTERM to the child instead of ending it;
* ``report PATH`` -- the ``--json`` file, already marked incomplete (:data:`INCOMPLETE`), that this run will write;
* ``doing TEXT`` -- the kernel and case in progress (named if the process ends there);
* ``exit N`` -- the report is complete and N is the command's exit status.

Standard library only: the parent reads this module's constants before anything heavy is imported.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

ENV = "GDN2_ORACLE_STATUS_FD"  # the status pipe's write end, set by the parent for the child
PARENT_ENV = "GDN2_ORACLE_PARENT_PID"  # the supervising parent's pid (the child ends when it is gone)
# A --json report while its run has not finished (the child writes it first; the parent, when the child ends
# without a verdict, replaces it): consumers read "outcome" (docs/commands.md, "Runs that did not finish").
INCOMPLETE = {"passed": False, "complete": False, "outcome": "running", "grade": "INCOMPLETE",
              "note": "the run has not finished: nothing is judged until it does"}

_fd = None


def start():
    """In the child: open the status channel and arrange to get SIGTERM when the parent dies (Linux), so a
    supervisor killed outright does not leave the run orphaned. Returns whether this process is supervised."""
    global _fd
    value = os.environ.pop(ENV, None)
    parent = os.environ.pop(PARENT_ENV, None)
    if value is None:
        return False
    with contextlib.suppress(ValueError, OSError):
        _fd = int(value)
        os.set_inheritable(_fd, False)  # the run's own subprocesses (oracle workers, kernels) must not hold it
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):  # noqa: BLE001 - best effort: without it the parent forwards signals
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if parent is not None and str(os.getppid()) != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)
    return _fd is not None


def supervised():
    """Whether this process reports to a supervising parent."""
    return _fd is not None


def _send(line):
    global _fd
    if _fd is None:
        return
    try:
        os.write(_fd, (line.replace("\n", " ") + "\n").encode("utf-8", "replace"))
    except OSError:  # the parent is gone: nothing to tell
        _fd = None


def ready():
    """Start-up is over: signals may now be forwarded to this process."""
    _send("ready")


def report(path):
    """This run writes its JSON report to ``path`` (already marked incomplete)."""
    _send(f"report {os.path.abspath(path)}")


def doing(text):
    """``text`` (kernel and case) is in progress."""
    _send(f"doing {text}")


def finished(code):
    """The command is over and its report complete: ``code`` is its exit status (said once)."""
    global _fd
    _send(f"exit {int(code)}")
    if _fd is not None:
        with contextlib.suppress(OSError):
            os.close(_fd)
        _fd = None


# --- a kernel calling os._exit -------------------------------------------------------------------------------------

class ProcessExitInKernel(Exception):
    """``os._exit(code)`` called while a kernel call was in progress: raised in its place (the kernel's error)."""

    def __init__(self, code):
        super().__init__(f"the kernel called os._exit({code!r})")
        self.code = code


_real_exit = os._exit
_calls = [0]  # kernel calls in progress, in any thread (host callbacks run on other threads than the caller)
_calls_lock = threading.Lock()


def exit_process(code):
    """End the process now (``os._exit``), whatever :func:`guard_exit` installed: the suite's own way out."""
    _real_exit(code)


def _exit_unless_in_kernel(code):
    """``os._exit`` while the guard is installed: raises :class:`ProcessExitInKernel` during a kernel call."""
    if _calls[0]:
        raise ProcessExitInKernel(code)
    _real_exit(code)


def guard_exit():
    """From now on ``os._exit`` called during a kernel call (:func:`kernel_call`) raises instead of ending the process,
    so the kernel's case fails with the run going on -- in ``validate`` and in a pytest run of the conformance suite,
    which no parent process supervises. Idempotent."""
    os._exit = _exit_unless_in_kernel


@contextlib.contextmanager
def kernel_call():
    """Mark a kernel call (tracing, compiling or running the kernel's code) as in progress."""
    with _calls_lock:
        _calls[0] += 1
    try:
        yield
    finally:
        with _calls_lock:
            _calls[0] -= 1
