"""The reference cache (ci/grading/reference_cache.py): a warm case computes nothing, returns the bits a fresh
computation gives, and a damaged, stale, foreign or unwritable entry is recomputed, never trusted."""

from __future__ import annotations

import json
import threading
import types

import numpy as np
import pytest

from gdn2_oracle.ci.grading import case as case_module
from gdn2_oracle.ci.grading import reference_cache, references
from gdn2_oracle.ci.grading.case import Case
from gdn2_oracle.ci.grading.modes import ModeCase
from gdn2_oracle.ci.testing import pytest_run
from gdn2_oracle.oracle import RESULTS, Recipe
from gdn2_oracle.oracle import modes as oracle_modes
from gdn2_oracle.oracle.mode_recipes import ModeRecipe

RECIPE = Recipe(1, 24, 2, 8, 8, decay="strong", gates="uniform", initial_state=True, seed=5)
MODE_RECIPE = ModeRecipe(1, 8, 8, (5, 20), gate="bounded", qk_l2norm=True, intermediate_chunk_size=8,
                         initial_state=True, seed=3)
F32 = {n: "float32" for n in RESULTS}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The cache in a fresh directory, on, with this process's bookkeeping reset; its path."""
    root = tmp_path / "references"
    monkeypatch.setenv(reference_cache.ENV, str(root))
    monkeypatch.setattr(reference_cache, "_enabled", True)
    monkeypatch.setattr(reference_cache, "_unwritable", set())
    monkeypatch.setattr(reference_cache, "_pruned", set())
    monkeypatch.setattr(reference_cache, "STATS", reference_cache.Stats())
    return root


@pytest.fixture
def calls(monkeypatch):
    """Counts of the oracle's computations: the dense reference, the two dense baselines, the mode pipelines."""
    n = {"reference": 0, "baseline": 0, "cumulative_baseline": 0, "modes": 0}

    def counting(name, fn):
        def run(*args, **kw):
            n[name] += 1
            return fn(*args, **kw)
        return run

    monkeypatch.setattr(case_module, "baseline", counting("baseline", case_module.baseline))
    monkeypatch.setattr(case_module, "cumulative_baseline",
                        counting("cumulative_baseline", case_module.cumulative_baseline))
    monkeypatch.setattr(oracle_modes, "run_call", counting("modes", oracle_modes.run_call))  # every mode pipeline
    n["reference_fn"] = counting("reference", references.reference_results)
    return n


def dense_values(case):
    """Every value a dense case caches: reference, float32 and bf16 baselines, cumulative baseline."""
    bf16 = {n: "bfloat16" if n not in ("final_state", "dh0") else "float32" for n in RESULTS}
    return {"reference": case.reference(), "baseline": case.baseline(F32), "baseline_bf16": case.baseline(bf16),
            "cumulative": case.cum_baseline(F32)}


def mode_values(case):
    """Every value a mode case caches: reference (with the chunk states), envelopes, both baselines."""
    dt = {n: "float32" for n in case.names()}
    return {"reference": case.reference(), "envelopes": case.envelopes(), "baseline": case.baseline(dt),
            "cumulative": case.cum_baseline(dt), "states_at_16": case.reference(chunk_size=16)}


def assert_same_bits(a, b):
    """Two nested mappings of arrays hold the same names, dtypes, shapes and bytes."""
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            assert_same_bits(a[k], b[k])
        else:
            x, y = np.asarray(a[k]), np.asarray(b[k])
            assert (x.dtype, x.shape) == (y.dtype, y.shape), k
            assert x.tobytes() == y.tobytes(), k


def dense_case(calls):
    return Case.from_recipe("t", RECIPE, reference_fn=calls["reference_fn"])


def fresh_dense():
    """The dense values computed with the cache bypassed (the reference of truth)."""
    with reference_cache.bypassed():
        return dense_values(Case.from_recipe("t", RECIPE))


def test_a_warm_dense_case_computes_nothing_and_returns_the_same_bits(cache, calls):
    cold = dense_values(dense_case(calls))
    after_cold = dict(calls)
    assert after_cold["reference"] == 1 and after_cold["baseline"] == 2 and after_cold["cumulative_baseline"] == 1
    warm_case = dense_case(calls)
    warm = dense_values(warm_case)
    assert {k: calls[k] for k in after_cold} == after_cold  # nothing computed again
    assert reference_cache.STATS.from_cache == 4 and reference_cache.STATS.computed == 4
    assert_same_bits(warm, cold)
    assert_same_bits(warm, fresh_dense())
    # the same judgement from a warm case as from a fresh one
    got = {n: (np.asarray(cold["reference"][n]) * (1 + 1e-3)).astype(np.float32) for n in RESULTS}
    with reference_cache.bypassed():
        want = Case.from_recipe("t", RECIPE).judge(got)
    assert [v.as_dict() for v in warm_case.judge(got).verdicts] == [v.as_dict() for v in want.verdicts]


def test_a_warm_mode_case_computes_nothing_and_returns_the_same_bits(cache, calls):
    cold = mode_values(ModeCase.from_recipe("m", MODE_RECIPE))
    n = calls["modes"]
    assert n >= 5  # reference, two baselines, states at chunk starts (three forwards) at 8 and at 16 tokens
    warm = mode_values(ModeCase.from_recipe("m", MODE_RECIPE))
    assert calls["modes"] == n
    assert_same_bits(warm, cold)
    with reference_cache.bypassed():
        assert_same_bits(warm, mode_values(ModeCase.from_recipe("m", MODE_RECIPE)))


def test_a_golden_case_caches_its_baselines_by_its_file(cache, calls):
    cold = Case.golden("len_1")
    base = cold.baseline(F32)
    assert cold.key["golden_sha256"] and calls["baseline"] == 1
    warm = Case.golden("len_1")
    assert_same_bits({"b": warm.baseline(F32)}, {"b": base}) and calls["baseline"] == 1


def test_cases_without_a_recipe_are_not_cached(cache):
    p, do, dfs = RECIPE.build()
    case = Case.of(p, do, dfs)
    case.baseline(F32)
    assert case.key is None and not cache.exists()


def _entries(root):
    return sorted(root.glob("*.npz"))


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "garbage"])
def test_a_damaged_entry_is_recomputed_and_overwritten(cache, calls, damage):
    want = dense_case(calls).reference()
    [path] = _entries(cache)
    data = bytearray(path.read_bytes())
    if damage == "flip":  # inside the arrays' bytes: the zip's CRC or the payload's sha256 catches it
        for i in range(len(data) // 3, len(data) // 3 + 8):
            data[i] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "empty":
        data = bytearray()
    else:
        data = bytearray(b"not a zip file" * 10)
    path.write_bytes(bytes(data))
    again = dense_case(calls).reference()
    assert calls["reference"] == 2 and reference_cache.STATS.rejected == 1
    assert_same_bits(again, want)
    dense_case(calls).reference()  # overwritten with a sound entry: read, not computed
    assert calls["reference"] == 2 and reference_cache.STATS.from_cache == 1


def test_an_altered_array_with_a_valid_zip_is_caught_by_the_payload_sha256(cache, calls):
    dense_case(calls).reference()
    [path] = _entries(cache)
    with np.load(path) as z:
        arrays = {n: z[n] for n in z.files}
    arrays["o"] = arrays["o"].copy()
    arrays["o"].flat[0] += 1.0  # a plausible wrong value, stored in a well-formed file
    np.savez(path, **arrays)
    ref = dense_case(calls).reference()
    assert calls["reference"] == 2 and reference_cache.STATS.rejected == 1
    assert ref["o"].flat[0] != arrays["o"].flat[0]


def test_an_entry_under_another_key_is_not_trusted(cache, calls):
    dense_case(calls).reference()
    other = RECIPE.replace(seed=RECIPE.seed + 1)
    Case.from_recipe("u", other, reference_fn=calls["reference_fn"]).reference()
    a, b = _entries(cache)
    b.write_bytes(a.read_bytes())  # one entry copied over the other's name
    Case.from_recipe("u", other, reference_fn=calls["reference_fn"]).reference()
    dense_case(calls).reference()
    assert calls["reference"] == 3 and reference_cache.STATS.rejected == 1  # exactly one of them was wrong


@pytest.mark.parametrize("stale", ["numpy", "oracle"])
def test_a_stale_entry_is_recomputed(cache, calls, monkeypatch, stale):
    dense_case(calls).reference()
    if stale == "numpy":
        monkeypatch.setattr(reference_cache.np, "__version__", "0.0.0")
    else:
        monkeypatch.setattr(reference_cache, "oracle_fingerprint", lambda: "0" * 64)
    dense_case(calls).reference()
    assert calls["reference"] == 2 and len(_entries(cache)) == 2


def test_the_key_names_the_oracle_sources_numpy_and_the_value(cache):
    key = json.loads(reference_cache.canonical({"dense_recipe": {"seed": 1}, "value": "reference"}))
    assert key["numpy"] == np.__version__ and key["oracle"] == reference_cache.oracle_fingerprint()
    assert key["what"] == {"dense_recipe": {"seed": 1}, "value": "reference"}
    assert key["format"] == reference_cache.FORMAT and key["cpu"] == reference_cache._cpu_dispatch()
    a = Case.from_recipe("t", RECIPE)
    a.baseline(F32)
    a.baseline({**F32, "o": "bfloat16"})
    assert len(_entries(cache)) == 2  # a baseline per result dtypes


def test_bypassed_neither_reads_nor_writes(cache, calls):
    with reference_cache.bypassed():
        dense_values(dense_case(calls))
    assert not cache.exists()
    dense_values(dense_case(calls))
    with reference_cache.bypassed():
        dense_values(dense_case(calls))
    assert calls["reference"] == 3 and reference_cache.STATS.from_cache == 0
    assert reference_cache.active_directory() == cache  # restored after the block


@pytest.mark.parametrize("value", ["0", "off", "", " NO "])
def test_the_environment_turns_it_off(monkeypatch, value):
    monkeypatch.setenv(reference_cache.ENV, value)
    assert reference_cache.directory() is None


def test_the_default_directory_is_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(reference_cache.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert reference_cache.directory() == tmp_path / "gdn2-oracle" / "references"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert reference_cache.directory() == tmp_path / "home" / ".cache" / "gdn2-oracle" / "references"


def test_a_multi_process_jax_run_does_not_use_it(cache, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "jax", types.SimpleNamespace(process_count=lambda: 2))
    assert reference_cache.active_directory() is None
    Case.from_recipe("t", RECIPE).reference()
    assert not cache.exists()


def test_an_unwritable_cache_warns_once_and_the_results_are_right(tmp_path, monkeypatch, cache, calls):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(reference_cache.ENV, str(blocker / "references"))  # mkdir fails: a file is in the way
    with pytest.warns(reference_cache.ReferenceCacheWarning, match="cannot write") as caught:
        got = dense_values(dense_case(calls))
    assert len(caught) == 1
    assert_same_bits(got, fresh_dense())


def test_concurrent_writers_and_readers_see_only_whole_entries(cache):
    arrays = {"x": np.arange(200_000, dtype=np.float64)}
    text = reference_cache.canonical({"test": "concurrent"})
    path = reference_cache.entry_path(cache, text)
    cache.mkdir(parents=True)
    seen, stop = [], threading.Event()

    def writer():
        for _ in range(15):
            reference_cache.write(path, text, arrays, 1.0)

    def reader():
        while not stop.is_set():
            seen.append(reference_cache.read(path, text))

    threads = [threading.Thread(target=writer) for _ in range(3)]
    r = threading.Thread(target=reader)
    r.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    r.join()
    assert reference_cache.STATS.rejected == 0 and reference_cache.STATS.written == 45
    assert [p.name for p in cache.iterdir()] == [path.name]  # no temporary file left
    assert all(np.array_equal(s[0]["x"], arrays["x"]) for s in seen if s is not None)
    assert reference_cache.read(path, text) is not None


def test_prune_drops_the_least_recently_used_entries_and_dead_writers_files(tmp_path):
    import os

    for i in range(10):
        p = tmp_path / f"{i}.npz"
        p.write_bytes(b"x" * 100)
        os.utime(p, (1000 + i, 1000 + i))
    dead = tmp_path / ".abc.tmp"
    dead.write_bytes(b"")
    os.utime(dead, (0, 0))
    reference_cache.prune(tmp_path, max_bytes=500)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{i}.npz" for i in range(6, 10)]


def test_validate_reads_the_cache_on_a_warm_run_with_the_same_grades_and_bypasses_it_on_request(cli, cache,
                                                                                                  tmp_path):
    def run(*extra):
        path = tmp_path / "v.json"
        code, out, err = cli("validate", "--kernel", "pairwise[chunk_size=16]", "--cases", "quick", "--case",
                             "gen_moderate_T130", "--case", "varlen_quick", "--dtype", "float32", "--no-progress",
                             "--json", path, *extra)
        assert code == 0, out + err
        report = json.loads(path.read_text())
        return report["environment"]["reference_cache"], [c["verdicts"] for c in report["kernels"][0]["cases"]]

    cold, verdicts = run()
    warm, warm_verdicts = run()
    off, off_verdicts = run("--no-reference-cache")
    assert cold["directory"] == str(cache) and cold["from_cache"] == 0 and cold["computed"] >= 4
    assert warm["computed"] == 0 and warm["from_cache"] == cold["computed"] and warm["seconds_saved"] > 0
    assert off["directory"] is None and off["from_cache"] == 0 and off["computed"] == cold["computed"]
    assert verdicts == warm_verdicts == off_verdicts


def test_the_plugin_option_turns_it_off(tmp_path):
    (tmp_path / "test_where.py").write_text(
        "from gdn2_oracle.ci.grading import reference_cache\n"
        "def test_where():\n"
        "    print('CACHE', reference_cache.active_directory())\n")
    env = {reference_cache.ENV: str(tmp_path / "refs")}  # a directory: only the option can turn it off
    code, out = pytest_run(tmp_path, "-s", "--gdn2-no-reference-cache", "test_where.py", env=env)
    assert code == 0 and "CACHE None" in out and "reference cache off" in out, out


def test_the_key_covers_every_module_a_cached_value_is_computed_by(cache):
    closure = reference_cache.source_closure()
    for module in ("oracle.recurrence", "oracle.generate", "ci.grading.tolerance", "ci.grading.case",
                   "golden.load", "golden.catalogue"):
        assert module in closure, f"{module} is not in the reference cache's key"
    assert not any(m.startswith(("ci.commands", "ci.running", "kernels", "property_tests")) for m in closure)
    imported = {m for name, path in closure.items() for m in reference_cache._imports(path, name)}
    assert {m for m in imported if reference_cache._file_of(reference_cache._package_root(), m)} <= set(closure), (
        "every package module a covered module imports is covered")


@pytest.mark.parametrize("env", ["OPENBLAS_CORETYPE", "OMP_NUM_THREADS"])
def test_the_blas_environment_and_the_format_are_in_the_key(cache, calls, monkeypatch, env):
    dense_case(calls).reference()
    monkeypatch.setenv(env, "7")
    dense_case(calls).reference()
    assert calls["reference"] == 2 and len(_entries(cache)) == 2
    monkeypatch.setattr(reference_cache, "FORMAT", 1)  # an entry of the format before the audit is never read
    dense_case(calls).reference()
    assert calls["reference"] == 3
