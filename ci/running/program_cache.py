"""Kernel programs kept between runs: a kernel's exported forward-and-gradients program (``jax.export``), keyed by
the program itself, read back instead of lowered again.

JAX's persistent compilation cache skips only the XLA compile; tracing and lowering come first. This cache skips
the lowering of :func:`harness.runner`'s program: the serialized ``jax.export.Exported`` is stored under the
**content key** of what was traced this run, and a run that traces the same program deserializes it and lowers only
a call to it; the compile then comes from the persistent compilation cache as before.

**The key** (:func:`key`) is the sha256 of the traced program's canonical text (``program_key.py``: every equation,
parameter, nested jaxpr -- a Pallas kernel body, its index maps -- and the bytes of every constant and literal),
with the signature (input shapes, dtype, scale), the backend and device kind, the versions of JAX, jaxlib and every
installed distribution, every ``jax.config`` value that is not about caching or logging, the ``XLA_FLAGS`` and
``LIBTPU_INIT_ARGS`` environment and this entry format's version. Every run traces the kernel, so a name never
decides what runs: two kernels of one factory, a kernel behind a mapping or padding option, a peer with other
options, an edited file or helper module, an environment variable or file read while tracing -- each traces to its
own program and key; two different callables that trace to the same program share one entry, rightly.

**What it cannot see, and so never stores**: a program holding something whose content cannot be written down (a
host callback such as a torch kernel's, a Python object without readable state) is :class:`program_key.Unkeyable`
and is lowered every run; so is a program holding a primitive lowered by user code (a lowering rule registered
from a user's file, or a primitive defined in a user module: ``program_key.user_lowering``), since the key covers
the installed distributions' versions (JAX's own rules among them), never a user's file.

**An entry** is ``HEADER``, its key, the payload's sha256 and the payload. A read checks all three: a damaged,
truncated, swapped (another key's entry under this name) or older-format entry is ignored and rebuilt, so entries
written before the content key existed are never read. A program is stored only if the export traced the very
jaxpr that was keyed (JAX's trace cache returns the same object before and after it). A directory that cannot be
written warns once (:class:`ProgramCacheWarning`) and the run goes on lowering. ``--no-program-cache`` and env
``GDN2_PROGRAM_CACHE=off`` turn it off.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import importlib.metadata
import os
import tempfile
import warnings
from pathlib import Path

from . import program_key

ENV = "GDN2_PROGRAM_CACHE"
OFF = ("", "0", "off", "false", "no")
FORMAT = 2  # 1: keyed by the kernel's name and package sources (unsound; never read again)
HEADER = f"gdn2-oracle program {FORMAT}\n".encode()
# Environment variables that change a lowered or compiled program without changing the traced one.
ENV_FLAGS = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")
# jax.config options left out of the key: where caches live and what is logged change no program.
_CONFIG_IGNORED = ("cache", "log", "explain")


class ProgramCacheWarning(RuntimeWarning):
    """The program cache could not be written; programs are lowered again next run."""


_unwritable: set = set()  # directories that failed a write in this process (warned once)
# This process's counts: programs read back, stored, not keyable (lowered every run), not exportable or stored.
STATS = collections.Counter()


def directory():
    """The cache directory: env ``GDN2_PROGRAM_CACHE`` (``off`` disables it), else
    ``$XDG_CACHE_HOME/gdn2-oracle/programs``; None when off."""
    value = os.environ.get(ENV)
    if value is not None:
        return None if value.strip().lower() in OFF else Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gdn2-oracle" / "programs"


def environment():
    """What a program depends on beyond its jaxpr: versions, backend, device, ``jax.config`` and flag variables."""
    import jax
    import jaxlib

    config = {k: repr(v) for k, v in sorted(jax.config.values.items())
              if not any(word in k for word in _CONFIG_IGNORED)}
    return {"format": FORMAT, "jax": jax.__version__, "jaxlib": jaxlib.__version__, "backend": jax.default_backend(),
            "device": jax.devices()[0].device_kind,
            "distributions": _distributions(),
            "config": config, "env": {name: os.environ.get(name) for name in ENV_FLAGS}}


@functools.cache
def _distributions():
    """sha256 over every installed distribution's name and version (an upgrade is a new key), once a process."""
    dists = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
                   if d.metadata["Name"])
    return hashlib.sha256("\n".join(dists).encode()).hexdigest()


def key(closed_jaxpr, signature):
    """The sha256 naming the program ``closed_jaxpr`` traced for ``signature`` (JSON-ready) in this environment;
    raises :class:`program_key.Unkeyable` for a program whose content cannot be written down."""
    return program_key.sha256(closed_jaxpr, signature, environment())


def read(root: Path, name: str):
    """The serialized program stored under key ``name``, or None (missing, damaged, another key's, older format)."""
    try:
        data = (root / f"{name}.exported").read_bytes()
    except OSError:
        return None
    n = len(HEADER)
    stored, digest, payload = data[n:n + 64], data[n + 64:n + 128], data[n + 128:]
    if (data[:n] != HEADER or stored != name.encode()
            or hashlib.sha256(payload).hexdigest().encode() != digest):
        return None
    return payload


def write(root: Path, name: str, payload: bytes):
    """Store ``payload`` under key ``name`` atomically (a temporary file, then a rename); an OSError warns once
    per directory (:class:`ProgramCacheWarning`) and the program is lowered again next run."""
    if root in _unwritable:
        return
    tmp = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{name[:16]}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(HEADER + name.encode() + hashlib.sha256(payload).hexdigest().encode() + payload)
        os.replace(tmp, root / f"{name}.exported")
        tmp = None
    except OSError as exc:
        _unwritable.add(root)
        warnings.warn(ProgramCacheWarning(f"program cache {root}: cannot write ({type(exc).__name__}: {exc}); "
                                          f"programs are lowered again next run (env {ENV}=off turns it off)"),
                      stacklevel=2)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def exported(traced, signature, export, retrace):
    """``jax.export.Exported`` of the program ``traced`` (a ``jax.stages.Traced``) for ``signature``: read from the
    cache under its content key, or made by ``export()`` and stored; None when the cache is off, the program is
    unkeyable, or it cannot be exported or serialized (the caller then lowers ``traced`` as usual).
    ``retrace()``: the same trace again; a program is stored only if it returns the keyed jaxpr itself (so the
    export serialized exactly what was keyed)."""
    from jax import export as jax_export

    root = directory()
    if root is None:
        return None
    try:
        name = key(traced.jaxpr, signature)
    except program_key.Unkeyable:
        STATS["unkeyable"] += 1
        return None
    except Exception as exc:  # noqa: BLE001 - the key is the suite's own work on a traced program: never the kernel's
        STATS["unkeyable"] += 1  # fault; a program that cannot be keyed is lowered as usual, never stored
        warnings.warn(ProgramCacheWarning(f"program cache: the program's key could not be formed ({type(exc).__name__}:"
                                          f" {exc}); it is lowered this run and not stored"), stacklevel=2)
        return None
    payload = read(root, name)
    if payload is not None:
        try:
            exp = jax_export.deserialize(bytearray(payload))
            STATS["read"] += 1
            return exp
        except Exception:  # noqa: BLE001 - a damaged or foreign entry is rebuilt below
            pass
    try:
        exp = export()
        payload = bytes(exp.serialize())
    except Exception:  # noqa: BLE001 - not exportable (e.g. a host callback): lowered every run
        STATS["not_exported"] += 1
        return None
    if retrace().jaxpr is not traced.jaxpr:
        STATS["not_exported"] += 1
        return None  # the export traced again and may have seen another program: lower what was keyed
    write(root, name, payload)
    STATS["stored"] += 1
    return exp
