"""The ``gdn2_oracle`` pytest plugin (entry point ``pytest11``): options of the conformance suite.

Loaded automatically once gdn2-oracle is installed. It declares options (all ``--gdn2-*``) and
otherwise does nothing outside a run of the conformance suite: no fixtures, no import of JAX or
Hypothesis; its only hooks that act look for the suite's kernels and do nothing without them. The
conformance suite (``gdn2_oracle.property_tests``, whose ``conftest.py`` reads these options) is
what acts on them::

    pytest --pyargs gdn2_oracle.property_tests --gdn2-kernel mypkg.mod:fn [--gdn2-profile ci]
           [--gdn2-xfails xfails.txt]

* ``--gdn2-kernel NAME`` (repeatable; or env ``GDN2_KERNEL=a,b``): a registered kernel name
  (options as ``NAME[key=value,...]``) or ``package.module:attr``;
* ``--gdn2-profile {dev,ci,thorough}`` (or env ``HYPOTHESIS_PROFILE``; default ``dev``, ``ci``
  when env ``CI`` is true): the Hypothesis profile;
* ``--gdn2-xfails FILE``: one test id, test name or golden case name per line (``#`` comments);
  matching tests are reported as xfail, the convention of array-api-tests;
* ``--gdn2-mesh AXIS=N,...``: every kernel runs inside that device mesh (``seq``/``data``/``heads``
  shard T/B/H), on inputs placed with NamedSharding;
* ``--gdn2-strict``: a result graded PRECISION (over the working-precision tolerance, within the
  precision-loss bound: docs/DESIGN.md §4) fails the test; by default the test passes with a
  ``PrecisionLossWarning``;
* ``--gdn2-modes LIST`` (or env ``GDN2_MODES``): the training-call modes whose properties run
  (``varlen,gate,l2norm,state_v_first,intermediate``; default every mode the kernel under test accepts,
  i.e. whose keywords its signature has). A mode test a kernel does not accept, or a mode not listed, is
  deselected for that kernel (docs/modes.md);
* ``--gdn2-no-reference-cache`` (or env ``GDN2_REFERENCE_CACHE=0``): the references and baselines of cases built
  from a recipe are neither read from nor stored in the reference cache (``ci/grading/reference_cache.py``; by
  default ``$GDN2_REFERENCE_CACHE``, else ``~/.cache/gdn2-oracle/references``);
* ``--gdn2-prefill NAME`` (repeatable; or env ``GDN2_PREFILL=a,b``): a Gated DeltaNet training-call kernel whose
  final states the hand-off sessions (``test_handoff_sessions.py``) hand into each decode kernel under test; without
  it those sessions are skipped with the reason;
* ``--gdn2-no-compile-cache`` (or env ``GDN2_COMPILE_CACHE=off``): the suite's compiled programs are not kept in
  JAX's persistent compilation cache (by default they are, as the CLI's: ``ci/running/compile_cache.py``, unless
  JAX already has a cache directory of its own).

Each kernel has a family (``ci/running/families.py: kernel_family``, as ``validate`` reads it: the spec option
``family=gdn|kda``, else the kernel's ``family`` attribute; a kernel whose signature takes ``beta`` without either is a
usage error naming ``family``). A test module marked ``gdn2_family(...)`` judges kernels of those families only: the
GDN-2 properties (``gdn2``) skip a Gated DeltaNet or KDA kernel, and the family properties (``test_families.py``) a
GDN-2 one, each with a reason naming the kernel and its family.

In a run of the suite's tests, a selected kernel that no test judges (every test taking it deselected: its signature
lacks the modes, ``--gdn2-modes``, ``-k``, ``-m``; or skipped as another family's) makes the run EMPTY for it, not a
pass: the summary names it and a run that would exit 0 exits 5 (pytest's "no tests collected"). ``--collect-only``
is exempt.
"""

from __future__ import annotations

import ast
import os
import signal
import threading
from pathlib import Path

import pytest

# The profile names (their settings live in property_tests/profiles.py, imported only when used).
PROFILES = ("dev", "ci", "thorough")
SLOW = "slow: long-running tests (deselect with -m 'not slow')"
FAMILY_MARK = ("gdn2_family(*families): the test judges kernels of these families (gdn2: the plain contract; gdn, "
               "kda: FLA's signature); a kernel of another family is skipped with the reason")
# The call-mode registry (oracle/call_modes.py), read from its source: importing it would load the package in every
# pytest run, the suite's or not.
CALL_MODES = Path(__file__).resolve().parents[1] / "oracle" / "call_modes.py"


def registry_modes():
    """``((name, kind), ...)`` of the call-mode registry in its order, read from its source (nothing imported)."""
    tree = ast.parse(CALL_MODES.read_text())
    registry = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                    and any(getattr(t, "id", None) == "REGISTRY" for t in node.targets))
    return tuple((entry.args[0].value, entry.args[1].value) for entry in registry.elts)


def _mode_names(*kinds):
    """The registry's mode names (of ``kinds``, default all) joined for help: ``"varlen, gate, ..."``."""
    return ", ".join(name for name, kind in registry_modes() if not kinds or kind in kinds)


def modes_mark():
    """The ``gdn2_modes`` marker's line (``pytest --markers``): the training then the serving modes."""
    return (f"gdn2_modes(*modes): the test needs these call modes ({_mode_names('training')}; "
            f"{_mode_names('serving')}); deselected for a kernel that does not accept them or when --gdn2-modes "
            "leaves one out")


def _truthy(x):
    return str(x).strip().lower() not in ("", "0", "false", "no", "off")


def profile_name(config):
    """The Hypothesis profile in force: --gdn2-profile, else env HYPOTHESIS_PROFILE, else ci when CI is true,
    else dev."""
    return (config.getoption("gdn2_profile", default=None) or os.environ.get("HYPOTHESIS_PROFILE")
            or ("ci" if _truthy(os.environ.get("CI", "")) else "dev"))


def _spec_list(config, option, env, label, unnamed):
    """The kernel specs named by ``option`` (repeatable) or env ``env``, split by the one spec grammar
    (``kernels.split_specs``: commas inside ``[...]`` separate options); a usage error names ``label``, and what
    leaving the option out means (``unnamed``) for a name left empty."""
    given = config.getoption(option, default=None)
    blank = [v for v in given or () if not v.strip()]
    if blank:  # as the CLI's --kernel '': a name left empty is a mistake, not the suite's default
        raise pytest.UsageError(f"--{option.replace('_', '-')} {blank[0]!r}: an empty kernel name (leave the option "
                                f"out for {unnamed})")
    values = [v for v in given or [os.environ.get(env, "")] if v.strip()]
    if not values:
        return []
    from gdn2_oracle.kernels import split_specs  # the grammar only (no JAX), when a kernel is named

    names = []
    for value in values:
        try:
            names += split_specs(value)
        except ValueError as exc:
            why = str(exc).removeprefix("name: ")
            raise pytest.UsageError(f"{label} {value!r}: {why}") from None
    return list(dict.fromkeys(names))


KERNEL_LABEL = "--gdn2-kernel / GDN2_KERNEL"
PREFILL_LABEL = "--gdn2-prefill / GDN2_PREFILL"


def kernel_names(config):
    """The kernel specs named by --gdn2-kernel or env GDN2_KERNEL; empty: the suite's default."""
    return _spec_list(config, "gdn2_kernel", "GDN2_KERNEL", KERNEL_LABEL, "the suite's default kernels")


def prefill_names(config):
    """The prefill kernel specs named by --gdn2-prefill or env GDN2_PREFILL (the training-call kernels whose final
    states the hand-off sessions hand to each decode kernel under test); empty: no hand-off session runs."""
    return _spec_list(config, "gdn2_prefill", "GDN2_PREFILL", PREFILL_LABEL, "no prefill")


def mesh_spec(config):
    """The --gdn2-mesh value (e.g. ``"data=2,seq=4"``), or None: kernels run on one device."""
    return config.getoption("gdn2_mesh", default=None)


def modes_option(config):
    """The --gdn2-modes (else env GDN2_MODES) value as a list of names, or None: every mode a kernel accepts."""
    value = config.getoption("gdn2_modes", default=None) or os.environ.get("GDN2_MODES", "")
    names = [m.strip() for m in value.split(",") if m.strip()]
    return names or None


def every_mode():
    """Every call mode the suite knows (the registry's: the plain call, the training-call modes, the serving modes);
    NumPy only."""
    from gdn2_oracle.oracle import call_modes

    return call_modes.names()


def selected_modes(config):
    """The modes --gdn2-modes / GDN2_MODES selects, in registry order (every mode when not given); ValueError naming
    an unknown one (``call_modes.parse``)."""
    from gdn2_oracle.oracle import call_modes

    names = modes_option(config)
    return call_modes.names() if names is None else call_modes.parse(",".join(names))


def _check_modes(config):
    """An unknown --gdn2-modes name is a usage error before collection."""
    if modes_option(config) is None:
        return
    try:
        selected_modes(config)
    except ValueError as exc:
        raise pytest.UsageError(f"--gdn2-modes / GDN2_MODES: {str(exc).removeprefix('modes: ')}") from None


def strict(config):
    """Whether --gdn2-strict was given: results graded PRECISION fail instead of warning."""
    return bool(config.getoption("gdn2_strict", default=False))


def no_reference_cache(config):
    """Whether --gdn2-no-reference-cache was given."""
    return bool(config.getoption("gdn2_no_reference_cache", default=False))


def no_compile_cache(config):
    """Whether --gdn2-no-compile-cache was given."""
    return bool(config.getoption("gdn2_no_compile_cache", default=False))


def _asked(config):
    return bool(kernel_names(config) or config.getoption("gdn2_profile", default=None)
                or config.getoption("gdn2_xfails", default=None) or strict(config) or mesh_spec(config)
                or config.getoption("gdn2_modes", default=None) or no_reference_cache(config)
                or no_compile_cache(config) or prefill_names(config))


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
    group.addoption("--gdn2-mesh", metavar="AXIS=N,...", default=None,
                    help="run every kernel on a device mesh, e.g. data=2,seq=4 (axes seq, data, heads shard "
                         "T, B, H; inputs placed with NamedSharding)")
    group.addoption("--gdn2-modes", metavar="LIST", default=None,
                    help=f"call modes to test, comma-separated among {_mode_names()} (default: env GDN2_MODES, "
                         "else every mode the kernel's signature accepts)")
    group.addoption("--gdn2-strict", action="store_true", default=False,
                    help="fail on results graded PRECISION (over the working-precision tolerance but within the "
                         "precision-loss bound); default: pass with a PrecisionLossWarning")
    group.addoption("--gdn2-no-reference-cache", action="store_true", default=False,
                    help="neither read nor write the references and baselines cached by recipe (default: env "
                         "GDN2_REFERENCE_CACHE, a directory or 0 for none, else ~/.cache/gdn2-oracle/references)")
    group.addoption("--gdn2-no-compile-cache", action="store_true", default=False,
                    help="do not keep the suite's compiled programs in JAX's persistent compilation cache (default: "
                         "env GDN2_COMPILE_CACHE, a directory or off; else JAX's own cache directory if set; else "
                         "~/.cache/gdn2-oracle/jax)")
    group.addoption("--gdn2-prefill", action="append", default=None, metavar="NAME",
                    help="a Gated DeltaNet training-call kernel (a spec as for --gdn2-kernel) whose final states the "
                         "hand-off sessions hand into each kernel under test that keeps a state pool, which continues "
                         "the request (repeatable; default: env GDN2_PREFILL, else none: those sessions are skipped)")


# The entries of --gdn2-xfails, read (and checked) when pytest starts.
XFAILS = pytest.StashKey[list]()


def _read_xfails(path):
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise pytest.UsageError(f"--gdn2-xfails {path}: {exc.strerror or exc}") from None
    return [e for e in (ln.split("#", 1)[0].strip() for ln in lines) if e]


def _check_importable(spec, label=KERNEL_LABEL):
    """A ``pkg.mod:attr`` (or ``torch:pkg.mod:attr``, ``replayssm:PACKAGE``) kernel whose module cannot be found is a
    usage error naming the module and PYTHONPATH (looked up with importlib.util.find_spec: nothing is imported)."""
    import importlib.util

    name = spec.split("[", 1)[0].removeprefix("torch:")
    if name.startswith("replayssm:"):
        module = name.removeprefix("replayssm:")
    elif ":" not in name:
        return
    else:
        module = name.split(":", 1)[0]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing
        found = False
    if not found:
        raise pytest.UsageError(
            f"{label} {spec!r}: cannot import module {module!r}: is it installed in this "
            "environment, or on PYTHONPATH? pytest does not add the working directory to sys.path: from your "
            "repository's root, PYTHONPATH=. pytest --pyargs ...")


# Ctrl-Cs this pytest process received: code may swallow the KeyboardInterrupt (JAX's gc callback prints it and
# goes on), so a run of the suite that then passes is reported interrupted (exit 2), never passed.
CTRL_C = []


def _record_ctrl_c(config):
    """Chain a recorder in front of the SIGINT handler in force (pytest's own runs unchanged); undone at exit."""
    CTRL_C.clear()  # an earlier in-process run's Ctrl-C is not this run's
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        return

    def record(signum, frame):
        CTRL_C.append(signum)
        return previous(signum, frame)

    signal.signal(signal.SIGINT, record)
    config.add_cleanup(lambda: signal.signal(signal.SIGINT, previous))


def pytest_configure(config):
    _record_ctrl_c(config)
    # The conformance suite marks its long tests; registered here because the installed suite has
    # no ini file of its own (with --strict-markers an unregistered marker is an error).
    config.addinivalue_line("markers", SLOW)
    config.addinivalue_line("markers", modes_mark())
    config.addinivalue_line("markers", FAMILY_MARK)
    path = config.getoption("gdn2_xfails", default=None)
    config.stash[XFAILS] = _read_xfails(path) if path else []
    for name in kernel_names(config):  # a malformed list or a missing module: a usage error before collection
        _check_importable(name)
    for name in prefill_names(config):
        _check_importable(name, PREFILL_LABEL)
    _check_modes(config)
    if no_reference_cache(config):  # NumPy only: the cache module imports no JAX
        from gdn2_oracle.ci.grading import reference_cache

        reference_cache.set_enabled(False)


def pytest_unconfigure(config):
    if no_reference_cache(config):  # an in-process pytest run leaves the cache as it found it
        from gdn2_oracle.ci.grading import reference_cache

        reference_cache.set_enabled(True)


# The selected kernels no collected test judges (set after collection, when the suite runs).
UNJUDGED = pytest.StashKey[list]()
# On a test skipped because its kernel is of another family than the test judges (set by the suite's conftest.py):
# the reason. Such a test does not judge its kernel.
OTHER_FAMILY = pytest.StashKey[str]()
EMPTY_EXIT = pytest.ExitCode.NO_TESTS_COLLECTED


def _kernel_of(item):
    """The name of the suite's kernel a test runs on (its ``kernel`` or ``serving_kernel`` argument), or None."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return getattr(params.get("kernel", params.get("serving_kernel")), "name", None)


def _in_suite(item):
    """Whether a test is one of the conformance suite's (a module beside this file, not the plugin's own tests)."""
    return Path(str(item.fspath)).resolve().parent == Path(__file__).resolve().parent


@pytest.hookimpl(trylast=True)  # after the suite's and pytest's own deselection (-k, -m)
def pytest_collection_modifyitems(config, items):
    names = getattr(config, "_gdn2_kernel_names", None)  # set by the suite's conftest.py: absent, not our run
    if names is not None and not config.option.collectonly and any(map(_in_suite, items)):
        judged = {_kernel_of(item) for item in items  # skipped (another family's; no state pool): not judged
                  if OTHER_FAMILY not in item.stash and item.get_closest_marker("skip") is None}
        config.stash[UNJUDGED] = [n for n in names if n not in judged]


def pytest_runtest_teardown(item):
    """After each test of the suite: clear JAX's caches once the process holds half its limit of memory mappings, which
    every compiled program fills and past which XLA's compiler crashes (``ci/running/map_guard.py``)."""
    if _in_suite(item):
        from gdn2_oracle.ci.running import map_guard

        map_guard.relieve()


def pytest_sessionfinish(session, exitstatus):
    """A run of the suite that would pass but was reached by a Ctrl-C exits 2 (interrupted); one that judged some
    selected kernel on nothing exits 5 (EMPTY, not a pass)."""
    if UNJUDGED not in session.config.stash or exitstatus != pytest.ExitCode.OK:
        return
    if CTRL_C:
        session.exitstatus = pytest.ExitCode.INTERRUPTED
    elif session.config.stash[UNJUDGED]:
        session.exitstatus = EMPTY_EXIT


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """One line naming the kernels no test judged, or saying that a Ctrl-C reached the run."""
    unjudged = config.stash.get(UNJUDGED, None)
    if CTRL_C and unjudged is not None:
        terminalreporter.write_line("gdn2: INTERRUPTED: a Ctrl-C reached this run (its KeyboardInterrupt was "
                                    "swallowed by the code it hit); not a pass (exit 2)", red=True)
    elif unjudged:
        terminalreporter.write_line(
            f"gdn2: EMPTY for {', '.join(unjudged)}: no test judged {'it' if len(unjudged) == 1 else 'them'} (every "
            "test taking it was deselected: the modes it accepts, --gdn2-modes, -k or -m; or skipped: the properties "
            "of another family); not a pass (exit 5)",
            red=True)


def pytest_report_header(config):
    """One header line, only in a run that uses the suite's options."""
    if _asked(config):
        names = kernel_names(config) or ["the default set"]
        return (f"gdn2: hypothesis profile {profile_name(config)!r}; kernels {', '.join(names)}"
                + ("; strict grades (PRECISION fails)" if strict(config) else "")
                + (f"; mesh {mesh_spec(config)}" if mesh_spec(config) else "")
                + (f"; modes {','.join(modes_option(config))}" if modes_option(config) else "")
                + ("; reference cache off" if no_reference_cache(config) else "")
                + ("; compile cache off" if no_compile_cache(config) else "")
                + (f"; prefill {', '.join(prefill_names(config))}" if prefill_names(config) else ""))
    return None
