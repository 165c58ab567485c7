"""The float64 oracle in worker processes (ci/grading/references.py): bit for bit the one-process results."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from gdn2_oracle.ci.grading import references
from gdn2_oracle.oracle import make_problem, random_cotangents


@pytest.mark.parametrize("shape", [(3, 40, 2, 8, 8), (1, 40, 3, 8, 16)])  # split over the batch, over the heads
def test_workers_reproduce_one_process_bit_for_bit(monkeypatch, shape):
    monkeypatch.setattr(references, "MIN_WORK", 0)
    problem = make_problem(*shape, decay="resets", initial_state=True)
    do, dfs = random_cotangents(problem, seed=1)
    one = references.reference_results(problem, do, dfs)
    two = references.reference_results(problem, do, dfs, jobs=2)
    assert set(one) == set(two)
    for name in one:
        np.testing.assert_array_equal(two[name], one[name], err_msg=name)


@pytest.mark.parametrize("in_memory", [True, False])  # /dev/shm, or the temp dir when /dev/shm lacks room
def test_scratch_files_are_removed_and_results_are_plain_arrays(monkeypatch, tmp_path, request, in_memory):
    monkeypatch.setattr(references, "MIN_WORK", 0)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    scratch = Path(references._scratch_dir(1) or tmp_path) if in_memory else tmp_path
    if in_memory and scratch != tmp_path:  # a private folder in /dev/shm: other processes' runs do not count
        scratch = scratch / f"gdn2-test-{os.getpid()}-{tmp_path.name}"
        scratch.mkdir()
        request.addfinalizer(lambda: shutil.rmtree(scratch, ignore_errors=True))
    monkeypatch.setattr(references, "_scratch_dir", lambda nbytes: None if scratch == tmp_path else str(scratch))
    before = set(scratch.glob("gdn2-oracle-*"))
    problem = make_problem(2, 8, 1, 4, 4)
    do, dfs = random_cotangents(problem, seed=1)
    results = references.reference_results(problem, do, dfs, jobs=2)
    assert set(scratch.glob("gdn2-oracle-*")) == before
    np.testing.assert_array_equal(results["o"], references.reference_results(problem, do, dfs)["o"])
    for name, a in results.items():
        assert type(a) is np.ndarray and a.dtype == np.float64, name
        a[...] = 0.0  # writable


@pytest.mark.parametrize("jobs", [0, -1, 1.5, True])
def test_bad_jobs_name_the_argument(jobs):
    problem = make_problem(1, 4, 1, 4, 4)
    do, dfs = random_cotangents(problem, seed=1)
    with pytest.raises(ValueError, match="jobs"):
        references.reference_results(problem, do, dfs, jobs=jobs)


def test_cli_jobs_sets_the_oracle_workers(monkeypatch):
    from gdn2_oracle.ci.cli import main

    monkeypatch.setattr(references, "JOBS", None)
    assert main(["validate", "--jobs", "0"]) == 2
    assert main(["validate", "--jobs", "3", "--kernel", "pairwise[chunk_size=16]", "--cases", "quick",
                 "--case", "len_1", "--dtype", "float32", "--no-progress"]) == 0
    assert references.JOBS == 3
    assert main(["validate", "--kernel", "pairwise[chunk_size=16]", "--cases", "quick", "--case", "len_1",
                 "--dtype", "float32", "--no-progress"]) == 0
    assert references.JOBS is None  # the next command without --jobs: one a core again


def test_float64_and_mpmath_oracles_default_to_one_worker_a_core(monkeypatch):
    """One worker a core this process may use (its CPU affinity, not the machine's core count)."""
    from gdn2_oracle.golden import regenerate

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert references.default_jobs() == 3
    assert regenerate._parser().parse_args([]).jobs == 3
