"""Fixtures of these tests: ``cli`` (``gdn2-oracle ARGV`` in this process) from the suite's test support; the
reference cache off (every reference computed; test_reference_cache.py points it at a temporary directory)."""

import pytest

from gdn2_oracle.ci.testing import cli  # noqa: F401 - a fixture, found by name


@pytest.fixture(autouse=True)
def _no_reference_cache(monkeypatch):
    """No test reads the user's reference cache or writes into it (a warm entry would skip the oracle's work)."""
    monkeypatch.setenv("GDN2_REFERENCE_CACHE", "0")
