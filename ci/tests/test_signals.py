"""Signals and the oracle's own faults: SIGTERM is handled like Ctrl-C (the finished part reported, workers
stopped, exit 143, no orphan), and a fault of the oracle's worker machinery never grades a kernel."""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import json
import shutil
import signal
import tempfile
import time

import numpy as np
import pytest

from gdn2_oracle import golden
from gdn2_oracle.ci.grading import references
from gdn2_oracle.ci.testing import alive, corpus_copy, interrupt_after
from gdn2_oracle.oracle import make_problem, random_cotangents

TINY_BENCH = ["--batch", "1", "--seq", "32", "--heads", "2", "--dim", "16", "--repeats", "1", "--no-progress"]


def _gone(pids, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def test_sigterm_to_golden_regenerate_reports_stops_its_workers_and_exits_143(tmp_path):
    names = ["gdn_resets_len17", "len_c16_plus1", "len_c16_minus1", "len_c16"]
    root = corpus_copy(tmp_path, drop_entries=names)
    argv = ["gdn2_oracle.ci.cli", "golden", "regenerate", "--root", str(root), "--jobs", "2",
            *(a for n in names for a in ("--case", n))]
    code, out, err, workers = interrupt_after(argv, "regenerate: 1/", sig=signal.SIGTERM)
    assert code == 143, out + err
    assert "interrupted" in err and "Traceback" not in err, err
    assert workers, "the regeneration had no worker processes to check"
    assert not _gone(workers), f"orphaned workers after SIGTERM: {workers}"
    finished = [n for n in names if n in golden.read_manifest(root / "MANIFEST.json")["cases"]]
    assert 1 <= len(finished) < len(names)


@pytest.mark.slow
def test_sigterm_to_validate_writes_the_finished_cases_and_exits_143(tmp_path):
    path = tmp_path / "v.json"
    cases = ["len_1", "len_c16", "kv_16x32", "kv_32x8", "len_c64"]
    argv = ["gdn2_oracle.ci.cli", "validate", "--cases", "golden", "--kernel", "pairwise", "--dtype", "float32",
            "--json", str(path), *(a for c in cases for a in ("--case", c))]
    code, out, err, _ = interrupt_after(argv, "validate: 1/", sig=signal.SIGTERM)
    assert code == 143, out + err
    assert "Traceback" not in err and "interrupted" in err
    report = json.loads(path.read_text())
    assert report["interrupted"] is True and 1 <= len(report["kernels"][0]["cases"]) < len(cases)


@pytest.fixture
def problem():
    p = make_problem(2, 24, 2, 8, 8, decay="strong", initial_state=True, seed=3)
    return (p, *random_cotangents(p, seed=4))


class _KilledWorkers(concurrent.futures.ProcessPoolExecutor):
    """A pool whose workers die (as when one is killed by the OOM killer or a signal)."""

    def map(self, *args, **kwargs):
        raise concurrent.futures.process.BrokenProcessPool("A process in the process pool was terminated abruptly")


def test_a_killed_oracle_worker_falls_back_to_this_process(problem, monkeypatch):
    monkeypatch.setattr(references, "MIN_WORK", 0)
    monkeypatch.setattr(references.concurrent.futures, "ProcessPoolExecutor", _KilledWorkers)
    with pytest.warns(references.OracleWorkersFailed, match="BrokenProcessPool.*computing it in this process"):
        got = references.reference_results(*problem, jobs=2)
    want = references._solve(*problem)
    for name, a in want.items():
        np.testing.assert_array_equal(got[name], a, err_msg=name)


def test_read_only_shared_memory_falls_back_to_this_process(problem, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system", "/dev/shm/gdn2-oracle-x")

    monkeypatch.setattr(references, "MIN_WORK", 0)
    monkeypatch.setattr(tempfile, "TemporaryDirectory", read_only)
    with pytest.warns(references.OracleWorkersFailed, match="Read-only file system"):
        got = references.reference_results(*problem, jobs=2)
    np.testing.assert_array_equal(got["o"], references._solve(*problem)["o"])


def test_bench_never_rejects_a_correct_kernel_for_the_oracles_fault(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(references, "MIN_WORK", 0)
    monkeypatch.setattr(references.concurrent.futures, "ProcessPoolExecutor", _KilledWorkers)
    path = tmp_path / "b.json"
    with pytest.warns(references.OracleWorkersFailed):
        code, out, err = cli("bench", "--kernel", "pairwise[chunk_size=16]", *TINY_BENCH, "--jobs", "2",
                             "--json", path)
    assert code == 0 and "REJECTED" not in out, out + err
    assert json.loads(path.read_text())["results"][0]["status"] == "ok"


def test_no_temporary_directories_are_left_by_the_fallback(problem, monkeypatch, tmp_path):
    monkeypatch.setattr(references, "MIN_WORK", 0)
    monkeypatch.setattr(references, "_scratch_dir", lambda nbytes: str(tmp_path))
    monkeypatch.setattr(references.concurrent.futures, "ProcessPoolExecutor", _KilledWorkers)
    with pytest.warns(references.OracleWorkersFailed):
        references.reference_results(*problem, jobs=2)
    assert not list(tmp_path.iterdir()), list(tmp_path.iterdir())
    shutil.rmtree(tmp_path, ignore_errors=True)


KERNELS_THAT_STOP = '''
import sys
from gdn2_oracle import kernels

_base = kernels.get("pairwise", chunk_size=16)


def exit0(*args, **kwargs):
    sys.exit(0)


def exit3(*args, **kwargs):
    sys.exit(3)


def interrupts(*args, **kwargs):
    raise KeyboardInterrupt
'''


@pytest.mark.parametrize("name, message", [
    ("exit0", "the kernel called sys.exit(0)"),
    ("exit3", "the kernel called sys.exit(3)"),
    ("interrupts", "the kernel raised KeyboardInterrupt itself"),
])
def test_a_kernel_that_exits_or_interrupts_fails_its_cases_and_the_run_goes_on(tmp_path, name, message):
    """Before: sys.exit(0) in a kernel ended validate with exit 0, no table, no JSON (a false pass)."""
    import os
    import subprocess
    import sys

    (tmp_path / "stopping_kernels.py").write_text(KERNELS_THAT_STOP)
    path = tmp_path / "v.json"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "gdn2_oracle.ci.cli", "validate", "--kernel", "pairwise",
                           "--kernel", f"stopping_kernels:{name}", "--cases", "golden", "--case", "decay_moderate",
                           "--dtype", "float32", "--json", str(path), "--no-progress"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "pairwise: PASS" in done.stdout and message in done.stdout, done.stdout
    report = json.loads(path.read_text())
    assert [k["passed"] for k in report["kernels"]] == [True, False]


def _no_space(*args, **kwargs):
    raise OSError(28, "No space left on device")


def test_a_json_that_cannot_be_written_after_the_work_keeps_the_verdicts_exit_status(cli, tmp_path, monkeypatch):
    """Before: bench on a full disk printed its table, then an ENOSPC traceback, exit 1 (the kernel-failed code)."""
    from gdn2_oracle.ci.commands import bench

    monkeypatch.setattr(bench, "write_json", _no_space)
    code, out, err = cli("bench", "--kernel", "pairwise[chunk_size=16]", *TINY_BENCH, "--json", tmp_path / "b.json")
    assert code == 0 and "validated" in out, out + err
    assert "--json" in err and "No space left on device" in err and "Traceback" not in err, err


def test_domain_maps_that_cannot_be_written_keep_the_printed_summary(cli, tmp_path, monkeypatch):
    from gdn2_oracle.ci.commands import domain

    tiny = domain.Grid("quick", (domain.Axis("erase", "erase gate b", (0.5, 1.0)),), seeds=1,
                       base=domain.Point(T=8), shape=(1, 1, 4, 4))
    monkeypatch.setitem(domain.GRIDS, "quick", tiny)
    monkeypatch.setattr(domain, "write_json", _no_space)
    code, out, err = cli("domain", "--kernel", "pairwise[chunk_size=16]", "--out", tmp_path, "--no-progress")
    assert code == 0 and "domain: no FAIL" in out, out + err
    assert "could not write it" in err and "Traceback" not in err, err


HANGING = '''
import time
from gdn2_oracle import kernels

_base = kernels.get("pairwise", chunk_size=16)


def hangs(*args, **kwargs):  # a JAX kernel that never returns (at trace time, in Python)
    while True:
        time.sleep(0.05)


def torch_hangs(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False):
    """A torch kernel that loops for good on non-zero input (the probe, on zeros, returns)."""
    import torch

    from gdn2_oracle.kernels.testing_torch import recurrent

    if bool(torch.any(q != 0)):
        while True:
            sum(range(10000))
    return recurrent(q, k, v, g, b, w, scale=scale, initial_state=initial_state,
                     output_final_state=output_final_state)
'''


def _validate_hanging(tmp_path, kernel, *extra):
    import os
    import subprocess
    import sys

    (tmp_path / "hanging_kernels.py").write_text(HANGING)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GDN2_"))},
           "PYTHONPATH": str(tmp_path)}
    return subprocess.Popen([sys.executable, "-m", "gdn2_oracle.ci.cli", "validate", "--kernel", "pairwise",
                             "--kernel", kernel, "--cases", "golden", "--case", "len_1", "--case", "decay_moderate",
                             "--dtype", "float32", "--no-progress", "--json", str(tmp_path / "v.json"), *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_hung_kernel_is_stopped_by_the_case_timeout_with_the_finished_cases_reported(tmp_path):
    """Before: no time limit; a hung kernel held the run for good. Now --case-timeout: that case is FAIL
    (timed out), the run stops with what was finished (JSON written), exit 1."""
    proc = _validate_hanging(tmp_path, "hanging_kernels:hangs", "--case-timeout", "4")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, out + err
    assert "timed out after 4 s" in out and "pairwise" in out and "--case-timeout 4 s" in err, out + err
    report = json.loads((tmp_path / "v.json").read_text())
    hung = report["kernels"][1]["cases"][-1]
    assert hung["grade"] == "FAIL" and "timed out" in hung["error"]
    assert report["kernels"][0]["cases"], "the finished cases of the other kernel are reported"


def test_ctrl_c_stops_a_torch_kernel_hung_in_its_callback_with_the_partial_report(tmp_path):
    """Before: a torch kernel looping in its host callback ignored SIGINT (only SIGKILL ended it). Now the
    watchdog sees the signal the main thread cannot take, reports what was finished and exits 130."""
    proc = _validate_hanging(tmp_path, "torch:hanging_kernels:torch_hangs[output_final_state=True]",
                             "--case-timeout", "0")
    time.sleep(25)  # past the first cases and into the hung callback
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert time.monotonic() - t0 < 30 and "interrupted while a kernel did not return" in err, err
    assert json.loads((tmp_path / "v.json").read_text())["interrupted"] is True
