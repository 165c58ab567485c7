"""Kernel programs kept between runs: a kernel's exported forward-and-gradients program (``jax.export``), read back
instead of traced again while nothing that determines it has changed.

JAX's persistent compilation cache skips only the XLA compile; tracing and lowering the kernel come first, every
run, and in a warm ``validate`` they are most of the time. This cache keeps the program one step earlier: the
serialized ``jax.export.Exported`` of :func:`harness.runner` for one kernel and one signature (input shapes, dtype,
scale). A warm run deserializes it and lowers only a call to it (~0.1 s instead of seconds of tracing); the
compile then comes from the persistent compilation cache as before.

**What may be reused, and what is never trusted.** The key covers everything the program is a function of that we
can see: the kernel's identity (its factory's repr with its options, or its module and name) and the sha256 of the
sources of every module of its package it refers to (``fingerprint.source_sha256``), the harness's own source (the
VJP and the contract checks), the versions of JAX, jaxlib and every installed distribution (an upgraded dependency
is a new key), the backend and the signature. What it cannot see -- code outside the kernel's package changed in
place without a version change, a kernel reading files or the environment while traced -- is why the cache can be
turned off (``--no-program-cache``, env ``GDN2_PROGRAM_CACHE=off``). A kernel without a stable identity (an object
whose repr is its address), without source, or that cannot be exported (a host callback: torch kernels) is traced
every run. An entry is a payload and its sha256; one that fails the check or to deserialize is rebuilt.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import inspect
import json
import os
import tempfile
from pathlib import Path

ENV = "GDN2_PROGRAM_CACHE"
OFF = ("", "0", "off", "false", "no")
_HEADER = b"gdn2-oracle program 1\n"


def directory():
    """The cache directory: env ``GDN2_PROGRAM_CACHE`` (``off`` disables it), else
    ``$XDG_CACHE_HOME/gdn2-oracle/programs``; None when off."""
    value = os.environ.get(ENV)
    if value is not None:
        return None if value.strip().lower() in OFF else Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gdn2-oracle" / "programs"


def identity(fn):
    """A stable name for kernel ``fn`` with its options (None when it has none: a repr holding an address)."""
    if inspect.isfunction(fn) or inspect.isbuiltin(fn):
        return f"{fn.__module__}:{fn.__qualname__}"
    text = repr(fn)
    return None if " at 0x" in text or "object at" in text else f"{type(fn).__module__}.{type(fn).__qualname__}:{text}"


def _environment():
    """The versions and backend a program depends on beyond the kernel's own code."""
    import jax
    import jaxlib

    dists = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
                   if d.metadata["Name"])
    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "backend": jax.default_backend(),
            "device": jax.devices()[0].device_kind,
            "distributions": hashlib.sha256("\n".join(dists).encode()).hexdigest()}


_ENV = None


@functools.cache
def _source(fn):
    """The sha256 of the sources defining ``fn``, once a run (every program of a kernel is keyed by it)."""
    from .fingerprint import source_sha256

    return source_sha256(fn)["sha256"]


def key(fn, signature, harness_source):
    """The sha256 naming kernel ``fn``'s program for ``signature`` (JSON-ready parts), or None if ``fn`` cannot be
    named stably (it is then traced every run)."""
    global _ENV
    name, source = identity(fn), _source(fn)
    if name is None or source is None:
        return None
    if _ENV is None:
        _ENV = _environment()
    text = json.dumps({"kernel": name, "source": source, "harness": hashlib.sha256(harness_source.encode()).hexdigest(),
                       "environment": _ENV, "signature": signature}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def read(root: Path, name: str):
    """The serialized program stored under ``name``, or None (missing, damaged: its sha256 does not match)."""
    try:
        data = (root / f"{name}.exported").read_bytes()
    except OSError:
        return None
    head, _, rest = data.partition(b"\n")
    digest, payload = rest[:64], rest[64:]
    if head + b"\n" != _HEADER or hashlib.sha256(payload).hexdigest().encode() != digest:
        return None
    return payload


def write(root: Path, name: str, payload: bytes):
    """Store ``payload`` under ``name`` atomically (a temporary file, then a rename); an OSError is ignored (the
    program is then traced again next run)."""
    with contextlib.suppress(OSError):
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_HEADER + hashlib.sha256(payload).hexdigest().encode() + payload)
            os.replace(tmp, root / f"{name}.exported")
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def exported(fn, signature, harness_source, export):
    """``jax.export.Exported`` of kernel ``fn``'s program for ``signature``: read from the cache, or made by
    ``export()`` and stored; None when the cache is off, ``fn`` has no stable key, or it cannot be exported or
    serialized (the caller then traces it as usual)."""
    from jax import export as jax_export

    root = directory()
    name = None if root is None else key(fn, signature, harness_source)
    if name is None:
        return None
    payload = read(root, name)
    if payload is not None:
        try:
            return jax_export.deserialize(bytearray(payload))
        except Exception:  # noqa: BLE001 - a damaged or foreign entry is rebuilt below
            pass
    try:
        exp = export()
        payload = bytes(exp.serialize())
    except Exception:  # noqa: BLE001 - not exportable (e.g. a host callback): traced every run
        return None
    write(root, name, payload)
    return exp
