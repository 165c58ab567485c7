"""Programs compiled ahead of time (ci/running/ahead.py): one program a signature, the same results as compiling on
first call, and a kernel's failure while tracing raised where its case is judged."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn2_oracle import oracle
from gdn2_oracle.ci.commands import validate
from gdn2_oracle.ci.running import harness, program_cache
from gdn2_oracle.ci.running.ahead import Ahead
from gdn2_oracle.kernels import spec


@pytest.fixture(scope="module")
def pairwise():
    return spec.get("pairwise[chunk_size=16]")


def _problem(T, seed=0):
    p = oracle.make_problem(1, T, 1, 8, 8, decay="moderate", initial_state=True, seed=seed)
    return (p, *oracle.random_cotangents(p, seed=seed))


def test_keys_of_one_signature_share_one_program_and_results_equal_the_jit_path(pairwise):
    data = {name: _problem(T, seed) for name, T, seed in (("a", 20, 0), ("b", 20, 1), ("c", 33, 0))}
    lowered = []

    def prepare(name):
        problem = data[name][0]

        def lower():
            lowered.append(name)
            return harness.lower(pairwise, problem, "float32")

        return harness.program_signature(pairwise, problem, "float32"), lower

    with Ahead([(name, lambda name=name: prepare(name)) for name in data], workers=2) as ahead:
        programs = {name: ahead.compiled(name) for name in data}
        assert "missing" not in ahead and ahead.compiled("missing") is None
    assert lowered == ["a", "c"], "a and b have one signature: one program"
    assert programs["a"] is programs["b"] and programs["a"] is not programs["c"]
    for name, (p, do, dfs) in data.items():
        ahead_out = harness.kernel_results(pairwise, p, do, dfs, program=lambda name=name: programs[name])
        jit_out = harness.kernel_results(pairwise, p, do, dfs)
        for result in oracle.RESULTS:
            np.testing.assert_array_equal(ahead_out[result], jit_out[result], err_msg=f"{name} {result}")


def _exits(q, k, v, g, b, w, *, scale=None, initial_state=None):
    raise SystemExit(3)


def _breaks_contract(q, k, v, g, b, w, *, scale=None, initial_state=None):
    return (jnp.zeros(q.shape[:-1] + v.shape[-1:], v.dtype),)


@pytest.mark.parametrize("kernel, error, message", [
    (_exits, harness.KernelError, r"sys\.exit\(3\)"),
    (_breaks_contract, harness.ContractError, "returned 1 results"),
])
def test_a_kernel_failing_while_traced_ahead_fails_where_its_case_is_judged(kernel, error, message):
    p, do, dfs = _problem(8)
    signature = harness.program_signature(kernel, p, "float32")
    job = ("case", lambda: (signature, lambda: harness.lower(kernel, p, "float32")))
    with Ahead([job], workers=1) as ahead:
        with pytest.raises(error, match=message):
            harness.kernel_results(kernel, p, do, dfs, program=lambda: ahead.compiled("case"))


def test_validate_grades_the_same_with_and_without_programs_compiled_ahead():
    specs = [spec.KernelSpec.parse("pairwise[chunk_size=16]")]
    reports = {w: validate.run_validation(specs, validate.ValidateOptions(
        dtypes=("float32",), only=["decay_resets", "len_c64_plus1"], modes=("dense",), show_progress=False,
        compile_workers=w)) for w in (0, 2)}
    names = [[c["case"] for c in r.kernels[0]["cases"]] for r in reports.values()]
    assert names[0] == names[1] and len(names[0]) == 2, names
    for a, b in zip(reports[0].kernels[0]["cases"], reports[2].kernels[0]["cases"]):
        assert (a["grade"], a["verdicts"]) == (b["grade"], b["verdicts"]), a["case"]


def test_every_case_of_a_program_that_fails_to_trace_gets_the_failure():
    """Before: the first case got the failure and the second, sharing the signature, waited for good."""
    def prepare():
        def lower():
            raise harness.ContractError("returned 1 results, expected 2")
        return "one signature", lower

    with Ahead([("a", prepare), ("b", prepare)], workers=1) as ahead:
        for key in ("a", "b"):
            with pytest.raises(harness.ContractError, match="returned 1 results"):
                ahead.compiled(key, timeout=60)


def test_ahead_refuses_a_bad_worker_count():
    with pytest.raises(ValueError, match="workers"):
        Ahead([], workers=0)


TRACES = []


def make_counted():
    """A new function object (so nothing traced is kept in memory for it) of one stable name: pairwise, counting
    how often it is traced."""
    def counted(q, k, v, g, b, w, *, scale=None, initial_state=None):
        TRACES.append(q.shape)
        return spec.get("pairwise[chunk_size=16]")(q, k, v, g, b, w, scale=scale, initial_state=initial_state)

    return counted


def _from(counts, before):
    return {k: counts[k] - before.get(k, 0) for k in ("read", "stored", "unkeyable", "not_exported")}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_program_cache_reads_back_a_kernel_program_it_traced_again(tmp_path, monkeypatch, dtype):
    monkeypatch.setenv(program_cache.ENV, str(tmp_path))
    p = oracle.make_problem(1, 24, 1, 8, 8, decay="moderate", initial_state=True, seed=0, precision=dtype)
    do, dfs = oracle.random_cotangents(p, precision=dtype)
    TRACES.clear()
    runs, before = [], dict(program_cache.STATS)
    for _ in range(2):
        counted = make_counted()  # a new function object: nothing of it is traced in memory
        compiled = harness.lower(counted, p, dtype, cache=True).compile()
        runs.append(harness.kernel_results(counted, p, do, dfs, dtype=dtype, program=lambda c=compiled: c))
    assert len(TRACES) == 2, "every run traces the kernel: the key is what was traced"
    assert _from(program_cache.STATS, before) == {"read": 1, "stored": 1, "unkeyable": 0, "not_exported": 0}
    assert len(list(tmp_path.glob("*.exported"))) == 1
    reference = harness.kernel_results(counted, p, do, dfs, dtype=dtype)  # jit on first call, no cache
    for got in runs:
        for result in oracle.RESULTS:
            np.testing.assert_array_equal(got[result], reference[result], err_msg=result)


def make_scaled(factor):
    """A factory's kernel: pairwise with ``o`` times ``factor`` (every kernel it makes has one name)."""
    base = spec.get("pairwise[chunk_size=16]")

    def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):
        o, S = base(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
        return o * factor, S

    return kernel


def test_kernels_of_one_factory_get_programs_of_their_own(tmp_path, monkeypatch):
    monkeypatch.setenv(program_cache.ENV, str(tmp_path))
    p, do, dfs = _problem(24)
    results = {}
    for factor in (1.0, 1.5, 1.0):
        fn = make_scaled(factor)
        compiled = harness.lower(fn, p, "float32", cache=True).compile()
        results.setdefault(factor, []).append(harness.kernel_results(fn, p, do, dfs, program=lambda c=compiled: c))
    assert len(list(tmp_path.glob("*.exported"))) == 2, "one entry a program, shared by the two factor-1 kernels"
    np.testing.assert_array_equal(results[1.5][0]["o"], 1.5 * results[1.0][0]["o"])
    np.testing.assert_array_equal(results[1.0][1]["o"], results[1.0][0]["o"])


def test_a_damaged_swapped_or_old_entry_is_never_read(tmp_path, monkeypatch):
    monkeypatch.setenv(program_cache.ENV, str(tmp_path))
    p, do, dfs = _problem(24)
    for factor in (1.0, 2.0):
        harness.lower(make_scaled(factor), p, "float32", cache=True)
    one, two = sorted(tmp_path.glob("*.exported"))
    good = one.read_bytes()
    assert program_cache.read(tmp_path, one.stem) is not None
    damaged = bytearray(good)
    damaged[-10] ^= 0xFF
    for data in (bytes(damaged), good[:len(good) // 2], two.read_bytes(),
                 good.replace(program_cache.HEADER, b"gdn2-oracle program 1\n")):
        one.write_bytes(data)
        assert program_cache.read(tmp_path, one.stem) is None
    before = dict(program_cache.STATS)
    for factor in (1.0, 2.0):
        harness.lower(make_scaled(factor), p, "float32", cache=True)
    assert _from(program_cache.STATS, before) == {"read": 1, "stored": 1, "unkeyable": 0, "not_exported": 0}, (
        "the refused entry is rebuilt, the other read")
    assert program_cache.read(tmp_path, one.stem) is not None


def test_a_program_with_a_host_callback_is_never_stored(tmp_path, monkeypatch):
    monkeypatch.setenv(program_cache.ENV, str(tmp_path))
    base = spec.get("pairwise[chunk_size=16]")

    def calls_back(q, k, v, g, b, w, *, scale=None, initial_state=None):
        o, S = base(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
        shift = jax.pure_callback(lambda: np.float32(0), jax.ShapeDtypeStruct((), np.float32))
        return o + shift.astype(o.dtype), S

    p, _, _ = _problem(24)
    before = dict(program_cache.STATS)
    harness.lower(calls_back, p, "float32", cache=True)
    assert _from(program_cache.STATS, before)["unkeyable"] == 1
    assert not list(tmp_path.glob("*.exported"))
    monkeypatch.setenv(program_cache.ENV, "off")
    assert program_cache.directory() is None


def test_an_unwritable_cache_warns_once_and_the_run_goes_on(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv(program_cache.ENV, str(blocked / "programs"))
    p, do, dfs = _problem(24)
    with pytest.warns(program_cache.ProgramCacheWarning, match="cannot write"):
        compiled = harness.lower(make_scaled(2.0), p, "float32", cache=True).compile()
    got = harness.kernel_results(make_scaled(2.0), p, do, dfs, program=lambda: compiled)
    assert np.isfinite(got["o"]).all()


class AlwaysEqual:
    """A kernel object equal to every other of its class (as a dataclass whose options are compare=False)."""

    def __init__(self, factor):
        self.inner = make_scaled(factor)

    def __call__(self, *args, **kwargs):
        return self.inner(*args, **kwargs)

    def __eq__(self, other):
        return isinstance(other, AlwaysEqual)

    def __hash__(self):
        return 0


def test_kernels_that_compare_equal_get_programs_of_their_own():
    p, do, dfs = _problem(24)
    one, two = AlwaysEqual(1.0), AlwaysEqual(3.0)
    assert one == two and harness.runner(one) is not harness.runner(two)
    got = [harness.kernel_results(fn, p, do, dfs)["o"] for fn in (one, two)]
    np.testing.assert_array_equal(got[1], 3.0 * got[0])
