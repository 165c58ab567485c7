"""JAX's persistent compilation cache for the CLI (ci/running/compile_cache.py): on by default, off by flag or env."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gdn2_oracle.ci.running import compile_cache

CLI = str(Path(sys.executable).with_name("gdn2-oracle"))
CASE = ["validate", "--kernel", "pairwise[chunk_size=16]", "--cases", "quick", "--case", "len_c16_plus1",
        "--dtype", "float32", "--no-progress"]


def _cli(cwd, env_cache, *argv):
    # MIN_ENV 0: the case's programs compile in about the 0.2 s threshold, so a fast host would keep none of them
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GDN2_"))},
           compile_cache.ENV: str(env_cache), compile_cache.MIN_ENV: "0"}
    done = subprocess.run([CLI, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize(("value", "expected"), [("off", None), ("OFF", None), ("/x/y", Path("/x/y"))])
def test_env_chooses_or_disables_the_directory(monkeypatch, value, expected):
    monkeypatch.setenv(compile_cache.ENV, value)
    assert compile_cache.cache_dir() == expected


def test_default_directory_is_under_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    monkeypatch.delenv(compile_cache.JAX_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache.cache_dir() == tmp_path / "gdn2-oracle" / "jax"


@pytest.mark.slow
def test_validate_fills_the_cache_unless_told_not_to(tmp_path):
    off, on = tmp_path / "off", tmp_path / "on"
    code, out = _cli(tmp_path, off, "--no-compile-cache", *CASE)
    assert code == 0, out
    assert not off.exists() or not any(off.iterdir())
    code, out = _cli(tmp_path, on, *CASE)
    assert code == 0, out
    assert any(on.iterdir()), "no compiled program was written to the cache"


def test_jax_own_cache_variable_is_honoured(monkeypatch, tmp_path):
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
    assert compile_cache.cache_dir() == tmp_path / "jax"
    monkeypatch.setenv(compile_cache.ENV, "off")  # ours wins
    assert compile_cache.cache_dir() is None


def test_restore_puts_back_the_settings_enable_changed(tmp_path):
    before = compile_cache.settings()
    try:
        assert compile_cache.enable(tmp_path) == tmp_path
        assert compile_cache.settings() == (str(tmp_path), compile_cache.MIN_COMPILE_SECONDS)
    finally:
        compile_cache.restore(before)
    assert compile_cache.settings() == before
