"""Support for the suite's own tests (not for users): the ``cli`` fixture, the installed console script in a
subprocess (``console``), pytest in a subprocess, and one ``assert_matches_oracle`` whose references are cached by
recipe."""

from __future__ import annotations

import fcntl
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gdn2_oracle.kernels.triton_interpret import ENV as INTERPRET_ENV
from gdn2_oracle.oracle import Recipe

from .cli import main
from .grading.case import Case
from .grading.tolerance import Report
from .running import harness


@pytest.fixture
def cli(capsys):
    """``cli(*argv) -> (exit status, stdout, stderr)`` of ``gdn2-oracle ARGV`` run in this process."""
    def run(*argv):
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err
    return run


# The console script of the environment under test, and the variables of this session that never reach it
# (TRITON_INTERPRET: a test that ran an interpreted kernel in this process set it, and it cannot be unset there).
CONSOLE_SCRIPT = Path(sys.executable).with_name("gdn2-oracle")
DROPPED = ("GDN2_", "PYTEST_", "JAX_", "XLA_", INTERPRET_ENV)


SHARED_COMPILE_CACHE = "GDN2_TEST_COMPILE_CACHE"  # make test: one folder for the commands the tests start


def shared_compile_cache():
    """The JAX compilation cache folder the commands of this session share (env ``GDN2_TEST_COMPILE_CACHE``, which
    ``make test`` sets), or None (unset or empty). A compiled program never changes a verdict, and a command whose
    programs another command already compiled runs 3-5x faster (Makefile)."""
    value = os.environ.get(SHARED_COMPILE_CACHE, "").strip()
    return Path(value) if value else None


def console_env(tmp_path, **extra):
    """The environment of a cold console-script run: every cache folder of the judge (references, programs) fresh
    under ``tmp_path``, none of this session's settings (:data:`DROPPED`), plus ``extra`` (which may name a cache
    folder in place of a fresh one). JAX's compilation cache is the session's shared folder where it names one
    (:func:`shared_compile_cache`), else fresh too."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROPPED)}
    env.update(PYTHONDONTWRITEBYTECODE="1", XDG_CACHE_HOME=str(tmp_path / "xdg"),
               GDN2_REFERENCE_CACHE=str(tmp_path / "references"), GDN2_PROGRAM_CACHE=str(tmp_path / "programs"),
               GDN2_COMPILE_CACHE=str(shared_compile_cache() or tmp_path / "compiled"))
    return {**env, **extra}


def console(tmp_path, *argv, timeout=600, **env):
    """``gdn2-oracle ARGV`` run cold (:func:`console_env`) from ``tmp_path`` as a user runs it: the installed console
    script in a subprocess. Returns the ``CompletedProcess`` (text output); ``env``: extra variables."""
    assert CONSOLE_SCRIPT.is_file(), f"no console script at {CONSOLE_SCRIPT}: the package is not installed here"
    return subprocess.run([str(CONSOLE_SCRIPT), *map(str, argv)], cwd=tmp_path, env=console_env(tmp_path, **env),
                          capture_output=True, text=True, timeout=timeout)


def pytest_run(cwd, *args, timeout=600, env=None):
    """``(exit code, stdout + stderr)`` of ``pytest ARGS`` run from ``cwd`` in a fresh interpreter, without this
    session's ``PYTEST_*``, ``GDN2_*`` and ``TRITON_INTERPRET`` environment (as a kernel author runs it from their
    repository) but its ``GDN2_REFERENCE_CACHE`` (where a cache may be written), plus ``env``."""
    env = {**{k: v for k, v in os.environ.items()
              if not k.startswith(("PYTEST_", "GDN2_", INTERPRET_ENV)) or k == "GDN2_REFERENCE_CACHE"}, **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def once_per_run(tmp_path_factory, name, compute):
    """``(compute(folder), folder)``: work done once per pytest run however xdist deals out the tests that use it (a
    module's tests may go to both workers, and each would build its module fixtures). The first worker to get here
    runs ``compute`` (its JSON result and any files it writes in ``folder``) under a lock in the run's shared
    temporary folder; the others wait for it and read what it left. A ``compute`` that failed left nothing: the next
    one tries again."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder: its workers' base folders are in it
    folder, lock = root / f"once-{name}", root / f"once-{name}.lock"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        done = folder / "result.json"
        if done.is_file():
            return json.loads(done.read_text(encoding="utf-8")), folder
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        result = compute(folder)
        done.write_text(json.dumps(result), encoding="utf-8")
        return result, folder


def without_interpreter_env():
    """This process's environment without ``TRITON_INTERPRET``, for a Python process a test starts that must set
    Triton's interpreter up itself (an earlier test of this worker may have set it for good)."""
    return {k: v for k, v in os.environ.items() if k != INTERPRET_ENV}


def interpreted_script(script, spec, timeout):
    """The JSON a script prints on its ``RESULT`` line, the script run as ``python -c SCRIPT SPEC`` (``spec`` as
    JSON) in a fresh interpreter without ``TRITON_INTERPRET`` (a kernel factory must set Triton's interpreter up
    itself, before Triton is imported). A failed run fails the caller with its output."""
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(spec)], capture_output=True, text=True,
                          env=without_interpreter_env(), timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@functools.cache
def oracle_case(recipe: Recipe) -> Case:
    """The :class:`Case` of a recipe, its reference and baselines computed once per test process."""
    return Case.from_recipe("test", recipe)


def assert_matches_oracle(kernel, recipe: Recipe, dtype=None) -> Report:
    """Run ``kernel`` on ``recipe`` (in ``dtype``, default the recipe's precision) and assert it passes the
    tolerance model against the float64 oracle; the report on failure, the report when it passes."""
    case = oracle_case(recipe if dtype is None else recipe.replace(precision=dtype))
    problem, do, dfs = case.data()
    harness.check_representable(problem, case.dtype)
    report = case.judge(harness.kernel_results(kernel, problem, do, dfs, dtype=case.dtype))
    assert report.passed, f"{kernel!r} on {recipe!r}:\n{report.format()}"
    return report


def children(pid):
    """The pids of the living child processes of ``pid`` (from /proc; [] where there is no /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def alive(pid):
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def interrupt_after(argv, ready, *, sig=signal.SIGINT, timeout=120, cwd=None):
    """Run ``python -m argv`` (from ``cwd``: its modules importable); once a stderr line contains ``ready``, send
    ``sig``. Returns ``(returncode, stdout, stderr, child pids it had when signalled)``."""
    proc = subprocess.Popen([sys.executable, "-m", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=cwd)
    lines, kids, deadline = [], [], time.monotonic() + timeout
    try:
        for line in proc.stderr:
            lines.append(line)
            if ready in line:
                kids = children(proc.pid)
                proc.send_signal(sig)
                break
            assert time.monotonic() < deadline, "".join(lines)
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, "".join(lines) + err, kids


def corpus_copy(tmp_path, names=(), drop_entries=()):
    """A temporary golden root: the real manifest (minus ``drop_entries``) and the data files of ``names``."""
    import importlib
    import shutil

    from gdn2_oracle import golden
    from gdn2_oracle.golden import regenerate

    load = importlib.import_module("gdn2_oracle.golden.load")  # the module (golden.load is the function)

    root = tmp_path / "golden"
    (root / "data").mkdir(parents=True)
    manifest = golden.read_manifest()
    for n in drop_entries:
        del manifest["cases"][n]
    (root / "MANIFEST.json").write_text(regenerate.manifest_text(manifest), encoding="utf-8")
    for n in names:
        shutil.copy(load.DATA_DIR / f"{n}.npz", root / "data" / f"{n}.npz")
    return root


DAMAGES = ("flip", "truncate", "missing")


def damage(path, how):
    """Damage the file at ``path`` as a disk or a copy might: ``flip`` one bit in its middle, ``truncate`` its
    last 100 bytes, or make it ``missing``."""
    if how == "missing":
        Path(path).unlink()
        return
    data = bytearray(Path(path).read_bytes())
    if how == "flip":
        data[len(data) // 2] ^= 0x01
    elif how == "truncate":
        del data[len(data) - 100:]
    else:
        raise ValueError(f"how: {how!r} not one of {DAMAGES}")
    Path(path).write_bytes(bytes(data))

