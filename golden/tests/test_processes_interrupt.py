"""An interrupt that strikes library internals comes out as another exception (mpmath's C call: SystemError; an
executor starting its thread: RuntimeError): after a recorded signal it still ends the run as an interrupt."""

from __future__ import annotations

import signal

from gdn2_oracle.golden import processes


def test_an_exception_after_a_recorded_signal_is_an_interrupt(monkeypatch):
    assert processes.is_interrupt(KeyboardInterrupt()) and processes.exit_status(processes.Terminated()) == 143
    monkeypatch.setattr(processes, "_RECEIVED", [])
    assert not processes.is_interrupt(SystemError("returned a result with an exception set"))
    monkeypatch.setattr(processes, "_RECEIVED", [signal.SIGTERM])
    assert processes.is_interrupt(RuntimeError("cannot join thread before it is started"))
    assert processes.exit_status(RuntimeError()) == 143
    monkeypatch.setattr(processes, "_RECEIVED", [signal.SIGINT])
    assert processes.exit_status(SystemError()) == 130
    assert not processes.is_interrupt(SystemExit(1))  # not an Exception: never taken for an interrupt
