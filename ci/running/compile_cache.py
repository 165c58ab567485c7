"""JAX's persistent compilation cache for the CLI and the conformance suite: a second run reuses compiled programs.

The directory is env ``GDN2_COMPILE_CACHE`` if set (``off`` disables it), else JAX's ``JAX_COMPILATION_CACHE_DIR``,
else ``$XDG_CACHE_HOME/gdn2-oracle/jax`` (default ``~/.cache/gdn2-oracle/jax``); ``--no-compile-cache`` turns it off.
A program is kept when it compiled in at least ``GDN2_COMPILE_CACHE_MIN_SECONDS`` (default 0.2 s).
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "GDN2_COMPILE_CACHE"
JAX_ENV = "JAX_COMPILATION_CACHE_DIR"  # honoured when GDN2_COMPILE_CACHE is not set
OFF = ("", "0", "off", "false", "no")
# Programs that compile faster than this are not worth a disk entry (JAX's own default is 1 s).
MIN_COMPILE_SECONDS = 0.2
MIN_ENV = "GDN2_COMPILE_CACHE_MIN_SECONDS"  # overrides it (a test that must see an entry sets 0)


def min_compile_seconds():
    """The least compile time of a kept program: env ``GDN2_COMPILE_CACHE_MIN_SECONDS``, else
    :data:`MIN_COMPILE_SECONDS`; ValueError naming the variable for a value that is not a number >= 0."""
    value = os.environ.get(MIN_ENV, "").strip()
    if not value:
        return MIN_COMPILE_SECONDS
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ValueError(f"{MIN_ENV}: expected a number of seconds >= 0, got {value!r}")
    return seconds


def cache_dir():
    """The cache directory in force: env GDN2_COMPILE_CACHE (``off`` disables it), else JAX's own env
    JAX_COMPILATION_CACHE_DIR, else ``$XDG_CACHE_HOME/gdn2-oracle/jax``."""
    value = os.environ.get(ENV)
    if value is not None:
        return None if value.strip().lower() in OFF else Path(value).expanduser()
    if os.environ.get(JAX_ENV, "").strip():
        return Path(os.environ[JAX_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gdn2-oracle" / "jax"


def enable(directory=None):
    """Point JAX's persistent compilation cache at ``directory`` (default :func:`cache_dir`); return it or None."""
    directory = cache_dir() if directory is None else Path(directory)
    if directory is None:
        return None
    import jax  # only commands that compile import JAX

    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_seconds())
    return directory


def settings():
    """JAX's cache settings in force: ``(directory or None, minimum compile seconds)``, for :func:`restore`."""
    import jax

    return jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs


def restore(previous):
    """Put back the cache settings :func:`settings` returned (an in-process run leaves JAX as it found it)."""
    import jax

    jax.config.update("jax_compilation_cache_dir", previous[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", previous[1])
