"""``make test``'s pytest plugin (``-p gdn2_oracle.ci.crash_rerun``): a test whose xdist worker crashes is rerun
whenever its rerun count allows, not only when the controller happens to have stored that count first.

pytest-rerunfailures (16.7) sends a test's allowed reruns from the worker to the controller's ledger without waiting
for an answer (``ClientStatusDB._set``) and then runs the test. A test that ends its worker at once can reach the
controller's crash hook (``pytest_handlecrashitem``) before the ledger's socket thread has stored the count; the hook
then reads 0 reruns and fails the test. Seen on CI (a crashed test failed without its rerun) and here: 3 of 40
single-crash runs with four runs side by side on 2 cores.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Wait until the ledger holds this test's rerun count: one connection's requests are served in order, so the
    answer to this read comes after the write that rerunfailures sent before the test began."""
    ledger = getattr(item.config, "failures_db", None)
    if ledger is not None:
        ledger.get_test_reruns(item.nodeid)
