"""Fuzzing: random arguments reach only the documented outcomes.

Hypothesis drives

* the CLI (``ci.cli.main(argv)``, in-process) with random argument lists built from every option of
  ``validate``, ``bench`` and ``golden`` with valid and invalid values and random tokens. The real
  parsers, kernel builds, path and tile checks, case selection, golden loading and reports run; the
  heavy work is cut where it starts (a kernel run raises, a benchmark record is made up, a golden
  recomputation yields nothing, and ``golden`` commands use a temporary copy of the corpus);
* ``oracle.Problem`` with random shapes (empty, wrong rank, mismatched), dtypes (float16/32/64,
  bfloat16, ints, bool, complex, object), values (NaN, +-inf, huge, denormal, -0, positive decay),
  non-contiguous and read-only arrays, non-arrays, and random ``scale`` / ``initial_state``;
* ``kernels.get`` with random specs and options, and the kernels it builds called with random
  inputs (the same kinds of damage, ``check_values=True``).

Allowed outcomes only: a result, a ``ValueError`` whose message starts with the argument's name, or an
exit status 0/1/2/3 (130 needs a signal: ``test_hardening.py``) with a message and no traceback.
Example counts are fixed per test (:data:`EXAMPLES`); derandomized when ``CI`` is true.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gdn2_oracle import kernels, oracle
from gdn2_oracle.ci import cli
from gdn2_oracle.ci.commands import bench, domain, hunt
from gdn2_oracle.ci.commands.output import EXIT
from gdn2_oracle.ci.running import harness
from gdn2_oracle.ci.running import modes as mode_running
from gdn2_oracle.golden import regenerate

CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no", "off")
EXAMPLES = {"cli": 150, "problem": 200, "get": 100, "kernel_call": 25}


def fuzz_settings(name):
    return settings(max_examples=EXAMPLES[name], deadline=None, derandomize=CI, database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large, HealthCheck.filter_too_much])


def names_the_argument(exc, names):
    """Whether a ValueError's message starts with one of ``names`` and a colon."""
    return re.match(rf"^({'|'.join(map(re.escape, names))}):", str(exc)) is not None


# --- the CLI -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """A temporary directory with a copy of the golden corpus (``--root`` of every golden command)."""
    root = tmp_path_factory.mktemp("fuzz")
    src = Path(regenerate.__file__).parent
    shutil.copytree(src / "data", root / "golden" / "data")
    shutil.copy(src / "MANIFEST.json", root / "golden" / "MANIFEST.json")
    (root / "afile").write_text("x")
    (root / "outdir").mkdir()
    return root


@pytest.fixture(scope="module")
def no_heavy_work():
    """Cut the work where it starts: kernels are not run, benchmarks not timed, goldens not recomputed."""
    mp = pytest.MonkeyPatch()

    def no_kernel_run(*a, **kw):
        raise RuntimeError("kernel run skipped by the fuzz test")

    def made_up_record(run, spec, shape, dtype):
        B, T, H, K, V = shape
        return {"kernel": spec.label(), "spec": spec.spec, "shape": dict(B=B, T=T, H=H, K=K, V=V), "dtype": dtype,
                "status": "ok", "reason": None, "sweep": [], "label": spec.label(), "compile_s": 0.1,
                "median_s": 1e-3, "min_s": 1e-3, "times_s": [1e-3]}

    def no_search(fn, kernel, options, *, on_stop):
        return hunt.HuntReport(kernel=kernel, budget=options.budget, seed=options.seed, shapes=options.shapes,
                               result=options.result, examples=0, first_fail=None, seconds=0.0, worst=None, found=None,
                               modes=list(options.modes))

    def no_cluster(**kwargs):
        raise RuntimeError("fuzz: no other process")  # our checks before it are what is fuzzed

    import jax

    tiny = domain.Grid("tiny", (domain.Axis("erase", "erase gate b", (1.0,)),), seeds=1, base=domain.Point(T=4),
                       shape=(1, 1, 2, 2), mode_values={sweep: v[:1] for sweep, v in domain.MODE_VALUES.items()})
    mp.setattr(harness, "kernel_results", no_kernel_run)
    mp.setattr(mode_running, "mode_results", no_kernel_run)
    mp.setattr(bench.BenchRun, "bench_one", made_up_record)
    mp.setattr(regenerate, "_run_all", lambda names, jobs, desc: iter(()))
    mp.setattr(hunt, "hunt", no_search)
    mp.setitem(domain.GRIDS, "quick", tiny)
    mp.setitem(domain.GRIDS, "full", tiny)
    mp.setattr(jax.distributed, "initialize", no_cluster)
    yield
    mp.undo()


junk = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
ints = st.integers(-3, 10**13).map(str)
KERNEL_SPECS = st.one_of(
    st.sampled_from(["pairwise", "factorized", "pallas-pairwise", "pallas-factorized[interpret='xla']",
                     "pairwise,factorized", "pallas-pairwise,pallas-factorized", "factorized[chunk_size=32,leaf=8]",
                     "no-such-kernel", "gdn2_oracle.kernels.testing:correct", "gdn2_oracle.kernels.testing:nope",
                     "no_such_module_xyz:fn", "math:sqrt", "pairwise[", "pairwise]", ",", "pairwise,,factorized",
                     "atomic-ops", ":", "[]", "a[b=1]",
                     # torch options, mapping and padding options, repeated keys
                     "torch:gdn2_oracle.kernels.testing_torch:recurrent[output_final_state=True,order=qkvwbg]",
                     "torch:gdn2_oracle.kernels.testing_torch:recurrent[order=qkv]",
                     "torch:gdn2_oracle.kernels.testing_torch:recurrent[layout=thbk,device=nope]",
                     "torch:gdn2_oracle.kernels.testing_torch:recurrent[order=qkvgbw,order=qkvwbg]",
                     "torch:gdn2_oracle.kernels.testing_torch:recurrent[bogus=1]",
                     "gdn2_oracle.kernels.testing:correct[order=qkvwbgsh,layout=bhtk]",
                     "gdn2_oracle.kernels.testing:correct[pad=K8V8T16]", "pairwise[pad=X1]",
                     "pairwise[o_dtype=float16]", "pairwise[chunk_size=16,chunk_size=32]", "decode[state_dtype=int8]"]),
    st.builds(lambda k, v: f"{k}[{v}]", st.sampled_from(["pairwise", "factorized", "pallas-factorized"]),
              st.builds(lambda key, val: f"{key}={val}",
                        st.sampled_from(["chunk_size", "split", "leaf", "interpret", "bogus"]),
                        st.one_of(ints, junk.filter(lambda s: "]" not in s and "," not in s)))),
    junk.filter(lambda s: ":" not in s))  # random module names are never imported (no side effects)


def paths(sandbox):
    return st.sampled_from([str(sandbox / "r.json"), str(sandbox / "p.png"), str(sandbox / "x.txt"),
                            str(sandbox / "outdir"), str(sandbox / "afile" / "x.json"), "/proc/x.json",
                            str(sandbox / "new" / "deeper" / "r.json"), ""])


def mostly(valid, invalid):
    """Valid values three times out of four (so the deeper paths run), else invalid ones or junk."""
    return st.one_of(valid, valid, valid, st.one_of(invalid, junk))


def option_tokens(sandbox):
    """Per subcommand: ``[option, value]`` pairs of its options; occasionally a flag or a random token."""
    kernel_value = mostly(st.sampled_from(["pairwise", "factorized", "pairwise,factorized",
                                           "gdn2_oracle.kernels.testing:correct", "factorized[chunk_size=32,leaf=8]",
                                           "pallas-pairwise,pallas-factorized[interpret='xla']"]), KERNEL_SPECS)
    common = {
        "--kernel": kernel_value,
        "--dtype": mostly(st.sampled_from(["float32", "bfloat16", "float32,bfloat16"]),
                          st.sampled_from(["float16", ",", ""])),
        "--seed": mostly(st.integers(0, 10).map(str), ints),
        "--json": paths(sandbox),
    }
    mesh = mostly(st.sampled_from(["data=1", "seq=1", "data=1,heads=1"]),
                  st.sampled_from(["seq=2", "bogus=1", "data=0", "data=1,data=1", "data", ""]))
    jobs = mostly(st.sampled_from(["1", "2"]), st.sampled_from(["0", "-1", "x"]))
    one_kernel = mostly(st.sampled_from(["pairwise", "gdn2_oracle.kernels.testing:correct"]), KERNEL_SPECS)
    # never a short limit: the watchdog ends the process (this one) when a call passes it
    case_timeout = mostly(st.sampled_from(["0", "900"]), st.sampled_from(["-1", "x", "nan", "inf", ""]))
    call_modes = mostly(st.sampled_from(["dense", "varlen", "gate,l2norm", "all", "dense,intermediate"]),
                        st.sampled_from(["bogus", "", ",", "decode"]))
    options = {
        "validate": {**common,
                     "--cases": mostly(st.sampled_from(["golden", "quick", "full"]), st.just("huge")),
                     "--max-failures": mostly(st.sampled_from(["0", "5"]), ints),
                     "--modes": mostly(st.sampled_from(["dense", "dense,varlen", "decode,speculative"]),
                                       st.sampled_from(["bogus", "", ","])),
                     "--mesh": mesh, "--jobs": jobs, "--case-timeout": case_timeout},
        "domain": {"--kernel": one_kernel, "--modes": call_modes, "--case-timeout": case_timeout,
                   "--seed": mostly(st.integers(0, 10).map(str), ints),
                   "--grid": mostly(st.sampled_from(["quick", "full"]), st.just("huge")),
                   "--out": mostly(st.sampled_from([str(sandbox / "dom")]), paths(sandbox))},
        "hunt": {"--kernel": one_kernel, "--modes": call_modes, "--case-timeout": case_timeout,
                 "--seed": mostly(st.integers(0, 10).map(str), ints),
                 "--budget": mostly(st.sampled_from(["1", "5"]), st.sampled_from(["0", "-3", "x"])),
                 "--result": mostly(st.sampled_from(["o", "dh0"]), st.just("dz")),
                 "--shapes": mostly(st.sampled_from(["core", "all"]), st.just("some"))},
        "bench": {**common, "--plot": paths(sandbox),
                  "--batch": mostly(st.sampled_from(["1", "1,2"]), st.sampled_from(["0", "-1", "10000000"])),
                  "--seq": mostly(st.sampled_from(["1", "32", "33"]), st.sampled_from(["0", "10000000000"])),
                  "--heads": mostly(st.sampled_from(["1", "2"]), st.just("0")),
                  "--dim": mostly(st.sampled_from(["8", "16"]), st.just("0")),
                  "--tiles": mostly(st.sampled_from(["sweep", "chunk_size=32,64", "leaf=8,16", ""]),
                                    st.sampled_from(["bogus=1", "chunk_size", "chunk_size=0", "leaf=abc", ";"])),
                  "--repeats": mostly(st.just("1"), st.sampled_from(["0", "-2"])),
                  "--mesh": mesh, "--jobs": jobs, "--case-timeout": case_timeout},
        "golden": {"--case": mostly(st.sampled_from(["len_1", "len_c16"]), st.just("no_such_case")),
                   "--jobs": mostly(st.sampled_from(["1", "2"]), st.sampled_from(["0", "-1", "x"]))},
    }
    flags = {"validate": ["--no-progress", "--strict", "--help"], "bench": ["--no-progress", "--help"],
             "golden": ["--force", "--check", "--list", "--help"], "domain": ["--no-progress", "--help"],
             "hunt": ["--no-progress", "--help"]}

    def tokens(command):
        if command not in options:
            return st.lists(junk.map(lambda t: [t]), max_size=2)
        opts = options[command]
        pair = st.sampled_from(sorted(opts)).flatmap(lambda o: st.tuples(st.just(o), opts[o]).map(list))
        flag = st.sampled_from(flags[command] + ["--", "-x"]).map(lambda f: [f])
        return st.lists(st.one_of(pair, pair, pair, pair, flag, junk.map(lambda t: [t])), max_size=5)

    return tokens


def argvs(sandbox):
    tokens = option_tokens(sandbox)
    commands = ["validate", "validate", "bench", "bench", "golden regenerate", "golden check", "golden list",
                "golden", "domain", "hunt", "frobnicate"]
    distributed = st.lists(st.one_of(
        st.just(["--distributed"]), st.just(["--init-timeout", "1"]),
        st.tuples(st.just("--coordinator"), mostly(st.sampled_from(["localhost:1", "127.0.0.1:9"]),
                                                   st.sampled_from(["notaport", "h:99999", ":1", ""]))).map(list),
        st.tuples(st.just("--num-processes"), mostly(st.just("2"), st.sampled_from(["0", "-1", "x"]))).map(list),
        st.tuples(st.just("--process-id"), mostly(st.sampled_from(["1"]), st.sampled_from(["2", "-1", "x"])))
        .map(list)), max_size=4)

    def assemble(command, groups, cap, global_options):
        head = command.split()
        if any("--coordinator" in g or "--distributed" in g for g in global_options):
            global_options = [*global_options, ["--init-timeout", "1"]]  # never a long wait
        argv = [*[t for g in global_options for t in g], *head, *[t for g in groups for t in g]]
        if head[0] == "validate":
            argv += ["--case", cap]  # never the whole case set
        if head[0] == "golden":
            argv += ["--root", str(sandbox / "golden")]  # never the real corpus (its parser keeps the last)
        if head[0] == "bench" and "--repeats" not in argv:
            argv += ["--repeats", "1"]
        if head[0] in ("domain", "hunt") and "--kernel" not in argv:
            argv += ["--kernel", "pairwise"]
        if head[0] == "domain" and "--out" not in argv:
            argv += ["--out", str(sandbox / "dom")]  # never the default folder in the working directory
        return argv

    return st.sampled_from(commands).flatmap(lambda c: st.builds(
        assemble, st.just(c), tokens(c.split()[0]),
        mostly(st.sampled_from(["len_1", "gen_moderate_T130"]), st.just("no_such_case")),
        st.one_of(st.just([]), st.just([]), distributed)))


@fuzz_settings("cli")
@given(data=st.data())
def test_fuzzed_command_lines_exit_with_a_documented_status_and_a_message(sandbox, no_heavy_work, capsys, data):
    argv = data.draw(argvs(sandbox), label="argv")
    here = os.getcwd()
    os.chdir(sandbox)  # a junk relative path (an --out, a --json) lands in the sandbox, never in the working tree
    try:
        code = cli.main(argv)  # any exception escaping here fails the test
    finally:
        os.chdir(here)
    out, err = capsys.readouterr()
    event(f"{argv[0]} exit {code}")
    assert code in set(EXIT.values()) - {EXIT["interrupted"]}, (argv, code, out, err)  # documented, no interrupt
    assert "Traceback" not in out + err, argv
    if code == 2:
        assert "error:" in err, (argv, err)
    else:
        assert out.strip() or err.strip(), argv  # a table, a list, help or a message


# --- oracle.Problem --------------------------------------------------------------------------

ARGS = ("q", "k", "v", "g", "b", "w")
SPECIAL = [np.nan, np.inf, -np.inf, 1e308, -1e308, 3.4e38, 5e-324, -0.0, 1e-310, 1.0]
DTYPES = ["float64", "float32", "float16", "bfloat16", "int32", "bool", "complex64", "object", "longdouble"]


def _dtype(name):
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(name)


@st.composite
def problem_arguments(draw):
    """Keyword arguments of ``oracle.Problem``: a valid problem, then up to three kinds of damage."""
    B, T, H, K, V = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), 1, draw(st.integers(1, 3)),
                     draw(st.integers(1, 3)))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    shapes = {n: (B, T, H, V if n in ("v", "w") else K) for n in ARGS}
    args = {n: rng.standard_normal(shapes[n]) for n in ARGS}
    args["g"] = -np.abs(args["g"])
    kw = {"scale": None, "initial_state": None}
    if draw(st.booleans()):
        kw["initial_state"] = rng.standard_normal((B, H, K, V))
    names = ARGS + ("initial_state",)
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(names + ("scale",)))
        kind = draw(st.sampled_from(["value", "dtype", "shape", "layout", "readonly", "object", "scale"]))
        a = args.get(name, kw.get(name))
        if name == "scale" or kind == "scale":
            kw["scale"] = draw(st.sampled_from([None, 0.5, 0.0, -2.0, np.nan, np.inf, 1e308, "x", "0.25", 1j,
                                                np.array([1.0, 2.0]), [1.0], np.float32(0.3), True]))
        elif not isinstance(a, np.ndarray) or (kind in ("value", "layout") and (a.size == 0 or a.ndim == 0)):
            continue  # already replaced by a non-array, or nothing to change
        elif kind == "value":
            a = np.array(a, dtype=np.float64)
            a.flat[draw(st.integers(0, a.size - 1))] = draw(st.sampled_from(SPECIAL + [abs(x) for x in SPECIAL]))
        elif kind == "dtype":
            with np.errstate(all="ignore"):
                a = np.asarray(a).astype(_dtype(draw(st.sampled_from(DTYPES))))
        elif kind == "shape":
            new = list(np.shape(a))
            op = draw(st.sampled_from(["drop", "add", "zero", "grow"]))
            if op == "drop" and new:
                new.pop()
            elif op == "add":
                new.append(1)
            elif op == "zero" and new:
                new[draw(st.integers(0, len(new) - 1))] = 0
            elif new:
                new[draw(st.integers(0, len(new) - 1))] += 1
            a = np.zeros(new)
        elif kind == "layout":
            a = np.repeat(np.asarray(a), 2, axis=-1)[..., ::2]  # same values, non-contiguous
            assert not a.flags.c_contiguous or a.size <= 1
        elif kind == "readonly":
            a = np.array(a)
            a.setflags(write=False)
        else:
            a = draw(st.sampled_from([None, "text", [[1.0], [1.0, 2.0]], {"a": 1}, 3.0, [], object()]))
        if name in ARGS:
            args[name] = a
        else:
            kw[name] = a
    return {**args, **kw}


@fuzz_settings("problem")
@given(problem_arguments())
def test_fuzzed_problems_are_valid_or_a_value_error_naming_the_argument(kwargs):
    before = {n: np.array(a, copy=True) if isinstance(a, np.ndarray) else None for n, a in kwargs.items()}
    try:
        p = oracle.Problem(**kwargs)
    except ValueError as exc:
        assert names_the_argument(exc, ARGS + ("scale", "initial_state")), exc
        return
    B, T, H, K, V = p.shape
    for name in ARGS + ("initial_state",):
        a = getattr(p, name)
        if a is None:
            continue
        assert a.dtype == np.float64 and not a.flags.writeable and np.all(np.isfinite(a))
        original = kwargs[name]
        if isinstance(original, np.ndarray):
            assert not np.shares_memory(a, original) or not original.flags.writeable
            np.testing.assert_array_equal(a, np.asarray(before[name], dtype=np.float64))
    assert np.all(p.g <= 0) and np.isfinite(p.scale) and T >= 1 and min(B, H, K, V) >= 1
    with np.errstate(all="ignore"):  # huge finite inputs may overflow: a result all the same
        o, S = oracle.recurrence.forward(p, dtype=np.float64)
    assert o.shape == (B, T, H, V) and S.shape == (B, H, K, V)


@fuzz_settings("problem")
@given(st.one_of(st.sampled_from(["bogus", "float16", "int8", "complex128", "", None, 3, "float32", "longdouble"]),
                 st.text(max_size=8)))
def test_fuzzed_recurrence_dtypes_run_or_raise_a_value_error_naming_dtype(dtype):
    p = oracle.make_problem(1, 2, 1, 2, 2)
    try:
        o, _ = oracle.recurrence.forward(p, dtype=dtype)
    except ValueError as exc:
        assert names_the_argument(exc, ("dtype",)), exc
    else:
        assert o.shape == (1, 2, 1, 2)


# --- kernels.get and kernel calls ----------------------------------------------------------------

OPTION_VALUES = st.one_of(st.integers(-5, 300),
                          st.sampled_from([None, True, False, 1.5, "xla", "auto", "tpu", "", [8], (64,), 10**30,
                                           float("nan")]), st.text(max_size=5))
OPTION_NAMES = ("name", "options", "chunk_size", "split", "leaf", "interpret", "method", "state_dtype", "o_dtype",
                "pad", "order", "layout", "device", "decay_base", "scale_arg", "state_arg")


@fuzz_settings("get")
@given(st.one_of(KERNEL_SPECS, st.sampled_from(["pairwise", "factorized", "pallas-pairwise", "pallas-factorized"])),
       st.dictionaries(st.sampled_from(["chunk_size", "split", "leaf", "interpret", "bogus", "check_values"]),
                       OPTION_VALUES, max_size=3))
def test_fuzzed_kernel_specs_and_options_build_or_raise_a_value_error_naming_the_argument(spec, options):
    try:
        fn = kernels.get(spec, **options)
    except ValueError as exc:
        assert names_the_argument(exc, OPTION_NAMES), exc
    else:
        assert callable(fn)


KERNEL_SHAPES = [(1, 17, 2, 8, 4)]  # a valid call compiles once per (shape, dtype, scale, initial state): few


@st.composite
def kernel_calls(draw):
    """``(args, kwargs)`` of a kernel call: a valid float32/bfloat16 call, then up to two kinds of damage."""
    B, T, H, K, V = draw(st.sampled_from(KERNEL_SHAPES))
    dtype = draw(st.sampled_from(["float32", "bfloat16"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    arrays = {n: rng.standard_normal((B, T, H, V if n in ("v", "w") else K)) for n in ARGS}
    arrays["g"] = -np.abs(arrays["g"])
    arrays = {n: np.asarray(a, dtype=_dtype(dtype)) for n, a in arrays.items()}
    kw = {"scale": None, "initial_state": np.zeros((B, H, K, V), np.float32) if draw(st.booleans()) else None,
          "check_values": True}
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(ARGS + ("initial_state", "scale")))
        kind = draw(st.sampled_from(["value", "dtype", "shape", "layout", "readonly", "object"]))
        if name == "scale":
            kw["scale"] = draw(st.sampled_from([0.5, np.nan, np.inf, "x", [1.0], 1j]))
            continue
        a = arrays.get(name, kw.get(name))
        if a is None:
            continue
        if kind == "value":
            a = np.array(a)
            a.flat[draw(st.integers(0, a.size - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf, 3e38, -3e38,
                                                                            1e-40, 5.0, -1e30]))
        elif kind == "dtype":
            a = np.asarray(a, dtype=np.float32).astype(_dtype(draw(st.sampled_from(
                ["float64", "float16", "int32", "bool", "bfloat16", "float32"]))))
        elif kind == "shape":
            shape = list(a.shape)
            op = draw(st.sampled_from(["drop", "add", "zero", "grow"]))
            if op == "drop":
                shape.pop()
            elif op == "add":
                shape.append(1)
            else:
                shape[draw(st.integers(0, len(shape) - 1))] = 0 if op == "zero" else shape[-1] + 1
            a = np.zeros(shape, dtype=a.dtype)
        elif kind == "layout":
            a = np.repeat(a, 2, axis=-1)[..., ::2]
        elif kind == "readonly":
            a = np.array(a)
            a.setflags(write=False)
        else:
            a = draw(st.sampled_from([None, [[1.0]], "text", 2.0]))
        if name in ARGS:
            arrays[name] = a
        else:
            kw[name] = a
    return [arrays[n] for n in ARGS], kw


@pytest.mark.slow
@fuzz_settings("kernel_call")
@given(kernel_calls())
def test_fuzzed_kernel_calls_return_results_or_a_value_error_naming_the_argument(call):
    args, kwargs = call
    fn = _built("pairwise[chunk_size=16]")  # the argument checks are shared by every kernel (kernels.contract)
    try:
        o, S = fn(*args, **kwargs)
    except ValueError as exc:
        assert names_the_argument(exc, ARGS + ("scale", "initial_state", "q/v")), exc
        return
    q, v = args[0], args[2]
    assert o.shape == v.shape and o.dtype == v.dtype
    assert S.shape == (q.shape[0], q.shape[2], q.shape[3], v.shape[3])


_BUILT = {}


def _built(spec):
    if spec not in _BUILT:
        _BUILT[spec] = kernels.get(spec)
    return _BUILT[spec]
