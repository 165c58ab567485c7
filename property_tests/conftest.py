"""Hypothesis profiles and the pluggable-kernel option of the property suite.

Profiles (``--hypothesis-profile NAME`` or env ``HYPOTHESIS_PROFILE=NAME``; default ``dev``, or
``ci`` when env ``CI`` is true):

* ``dev``: a few random examples per test, fast local loop;
* ``ci``: derandomized (the same examples every run), no deadline, no example database, sized so
  that the property suite takes ~3-4 minutes on 2 CPU cores;
* ``thorough``: many examples and drawn shapes from the full small-set cross product
  (nightly / on-device).

Kernels (like array-api-tests): ``--kernel NAME`` (repeatable) or env ``GDN2_KERNEL=a,b``; NAME is a
registered kernel ("pairwise", "factorized", ...) or ``package.module:attr``. Default: pairwise and
factorized. A test that takes the ``kernel`` argument runs once per selected kernel (ids = names);
a test that does not runs once.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from strategies import Kernel, kernel_fn  # noqa: F401  (Kernel: the type of the `kernel` argument)

DEFAULT_KERNELS = ("pairwise", "factorized")

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
               print_blob=True)
settings.register_profile("dev", max_examples=3, **_common)
settings.register_profile("ci", max_examples=10, derandomize=True, database=None, **_common)
settings.register_profile("thorough", max_examples=60, **_common)


def _truthy(x):
    return str(x).strip().lower() not in ("", "0", "false", "no", "off")


def default_profile():
    return os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if _truthy(os.environ.get("CI", "")) else "dev")


settings.load_profile(default_profile())


def pytest_addoption(parser):
    group = parser.getgroup("gdn2", "GDN-2 property suite")
    group.addoption("--kernel", action="append", default=None, metavar="NAME",
                    help="kernel under test: a registered name or package.module:attr (repeatable; "
                         "default: env GDN2_KERNEL, else pairwise and factorized)")


def profile_name(config):
    """The Hypothesis profile in force (--hypothesis-profile wins over the environment)."""
    try:
        opt = config.getoption("hypothesis_profile")
    except ValueError:
        opt = None
    return opt or default_profile()


def pytest_configure(config):
    config._gdn2_profile = profile_name(config)
    names = config.getoption("kernel") or [n for n in os.environ.get("GDN2_KERNEL", "").split(",") if n.strip()]
    names = [n.strip() for n in names] or list(DEFAULT_KERNELS)
    config._gdn2_kernel_names = list(dict.fromkeys(names))


def pytest_report_header(config):
    return (f"gdn2: hypothesis profile {config._gdn2_profile!r}; "
            f"kernels {', '.join(config._gdn2_kernel_names)}")


def selected_kernels(config):
    out = []
    for name in config._gdn2_kernel_names:
        try:
            out.append(Kernel(name, kernel_fn(name)))
        except ValueError as exc:
            raise pytest.UsageError(f"kernel {name!r} (from --kernel or GDN2_KERNEL): {exc}") from None
    return out


def _already_parametrized(metafunc, argname):
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", ())
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if argname in names:
            return True
    return False


def pytest_generate_tests(metafunc):
    """Parametrize every test that takes ``kernel`` over the selected kernels (ids = names)."""
    if "kernel" in metafunc.fixturenames and not _already_parametrized(metafunc, "kernel"):
        ks = selected_kernels(metafunc.config)
        metafunc.parametrize("kernel", ks, ids=[k.name for k in ks], scope="session")


@pytest.fixture(scope="session")
def hypothesis_profile(pytestconfig):
    """The name of the Hypothesis profile in force."""
    return pytestconfig._gdn2_profile


def pytest_collection_modifyitems(config, items):
    """Deselect (not skip) kernel-option variants that belong to another kernel than the one under test."""
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        kernel, owner = params.get("kernel"), params.get("owner")
        if kernel is not None and owner is not None and getattr(kernel, "name", None) != owner:
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
