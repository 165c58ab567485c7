"""Test support for the suite's own tests: running pytest as a user would, in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys


def pytest_run(cwd, *args, timeout=600):
    """``(exit code, stdout + stderr)`` of ``pytest ARGS`` run from ``cwd`` in a fresh interpreter, without
    this session's ``PYTEST_*`` and ``GDN2_*`` environment (as a kernel author runs it from their repository)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GDN2_"))}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr
