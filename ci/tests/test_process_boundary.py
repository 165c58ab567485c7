"""The process boundary, through the installed ``gdn2-oracle`` console script in subprocesses, cold: every run ends
in its own verdict (docs/commands.md, "Runs that did not finish").

* cold runs, with the compile-ahead threads and torch's callbacks running, end in a verdict table (before: half of
  them died of ``SystemError: AST constructor recursion depth mismatch``, python/cpython#106905);
* a kernel that ends the process where Python cannot see it (a C library's ``_exit(0)``, a segfault) is a FAIL with
  one line naming it, exit 1, and the ``--json`` report marked ``crashed`` (before: exit 0, and an earlier run's PASS
  left in the file);
* a kernel raising a ``BaseException`` of its own, or calling ``os._exit``, is that kernel's error, with the table
  and the report, in ``validate`` and in the conformance suite under pytest;
* Ctrl-C / SIGTERM at any moment from the first line of ``main``: 130 / 143, one line, no traceback.
"""

from __future__ import annotations

import ast
import json
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from gdn2_oracle.ci.grading import reference_cache
from gdn2_oracle.ci.running import ast_guard
from gdn2_oracle.ci.testing import CONSOLE_SCRIPT, console, console_env, pytest_run

KERNELS = '''
import os
import signal


def ends_the_process(q, k, v, g, b, w, *, scale=None, initial_state=None):
    os._exit(0)  # as some libraries do on an error path


def exits_in_c(q, k, v, g, b, w, *, scale=None, initial_state=None):
    import ctypes

    ctypes.CDLL(None)._exit(0)  # a C library ending the process: nothing in Python sees it


def segfaults(q, k, v, g, b, w, *, scale=None, initial_state=None):
    import ctypes

    ctypes.string_at(0)


class OwnStop(BaseException):
    """A kernel library's own control-flow exception, not an Exception."""


def raises_its_own(q, k, v, g, b, w, *, scale=None, initial_state=None):
    raise OwnStop("stop from inside the kernel")


def gdn_raises_its_own(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                       use_gate_in_kernel=False, A_log=None, dt_bias=None):
    raise OwnStop("stop from inside the family kernel")
'''


# --- one ast.parse at a time --------------------------------------------------------------------------------------

def test_the_reference_key_reads_imports_without_building_an_ast(monkeypatch):
    """The import walk behind the reference cache's key reads bytecode: it cannot meet CPython's AST race at all.
    Its closure is the one an ``ast`` walk of the same files finds."""
    expected = dict(reference_cache.source_closure())

    def refuse(*args, **kwargs):
        raise AssertionError("ast.parse called by the import walk")

    with monkeypatch.context() as m:
        m.setattr(ast, "parse", refuse)
        try:
            walked = reference_cache.source_closure()
        except AssertionError as exc:
            walked = exc
    assert walked == expected
    names = set()  # the same closure read with ast: every module the walk found imports only modules it found
    for path in expected.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("gdn2_oracle."):
                names.add(node.module.removeprefix("gdn2_oracle."))
    root = reference_cache._package_root()
    assert {n for n in names if reference_cache._file_of(root, n) is not None} <= set(expected), names - set(expected)


def test_the_guard_lets_one_parse_run_at_a_time(monkeypatch):
    """Under :func:`ast_guard.install`, threads parsing at once take turns (the AST constructor's counter is shared)."""
    inside, most = [0], [0]
    lock = threading.Lock()

    def slow_parse(*args, **kwargs):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.02)  # a parse long enough for the threads to overlap without the guard
        with lock:
            inside[0] -= 1
        return ast.Module(body=[], type_ignores=[])

    monkeypatch.setattr(ast, "parse", slow_parse)
    ast_guard.install()
    assert ast.parse is not slow_parse and ast_guard.install() is ast.parse  # installed once
    threads = [threading.Thread(target=lambda: [ast.parse("x") for _ in range(5)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1, f"{most[0]} parses ran at once"


# --- cold runs of the real console script -------------------------------------------------------------------------

# A kernel module whose import starts a thread that keeps parsing source, as a library's background thread may: with
# the compile-ahead threads' own parses it makes CPython's AST race (python/cpython#106905) likely in every run.
PARSING_THREAD = """
import ast, gc, inspect, threading, time
from gdn2_oracle import kernels

kernel = kernels.get("pairwise")
SOURCE = inspect.getsource(inspect)


def _parse_forever():
    while True:
        try:
            ast.parse(SOURCE)
        except SystemError:  # the race, in this thread: a library would retry or log it
            pass
        time.sleep(0.001)


gc.callbacks.append(lambda phase, info: time.sleep(0))  # a thread switch inside a parse, as JAX's gc callback allows
threading.Thread(target=_parse_forever, daemon=True).start()
"""
COLD = [
    ("pairwise", ["--kernel", "pairwise", "--cases", "smoke"]),
    ("torch", ["--kernel", "torch:gdn2_oracle.kernels.testing_torch:recurrent[output_final_state=True]",
               "--cases", "golden"]),
    ("parsing-thread", ["--kernel", "parsing_thread:kernel", "--cases", "smoke"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("name, argv", COLD, ids=[c[0] for c in COLD])
def test_cold_runs_of_the_console_script_end_in_a_verdict(tmp_path, name, argv):
    """Three cold runs in a row, each with fresh cache folders, JAX's compilation cache too (the fingerprint of the
    oracle's sources is computed while the compile threads trace), each ends in its verdict table and its JSON.
    Before: 2 of 4 pairwise runs and 3 of 3 torch runs died of ``SystemError: AST constructor recursion depth
    mismatch`` (exit 1 or 134), and 2 of 3 with a parsing thread."""
    (tmp_path / "parsing_thread.py").write_text(PARSING_THREAD)
    for i in range(3):
        run_dir = tmp_path / f"run{i}"
        run_dir.mkdir()
        proc = console(run_dir, "validate", *argv, "--dtype", "float32", "--no-progress", "--json", "r.json",
                       PYTHONPATH=str(tmp_path), GDN2_COMPILE_CACHE=str(run_dir / "jax"))  # not make test's shared one
        assert proc.returncode == 0, f"run {i}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        assert "overall: PASS" in proc.stdout and "Traceback" not in proc.stderr, proc.stderr
        assert json.loads((run_dir / "r.json").read_text())["passed"] is True


# --- a kernel that ends the process -------------------------------------------------------------------------------

@pytest.mark.parametrize("kernel, how", [("exits_in_c", "exited with status 0"),
                                         ("segfaults", "was killed by SIGSEGV")])
def test_a_kernel_that_ends_the_process_is_a_fail_and_leaves_no_pass_behind(tmp_path, kernel, how):
    """Before: a kernel ending the process with status 0 ended ``validate`` with exit 0, no verdict, and an earlier
    run's PASS left in the ``--json`` file."""
    (tmp_path / "enders.py").write_text(KERNELS)
    (tmp_path / "r.json").write_text(json.dumps({"passed": True, "grade": "PASS", "outcome": "pass"}))
    proc = console(tmp_path, "validate", "--kernel", f"enders:{kernel}", "--case", "kv_32x8", "--dtype", "float32",
                   "--no-progress", "--json", "r.json", PYTHONPATH=str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("gdn2-oracle:")]
    assert len(lines) == 1 and "ended without a verdict" in lines[0] and how in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["passed"] is False and report["outcome"] == "crashed" and report["grade"] == "FAIL", report


@pytest.mark.parametrize("kernel, case, error", [
    ("raises_its_own", "kv_32x8", "enders.OwnStop"),
    ("gdn_raises_its_own[family=gdn]", "gdn_gate_softplus", "enders.OwnStop"),
    ("ends_the_process", "kv_32x8", "the kernel called os._exit(0)"),
])
def test_a_kernel_raising_its_own_base_exception_fails_its_case_with_the_table(tmp_path, kernel, case, error):
    """Before: a traceback, no table, no JSON (a dense case, and a family call through the training-call runner);
    ``os._exit(0)`` in the kernel ended the run with exit 0. Now each is the kernel's error, graded; the run goes on."""
    (tmp_path / "enders.py").write_text(KERNELS)
    proc = console(tmp_path, "validate", "--kernel", f"enders:{kernel}", "--case", case, "--dtype",
                   "float32", "--no-progress", "--json", "r.json", PYTHONPATH=str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert error in proc.stdout and "overall: FAIL" in proc.stdout and "Traceback" not in proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["outcome"] == "fail" and error.split(".")[-1] in report["kernels"][0]["cases"][0]["error"]


def test_a_kernel_calling_os_exit_fails_the_conformance_suite_instead_of_ending_it_with_0(tmp_path):
    """pytest has no supervising parent: before, ``os._exit(0)`` in a kernel ended a run of the conformance suite with
    exit 0 and no summary -- a CI gate read a pass."""
    (tmp_path / "enders.py").write_text(KERNELS)
    code, out = pytest_run(tmp_path, "--pyargs", "gdn2_oracle.property_tests.test_conformance", "--gdn2-kernel",
                           "enders:ends_the_process", "--gdn2-profile", "dev", "-k", "test_matches_oracle", "-q",
                           "-x", env={"PYTHONPATH": str(tmp_path)})
    assert code == 1 and "failed" in out and "the kernel called os._exit(0)" in out, out


# --- signals at any moment ----------------------------------------------------------------------------------------

DELAYS = (0.0, 0.3, 0.6, 0.9, 1.2, 1.5, 2.0, 3.0, 4.5)  # seconds after the console script's handlers are in place


def handling(pid, sig, timeout=60):
    """Wait until process ``pid`` catches ``sig`` (its handler installed: the first line of ``main`` has run), read
    from the caught-signal mask of /proc/PID/status."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            caught = int(next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                              if line.startswith("SigCgt:")).split()[1], 16)
        except (OSError, StopIteration):
            caught = 0
        if caught >> (sig - 1) & 1:
            return
        time.sleep(0.002)
    pytest.fail(f"process {pid} never installed a handler for {signal.Signals(sig).name}")


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_an_early_signal_at_any_moment_gives_one_line_and_its_status(tmp_path, sig, code):
    """A signal 0-4.5 s after the console script's first line of ``main`` (imports, JAX starting, the first kernel
    compiling): exit 130 / 143, one line, no traceback, no abort, and the ``--json`` file marked interrupted; the
    handlers are in place before NumPy, JAX or torch load. Before: NumPy and the oracle loaded first, and
    a KeyboardInterrupt traceback (0.3-0.8 s), ``terminate called after throwing an instance of
    'nanobind::python_error'`` (exit 134, ~1 s), a segfault (exit 139, 1.2-1.4 s)."""
    failures = []
    for delay in DELAYS:
        run_dir = tmp_path / f"at{delay}"
        run_dir.mkdir()
        (run_dir / "r.json").write_text(json.dumps({"passed": True, "grade": "PASS"}))
        # the quick set: a run that cannot end within the 4.5 s (the smoke set once did, its programs in the shared
        # compilation cache: exit 0, the signal too late)
        proc = subprocess.Popen([str(CONSOLE_SCRIPT), "validate", "--kernel", "pairwise", "--cases", "quick", "--dtype",
                                 "float32", "--no-progress", "--json", "r.json"], cwd=run_dir, env=console_env(run_dir),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        handling(proc.pid, signal.SIGTERM)  # main's first lines ran (Python itself catches SIGINT from the start)
        heavy = [lib for lib in ("_multiarray_umath", "jaxlib", "libtorch") if lib in Path(f"/proc/{proc.pid}/maps")
                 .read_text()]
        if heavy:
            failures.append(f"at {delay} s: {heavy} loaded before the signal handlers: a signal then is a traceback")
        time.sleep(delay)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=300)
        # JAX's warning that an entry of the shared compilation cache could not be read (written by an earlier
        # test's command that a signal ended mid-write; JAX compiles the program instead) is not this command's
        own = re.sub(r".*UserWarning: Error reading persistent compilation cache entry.*\n\s*warnings\.warn\(\n", "",
                     err)
        said = [line for line in own.splitlines() if line.strip()]
        report = json.loads((run_dir / "r.json").read_text())
        if (proc.returncode != code or "Traceback" in err or "terminate called" in err or len(said) != 1
                or report.get("passed") is not False or report.get("outcome") != "interrupted"):
            failures.append(f"at {delay} s: exit {proc.returncode}, report {report.get('outcome')}, stderr {err!r}")
    assert not failures, "\n".join(failures)


OTHER_COMMANDS = {
    "bench": ["bench", "--batch", "1", "--seq", "32", "--heads", "2", "--dim", "16", "--repeats", "1"],
    "domain": ["domain", "--out", "d"],
    "hunt": ["hunt", "--seed", "3", "--budget", "5"],
}


@pytest.mark.parametrize("command", sorted(OTHER_COMMANDS))
def test_bench_domain_and_hunt_never_exit_0_for_a_kernel_that_ends_the_process(tmp_path, command):
    """The same parent and the same guard serve every command: a C-level exit(0) is a crashed run (exit 1, one line),
    ``os._exit(0)`` a kernel error (exit 1, the command's own report). Before: both exit 0."""
    (tmp_path / "enders.py").write_text(KERNELS)
    name, *rest = OTHER_COMMANDS[command]
    crashed = console(tmp_path, name, "--kernel", "enders:exits_in_c", *rest, "--no-progress",
                      PYTHONPATH=str(tmp_path))
    assert crashed.returncode == 1, crashed.stdout + crashed.stderr
    assert "the run ended without a verdict: the process exited with status 0" in crashed.stderr, crashed.stderr
    graded = console(tmp_path, name, "--kernel", "enders:ends_the_process", *rest, "--no-progress",
                     PYTHONPATH=str(tmp_path))
    assert graded.returncode == 1, graded.stdout + graded.stderr
    assert "ended without a verdict" not in graded.stderr and "Traceback" not in graded.stderr, graded.stderr
    said = graded.stdout + graded.stderr + ((tmp_path / "d" / "domain.json").read_text() if name == "domain" else "")
    assert "the kernel called os._exit(0)" in said, said
