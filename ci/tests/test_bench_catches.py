"""``ci/benchmarks/bench_catches.py``: which wrong kernels the smoke and quick sets catch, each a console run."""

from __future__ import annotations

import importlib
import json

import pytest

from gdn2_oracle.ci.benchmarks import bench_catches
from gdn2_oracle.ci.commands import validate


def test_every_listed_mutant_is_a_kernel_of_its_module():
    for name, spec in bench_catches.specs():
        module, attr = spec.split(":")
        assert attr == name and callable(getattr(importlib.import_module(module), attr)), spec
    assert len(bench_catches.specs()) == len({n for n, _ in bench_catches.specs()})


def test_an_unknown_mutant_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match=r"mutant: unknown \['no_such_mutant'\]"):
        bench_catches.specs(["broken", "no_such_mutant"])


def test_a_set_catches_a_mutant_by_its_own_fail_cases_only():
    smoke = {"gates_negative"}
    cases = [("gates_negative", "float32", "pass"), ("len_1", "float32", "fail"), ("len_1", "bfloat16", "error"),
             ("decay_none", "float32", "precision")]
    r = bench_catches.row("m", 1, 1.0, cases, smoke)
    assert r["smoke"] == {"caught": False, "failed": 0, "cases": 1, "failed_cases": []}
    assert r["quick"]["caught"] and r["quick"]["failed_cases"] == ["len_1[bfloat16]", "len_1[float32]"]
    assert r["quick"]["cases"] == 4


@pytest.mark.slow
def test_a_run_says_both_sets_catch_a_kernel_that_raises(tmp_path, capsys):
    path = tmp_path / "catches.json"
    bench_catches.main(["--mutant", "broken", "--json", str(path)])
    [r] = json.loads(path.read_text())
    assert r["mutant"] == "broken" and r["exit"] == 1 and r["smoke"]["caught"] and r["quick"]["caught"]
    assert 0 < r["smoke"]["cases"] < r["quick"]["cases"] <= len(validate.build_cases("quick"))
    assert "caught: smoke 1 of 1, quick 1 of 1" in capsys.readouterr().out
