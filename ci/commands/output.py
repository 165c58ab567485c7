"""What every command shares for its output: ``UsageError`` (exit 2), atomic JSON, output paths probed before
any work, fixed-width tables, error figures and progress bars."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path

from gdn2_oracle.golden.processes import TERMINATED
from gdn2_oracle.golden.progress import Progress

from ..running.watchdog import exit_now

PROG = "gdn2-oracle"

# Exit status of each outcome of a command (README "Exit codes", docs/commands.md). empty: no case, cell or recipe
# was judged for a kernel (nothing selected that it takes), so nothing is known about it: not a pass.
EXIT = {"pass": 0, "fail": 1, "usage": 2, "input-error": 3, "empty": 4, "interrupted": 130,
        "precision": 0}  # precision: some case graded PRECISION (a warning; validate --strict: 1)


class UsageError(ValueError):
    """A command-line problem (unknown kernel, import failure, bad option): exit status 2."""


# Exit status of a run the watchdog stopped (ci/running/watchdog.py): a kernel call past --case-timeout is a
# FAIL (1); a Ctrl-C / SIGTERM that did not stop the kernel call in progress (a kernel that does not return, or one
# whose interrupt was swallowed) is 130 / 143, as when the main thread takes it.
STOPPED = {"timeout": EXIT["fail"], "interrupt": EXIT["interrupted"], "terminate": TERMINATED}


def timed_out(limit):
    """The error recorded for a kernel call stopped by ``--case-timeout`` (``limit`` seconds)."""
    return f"timed out after {limit:g} s (--case-timeout); the run stops here"


def stop_run(reason, limit, what, report):
    """The end of a run the watchdog stopped (``reason``: timeout, interrupt, terminate): ``report()`` prints and
    writes what was finished, one stderr line says why, then the process ends with :data:`STOPPED`'s status (a hung
    kernel cannot be unwound, so nothing returns)."""
    report()
    why = (f"a kernel call passed --case-timeout {limit:g} s" if reason == "timeout"
           else "interrupted; the kernel call in progress did not stop")
    print(f"gdn2-oracle: {why}; the run stops with the {what} finished before it", file=sys.stderr, flush=True)
    exit_now(STOPPED[reason])


# The error of a kernel call a Ctrl-C or SIGTERM broke off in its host callback ("KernelError: KeyboardInterrupt"):
# in a run that saw the signal (``golden.processes.signalled``) it is the interrupt, not the kernel's failure.
INTERRUPT_ERRORS = re.compile(r"\b(KeyboardInterrupt|Terminated)\b")


def interrupt_error(text):
    """Whether an error text (a case's error, a rejection's reason) names an interrupt."""
    return bool(INTERRUPT_ERRORS.search(text or ""))


def say_interrupted(n, what, json_path):
    """The stderr line of an interrupted command: how much was finished and where it was written."""
    print(f"gdn2-oracle: interrupted; {n} {what} finished before it are reported"
          f"{f' (and in {json_path}, marked interrupted)' if json_path else ''}", file=sys.stderr, flush=True)


# --- JSON -----------------------------------------------------------------------------------

def jsonable(x):
    """Plain-JSON form: non-finite floats become the strings "inf", "-inf", "nan"."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if hasattr(x, "item") and not isinstance(x, (list, tuple, dict)):
        x = x.item()
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return x
    return x


def write_json(path, data):
    """Write ``data`` as plain JSON, atomically (a temporary file beside ``path``, then ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(jsonable(data), indent=1, allow_nan=False) + "\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_after_work(option, path, write):
    """Run ``write()`` (a report's file, after the work): on OSError say so on stderr -- the verdict printed above
    stands, and the command keeps its exit status -- instead of a traceback. Returns whether it was written."""
    try:
        write()
    except OSError as exc:
        print(f"gdn2-oracle: error: {option} {path}: could not write it ({exc.strerror or exc}); the verdict above "
              "stands and the exit status is the verdict's", file=sys.stderr, flush=True)
        return False
    return True


def output_dir(path, *, option, text=None):
    """The directory an output option writes into, created and probed (a temporary file made and removed there)
    before any work; UsageError naming the option when it cannot be written."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".gdn2-oracle.{os.getpid()}.probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"{option} {text or path}: cannot write to {path} ({exc.strerror or exc})") from None
    return path


def output_path(text, *, option, default_name, suffixes):
    """The file an output option (``--json``, ``--plot``) will write, checked before any work.

    An existing directory (or a path ending in ``/``) means ``<dir>/<default_name>``. The file must end
    in one of ``suffixes`` and its directory must be creatable and writable (probed by creating and
    removing a temporary file there). UsageError naming the option otherwise (an empty path too).
    """
    if not str(text).strip():
        raise UsageError(f"{option}: expected a path, got an empty one")
    path = Path(text)
    if path.is_dir() or str(text).endswith(("/", os.sep)):
        path = path / default_name
    if path.suffix.lower() not in suffixes:
        raise UsageError(f"{option} {text}: expected a {' or '.join(suffixes)} file or a directory")
    if path.is_dir():
        raise UsageError(f"{option} {text}: {path} is a directory")
    output_dir(path.parent, option=option, text=text)
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{option} {text}: {path} is not writable")
    return path


# --- tables ---------------------------------------------------------------------------------

def table(headers, rows, aligns=None):
    """A fixed-width text table; ``aligns`` is a string of '<' / '>' per column."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in rows)) if rows else len(str(h)) for i, h in enumerate(headers)]
    aligns = aligns or "<" * len(headers)
    fmt = "  ".join(f"{{:{a}{w}}}" for a, w in zip(aligns, widths))
    out = [fmt.format(*headers), "  ".join("-" * w for w in widths)]
    out += [fmt.format(*r) for r in rows]
    return "\n".join(out)


def fmt_err(x):
    return "inf" if x == float("inf") else ("nan" if x != x else f"{x:.2e}")


def progress(*, total, desc="", unit="it"):
    """Progress on stderr: a tqdm bar on a terminal, else a line every few seconds (``golden.progress``)."""
    return Progress(total, desc, unit)
