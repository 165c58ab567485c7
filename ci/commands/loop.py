"""The one run loop of ``validate``, ``bench``, ``domain`` and ``hunt``: a progress bar, the watchdog over each unit
of work (ci/running/watchdog.py), Ctrl-C / SIGTERM, and the report of what was finished when the run stops early.

A command describes its run with a :class:`RunLoop` and hands it the work; the loop enters the progress bar, the
contexts the work needs (the mesh, a compile-ahead pool) and the watchdog in one :class:`contextlib.ExitStack`, so
whatever was entered is left again however the run ends. Three ends, one report (``report(interrupted)``, the
command's report of the units finished so far):

* the work returns: the report, marked interrupted when a signal arrived whose exception some code swallowed
  (``golden.processes.signalled``);
* Ctrl-C (KeyboardInterrupt) or SIGTERM reaches the main thread: the same, marked interrupted;
* the watchdog stops a unit (past ``--case-timeout``, or hung through a Ctrl-C / SIGTERM): the unit in progress is
  recorded (``on_timeout``), ``on_stop(report, reason)`` prints and writes the report and the process ends
  (``output.stop_run``: exit 1, 130, 143).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

from gdn2_oracle.golden.processes import is_interrupt, signalled

from ..running import map_guard, supervised
from ..running.watchdog import Watchdog
from .output import UsageError, progress, stop_run


def needs_matplotlib(command, option):
    """UsageError before any work when ``option`` of ``command`` (``--plot``, ``--dump``, ``--out``) draws with
    matplotlib and matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401 - checked before any work
    except ImportError as exc:
        raise UsageError(f"gdn2-oracle {command}: error: {option} needs matplotlib ({exc})") from None


@dataclass
class RunLoop:
    """One command's run over its units of work (a kernel on a case, a configuration's kernel call, a cell's seed, a
    recipe).

    ``report(interrupted)``: the command's report of the units finished so far. ``what``: those units, as the stop
    line names them (``"cases"``). ``total``, ``desc``, ``unit``: the progress bar (none without ``show_progress``).
    ``case_timeout`` (seconds; 0 or None: none): the most one unit may take. ``on_timeout(details)``: record the unit
    the watchdog stopped (``details``: what :meth:`unit` was given). ``on_stop(report, reason)``: print and write the
    report of a run the watchdog stopped, before the process ends. ``timeout_interrupts``: a run stopped by the time
    limit is reported as interrupted too (a partial map).
    """

    report: Callable
    what: str
    total: int = 0
    desc: str = ""
    unit_name: str = "it"
    show_progress: bool = True
    case_timeout: float | None = None
    on_timeout: Callable | None = None
    on_stop: Callable | None = None
    timeout_interrupts: bool = False
    interrupted: bool = False
    _bar: object = field(default=None, repr=False)
    _dog: Watchdog | None = field(default=None, repr=False)
    _details: dict = field(default_factory=dict, repr=False)

    def run(self, work, *contexts):
        """Enter the progress bar, ``contexts`` (in order) and the watchdog, call ``work(*entered)`` with what the
        contexts gave, leave them all; returns the report (interrupted after a Ctrl-C or SIGTERM)."""
        try:
            with contextlib.ExitStack() as stack:
                if self.show_progress:
                    self._bar = stack.enter_context(progress(total=self.total, desc=self.desc, unit=self.unit_name))
                entered = [stack.enter_context(c) for c in contexts]
                self._dog = stack.enter_context(Watchdog(self.case_timeout, self._stop))
                work(*entered)
        except (KeyboardInterrupt, Exception) as exc:  # noqa: BLE001 - only a signal's interrupt (else re-raised)
            if not is_interrupt(exc):  # Ctrl-C, SIGTERM, or their echo in library internals: report what was finished
                raise
            self.interrupted = True
        return self.finish()

    def finish(self, interrupted=False):
        """The report now: interrupted when the run was, or a signal arrived whose exception was swallowed."""
        return self.report(interrupted or self.interrupted or signalled() is not None)

    def unit(self, name, **details):
        """``with loop.unit(name, **details): <kernel call>``: the unit the watchdog watches (``details``: what
        ``on_timeout`` gets should it pass the limit)."""
        self._details = details
        supervised.doing(name)  # named by the console script's parent should the process end in this call
        return self._dog.case(name)

    def note(self, text):
        """Name what is running on the progress bar."""
        if self._bar is not None:
            self._bar.set_postfix_str(text)

    def advance(self, n=1):
        """``n`` more units are done (and JAX's caches cleared if compiled programs near the mapping limit:
        ``ci/running/map_guard.py``)."""
        if self._bar is not None:
            self._bar.update(n)
        map_guard.relieve()

    def _stop(self, reason, where):
        """The watchdog's stop (on its thread: the main thread is stuck in a kernel): record a timed-out unit, report
        what was finished through ``on_stop`` and end the process."""
        if reason == "timeout" and self.on_timeout is not None and self._details:
            self.on_timeout(self._details)
        report = self.finish(reason != "timeout" or self.timeout_interrupts)
        stop_run(reason, self.case_timeout, self.what,
                 lambda: self.on_stop(report, reason) if self.on_stop is not None else None)
