"""Programs compiled ahead of time (ci/running/ahead.py): one program a signature, the same results as compiling on
first call, and a kernel's failure while tracing raised where its case is judged."""

import jax.numpy as jnp
import numpy as np
import pytest

from gdn2_oracle import oracle
from gdn2_oracle.ci.commands import validate
from gdn2_oracle.ci.running import harness
from gdn2_oracle.ci.running import program_cache
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
    reports = {w: validate.run_validation(specs, dtypes=("float32",), only=["decay_resets", "len_c64_plus1"],
                                          modes=("dense",), show_progress=False, compile_workers=w) for w in (0, 2)}
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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_program_cache_reads_back_a_kernel_program_without_tracing_it(tmp_path, monkeypatch, dtype):
    monkeypatch.setenv(program_cache.ENV, str(tmp_path))
    p = oracle.make_problem(1, 24, 1, 8, 8, decay="moderate", initial_state=True, seed=0, precision=dtype)
    do, dfs = oracle.random_cotangents(p, precision=dtype)
    TRACES.clear()
    runs = []
    for _ in range(2):
        counted = make_counted()  # nothing of it traced in memory: only the program cache can spare the trace
        compiled = harness.lower(counted, p, dtype, cache=True).compile()
        runs.append(harness.kernel_results(counted, p, do, dfs, dtype=dtype, program=lambda c=compiled: c))
    assert len(TRACES) == 1, "the second lowering reads the exported program back"
    assert len(list(tmp_path.glob("*.exported"))) == 1
    reference = harness.kernel_results(counted, p, do, dfs, dtype=dtype)  # jit on first call, no cache
    for got in runs:
        for result in oracle.RESULTS:
            np.testing.assert_array_equal(got[result], reference[result], err_msg=result)


def test_a_damaged_program_entry_is_rebuilt_and_a_changed_kernel_is_a_new_key(tmp_path, monkeypatch):
    monkeypatch.setenv(program_cache.ENV, str(tmp_path))
    p, do, dfs = _problem(24)
    harness.lower(make_counted(), p, "float32", cache=True)
    (entry,) = tmp_path.glob("*.exported")
    data = bytearray(entry.read_bytes())
    data[-10] ^= 0xFF
    entry.write_bytes(bytes(data))
    assert program_cache.read(tmp_path, entry.stem) is None, "the damage is seen"
    TRACES.clear()
    harness.lower(make_counted(), p, "float32", cache=True)
    assert len(TRACES) == 1, "a damaged entry is traced again"
    assert program_cache.read(tmp_path, entry.stem) is not None, "and stored again"
    signature = {"shape": [1]}
    kernels = ("pairwise[chunk_size=16]", "pairwise[chunk_size=32]")
    keys = {program_cache.key(spec.get(s), signature, "h") for s in kernels}
    assert len(keys) == 2 and None not in keys, "the kernel's options are part of the key"
    assert program_cache.key(spec.get("pairwise"), signature, "h") != program_cache.key(
        spec.get("pairwise"), signature, "harness changed")


def test_a_kernel_without_a_stable_name_is_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv(program_cache.ENV, str(tmp_path))

    class Anonymous:
        def __call__(self, *args, **kwargs):
            return make_counted()(*args, **kwargs)

    assert program_cache.key(Anonymous(), {}, "h") is None
    monkeypatch.setenv(program_cache.ENV, "off")
    assert program_cache.directory() is None
