"""Signals and the oracle's own faults: SIGTERM is handled like Ctrl-C (the finished part reported, workers
stopped, exit 143, no orphan), and a fault of the oracle's worker machinery never grades a kernel."""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import json
import os
import re
import shutil
import signal
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from gdn2_oracle import golden
from gdn2_oracle.ci.commands import domain
from gdn2_oracle.ci.grading import references
from gdn2_oracle.ci.testing import alive, children, corpus_copy, interrupt_after
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
import sys
import time
from gdn2_oracle import kernels

_base = kernels.get("pairwise", chunk_size=16)


def hangs(*args, **kwargs):  # a JAX kernel that never returns (at trace time, in Python)
    while True:
        time.sleep(0.05)


def hangs_in_bf16(q, k, v, g, b, w, scale=None, initial_state=None):
    """The pairwise kernel on float32 inputs; never returns on bfloat16 ones."""
    if q.dtype.name == "bfloat16":
        hangs()
    return _base(q, k, v, g, b, w, scale=scale, initial_state=initial_state)


def torch_hangs(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False):
    """A torch kernel that loops for good on non-zero input (the probe, on zeros, returns)."""
    import torch

    from gdn2_oracle.kernels.testing_torch import recurrent

    if bool(torch.any(q != 0)):
        print("gdn2-test: hanging", file=sys.stderr, flush=True)
        while True:
            sum(range(10000))
    return recurrent(q, k, v, g, b, w, scale=scale, initial_state=initial_state,
                     output_final_state=output_final_state)


def slow_to_trace(q, k, v, g, b, w, scale=None, initial_state=None):
    """The pairwise kernel, a minute in tracing (while its program compiles)."""
    print("gdn2-test: tracing", file=sys.stderr, flush=True)
    time.sleep(60)
    return _base(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
'''


def _hanging(tmp_path, *argv, script=None):
    """``gdn2-oracle *argv`` (or ``python script *argv``) in a subprocess that can import ``hanging_kernels``."""
    import os
    import subprocess
    import sys

    (tmp_path / "hanging_kernels.py").write_text(HANGING)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GDN2_"))},
           "PYTHONPATH": str(tmp_path)}
    start = [str(script)] if script else ["-m", "gdn2_oracle.ci.cli"]
    return subprocess.Popen([sys.executable, *start, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _validate_hanging(tmp_path, kernel, *extra):
    return _hanging(tmp_path, "validate", "--kernel", "pairwise", "--kernel", kernel, "--cases", "golden", "--case",
                    "len_1", "--case", "decay_moderate", "--dtype", "float32", "--no-progress", "--json",
                    str(tmp_path / "v.json"), *extra)


# --case-timeout in validate, bench, domain and hunt: the same option and stop in each (ci/commands/args.py,
# output.stop_run). LIMIT: well over a cold compile of the pairwise kernel at these tiny shapes on a loaded 2-core
# machine (about 5 s; the four commands below run side by side, so 20 s), so only the hung kernel passes it. Each
# command spends most of its time waiting out the limit, so the four are started together (:func:`timed_out`): one
# wait of the limit for the module instead of four, one after another, on an idle test worker.
LIMIT = 20


def _timeout_runs(root):
    """name -> the command with a hung kernel and ``--case-timeout LIMIT``, started in its own folder under ``root``."""
    folders = {name: root / name for name in ("validate", "bench", "domain", "hunt")}
    for folder in folders.values():
        folder.mkdir()
    limit = ("--case-timeout", str(LIMIT))
    return {
        "validate": _validate_hanging(folders["validate"], "hanging_kernels:hangs", *limit),
        "bench": _hanging(folders["bench"], "bench", "--kernel", "pairwise[chunk_size=16]", "--kernel",
                          "hanging_kernels:hangs", *TINY_BENCH, *limit, "--json", str(folders["bench"] / "b.json")),
        "domain": _hanging(folders["domain"], "domain", "--kernel", "hanging_kernels:hangs_in_bf16", "--out",
                           str(folders["domain"] / "d"), *limit, "--no-progress"),
        "hunt": _hanging(folders["hunt"], "hunt", "--kernel", "hanging_kernels:hangs_in_bf16", "--seed", "3",
                         "--budget", "40", *limit, "--no-progress"),
    }, folders


@pytest.fixture(scope="module")
def timed_out(tmp_path_factory):
    """name -> ``(exit status, stdout, stderr, folder)`` of the four commands of :func:`_timeout_runs`, run side by
    side (a worker that runs only some of this module's tests still runs all four: each test reads its own)."""
    procs, folders = _timeout_runs(tmp_path_factory.mktemp("case-timeouts"))
    done = {}
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=300)
            done[name] = (proc.returncode, out, err, folders[name])
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return done


def test_a_hung_kernel_is_stopped_by_the_case_timeout_with_the_finished_cases_reported(timed_out):
    """Before: no time limit; a hung kernel held the run for good. Now --case-timeout: that case is FAIL
    (timed out), the run stops with what was finished (JSON written), exit 1."""
    code, out, err, folder = timed_out["validate"]
    assert code == 1, out + err
    assert f"timed out after {LIMIT} s" in out and "pairwise" in out and f"--case-timeout {LIMIT} s" in err, out + err
    report = json.loads((folder / "v.json").read_text())
    hung = report["kernels"][1]["cases"][-1]
    assert hung["grade"] == "FAIL" and "timed out" in hung["error"]
    assert report["kernels"][0]["cases"], "the finished cases of the other kernel are reported"


def test_ctrl_c_stops_a_torch_kernel_hung_in_its_callback_with_the_partial_report(tmp_path):
    """Before: a torch kernel looping in its host callback ignored SIGINT (only SIGKILL ended it). Now the
    watchdog sees the signal the main thread cannot take, reports what was finished and exits 130."""
    proc = _validate_hanging(tmp_path, "torch:hanging_kernels:torch_hangs[output_final_state=True]",
                             "--case-timeout", "0")
    sent = []
    status, out, err = _signal_at(proc, "gdn2-test: hanging", signal.SIGINT, sent=sent)  # in the hung callback
    assert status == 130, out + err
    t0 = sent[0]
    assert time.monotonic() - t0 < 30 and "the kernel call in progress did not stop" in err, err
    assert json.loads((tmp_path / "v.json").read_text())["interrupted"] is True


def test_bench_stops_a_hung_kernel_at_the_case_timeout_with_the_finished_results(timed_out):
    """Before: bench had no time limit; a hung kernel held the run for good."""
    code, out, err, folder = timed_out["bench"]
    path = folder / "b.json"
    assert code == 1, out + err
    assert f"--case-timeout {LIMIT} s" in err and "REJECTED" in out and f"timed out after {LIMIT} s" in out, out + err
    report = json.loads(path.read_text())
    ok, hung = report["results"] if len(report["results"]) == 2 else pytest.fail(out + err)
    assert ok["status"] == "ok" and ok["median_s"] > 0, "the finished result is reported"
    assert hung["status"] == "rejected" and "compiling at" in hung["reason"]
    assert f"timed out after {LIMIT} s" in hung["reason"]
    assert report["outcome"] == "fail" and report["interrupted"] is False


def test_domain_stops_a_hung_kernel_at_the_case_timeout_and_writes_the_cells_done(timed_out):
    """Before: domain had no time limit. Now the cell whose kernel call passes --case-timeout is FAIL (timed out), the
    cells finished before it are written (marked interrupted) and the exit status is 1."""
    code, out, err, tmp_path = timed_out["domain"]
    assert code == 1, out + err
    assert f"--case-timeout {LIMIT} s" in err and "domain: FAIL in 1 of" in out and "(INTERRUPTED)" in out, out + err
    report = json.loads((tmp_path / "d" / "domain.json").read_text())
    assert report["interrupted"] is True
    # the decay-strength sweep: every float32 cell, then the first bfloat16 one
    f32, bf16 = report["panels"] if len(report["panels"]) == 2 else pytest.fail(out + err)
    assert f32["dtype"] == "float32" and len(f32["cells"]) == len(domain.GRIDS["quick"].axes[0].values)
    assert all(r["grade"] == "PASS" for c in f32["cells"] for r in c["results"].values())
    [hung] = bf16["cells"]
    assert f"timed out after {LIMIT} s" in hung["note"] and {r["grade"] for r in hung["results"].values()} == {"FAIL"}
    assert "INTERRUPTED" in report["summary"] and (tmp_path / "d" / "domain.png").stat().st_size > 0


def test_hunt_stops_a_hung_kernel_at_the_case_timeout_with_its_seed_and_the_worst_so_far(timed_out):
    """Before: hunt had no time limit. Now the recipe whose kernel call passes --case-timeout is the FAIL (not shrunk:
    the search stops there), printed with its reproducer, the seed and the worst recipe so far; exit 1."""
    code, out, err, _ = timed_out["hunt"]
    assert code == 1, out + err
    assert f"--case-timeout {LIMIT} s" in err and "seed 3" in err, err
    assert f"FAIL (timed out after {LIMIT} s" in out and "not shrunk" in out and "precision='bfloat16'" in out, out
    # the kernel's module is found through PYTHONPATH only: its reproducer says so (kernels.spec.runnable)
    assert re.search(r"reproduce: PYTHONPATH=\S+ python -c", out), out
    assert "--seed 3" in out and "hunt: FAIL found" in out, out
    ran = int(re.search(r"(\d+) recipes run", out).group(1))
    assert ran == 1 or "worst error / tolerance reached" in out, out


def _tree(pid):
    """``pid`` and its descendants (from /proc)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children(p)
    return out


def _cmdline(pid):
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


ORACLE_IN_WORKERS = """
import sys

from gdn2_oracle.ci import cli
from gdn2_oracle.ci.grading import references

references.MIN_WORK = 0  # every generated case's float64 oracle in the worker processes of --jobs
sys.exit(cli.main())
"""


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_to_validate_with_oracle_workers_leaves_no_process_of_its_tree_alive(tmp_path, sig, code):
    """validate --jobs 2 runs the float64 oracle in spawned worker processes (ci/grading/references.py): a signal
    while they work gives the partial report and exit 143/130, and no process of its tree outlives it."""
    script = tmp_path / "oracle_in_workers.py"
    script.write_text(ORACLE_IN_WORKERS)
    path = tmp_path / "v.json"
    proc = _hanging(tmp_path, "validate", "--kernel", "pairwise[chunk_size=16]", "--cases", "quick", "--modes",
                    "dense", "--dtype", "float32", "--case", "gen_moderate_T130", "--case", "gen_strong_negative_T130",
                    "--case", "gen_extreme_h0_T130", "--jobs", "2", "--json", str(path), "--no-progress",
                    "--no-reference-cache",  # the oracle's workers must run: no reference read from a cache
                    script=script)
    tree, deadline = [], time.monotonic() + 240
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            tree = _tree(proc.pid)
            if any("spawn_main" in _cmdline(p) for p in tree):  # the oracle's workers have started
                break
            time.sleep(0.05)
        assert proc.poll() is None, "validate finished before its oracle workers were seen"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    workers = tree[1:]
    assert workers, "no worker process of the oracle to check"
    assert proc.returncode == code, out + err
    # A worker the signal caught in its spawn handshake (its parent stopped sending) prints multiprocessing's own
    # EOFError and exits: that is the worker's start-up, not validate's output, which must hold no traceback.
    own = re.sub(r"Traceback \(most recent call last\):\n(?:  .*\n)*?.*multiprocessing/spawn\.py(?:.*\n)*?"
                 r"EOFError: Ran out of input\n", "", err)
    assert "interrupted" in own and "Traceback" not in own, err
    assert json.loads(path.read_text())["interrupted"] is True
    assert not _gone(tree[1:]), f"processes of validate's tree alive after it exited: {_gone(tree[1:], 0)}"

# --- an interrupt at any moment gives an interrupted report, never a pass ----------------------------------

# Kernel modules whose import is the run's start-up: one swallows the interrupt (as JAX's gc callback does with one
# raised while JAX starts), one is interrupted in it.
SWALLOWS_AT_START = """
import sys
import time
from gdn2_oracle import kernels

print("gdn2-test: starting", file=sys.stderr, flush=True)
try:
    time.sleep(60)
except KeyboardInterrupt:  # a Terminated (SIGTERM) too
    pass
kernel = kernels.get("pairwise", chunk_size=16)
"""
SLOW_TO_START = """
import sys
import time

print("gdn2-test: starting", file=sys.stderr, flush=True)
time.sleep(60)
"""


def _signal_at(proc, marker, sig, timeout=240, sent=None):
    """Send ``sig`` to ``proc`` once a line of its stderr contains ``marker``; ``(exit status, stdout, stderr)``.
    ``sent``: a list the time of the signal is appended to (``time.monotonic``)."""
    lines, deadline = [], time.monotonic() + timeout
    try:
        for line in proc.stderr:
            lines.append(line)
            if marker in line:
                if sent is not None:
                    sent.append(time.monotonic())
                proc.send_signal(sig)
                break
            assert time.monotonic() < deadline, "".join(lines)
        else:
            pytest.fail(f"{marker!r} never came: {''.join(lines)}")
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, "".join(lines) + err


def _validate_one(tmp_path, kernel, *extra):
    return _hanging(tmp_path, "validate", "--kernel", kernel, "--cases", "golden", "--case", "len_1", "--dtype",
                    "float32", "--no-progress", "--json", str(tmp_path / "v.json"), *extra)


def _interrupted_report(tmp_path, out):
    """The JSON report, checked to be an interrupted one; the console says PASS for no kernel nor the run."""
    report = json.loads((tmp_path / "v.json").read_text())
    assert report["interrupted"] is True and report["outcome"] == "interrupted" and report["passed"] is False
    assert report["grade"] == "INTERRUPTED" and all(k["grade"] == "INTERRUPTED" for k in report.get("kernels", []))
    assert not re.search(r": PASS|overall: PASS", out), out
    return report


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupt_swallowed_during_start_up_still_interrupts_the_run(tmp_path, sig, code):
    """Before: Ctrl-C during start-up raised in a JAX gc callback, was printed and dropped; the run went on, printed
    PASS and exited 0, the JSON not marked interrupted."""
    (tmp_path / "swallows_at_start.py").write_text(SWALLOWS_AT_START)
    status, out, err = _signal_at(_validate_one(tmp_path, "swallows_at_start:kernel"), "gdn2-test: starting", sig)
    assert status == code, out + err
    _interrupted_report(tmp_path, out)
    assert "Traceback" not in err, err


def test_an_interrupt_during_start_up_replaces_an_earlier_report(tmp_path):
    """Before: exit 130 with no report; an earlier run's JSON (a PASS) was left at the --json path."""
    (tmp_path / "slow_to_start.py").write_text(SLOW_TO_START)
    (tmp_path / "v.json").write_text(json.dumps({"passed": True, "grade": "PASS"}))
    os.utime(tmp_path / "v.json", (0, 0))  # written by an earlier run
    status, out, err = _signal_at(_validate_one(tmp_path, "slow_to_start:kernel"), "gdn2-test: starting",
                                  signal.SIGINT)
    assert status == 130, out + err
    _interrupted_report(tmp_path, out)
    assert "nothing judged" in err, err


def test_an_interrupt_while_a_program_compiles_is_an_interrupted_run(tmp_path):
    """Before: exit 130, but the JSON's grade and the kernel's were PASS and the console read "PASS so far"."""
    status, out, err = _signal_at(_validate_one(tmp_path, "hanging_kernels:slow_to_trace"), "gdn2-test: tracing",
                                  signal.SIGINT)
    assert status == 130, out + err
    report = _interrupted_report(tmp_path, out)
    assert "INTERRUPTED (no case judged before the interrupt)" in out and not report["kernels"][0]["cases"], out


def test_an_interrupt_of_a_hung_torch_kernel_is_not_the_kernels_failure(tmp_path):
    """Before: the interrupt, raised in the kernel's host callback, was reported as the kernel's error
    (``KernelError: KeyboardInterrupt``): FAIL, exit 1, the JSON not marked interrupted."""
    status, out, err = _signal_at(_validate_one(tmp_path, "torch:hanging_kernels:torch_hangs[output_final_state=True]",
                                                "--case-timeout", "0"), "gdn2-test: hanging", signal.SIGINT)
    assert status == 130, out + err
    report = _interrupted_report(tmp_path, out)
    assert "FAIL" not in out and not report["kernels"][0]["cases"], out
