"""Packaging: the wheel installs one import package, ``gdn2_oracle``, and coexists with PyPI's ``kernels``.

The wheel is built (pip, with build isolation, as a user's ``pip install`` does) from a copy of the
working tree, so the build leaves no ``build/`` or ``*.egg-info`` in the repository, and installed into
a fresh virtual environment together with the PyPI package ``kernels`` (the Hugging Face kernel hub,
whose import name is also ``kernels``). Then, from a temporary directory outside the repository:

* the wheel puts exactly two names into site-packages, ``gdn2_oracle`` and its ``.dist-info`` (its
  file list, and the venv's site-packages listing before and after installing it): no top-level
  ``oracle``, ``kernels``, ``golden``, ``ci`` or ``property_tests`` of ours;
* (a) ``import kernels`` is still the hub package and ``import gdn2_oracle.kernels`` is ours, whichever
  is imported first, and importing ours never loads a bare ``kernels``;
* (b) ``gdn2-oracle validate --kernel pairwise --cases golden`` on two small golden cases passes,
  reading the installed golden corpus;
* (c) the conformance suite (``pytest --pyargs gdn2_oracle.property_tests``, through the installed
  ``pytest11`` plugin) passes for a correct kernel module written into that directory and fails for
  a wrong one (output scaled by 1 + 1e-3), and collects under a kernel author's ``--strict-markers``
  (the markers it uses must be registered by the installed suite, not only by our pyproject.toml).

Cost: the heavy dependencies (JAX, NumPy, mpmath, pytest, Hypothesis, ...) are not installed again.
The fresh venv gets a ``.pth`` line naming this environment's site-packages: a plain path line, so
that directory lands on ``sys.path`` without its own ``.pth`` files running (this environment's
editable install of gdn2_oracle stays inactive there). It is written only after pip has installed
``kernels`` (with its small dependencies, from the pip cache when warm) and the wheel (``--no-deps``),
so pip never sees, let alone modifies, this environment. The added time is printed (``pytest -s``):
about 45 s on 2 shared CPU cores (build 3 s, pip 8-11 s, (a) 2 s, (b) 5 s, (c) 24 s), the same with a
cold pip cache.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import time
import venv
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
OURS = ("oracle", "kernels", "golden", "ci", "property_tests")  # the subpackages, top-level folders here
HUB = "kernels"  # the PyPI package (Hugging Face kernel hub); import name also ``kernels``
# Not copied into the build tree: VCS data, caches, build outputs, reports (and any virtual environment).
COPY_IGNORE = {".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", ".benchmarks", "build", "dist",
               "reports", ".mypy_cache", ".ruff_cache"}
# Variables of the outer run that must not leak into the fresh environment's processes.
ENV_DROP = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONSAFEPATH", "VIRTUAL_ENV", "HYPOTHESIS_PROFILE")
ENV_DROP_PREFIXES = ("PYTEST_", "GDN2_")
TIMEOUT = 600


def _tail(text, n=6000):
    return text if len(text) <= n else "...\n" + text[-n:]


def _run(argv, *, cwd, env, what, timeout=TIMEOUT):
    """``(returncode, stdout + stderr)`` of ``argv``; fails the test with the output if it cannot run."""
    try:
        proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        pytest.fail(f"{what}: timed out after {timeout} s\n{_tail(out)}", pytrace=False)
    return proc.returncode, proc.stdout + proc.stderr


def _check(argv, *, cwd, env, what, hint=""):
    code, out = _run(argv, cwd=cwd, env=env, what=what)
    if code != 0:
        pytest.fail(f"{what} failed (exit {code}){hint}\n$ {' '.join(map(str, argv))}\n{_tail(out)}", pytrace=False)
    return out


def _copy_tree(src, dst):
    """The working tree (tracked and untracked files alike) minus VCS data, caches, build outputs, venvs."""
    def ignore(directory, names):
        d = Path(directory)
        return {n for n in names
                if n in COPY_IGNORE or n.endswith(".egg-info") or (d / n / "pyvenv.cfg").is_file()}

    shutil.copytree(src, dst, ignore=ignore, symlinks=True)


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROP and not k.startswith(ENV_DROP_PREFIXES)}
    env.update(extra)
    return env


def _dev_site_packages():
    """This environment's site-packages (where JAX, NumPy, pytest, ... are installed)."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(paths[k] for k in ("purelib", "platlib")))


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The built wheel and a fresh venv holding it and PyPI's ``kernels`` (see the module docstring)."""
    start = time.perf_counter()
    times = {}
    base = tmp_path_factory.mktemp("packaging")
    work, src, wheels, vdir, rundir = (base / n for n in ("work", "src", "wheels", "venv", "run"))
    for d in (work, wheels, rundir):
        d.mkdir()
    pip_env = _clean_env()

    def lap(name, t0):
        times[name] = time.perf_counter() - t0

    try:
        # 1. The wheel, built from a copy of the working tree (build isolation fetches setuptools>=68).
        t0 = time.perf_counter()
        _copy_tree(ROOT, src)
        build_log = _check([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", wheels, src],
                           cwd=work, env=pip_env, what="building the wheel (pip wheel)",
                           hint=" -- is the package index reachable (build isolation installs setuptools)?")
        [wheel] = sorted(wheels.glob("gdn2_oracle-*.whl"))
        lap("build wheel", t0)

        # 2. A fresh venv on this interpreter's base Python; this environment's pip installs into it (--python).
        t0 = time.perf_counter()
        venv.create(vdir, with_pip=False, symlinks=os.name != "nt")
        bindir = vdir / ("Scripts" if os.name == "nt" else "bin")
        python = bindir / ("python.exe" if os.name == "nt" else "python")
        site = Path(_check([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           cwd=work, env=pip_env, what="locating the fresh venv's site-packages").strip())
        pip = [sys.executable, "-m", "pip", "--python", python, "install", "--disable-pip-version-check"]
        listing0 = set(os.listdir(site))
        lap("create venv", t0)

        # 3. PyPI's kernels, with its dependencies (the fresh venv does not see this environment yet).
        t0 = time.perf_counter()
        _check([*pip, HUB], cwd=work, env=pip_env, what=f"pip install {HUB} (the PyPI package) into the fresh venv",
               hint=" -- is PyPI reachable? This test needs it and is not skipped without it.")
        listing1 = set(os.listdir(site))
        lap(f"pip install {HUB}", t0)

        # 4. Our wheel, without dependencies (they come from this environment, step 5).
        t0 = time.perf_counter()
        _check([*pip, "--no-deps", wheel], cwd=work, env=pip_env, what="pip install the wheel into the fresh venv")
        listing2 = set(os.listdir(site))
        lap("pip install wheel", t0)

        # 5. Reuse this environment's packages: a plain path line (its own .pth files do not run).
        (site / "_gdn2_dev_site_packages.pth").write_text("".join(p + "\n" for p in _dev_site_packages()))

        # its caches in the user's place, outside the clone (make test points XDG_CACHE_HOME into the clone)
        run_env = _clean_env(JAX_PLATFORMS="cpu", VIRTUAL_ENV=str(vdir), PYTHONPATH=str(rundir),
                             XDG_CACHE_HOME=str(base / "cache-home"),
                             PATH=str(bindir) + os.pathsep + os.environ.get("PATH", ""))
        yield SimpleNamespace(wheel=wheel, build_log=build_log, vdir=vdir, bindir=bindir, python=python,
                              site=site, rundir=rundir, env=run_env, times=times,
                              listing0=listing0, listing1=listing1, listing2=listing2)
    finally:
        times["total (setup + tests)"] = time.perf_counter() - start
        print("\n[test_packaging] added time: " + "; ".join(f"{k} {v:.1f} s" for k, v in times.items()))
        shutil.rmtree(base, ignore_errors=True)  # ~150 MB of venv; pytest would keep three runs of it


def _timed(env, name, argv, what):
    t0 = time.perf_counter()
    code, out = _run(argv, cwd=env.rundir, env=env.env, what=what)
    env.times[name] = time.perf_counter() - t0
    return code, out


def _site_packages_names(namelist):
    """Top-level names a wheel with these members creates in site-packages (purelib/platlib of .data too)."""
    names = set()
    for member in namelist:
        parts = member.split("/")
        if parts[0].endswith(".data"):
            if len(parts) > 2 and parts[1] in ("purelib", "platlib"):
                names.add(parts[2])
        else:
            names.add(parts[0])
    return names


# --------------------------------------------------------------------------------------------
# the wheel's contents


def test_wheel_installs_only_gdn2_oracle(env):
    with zipfile.ZipFile(env.wheel) as zf:
        members = zf.namelist()
        [dist_info] = {m.split("/")[0] for m in members if m.split("/")[0].endswith(".dist-info")}
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
    expected = {"gdn2_oracle", dist_info}
    assert _site_packages_names(members) == expected, sorted(_site_packages_names(members))

    # What installing it added to the fresh venv's site-packages (after kernels was installed).
    added = env.listing2 - env.listing1
    assert added == expected, f"installing the wheel added {sorted(added)} to site-packages"
    assert env.listing1 >= env.listing0 and HUB in env.listing1 - env.listing0, "pip install kernels added no kernels/"
    for name in OURS:
        if name != HUB:
            assert name not in env.listing2, f"top-level {name!r} in site-packages"
    assert not [m for m in members if m.startswith(tuple(f"{n}/" for n in OURS))], "a top-level subpackage"

    # Every subpackage is there, with the golden corpus; tests and benchmarks are not installed.
    for name in OURS:
        assert f"gdn2_oracle/{name}/__init__.py" in members, f"gdn2_oracle.{name} missing from the wheel"
    manifest = json.loads(zipfile.ZipFile(env.wheel).read("gdn2_oracle/golden/MANIFEST.json"))
    missing = [c for c in manifest["cases"] if f"gdn2_oracle/golden/data/{c}.npz" not in members]
    assert not missing, f"golden files missing from the wheel: {missing}"
    assert not [m for m in members if "/tests/" in m or "/benchmarks/" in m], "test folders are installed"

    # The console script and the pytest plugin.
    assert "gdn2-oracle = gdn2_oracle.ci.supervisor:main" in entry_points, entry_points  # runs ci/cli.py in a child
    assert "[pytest11]" in entry_points and "gdn2_oracle.property_tests.plugin" in entry_points, entry_points


# --------------------------------------------------------------------------------------------
# (a) `kernels` is the hub package, `gdn2_oracle.kernels` is ours, in either import order

_IMPORTS = textwrap.dedent("""
    import importlib, importlib.metadata as md, importlib.util, json, os, sys
    ours_first = sys.argv[1] == "ours-first"
    ours = ["gdn2_oracle.oracle", "gdn2_oracle.kernels", "gdn2_oracle.golden", "gdn2_oracle.ci.cli",
            "gdn2_oracle.ci.running.harness", "gdn2_oracle.property_tests.plugin",
            "gdn2_oracle.property_tests.strategies"]
    out = {}
    if ours_first:
        for m in ours:
            importlib.import_module(m)
        out["bare_kernels_loaded_by_ours"] = "kernels" in sys.modules
    import kernels
    import gdn2_oracle, gdn2_oracle.kernels as gk
    if not ours_first:
        for m in ours:
            importlib.import_module(m)
    hub = md.distribution("kernels")
    out.update(
        kernels_file=kernels.__file__,
        kernels_dist_file=str(hub.locate_file("kernels/__init__.py")),
        kernels_version=hub.version,
        kernels_has_get_kernel=callable(getattr(kernels, "get_kernel", None)),
        ours_kernels_file=gk.__file__,
        ours_get=callable(getattr(gk, "get", None)) and callable(gk.get("pairwise")),
        gdn2_oracle_path=[os.path.realpath(p) for p in gdn2_oracle.__path__],
        gdn2_version=md.version("gdn2-oracle"),
        top_level={n: (s.origin if s else None) for n in ("oracle", "golden", "ci", "property_tests")
                   for s in [importlib.util.find_spec(n)]},
    )
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.parametrize("order", ["hub-first", "ours-first"])
def test_a_kernels_is_the_hub_package_and_gdn2_oracle_kernels_is_ours(env, order):
    code, out = _timed(env, f"(a) imports {order}", [env.python, "-c", _IMPORTS, order], "import check")
    assert code == 0, out
    [line] = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    r = json.loads(line[len("RESULT "):])
    site = Path(os.path.realpath(env.site))
    assert Path(os.path.realpath(r["kernels_file"])) == site / "kernels" / "__init__.py", r
    assert os.path.realpath(r["kernels_file"]) == os.path.realpath(r["kernels_dist_file"]), r
    assert r["kernels_has_get_kernel"], r
    assert Path(os.path.realpath(r["ours_kernels_file"])) == site / "gdn2_oracle" / "kernels" / "__init__.py", r
    assert r["ours_get"], r
    assert r["gdn2_oracle_path"] == [str(site / "gdn2_oracle")], r  # the wheel's copy, not this repository
    assert r["gdn2_version"], r
    assert r["top_level"] == {n: None for n in ("oracle", "golden", "ci", "property_tests")}, r
    if order == "ours-first":
        assert r["bare_kernels_loaded_by_ours"] is False, "importing gdn2_oracle loaded a bare `kernels`"
    print(f"\n[test_packaging] {HUB} {r['kernels_version']} at {r['kernels_file']}; ours at {r['ours_kernels_file']}")


# --------------------------------------------------------------------------------------------
# (b) the console script validates a kernel against the installed golden corpus


def test_b_cli_validate_passes_on_two_golden_cases(env):
    report = env.rundir / "validate.json"
    code, out = _timed(env, "(b) gdn2-oracle validate",
                       [env.bindir / "gdn2-oracle", "validate", "--kernel", "pairwise", "--cases", "golden",
                        "--case", "len_1", "--case", "decay_moderate", "--dtype", "float32", "--no-progress",
                        "--json", report], "gdn2-oracle validate")
    assert code == 0 and "overall: PASS" in out, out
    data = json.loads(report.read_text())
    assert data["passed"] is True, data
    [k] = data["kernels"]
    assert sorted(c["case"] for c in k["cases"]) == ["decay_moderate", "len_1"], k
    assert str(ROOT) not in out + report.read_text(), "the run used this repository instead of the wheel"


# --------------------------------------------------------------------------------------------
# (c) the conformance suite, through the installed pytest plugin, on a kernel module of the user's

KERNEL_MODULE = textwrap.dedent('''
    """A kernel author's module: a correct kernel and a wrong one (output scaled by 1 + 1e-3)."""
    import os

    import gdn2_oracle.kernels

    # The installed wheel, not the repository it was built from.
    assert os.path.realpath(gdn2_oracle.kernels.__file__).startswith({site!r}), gdn2_oracle.kernels.__file__

    _pairwise = gdn2_oracle.kernels.get("pairwise")


    def correct(q, k, v, g, b, w, *, scale=None, initial_state=None):
        return _pairwise(q, k, v, g, b, w, scale=scale, initial_state=initial_state)


    def wrong(q, k, v, g, b, w, *, scale=None, initial_state=None):
        o, final_state = _pairwise(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
        return o * (1 + 1e-3), final_state
''')

# The property test (Hypothesis, dev profile) and one golden case: the installed suite end to end, quickly.
SELECT = ["-k", "test_matches_oracle or (test_kernel_matches_golden and len_1)"]


def _suite(env, kernel, *extra, name=None):
    return _timed(env, name or f"(c) conformance suite, {kernel}",
                  [env.python, "-m", "pytest", "--pyargs", "gdn2_oracle.property_tests", "--gdn2-kernel",
                   f"mykernel:{kernel}", "--gdn2-profile", "dev", "-p", "no:cacheprovider", *extra],
                  f"pytest --pyargs gdn2_oracle.property_tests ({kernel})")


@pytest.fixture(scope="module")
def kernel_module(env):
    (env.rundir / "mykernel.py").write_text(KERNEL_MODULE.format(site=os.path.realpath(env.site)))


def test_c_conformance_suite_passes_a_correct_kernel_and_fails_a_wrong_one(env, kernel_module):
    code, out = _suite(env, "correct", "-v", *SELECT)
    assert code == 0 and "2 passed" in out, out
    # the kernel under test is the one named (counted on the result lines: a warnings summary names tests too)
    assert len(re.findall(r"\[mykernel:correct[^\]]*\] PASSED", out)) == 2, out

    # The wrong kernel on the golden case only: deterministic, and quick (the property test would spend
    # ~15 s on its explicit examples to say the same).
    code, out = _suite(env, "wrong", "-rf", "-k", "test_kernel_matches_golden and len_1")
    assert code == 1 and "1 failed" in out and "[mykernel:wrong-len_1]" in out, out


def test_installed_suite_registers_the_markers_it_uses(env, kernel_module):
    """The repository's pyproject.toml registers markers (``slow``) for its own runs only; the installed
    suite must work under a kernel author's ``--strict-markers`` too."""
    code, out = _suite(env, "correct", "--strict-markers", "--collect-only", "-q", name="(c) collect, strict markers")
    assert code == 0 and "PytestUnknownMarkWarning" not in out, _tail(out, 1500)


def test_the_clone_holds_no_build_outputs():
    """The editable install of ``make test`` writes its metadata out of the tree (pyproject.toml
    [tool.distutils.egg_info]); a ``*.egg-info`` here would be taken by pip for an installed gdn2-oracle."""
    assert not sorted(ROOT.glob("*.egg-info")) and not (ROOT / "build").exists(), sorted(ROOT.iterdir())
