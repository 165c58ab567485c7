"""The compilation cache the commands a test starts share (ci.testing.console_env, the Makefile's
GDN2_TEST_COMPILE_CACHE): compiled programs only; the judge's own caches of each run stay fresh."""

from __future__ import annotations

import re
from pathlib import Path

from gdn2_oracle.ci import testing
from gdn2_oracle.ci.running import compile_cache

ROOT = Path(__file__).resolve().parents[2]


def test_console_runs_share_the_sessions_compile_cache_and_nothing_else(monkeypatch, tmp_path):
    shared = tmp_path / "shared-jax"
    monkeypatch.setenv(testing.SHARED_COMPILE_CACHE, str(shared))
    monkeypatch.setenv("GDN2_COMPILE_CACHE", "off")  # the test process's own setting never reaches a command
    env = testing.console_env(tmp_path / "run")
    assert env["GDN2_COMPILE_CACHE"] == str(shared)
    assert env["GDN2_REFERENCE_CACHE"] == str(tmp_path / "run" / "references")
    assert env["GDN2_PROGRAM_CACHE"] == str(tmp_path / "run" / "programs")
    assert testing.SHARED_COMPILE_CACHE not in env  # a GDN2_ variable of the session: dropped
    assert testing.console_env(tmp_path, GDN2_COMPILE_CACHE="off")["GDN2_COMPILE_CACHE"] == "off"  # extra wins


def test_without_a_shared_folder_each_console_run_compiles_cold(monkeypatch, tmp_path):
    monkeypatch.delenv(testing.SHARED_COMPILE_CACHE, raising=False)
    assert testing.shared_compile_cache() is None
    assert testing.console_env(tmp_path)["GDN2_COMPILE_CACHE"] == str(tmp_path / "compiled")
    monkeypatch.setenv(testing.SHARED_COMPILE_CACHE, " ")
    assert testing.shared_compile_cache() is None


def test_make_test_shares_the_folder_the_plugins_pytest_runs_use(monkeypatch):
    """The plugin's pytest runs (ci.testing.pytest_run) drop GDN2_ variables and so compile into
    $XDG_CACHE_HOME/gdn2-oracle/jax: the Makefile names that folder for the console runs, one folder for both."""
    makefile = (ROOT / "Makefile").read_text()
    [xdg] = re.findall(r"PYTEST := XDG_CACHE_HOME=(\S+)", makefile)
    [shared] = re.findall(rf"{testing.SHARED_COMPILE_CACHE}=(\S+)", makefile)
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    monkeypatch.delenv(compile_cache.JAX_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    assert str(compile_cache.cache_dir()) == shared
