"""The ``gdn2-oracle`` console script: a small parent that runs the command in a child process and owns the verdict.

A kernel runs in the process that judges it, so it can end that process: ``os._exit(0)`` on some library's error path,
a segfault, an abort. Whatever the child's exit status then is, it is not a verdict. The parent imports nothing but the
standard library, so its signal handlers are in place from the first line of :func:`main`, and it takes the exit
status from the child's status channel (``ci/running/supervised.py``), never from how the child ended:

* the child said ``exit N``: N (the report was complete; a crash in interpreter teardown after it changes nothing);
* the child ended without saying it: one line naming how it ended and the kernel and case in progress, the ``--json``
  report (if any) replaced by one marked ``"outcome": "crashed"``, and exit 1 (FAIL) -- or, after a Ctrl-C or
  SIGTERM, ``"outcome": "interrupted"`` and 130 / 143;
* Ctrl-C or SIGTERM during the child's start-up (imports, before it says ``ready``): the child is killed (nothing
  was judged; JAX's start-up can crash on an interrupt) and the parent says ``interrupted; nothing judged``, exit 130 /
  143; after ``ready`` the signal is forwarded and the child reports what it finished, as before.

The child runs in its own process group, so a terminal's Ctrl-C reaches the parent alone and is forwarded once;
Ctrl-Z stops both. ``GDN2_ORACLE_IN_PROCESS=1`` runs the command in this process instead (a debugger needs that).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time

from .running import supervised

PROG = "gdn2-oracle"
IN_PROCESS = "GDN2_ORACLE_IN_PROCESS"
INTERRUPTED, TERMINATED, FAIL = 130, 143, 1
KILL_AFTER = 3  # the third Ctrl-C / SIGTERM kills a child that did not stop (its watchdog stops a hung one in 2 s)
JSON_COMMANDS = ("validate", "bench")  # the commands with --json (ci/commands/validate.py, bench.py)
# The child: this Python, without the working directory on sys.path (-P, as the console script has none), the command.
CHILD = "import sys; from gdn2_oracle.ci.cli import main; sys.exit(main())"


class Run:
    """What the parent knows of its child: the lines it sent, and the first signal the parent received."""

    def __init__(self):
        self.child, self.ready, self.report, self.doing, self.code = None, False, None, None, None
        self.signal, self.signals, self.argv = None, 0, []
        self._buffer = b""

    def on_signal(self, signum, frame):
        """Ctrl-C / SIGTERM: forwarded to a child that is ready; a child still starting, or one that the third signal
        finds still running, is killed."""
        if self.signal is None:
            self.signal = signum
        if frame is not None:
            self.signals += 1
        child = self.child
        if child is None or child.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self.ready and self.signals < KILL_AFTER:
                os.kill(child.pid, signum)
            else:
                os.kill(child.pid, signal.SIGKILL)

    def on_stop(self, signum, frame):
        """Ctrl-Z: stop the child with the parent; continue it when the parent continues."""
        child = self.child
        if child is not None and child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGSTOP)
        os.kill(os.getpid(), signal.SIGSTOP)
        if child is not None and child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGCONT)

    def take(self, data):
        """Read the status lines in ``data`` (a chunk of the pipe)."""
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for raw in lines:
            kind, _, rest = str(raw, "utf-8", "replace").partition(" ")
            if kind == "ready":
                self.ready = True
                if self.signal is not None:  # a signal came while the child announced itself
                    self.on_signal(self.signal, None)
            elif kind == "report":
                self.report = rest
            elif kind == "doing":
                self.doing = rest
            elif kind == "exit":
                with contextlib.suppress(ValueError):
                    self.code = int(rest)


def main():
    """Run the command given on the command line in a supervised child; exit with the verdict's status."""
    if os.environ.get(IN_PROCESS, "").strip().lower() not in ("", "0", "false", "no", "off"):
        from .cli import main as run_here

        sys.exit(run_here())
    run = Run()
    signal.signal(signal.SIGINT, run.on_signal)
    signal.signal(signal.SIGTERM, run.on_signal)
    if hasattr(signal, "SIGTSTP"):
        signal.signal(signal.SIGTSTP, run.on_stop)
    sys.exit(supervise(run, sys.argv[1:]))


def supervise(run, argv):
    """Start the child on ``argv``, follow its status channel until it ends, return the exit status."""
    run.argv = list(argv)
    read, write = os.pipe()
    env = dict(os.environ, **{supervised.ENV: str(write), supervised.PARENT_ENV: str(os.getpid())})
    try:
        run.child = subprocess.Popen([sys.executable, "-P", "-c", CHILD, *argv], pass_fds=(write,), env=env,
                                     process_group=0)
    except OSError as exc:
        print(f"{PROG}: error: could not start the command: {exc}", file=sys.stderr)
        return FAIL
    finally:
        os.close(write)
    if run.signal is not None:  # a signal before the child existed
        run.on_signal(run.signal, None)
    try:
        while True:
            ready, _, _ = select.select([read], [], [], 0.2)
            if ready:
                data = os.read(read, 65536)
                if data:
                    run.take(data)
                    continue
                break  # EOF: every write end is closed (the child said its exit, or died), nothing more can come
            if run.child.poll() is not None:
                break
        os.set_blocking(read, False)
        with contextlib.suppress(BlockingIOError, OSError):
            while data := os.read(read, 65536):  # what the child wrote just before it ended
                run.take(data)
    finally:
        os.close(read)
    status = run.child.wait()
    return verdict(run, status)


def verdict(run, status):
    """The exit status of the run: the child's own when it said one, else the silence graded (one stderr line and
    the report replaced)."""
    if run.code is not None:
        return run.code
    how = (f"was killed by {_signal_name(-status)}" if status < 0 else f"exited with status {status}")
    where = f" during {run.doing}" if run.doing else ""
    if run.signal is not None:
        code = TERMINATED if run.signal == signal.SIGTERM else INTERRUPTED
        started = not run.ready
        line = ("interrupted; nothing judged" if started else
                f"interrupted; the run ended without its report (the process {how}{where})")
        outcome, grade, note = "interrupted", "INTERRUPTED", f"interrupted before the run finished: {line}"
    else:
        code = FAIL
        line = (f"the run ended without a verdict: the process {how}{where} -- a kernel or a library it calls ended "
                "it (os._exit, a crash); graded FAIL")
        outcome, grade, note = "crashed", "FAIL", line
    path = _mark_report(run.report or _raw_report(run.argv), outcome, grade, note)
    print(f"{PROG}: {line}{f' ({path} marked {outcome})' if path else ''}", file=sys.stderr, flush=True)
    return code


def _raw_report(argv):
    """The ``--json`` file the arguments name (for a child that ended before it said): ``--json PATH`` or
    ``--json=PATH`` of a command that writes one, a directory meaning ``<dir>/<command>.json``; else None."""
    name = next((a for a in argv if a in JSON_COMMANDS), None)
    given = [argv[i + 1] if a == "--json" and i + 1 < len(argv) else a.removeprefix("--json=")
             for i, a in enumerate(argv) if a == "--json" or a.startswith("--json=")]
    if name is None or not given or not given[-1].strip():
        return None
    path = given[-1]
    if os.path.isdir(path) or path.endswith(("/", os.sep)):
        path = os.path.join(path, f"{name}.json")
    return path if path.lower().endswith(".json") and os.path.isdir(os.path.dirname(path) or ".") else None


def _mark_report(path, outcome, grade, note):
    """Replace the report at ``path`` (None: none) by one that judged nothing, marked ``outcome``; returns the path,
    or None. The child's ``schema`` and ``command`` are kept."""
    if not path:
        return None
    partial = None
    with contextlib.suppress(OSError, ValueError):
        with open(path, encoding="utf-8") as f:
            partial = json.load(f)
    data = {k: v for k, v in (partial if isinstance(partial, dict) else {}).items()
            if k in ("schema", "command")}
    data.update(supervised.INCOMPLETE, passed=False, interrupted=outcome == "interrupted", outcome=outcome,
                grade=grade, note=note, finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return None
    return path


def _signal_name(num):
    with contextlib.suppress(ValueError):
        return signal.Signals(num).name
    return f"signal {num}"
