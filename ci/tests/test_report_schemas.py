"""The JSON reports' keys, per schema version (docs/commands.md): a key added or removed without a new schema
version fails here, and each version says what it changed."""

from __future__ import annotations

import json

from gdn2_oracle.ci.commands import bench, domain, validate

# What each schema version changed against the one before it.
CHANGES = {
    # /2 added modes (per kernel accepted_modes, modes, not_accepted_cases); /3 only new values: the grades EMPTY
    # and INTERRUPTED, the outcome "empty"
    # /4 added families (the run's kernels' families) and per kernel family, other_family_cases; a family case's
    # record has a dense case's keys and "family"
    # /5 added per kernel refused_cases (the cases outside the kernel's own domain, not run, each with its reason)
    "gdn2-oracle/validate/5": {"added": set(), "added per kernel": {"refused_cases"}},
    # /2 added interrupted; /3 modes, not_accepted_modes. /4 added family (the kernel's) and not_accepted_flags; a
    # family kernel's panels each have "family"
    "gdn2-oracle/domain/4": {"added": {"family", "not_accepted_flags"}},
}
VALIDATE = {"schema", "command", "cases", "dtypes", "seed", "only", "mesh", "environment", "n_cases", "seconds",
            "passed", "interrupted", "outcome", "grade", "kernels", "modes", "families"}
VALIDATE_KERNEL = {"name", "spec", "options", "source", "notes", "cases", "family", "accepted_modes",
                   "not_accepted_cases", "other_family_cases", "refused_cases",
                   "passed", "n_cases", "n_failed", "n_input_errors", "n_precision", "grade", "summary", "diagnosis",
                   "modes"}
VALIDATE_CASE = {"case", "source", "dtype", "shape", "passed", "outcome", "grade", "verdicts", "error", "diagnosis",
                 "seconds"}
BENCH = {"schema", "command", "environment", "repeats", "seed", "tiles", "mesh", "problem", "timed", "oracle_seconds",
         "seconds", "passed", "interrupted", "outcome", "results"}
DOMAIN = {"schema", "kernel", "grid", "seeds", "chunk", "shape", "base", "results", "panels", "seconds",
          "environment", "interrupted", "modes", "not_accepted_modes", "family", "not_accepted_flags", "boundaries",
          "summary"}


def test_the_versions_are_the_documented_ones():
    assert {validate.SCHEMA, domain.SCHEMA} == set(CHANGES)
    assert bench.SCHEMA == "gdn2-oracle/bench/2"  # /2: outcome "empty"


def test_validate_json_keys(cli, tmp_path):
    path = tmp_path / "v.json"
    cli("validate", "--kernel", "pairwise[chunk_size=16]", "--cases", "golden", "--case", "len_1", "--dtype",
        "float32", "--no-progress", "--json", path)
    report = json.loads(path.read_text())
    assert set(report) == VALIDATE
    [kernel] = report["kernels"]
    assert set(kernel) == VALIDATE_KERNEL
    [case] = kernel["cases"]
    assert set(case) - {"regime"} == VALIDATE_CASE
    assert CHANGES[report["schema"]]["added"] <= set(report)
    assert CHANGES[report["schema"]]["added per kernel"] <= set(kernel)


def test_bench_json_keys(cli, tmp_path):
    path = tmp_path / "b.json"
    cli("bench", "--kernel", "pairwise[chunk_size=16]", "--batch", "1", "--seq", "16", "--heads", "1", "--dim", "8",
        "--repeats", "1", "--no-progress", "--json", path)
    assert set(json.loads(path.read_text())) == BENCH


def test_domain_json_keys(cli, tmp_path, monkeypatch):
    tiny = domain.Grid("quick", (domain.Axis("erase", "erase gate b", (1.0,)),), seeds=1, base=domain.Point(T=8),
                       shape=(1, 1, 4, 4))
    monkeypatch.setitem(domain.GRIDS, "quick", tiny)
    cli("domain", "--kernel", "pairwise[chunk_size=16]", "--out", tmp_path, "--no-progress")
    report = json.loads((tmp_path / "domain.json").read_text())
    assert set(report) == DOMAIN and CHANGES[report["schema"]]["added"] <= set(report)


def test_family_domain_json_keys(cli, tmp_path, monkeypatch):
    """A family kernel's map has the same keys; its panels add "family"."""
    tiny = domain.FamilyGrid("quick", decays=("moderate",), betas=("uniform",), groups=(1,), shape=(1, 8, 1, 4, 4))
    monkeypatch.setitem(domain.FAMILY_GRIDS, "quick", tiny)
    cli("domain", "--kernel", "gdn-factorized", "--out", tmp_path, "--no-progress")
    report = json.loads((tmp_path / "domain.json").read_text())
    assert set(report) == DOMAIN and report["family"] == "gdn"
    [panel] = report["panels"]
    assert set(panel) == {"field", "label", "dtype", "mode", "cells", "family"}
