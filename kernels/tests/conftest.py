"""Fixtures of these tests: ``cli`` (``gdn2-oracle ARGV`` in this process) from the suite's test support."""

from gdn2_oracle.ci.testing import cli  # noqa: F401 - a fixture, found by name
