"""The ``gdn2_oracle`` pytest plugin (entry point ``pytest11``): options of the conformance suite.

Loaded automatically once gdn2-oracle is installed. It only declares options (all ``--gdn2-*``)
and does nothing else: no fixtures, no hooks that run, no import of JAX or Hypothesis. The
conformance suite (``gdn2_oracle.property_tests``, whose ``conftest.py`` reads these options) is
what acts on them::

    pytest --pyargs gdn2_oracle.property_tests --gdn2-kernel mypkg.mod:fn [--gdn2-profile ci]
           [--gdn2-xfails xfails.txt]

* ``--gdn2-kernel NAME`` (repeatable; or env ``GDN2_KERNEL=a,b``): a registered kernel name
  (options as ``NAME[key=value,...]``) or ``package.module:attr``;
* ``--gdn2-profile {dev,ci,thorough}`` (or env ``HYPOTHESIS_PROFILE``; default ``dev``, ``ci``
  when env ``CI`` is true): the Hypothesis profile;
* ``--gdn2-xfails FILE``: one test id, test name or golden case name per line (``#`` comments);
  matching tests are reported as xfail, the convention of array-api-tests.
"""

from __future__ import annotations

# The profile names (their settings live in property_tests/profiles.py, imported only when used).
PROFILES = ("dev", "ci", "thorough")


def pytest_addoption(parser):
    group = parser.getgroup("gdn2", "GDN-2 conformance suite (gdn2_oracle.property_tests)")
    group.addoption("--gdn2-kernel", action="append", default=None, metavar="NAME",
                    help="kernel under test: a registered name (options as NAME[key=value,...]) or "
                         "package.module:attr (repeatable; default: env GDN2_KERNEL, else pairwise "
                         "and factorized)")
    group.addoption("--gdn2-profile", choices=PROFILES, default=None,
                    help="Hypothesis profile of the conformance suite (default: env HYPOTHESIS_PROFILE, "
                         "else ci when env CI is true, else dev)")
    group.addoption("--gdn2-xfails", metavar="FILE", default=None,
                    help="file of test ids, test names or golden case names expected to fail for the "
                         "kernel under test (one per line; reported as xfail)")
