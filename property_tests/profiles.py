"""Hypothesis profiles of the conformance suite (selected by ``--gdn2-profile`` / env, see plugin.py).

* ``dev``: a few random examples per test, fast local loop;
* ``ci``: derandomized (the same examples every run), no deadline, no example database, sized so
  that the conformance suite takes a few minutes per kernel on 2 CPU cores;
* ``thorough``: many examples and drawn shapes from the full small-set cross product
  (nightly / on-device).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

from .plugin import profile_name

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
               print_blob=True)
settings.register_profile("dev", max_examples=3, **_COMMON)
settings.register_profile("ci", max_examples=10, derandomize=True, database=None, **_COMMON)
settings.register_profile("thorough", max_examples=60, **_COMMON)


def select(config):
    """Load and return the profile in force (``plugin.profile_name``: --gdn2-profile, then the environment)."""
    name = profile_name(config)
    settings.load_profile(name)
    return name
