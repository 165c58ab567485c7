"""The time-to-a-verdict benchmark (ci/benchmarks/bench_verdict.py) at a tiny size: cold then warm runs of validate,
the ratio to the pure-Python workload, and the breakdown of where the time went."""

import json

import pytest

from gdn2_oracle.ci.benchmarks import bench_verdict
from gdn2_oracle.ci.running import compile_cache


def test_stack_categories_take_the_innermost_deciding_frame():
    frames = [("/x/jax/_src/compiler.py", "backend_compile_and_load"), ("/x/gdn2_oracle/oracle/recurrence.py", "f")]
    assert bench_verdict.category(frames) == "xla-compile"
    assert bench_verdict.category(frames[1:]) == "oracle"
    assert bench_verdict.category([("/x/jax/_src/interpreters/partial_eval.py", "trace")]) == "tracing"
    assert bench_verdict.category([("/x/app.py", "main")]) == "other"


def test_validate_cold_then_warm_at_a_tiny_size(tmp_path, monkeypatch):
    # every compiled program is kept: this tiny case compiles in about the cache's least kept time (0.2 s), so
    # whether the warm run finds it would depend on the machine's load
    monkeypatch.setenv(compile_cache.MIN_ENV, "0")
    out = tmp_path / "verdict.json"
    rc = bench_verdict.main(["--what", "validate", "--kernel", "pairwise[chunk_size=16]", "--repeats", "1",
                             "--validate-args", "--case decay_resets --dtype float32 --modes dense",
                             "--json", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    rows = {r["state"]: r for r in result["rows"]}
    assert set(rows) == {"cold", "warm"} and result["workload_s"] > 0
    cold, warm = rows["cold"], rows["warm"]
    # cold compiles the kernel's program and the warm run reads it from the persistent cache it left
    assert cold["jax"]["compile_n"] >= 1 and cold["jax"].get("cache_hits", 0) == 0
    assert warm["jax"].get("cache_hits", 0) >= 1
    for r in (cold, warm):
        assert r["ratio"] == pytest.approx(r["wall_s"] / result["workload_s"])
        assert sum(r["sampled_s"].values()) == pytest.approx(r["inner_wall_s"], rel=1e-6)
        assert r["inner_wall_s"] <= r["wall_s"]


def test_unknown_target_is_refused():
    with pytest.raises(SystemExit, match="unknown target"):
        bench_verdict.main(["--what", "validate,nonsense"])
