"""The conformance suite's hooks: which kernels run, which profile, which tests are expected to fail.

Options come from the ``gdn2_oracle`` pytest plugin (``property_tests/plugin.py``). A test that
takes the ``kernel`` argument runs once per selected kernel (ids = the names as given); a test
that does not runs once. Kernel-option variants that belong to another kernel than the one under
test are deselected, not skipped; so are training-call mode tests (marker ``gdn2_modes``) for a kernel
whose signature does not accept the mode, or for a mode left out of ``--gdn2-modes``. Each kernel's family is read
as ``validate`` reads it (``ci/running/families.py``). A GDN-2 property (marked ``gdn2_family("gdn2")``) is
deselected for a Gated DeltaNet or KDA kernel, which runs its family-lens version instead (``test_families.py``,
``test_family_properties.py``, ``test_family_golden.py``, ``test_family_serving.py``), and a line at the end of the
run says how many and why; a family property is skipped for a GDN-2 kernel with the reason.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from gdn2_oracle.ci.running import ast_guard, collector, supervised
from gdn2_oracle.ci.running import families as family_running
from gdn2_oracle.kernels.spec import KernelSpec
from gdn2_oracle.property_tests import grading, profiles
from gdn2_oracle.property_tests.plugin import (
    KERNEL_LABEL,
    OTHER_FAMILY,
    PREFILL_LABEL,
    XFAILS,
    kernel_names,
    mesh_spec,
    no_compile_cache,
    prefill_names,
    selected_modes,
    strict,
)
from gdn2_oracle.property_tests.strategies import DEFAULT_KERNELS, Kernel, kernel_fn

HERE = Path(__file__).resolve().parent


def _selected_names(config):
    return kernel_names(config) or list(DEFAULT_KERNELS)


def _ours(item):
    return Path(str(item.fspath)).resolve().parent == HERE


def pytest_configure(config):
    ast_guard.install()  # kernels run beside JAX's threads, and CPython's ast.parse is not thread-safe
    supervised.guard_exit()  # a kernel calling os._exit fails its test; nothing supervises a pytest process
    collector.raise_threshold()  # fewer young collections while kernels trace (ci/running/collector.py)
    config._gdn2_profile = profiles.select(config)
    config._gdn2_kernel_names = _selected_names(config)
    # a bad kernel (or a beta-signature one without its family): one line, before collection
    config._gdn2_kernels, config._gdn2_families = _built(config._gdn2_kernel_names)
    # the hand-off sessions' prefill kernels (--gdn2-prefill), built the same way
    config._gdn2_prefills, config._gdn2_prefill_families = _built(prefill_names(config), PREFILL_LABEL)
    grading.STRICT = strict(config)
    config._gdn2_modes = selected_modes(config)  # checked by the plugin when pytest started
    config._gdn2_compile_cache = _enable_compile_cache(config)
    if mesh_spec(config):  # every kernel call (ci.running.harness) runs in this mesh, on NamedSharding inputs
        import jax

        from gdn2_oracle.ci.running.mesh import build_mesh  # JAX only with --gdn2-mesh

        try:
            config._gdn2_mesh = jax.set_mesh(build_mesh(mesh_spec(config)))
        except ValueError as exc:
            raise pytest.UsageError(f"--gdn2-mesh {mesh_spec(config)}: {exc}") from None
        config._gdn2_mesh.__enter__()


def _enable_compile_cache(config):
    """JAX's persistent compilation cache for the suite's programs, as the CLI's (ci/running/compile_cache.py): a
    warm run reads what a cold one compiled (the ``ci`` profile draws the same examples every run). Not with
    --gdn2-no-compile-cache or ``GDN2_COMPILE_CACHE=off``, nor where JAX already has a cache directory (the user's
    setting wins). Returns the settings to restore when pytest ends, None when nothing was changed."""
    if no_compile_cache(config):
        return None
    from gdn2_oracle.ci.running import compile_cache

    before = compile_cache.settings()
    if before[0] or compile_cache.enable() is None:
        return None
    return before


def _modes_missing(item, kernel, config):
    """The modes a ``gdn2_modes``-marked test needs that ``kernel`` does not accept or the run left out."""
    needed = [m for mark in item.iter_markers("gdn2_modes") for m in mark.args]
    if not needed:
        return []
    from gdn2_oracle.ci.running.modes import accepted_modes, chosen_modes  # only when a mode test is collected
    from gdn2_oracle.ci.running.serving import accepts_serving

    family = kernel_family(config, kernel.name)
    serving = _pool_modes() if accepts_serving(kernel.fn) else set()
    if family == family_running.GDN2:
        accepted = set(accepted_modes(kernel.fn)) | serving
    else:  # those its family has (FLA's entry point) and its signature takes
        accepted = set(family_running.accepted_family_modes(kernel.fn, family)) | serving
    accepted = set(chosen_modes(kernel.fn, sorted(accepted)))  # less those its spec option modes= leaves out
    ok = accepted & set(config._gdn2_modes)
    return [m for m in needed if m not in ok]


def _pool_modes():
    """The modes a kernel on a state pool takes part in: the registry's serving modes and the hand-off sessions'."""
    from gdn2_oracle.oracle import call_modes, handoff_recipes

    return set(call_modes.names("serving")) | {handoff_recipes.MODE}


def pytest_unconfigure(config):
    if getattr(config, "_gdn2_mesh", None) is not None:
        config._gdn2_mesh.__exit__(None, None, None)
    before = getattr(config, "_gdn2_compile_cache", None)
    if before is not None:  # an in-process pytest run leaves JAX's settings as it found them
        from gdn2_oracle.ci.running import compile_cache

        compile_cache.restore(before)


IMPORT_HINT = ("is its module installed in this environment, or on PYTHONPATH? pytest does not add the working "
               "directory to sys.path: from your repository's root, PYTHONPATH=. pytest --pyargs ...")


def _built(names, label=KERNEL_LABEL):
    """``(kernels, {name: family})``: the selected kernels, built once, and the family of each (the spec option
    ``family``, taken out of the spec, else the kernel's attribute: ``ci/running/families.py``, as ``validate``);
    a usage error (one line, exit 4) naming the kernel and what to do."""
    out, fams = [], {}
    for name in names:
        try:
            spec, option = family_running.spec_family(KernelSpec.parse(name))
            fn = kernel_fn(name) if option is None else kernel_fn(spec.name, **spec.options)
            fams[name] = family_running.kernel_family(fn, option, label=name)
            out.append(Kernel(name, fn))
        except ValueError as exc:
            why = str(exc).removeprefix("name: ")
            hint = f"; {IMPORT_HINT}" if "cannot import module" in why else ""
            raise pytest.UsageError(f"{label} {name!r}: {why}{hint}") from None
    return out, fams


def selected_kernels(config):
    """The kernels under test (built when pytest started)."""
    return config._gdn2_kernels


def kernel_family(config, name):
    """The family of the kernel selected as ``name`` (``gdn2`` for one not selected: the suite's serving fallback)."""
    return config._gdn2_families.get(name, family_running.GDN2)


@pytest.fixture(scope="session")
def kernel_families(pytestconfig):
    """``{kernel name as selected: its family}`` (``gdn2``, ``gdn`` or ``kda``)."""
    return dict(pytestconfig._gdn2_families)


LENS_MODULES = ("test_families.py", "test_family_properties.py", "test_family_modes.py", "test_family_golden.py",
                "test_family_serving.py")


def _lensed(item, kernel, config):
    """Whether ``item`` is a GDN-2 property and ``kernel`` a family kernel: its family-lens version runs instead."""
    judged = [f for mark in item.iter_markers("gdn2_family") for f in mark.args]
    family = kernel_family(config, getattr(kernel, "name", None))
    return bool(judged) and family not in judged and family != family_running.GDN2


def _other_family(item, kernel, config):
    """The skip reason when ``item`` (marked ``gdn2_family``) judges other families than ``kernel``'s, else None."""
    judged = [f for mark in item.iter_markers("gdn2_family") for f in mark.args]
    name = getattr(kernel, "name", None)
    family = kernel_family(config, name)
    if not judged or family in judged:
        return None
    if family == family_running.GDN2:
        return (f"kernel {name!r} is a {family} kernel (the plain contract): judged by the GDN-2 properties; these "
                f"properties judge {' and '.join(judged)} family kernels")
    return f"kernel {name!r} is a {family} family kernel: judged by the family properties"


def _serving_only(item, kernel):
    """The skip reason when ``kernel`` runs serving sessions only (its ``serving_only`` attribute says why: vLLM's
    ReplaySSM functions) and ``item`` is not a serving test (marked ``gdn2_modes`` with serving modes), else None."""
    why = getattr(kernel.fn, "serving_only", None)
    if not why:
        return None
    needed = {m for mark in item.iter_markers("gdn2_modes") for m in mark.args}
    if needed and needed <= _pool_modes():
        return None
    return f"kernel {kernel.name!r} runs serving sessions only ({why}): judged by the serving properties"


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


def _listed(item, entries):
    """The --gdn2-xfails entry naming this test: its node id (or a suffix), its name, or a case parameter."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    names = {item.nodeid, item.name, item.originalname, *(str(v) for v in params.values() if isinstance(v, str))}
    return next((e for e in entries if e in names or item.nodeid.endswith(e)), None)


def pytest_collection_modifyitems(config, items):
    """Deselect option variants of other kernels and a family kernel's GDN-2 properties; mark the tests listed in
    --gdn2-xfails as xfail."""
    keep, drop, used, lensed = [], [], set(), {}
    config._gdn2_lensed = lensed
    for item in items:
        if not _ours(item):
            keep.append(item)
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        kernel, owner = params.get("kernel", params.get("serving_kernel")), params.get("owner")
        if kernel is not None and owner is not None and getattr(kernel, "name", None) != owner:
            drop.append(item)
            continue
        family = params.get("family")  # a family property's recipe of the other family than the kernel's
        if kernel is not None and family is not None and kernel_family(config, kernel.name) not in (
                family, family_running.GDN2):  # (a GDN-2 kernel: skipped with the reason below)
            drop.append(item)
            continue
        if kernel is not None and _lensed(item, kernel, config):
            lensed[kernel.name] = lensed.get(kernel.name, 0) + 1
            drop.append(item)
            continue
        missing = _modes_missing(item, kernel, config) if kernel is not None else []
        # a test the run's modes leave out is deselected; one skipped with its reason (a serving test of a kernel
        # without a state pool) stays, so the reason is seen
        if missing and (item.get_closest_marker("skip") is None or set(missing) - set(config._gdn2_modes)):
            drop.append(item)
            continue
        other = _other_family(item, kernel, config) if kernel is not None else None
        if other is None and kernel is not None:
            other = _serving_only(item, kernel)
        if other is not None:  # a skip with its reason, never a silent pass; the kernel is not judged by it
            item.stash[OTHER_FAMILY] = other
            item.add_marker(pytest.mark.skip(reason=other))
        entry = _listed(item, config.stash[XFAILS])
        if entry is not None:
            used.add(entry)
            item.add_marker(pytest.mark.xfail(reason=f"listed in --gdn2-xfails ({entry})", strict=False))
        keep.append(item)
    unmatched = [e for e in config.stash[XFAILS] if e not in used]
    if unmatched:  # a misspelt entry would otherwise be ignored silently
        names = ", ".join(map(repr, unmatched))
        warnings.warn(pytest.PytestConfigWarning(f"--gdn2-xfails: no test matches {names} (a test id or its "
                                                 "suffix, a test name or a golden case name)"), stacklevel=2)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_terminal_summary(terminalreporter, config):
    """One line per family kernel whose GDN-2 properties were deselected: how many, and where their lens runs."""
    for name, n in getattr(config, "_gdn2_lensed", {}).items():
        terminalreporter.write_line(
            f"gdn2: {n} GDN-2 properties deselected for {name!r} (a {kernel_family(config, name)} family kernel): "
            f"their family-lens versions judge it ({', '.join(LENS_MODULES)})")
