"""The program cache's staleness battery: a cached program never changes a verdict.

Every scenario runs the real command (``gdn2-oracle validate`` in a fresh interpreter, ``ci/cache_selfcheck.py``'s
``validate``) on one small golden case with a fresh temporary program cache (and XDG cache home), at least twice in
that cache, and compares each cached run -- its exit status and every kernel's grade and per-result grades from
``--json`` -- with a run of the same kernels on the same files and environment without it (``--no-program-cache``,
``GDN2_PROGRAM_CACHE=off``). Several kernels share a run (``--kernel a,b,c``), correct-then-wrong and
wrong-then-correct. Only a damaged or unusable cache may instead be refused clearly (exit 2 naming the cache).
The slowest scenarios are marked ``slow`` (the release group, ``make test-release``).

The kernels: ``kernels/testing_factory.py`` (closures of one factory: nothing but the traced program tells them
apart) and small modules written here on ``PYTHONPATH`` (no bytecode cache: an edit is always seen by the next
interpreter). A scenario whose change does not change the uncached verdict would prove nothing, so each asserts
that it does.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gdn2_oracle.ci import cache_selfcheck
from gdn2_oracle.ci.commands.output import EXIT
from gdn2_oracle.ci.testing import damage
from gdn2_oracle.kernels import testing_factory

FACTORY = testing_factory.spec
PASS = "PASS"
EXIT_USAGE = 2  # a refusal (README, exit codes)
# Environment variables a scenario sets itself: every other JAX_/XLA_/GDN2_ setting of this session is dropped.
DROPPED = ("GDN2_", "PYTEST_", "JAX_", "XLA_")

KERNEL_HEAD = """\
import jax
import jax.numpy as jnp
from gdn2_oracle.kernels import get

_BASE = get("pairwise")
WRONG = 1 + 1e-3


def _wrong(o):
    return (o * WRONG).astype(o.dtype)
"""


class Bench:
    """One scenario: its own program cache, the session's ``shared`` reference and compilation caches, its module
    directories (``PYTHONPATH``) and extra environment."""

    def __init__(self, root: Path, shared: Path):
        self.root, self.shared, self.paths, self.env = root, shared, [], {}
        self.programs = root / "programs"

    def module(self, name, body, *, where="mods", head=KERNEL_HEAD):
        """Write module ``name`` (dotted: packages made as needed) under ``where``, which goes on PYTHONPATH."""
        base = self.root / where
        if str(base) not in self.paths:
            self.paths.append(str(base))
        *pkgs, leaf = name.split(".")
        folder = base.joinpath(*pkgs)
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(len(pkgs)):
            (base.joinpath(*pkgs[: i + 1]) / "__init__.py").touch()
        path = folder / f"{leaf}.py"
        path.write_text(head + "\n\n" + textwrap.dedent(body), encoding="utf-8")
        return path

    def environ(self, cached):
        """The command's environment: this scenario's program cache (off when not ``cached``), the shared caches."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(DROPPED)}
        env.update(XDG_CACHE_HOME=str(self.root / "xdg"), PYTHONDONTWRITEBYTECODE="1",
                   PYTHONPATH=os.pathsep.join([*self.paths, *filter(None, [os.environ.get("PYTHONPATH")])]),
                   GDN2_PROGRAM_CACHE=str(self.programs) if cached else "off",
                   GDN2_REFERENCE_CACHE=str(self.shared / "references"), GDN2_COMPILE_CACHE=str(self.shared / "jax"))
        env.update(self.env)
        return env

    def validate(self, specs, *, cached=True, **popen):
        """``gdn2-oracle validate`` on ``specs`` (a :class:`cache_selfcheck.Run`)."""
        return cache_selfcheck.validate(specs, env=self.environ(cached), workdir=self.root / "work",
                                        cached=cached, **popen)

    def plain(self, specs):
        """The verdict with no cache at all: what every cached run must match."""
        run = self.validate(specs, cached=False)
        assert run.kernels, f"the uncached run judged nothing (exit {run.code}):\n{summary(run)}"
        return run

    def entries(self):
        """The files of the program cache (not a writer's temporary files)."""
        if not self.programs.is_dir():
            return set()
        return {p for p in self.programs.rglob("*") if p.is_file() and not p.name.startswith(".")}


@pytest.fixture(scope="session")
def shared(tmp_path_factory):
    """The reference and compilation caches of this session's scenarios: keyed by content (a recipe; a compiled
    program's HLO with the XLA flags and versions), so sharing them keeps the battery short and cannot carry one
    kernel's program to another."""
    return tmp_path_factory.mktemp("shared-caches")


@pytest.fixture
def bench(tmp_path, shared):
    """A scenario with a fresh temporary program cache."""
    return Bench(tmp_path, shared)


def differences(cached, plain, what):
    """The ways the cached run's verdict differs from the uncached one (empty when it is the same)."""
    out = []
    if cached.code != plain.code:
        out.append(f"{what}: exit {cached.code} with the cache, {plain.code} without")
    for spec, want in plain.kernels.items():
        got = cached.kernels.get(spec)
        if got is None:
            out.append(f"{what}: {spec} not judged with the cache")
        elif got != want:
            wrong = {r: g for r, g in got["results"].items() if want["results"].get(r) != g}
            out.append(f"{what}: {spec} graded {got['grade']} with the cache, {want['grade']} without "
                       f"(results that differ, as cached: {wrong})")
    return out


def assert_same(runs, plain=None):
    """Every ``(label, run)`` of ``runs`` has the uncached verdict ``plain`` (or every ``(label, run, plain)`` its
    own); all differences are reported at once."""
    runs = [r if plain is None else (*r, plain) for r in runs]
    found = [line for label, run, want in runs for line in differences(run, want, label)]
    assert not found, "\n".join(found) + "\n--- the last cached run's summary:\n" + summary(runs[-1][1])


def assert_same_or_refused(runs, plain=None):
    """As :func:`assert_same`, but a clear refusal (exit 2 naming the program cache) is accepted too."""
    kept = [r for r in runs if not refused(r[1])]
    if kept:
        assert_same(kept, plain)


def summary(run):
    """The closing lines of a run's output (its per-kernel grades), and any error."""
    return "\n".join(run.output.splitlines()[-12:])


def refused(run):
    """Whether ``run`` refused to go on because of its program cache: exit 2 and a message naming it."""
    return run.code == EXIT_USAGE and "program cache" in run.output.lower()


def assert_sound(plain, good, bad):
    """The uncached verdict holds what a scenario relies on: ``good`` kernels PASS, ``bad`` ones do not."""
    grades = {spec: plain.grade(spec) for spec in (*good, *bad)}
    assert all(grades[s] == PASS for s in good) and all(grades[s] not in (PASS, None) for s in bad), grades


def both_orders(bench, specs):
    """Two cached runs in one cache: ``specs`` as given, then reversed; with labels."""
    return [("first run, as given", bench.validate(specs)), ("second run, reversed", bench.validate(specs[::-1]))]


LAMBDAS = """
good = lambda q, k, v, g, b, w, *, scale=None, initial_state=None: _BASE(
    q, k, v, g, b, w, scale=scale, initial_state=initial_state)
bad = lambda q, k, v, g, b, w, *, scale=None, initial_state=None: (
    lambda o, s: (_wrong(o), s))(*_BASE(q, k, v, g, b, w, scale=scale, initial_state=initial_state))
"""


# --- (a) the factory's kernels -----------------------------------------------------------------------------------


def test_closures_of_one_factory_and_lambdas_of_one_module(bench):
    """Correct and wrong closures of one factory (a forward and a gradient-only bug) and two lambdas of one module
    (both named ``<lambda>``) keep their own verdicts, in one cold run and the next."""
    bench.module("lambdas", LAMBDAS)
    good = [FACTORY("good"), "lambdas:good", FACTORY("good_too")]
    bad = [FACTORY("bad_01"), "lambdas:bad", FACTORY("bad_14")]
    plain = bench.plain(good + bad)
    assert_sound(plain, good, bad)
    assert_same([("first run, correct then wrong", bench.validate(good + bad)),
                 ("second run, wrong then correct", bench.validate(bad[::-1] + good[::-1]))], plain)


@pytest.mark.slow
def test_every_factory_kernel_one_after_another_in_one_cache(bench):
    """All nineteen factory kernels: together in both orders, then each alone, one after another, in one cache."""
    names = list(testing_factory.WHAT)
    specs = [FACTORY(n) for n in names]
    plain = bench.plain(specs)
    assert_sound(plain, [FACTORY(n) for n in testing_factory.GOOD], [FACTORY(n) for n in testing_factory.BAD])
    found = [line for label, run in both_orders(bench, specs) for line in differences(run, plain, label)]
    alone = {spec: bench.validate([spec]) for spec in specs[::-1]}
    found += [f"{spec} alone: exit {run.code}, grade {run.grade(spec)}; without the cache {plain.grade(spec)}"
              for spec, run in alone.items() if (run.code, run.grade(spec)) != expected_alone(plain, spec)]
    assert not found, "\n".join(found)


def expected_alone(plain, spec):
    """``(exit status, grade)`` of a run of ``spec`` alone, from its uncached grade."""
    return EXIT[plain.grade(spec).lower()], plain.grade(spec)


# --- (b) mapping and padding options -------------------------------------------------------------------------------

MAPPED = """
import math

LOG2E = math.log2(math.e)


def ordered_good(q, k, v, w, b, g, *, scale=None, initial_state=None):
    return _BASE(q, k, v, g, b, w, scale=scale, initial_state=initial_state)


def ordered_bad(q, k, v, w, b, g, *, scale=None, initial_state=None):  # its erase gate 1% too strong
    return _BASE(q, k, v, g, b * 1.01, w, scale=scale, initial_state=initial_state)


def _bthk(*xs):
    return [jnp.swapaxes(x, 1, 2) for x in xs]


def headmajor_good(q, k, v, g, b, w, *, scale=None, initial_state=None):
    o, s = _BASE(*_bthk(q, k, v, g, b, w), scale=scale, initial_state=initial_state)
    return jnp.swapaxes(o, 1, 2), s


def headmajor_bad(q, k, v, g, b, w, *, scale=None, initial_state=None):
    o, s = _BASE(*_bthk(q, k, v, g, b, w), scale=scale, initial_state=initial_state)
    return jnp.swapaxes(_wrong(o), 1, 2), s


def base2_good(q, k, v, g2, b, w, *, scale=None, initial_state=None):
    return _BASE(q, k, v, g2 / LOG2E, b, w, scale=scale, initial_state=initial_state)


def base2_bad(q, k, v, g2, b, w, *, scale=None, initial_state=None):  # forgets the base
    return _BASE(q, k, v, g2, b, w, scale=scale, initial_state=initial_state)


def sm_good(q, k, v, g, b, w, *, sm_scale=None, initial_state=None):
    return _BASE(q, k, v, g, b, w, scale=sm_scale, initial_state=initial_state)


def sm_bad(q, k, v, g, b, w, *, sm_scale=None, initial_state=None):
    sm_scale = (q.shape[-1] ** -0.5 if sm_scale is None else sm_scale) * 1.01
    return _BASE(q, k, v, g, b, w, scale=sm_scale, initial_state=initial_state)


def h0_good(q, k, v, g, b, w, *, scale=None, h0=None):
    return _BASE(q, k, v, g, b, w, scale=scale, initial_state=h0)


def h0_bad(q, k, v, g, b, w, *, scale=None, h0=None):  # drops the initial state
    return _BASE(q, k, v, g, b, w, scale=scale)


def _whole(q, v):
    if q.shape[-1] % 64 or v.shape[-1] % 16:
        raise ValueError(f"K % 64 and V % 16 must be 0, got K={q.shape[-1]} V={v.shape[-1]}")


def wide_good(q, k, v, g, b, w, *, scale=None, initial_state=None):
    _whole(q, v)
    return _BASE(q, k, v, g, b, w, scale=scale, initial_state=initial_state)


def wide_bad(q, k, v, g, b, w, *, scale=None, initial_state=None):
    _whole(q, v)
    o, s = _BASE(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
    return _wrong(o), s


def f32_good(q, k, v, g, b, w, *, scale=None, initial_state=None):
    o, s = _BASE(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
    return o.astype(jnp.float32), s


def f32_bad(q, k, v, g, b, w, *, scale=None, initial_state=None):
    o, s = _BASE(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
    return _wrong(o).astype(jnp.float32), s
"""

# (kernel prefix, option): every mapping option and both wrapping ones (kernels/adapt.py), in two groups.
OPTIONS = {
    "order,pad,state_arg": (("ordered", "order=qkvwbg"), ("wide", "pad=K64V16"), ("h0", "state_arg=h0")),
    "layout,decay_base,scale_arg,o_dtype": (("headmajor", "layout=bhtk"), ("base2", "decay_base=2"),
                                            ("sm", "scale_arg=sm_scale"), ("f32", "o_dtype=float32")),
}


@pytest.mark.parametrize("group", [pytest.param(g, marks=[pytest.mark.slow] * (i > 0)) for i, g in enumerate(OPTIONS)])
def test_correct_then_wrong_kernels_behind_mapping_and_padding_options(bench, group):
    """A correct and a wrong kernel behind each option (order, pad, state_arg; in the release group also layout,
    decay_base, scale_arg, o_dtype), correct-then-wrong in one run, wrong-then-correct in the next."""
    bench.module("mapped", MAPPED)
    pairs = [(f"mapped:{p}_good[{o}]", f"mapped:{p}_bad[{o}]") for p, o in OPTIONS[group]]
    plain = bench.plain([s for pair in pairs for s in pair])
    assert_sound(plain, [g for g, _ in pairs], [b for _, b in pairs])
    first = bench.validate([s for pair in pairs for s in pair])
    second = bench.validate([s for g, b in pairs for s in (b, g)])
    assert_same([("first run, correct then wrong", first), ("second run, wrong then correct", second)], plain)


# --- (c) registered kernels with options ---------------------------------------------------------------------------


@pytest.mark.slow
def test_registered_kernels_with_options_beside_wrong_ones(bench):
    """Registered kernels with options (chunk sizes, factorized tiles, the wrapping options) beside wrong kernels
    behind the same wrapping options keep their verdicts."""
    bench.module("mapped", MAPPED)
    good = ["pairwise", "pairwise[chunk_size=16]", "factorized[chunk_size=32,leaf=4]", "pairwise[pad=K64V16]",
            "pairwise[o_dtype=float32]"]
    bad = ["mapped:wide_bad[pad=K64V16]", f"{FACTORY('bad_12')}[o_dtype=float32]", f"{FACTORY('bad_02')}[pad=K64]"]
    plain = bench.plain(good + bad)
    assert_sound(plain, good, bad)
    assert_same([("first run, correct then wrong", bench.validate(good + bad)),
                 ("second run, wrong then correct", bench.validate(bad[::-1] + good[::-1]))], plain)


@pytest.mark.slow
def test_atomic_ops_peer_with_options(bench):
    """The atomic-ops peer with its defaults and with a damping that changes its program keep their verdicts."""
    pytest.importorskip("atomic_ops", reason="the atomic-ops peer is the optional extra [peers], not installed")
    specs = ["atomic-ops", "atomic-ops[wy_eps=0.1]", "pairwise"]
    plain = bench.plain(specs)
    assert plain.kernels["atomic-ops"] != plain.kernels["atomic-ops[wy_eps=0.1]"], "the option changes the verdict"
    assert_same(both_orders(bench, specs), plain)


# --- (d, e, g) what the kernel reads besides its own source: a helper, the environment, a file, PYTHONPATH ---------

HELPER = """
FACTOR = {factor}


def tweak(o):
    return (o * FACTOR).astype(o.dtype)
"""

USES_HELPER = """
from helpers.tweak import tweak


def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):
    o, s = _BASE(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
    return tweak(o), s
"""

READS_ENV = """
import os


def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):
    o, s = _BASE(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
    return (o * float(os.environ.get("STALENESS_FACTOR", "1"))).astype(o.dtype), s
"""

READS_FILE = """
import json
from pathlib import Path


def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):
    factor = json.loads(Path(__file__).with_name("factor.json").read_text())["factor"]
    o, s = _BASE(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
    return (o * factor).astype(o.dtype), s
"""

SAME_NAME = """
def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):
    o, s = _BASE(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
    return {result}, s
"""

OUTSIDE = ["kpkg.kern:kernel", "envk:kernel", "filek:kernel", "samename:kernel"]


def set_outside(bench, right):
    """The helper, the environment variable, the data file and the ``samename`` module on PYTHONPATH: all right
    (``right``) or all wrong by ``1 + 1e-3``."""
    factor = "1.0" if right else "1.001"
    bench.module("helpers.tweak", HELPER.format(factor=factor), where="helpers", head="")
    (bench.root / "mods" / "factor.json").write_text(f'{{"factor": {factor}}}', encoding="utf-8")
    bench.env["STALENESS_FACTOR"] = factor
    bench.paths = [p for p in bench.paths if Path(p).name not in ("samename_a", "samename_b")]
    bench.paths.append(str(bench.root / ("samename_a" if right else "samename_b")))


@pytest.mark.slow  # make test-release: make test keeps the core scenarios
def test_helper_environment_data_file_and_pythonpath_changed_between_runs(bench):
    """A helper module in another package edited, an environment variable and a data file read while tracing
    changed, a module of the same name found on another PYTHONPATH: each cached run has the uncached verdict of
    that moment (right, wrong, right again)."""
    bench.module("kpkg.kern", USES_HELPER)
    bench.module("envk", READS_ENV)
    bench.module("filek", READS_FILE)
    bench.module("samename", SAME_NAME.format(result="o"), where="samename_a")
    bench.module("samename", SAME_NAME.format(result="_wrong(o)"), where="samename_b")
    plain = {}
    for right in (True, False):
        set_outside(bench, right)
        plain[right] = bench.plain(OUTSIDE)
    assert_sound(plain[True], OUTSIDE, [])
    assert_sound(plain[False], [], OUTSIDE)
    runs = []
    for label, right in (("first run, right", True), ("second run, changed to wrong", False),
                         ("third run, changed back", True)):
        set_outside(bench, right)
        runs.append((label, bench.validate(OUTSIDE[::1 if right else -1]), plain[right]))
    assert_same(runs)


# --- (f) jax.config and XLA_FLAGS ----------------------------------------------------------------------------------

READS_PRECISION = """
def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):  # one bf16 pass where the default asks for it
    o, s = _BASE(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
    if jax.config.jax_default_matmul_precision == "bfloat16":
        o = o.astype(jnp.bfloat16).astype(o.dtype)
    return o, s
"""

READS_DEVICES = """
def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):  # a bug on its multi-device path only
    o, s = _BASE(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
    return (_wrong(o) if jax.device_count() > 1 else o), s
"""

CONFIGS = {"none": {}, "matmul": {"JAX_DEFAULT_MATMUL_PRECISION": "bfloat16"},
           "xla": {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}}


@pytest.mark.slow  # make test-release: make test keeps the core scenarios
def test_jax_config_and_xla_flags_changed_between_runs(bench):
    """``JAX_DEFAULT_MATMUL_PRECISION`` (a jax.config value) and ``XLA_FLAGS`` (the device count) set, changed and
    unset between runs: each cached run has the uncached verdict of its settings."""
    bench.module("precisionk", READS_PRECISION)
    bench.module("devicesk", READS_DEVICES)
    specs = ["precisionk:kernel", "devicesk:kernel"]
    plain = {}
    for name, env in CONFIGS.items():
        bench.env = dict(env)
        plain[name] = bench.plain(specs)
    assert_sound(plain["none"], specs, [])
    assert_sound(plain["matmul"], specs[1:], specs[:1])
    assert_sound(plain["xla"], specs[:1], specs[1:])
    runs = []
    for name in ("none", "matmul", "xla", "none"):
        bench.env = dict(CONFIGS[name])
        runs.append((f"cached run with {name} after the others", bench.validate(specs), plain[name]))
    assert_same(runs)


# --- (h) a kernel file edited while a run is going ------------------------------------------------------------------

SELF_EDITING = """
from pathlib import Path

BUGGY = False  # the kernel rewrites this line when traced


def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):
    if not BUGGY:
        path = Path(__file__)
        path.write_text(path.read_text().replace("BUGGY = False  #", "BUGGY = True  #"))
    o, s = _BASE(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
    return (_wrong(o) if BUGGY else o), s
"""


@pytest.mark.slow  # make test-release: make test keeps the core scenarios
def test_kernel_file_edited_while_a_run_traces_it(bench):
    """A kernel that rewrites its own file to a wrong version when traced: the run judges the code it loaded,
    the next run the edited file."""
    specs = ["selfedit:kernel", FACTORY("good")]
    path = bench.module("selfedit", SELF_EDITING)
    before = bench.plain(specs)
    assert "BUGGY = True" in path.read_text(), "tracing it rewrote the file"
    bench.module("selfedit", SELF_EDITING)
    first = bench.validate(specs)
    after = bench.plain(specs)
    assert_sound(before, specs, [])
    assert_sound(after, specs[1:], specs[:1])
    assert_same([("the run that edited the file", first, before),
                 ("the next run", bench.validate(specs[::-1]), after)])


# --- (i), (j): damaged entries, a cache that cannot be written ------------------------------------------------------

RIGHT, WRONG_KERNEL = "gdn2_oracle.kernels.testing:correct", "gdn2_oracle.kernels.testing:perturbed"
# Kernels with names of their own (the old key told them apart) and two closures of one factory.
MECHANICS = [RIGHT, WRONG_KERNEL, FACTORY("good"), FACTORY("bad_06")]


@pytest.fixture(scope="module")
def plain_mechanics(tmp_path_factory, shared):
    """The uncached verdict of :data:`MECHANICS`, once a test process."""
    plain = Bench(tmp_path_factory.mktemp("plain"), shared).plain(MECHANICS)
    assert_sound(plain, MECHANICS[::2], MECHANICS[1::2])
    return plain


def stored_by(bench, spec):
    """Run ``spec`` alone; the cache entries that run added."""
    before = bench.entries()
    bench.validate([spec])
    return sorted(bench.entries() - before)


def swap(a_files, b_files):
    """Copy each entry of ``b_files`` over the one of ``a_files`` with the same suffix, and the other way."""
    for a in a_files:
        b = next((b for b in b_files if b.suffix == a.suffix), None)
        assert b is not None, f"no entry like {a.name} among {[p.name for p in b_files]}"
        data_a, data_b = a.read_bytes(), b.read_bytes()
        a.write_bytes(data_b)
        b.write_bytes(data_a)


def test_swapped_truncated_and_damaged_entries(bench, plain_mechanics):
    """Two kernels' entries swapped (each under the other's name), then every entry's end cut off, then a bit
    flipped in each: every next run has the uncached verdict, or refuses the cache clearly."""
    right, wrong = stored_by(bench, RIGHT), stored_by(bench, WRONG_KERNEL)
    assert right and wrong, "each kernel stored its program"
    swap(right, wrong)
    runs = [("after the swap", bench.validate(MECHANICS))]
    for how in ("truncate", "flip"):
        for path in bench.entries():
            damage(path, how)
        runs.append((f"after a {how} of every entry", bench.validate(MECHANICS[::-1])))
    assert_same_or_refused(runs, plain_mechanics)


CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, PR_CAPBSET_DROP = 1, 2, 24


def without_root_overrides():
    """In the child before exec: drop the capabilities that let root write into a read-only directory."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            os._exit(97)


def read_only_popen():
    """:func:`subprocess.run` arguments under which a directory without write permission is read-only."""
    return {"preexec_fn": without_root_overrides} if os.geteuid() == 0 else {}


def read_only(paths, on=True):
    """Make ``paths`` (directories and files) read-only, or writable again."""
    for path in paths:
        path.chmod((0o555 if path.is_dir() else 0o444) if on else (0o755 if path.is_dir() else 0o644))


def assert_writes_refused(directory):
    """A child like the command really cannot write into ``directory`` (else the test would prove nothing)."""
    code = f"open({str(directory / 'probe')!r}, 'w')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, **read_only_popen())
    assert done.returncode != 0 and "Permission" in done.stderr, done.stderr


def read_only_runs(bench, orders):
    """Cached runs of each kernel order in ``orders`` with ``bench.programs`` (and its entries) read-only."""
    bench.programs.mkdir(exist_ok=True)
    stored = bench.entries()
    read_only([bench.programs, *stored])
    try:
        assert_writes_refused(bench.programs)
        runs = [bench.validate(specs, **read_only_popen()) for specs in orders]
    finally:
        read_only([bench.programs, *stored], on=False)
    assert bench.entries() == stored, "nothing was written into the read-only cache"
    return runs


@pytest.mark.slow  # make test-release: make test keeps the core scenarios
def test_cache_that_cannot_be_written(bench, plain_mechanics):
    """A read-only cache directory after a run filled it (both orders), an empty read-only one, and a cache path
    under a regular file (the directory can never be made): uncached verdicts, or a clear refusal."""
    bench.validate(MECHANICS[2:3])
    filled = read_only_runs(bench, [MECHANICS, MECHANICS[::-1]])
    bench.programs = bench.root / "empty"
    empty = read_only_runs(bench, [MECHANICS])
    (bench.root / "a-file").write_text("not a directory", encoding="utf-8")
    bench.programs = bench.root / "a-file" / "programs"
    runs = [("read-only, filled", filled[0]), ("read-only, filled, reversed", filled[1]),
            ("read-only, empty", empty[0]), ("under a regular file", bench.validate(MECHANICS))]
    assert_same_or_refused(runs, plain_mechanics)


FILE_LIMIT = 4096  # bytes: below any stored program; the run writes nothing else (no report, no other cache)


def full_disk():
    """In the child before exec: every file write past :data:`FILE_LIMIT` bytes fails (EFBIG), as on a full disk."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))


@pytest.mark.slow  # make test-release: make test keeps the core scenarios
def test_full_cache_disk(bench, plain_mechanics):
    """Writes into the cache fail as on a full disk (after a run stored one kernel's program): the exit status and
    each kernel's grade are those without a cache."""
    bench.validate(MECHANICS[2:3])
    env = {**bench.environ(True), "GDN2_REFERENCE_CACHE": "off", "GDN2_COMPILE_CACHE": "off"}  # the program cache only
    runs = [(label, cache_selfcheck.validate(order, env=env, workdir=bench.root / "full", preexec_fn=full_disk,
                                             report=False))
            for label, order in (("full, as given", MECHANICS), ("full, reversed", MECHANICS[::-1]))]
    found = [f"{label}: exit {run.code}, without the cache {plain_mechanics.code}" for label, run in runs
             if run.code != plain_mechanics.code and not refused(run)]
    found += [f"{label}: {line!r}, without the cache {plain_mechanics.grade(spec)}"
              for label, run in runs for spec in MECHANICS
              if not refused(run) and (line := summary_line(run, spec)) != f"{spec}: {plain_mechanics.grade(spec)}"]
    assert not found, "\n".join(found) + "\n" + summary(runs[-1][1])


def summary_line(run, spec):
    """``SPEC: GRADE`` from the run's closing summary (the JSON report could not be written on a full disk)."""
    for line in run.output.splitlines():
        if line.startswith(f"{spec}: "):
            return line.split(" (")[0]
    return None


@pytest.mark.slow
def test_the_make_check_self_check_passes_and_can_fail(bench, monkeypatch, capsys):
    """``python -m gdn2_oracle.ci.cache_selfcheck`` (make check): exit 0 with every row right; exit 1 when a wrong
    kernel is declared correct (its FAIL then disagrees with what the check expects)."""
    for name, value in bench.environ(cached=True).items():
        monkeypatch.setenv(name, value)
    assert cache_selfcheck.main(["--cache", str(bench.root / "selfcheck")]) == 0
    out = capsys.readouterr().out
    rows = out.splitlines()[2:2 + len(cache_selfcheck.KERNELS)]
    assert len(rows) == len(cache_selfcheck.KERNELS) and all(r.endswith("yes") for r in rows), out
    assert out.rstrip().endswith("program cache self-check: ok"), out
    monkeypatch.setattr(testing_factory, "GOOD", (*testing_factory.GOOD, "bad_01"))
    assert cache_selfcheck.main(["--cache", str(bench.root / "selfcheck")]) == 1
    assert "FAILED" in capsys.readouterr().out
