"""Provenance recorded in every report: the kernel's source hash, the checkout's commit, the device and versions."""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import platform
import subprocess
import sys
import time
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parents[2]


def kernel_notes(fn):
    """Notes a kernel declares about itself (e.g. a peer's documented domain)."""
    note = getattr(fn, "note", None) or getattr(getattr(fn, "func", None), "note", None)
    return [note] if note else []


def _root_object(fn):
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def _module_of(obj):
    mod = inspect.getmodule(obj)
    if mod is None and not inspect.isfunction(obj) and not inspect.isclass(obj):
        mod = sys.modules.get(type(obj).__module__)
    return mod


def _package_of(module_name):
    """The package a module's kernel code belongs to: its top-level package, or for ours the
    subpackage (``gdn2_oracle.kernels``), so a kernel's hash never covers the oracle or the CLI."""
    parts = module_name.split(".")
    return ".".join(parts[:2]) if parts[0] == "gdn2_oracle" else parts[0]


def kernel_modules(fn):
    """The modules whose source defines kernel ``fn``: its module and, recursively, the modules of
    the same top-level package it refers to (or ``fn.modules`` when the kernel lists them)."""
    listed = getattr(fn, "modules", None)
    if listed:
        return [importlib.import_module(m) for m in listed]
    start = _module_of(_root_object(fn))
    if start is None:
        return []
    top = _package_of(start.__name__)
    seen, todo = {}, [start]
    while todo:
        mod = todo.pop()
        if mod.__name__ in seen:
            continue
        seen[mod.__name__] = mod
        if top in ("__main__",):
            continue
        for value in list(vars(mod).values()):
            if inspect.ismodule(value):
                dep = value
            else:
                name = getattr(value, "__module__", None)
                if not isinstance(name, str):
                    continue
                dep = sys.modules.get(name)
            if dep is not None and _package_of(dep.__name__) == top and dep.__name__ not in seen:
                todo.append(dep)
    return [seen[n] for n in sorted(seen)]


def source_sha256(fn):
    """``{"sha256": hex over all modules' sources, "modules": {module: sha256}}`` for kernel ``fn``."""
    per, total = {}, hashlib.sha256()
    for mod in kernel_modules(fn):
        try:
            src = inspect.getsource(mod)
        except (OSError, TypeError):
            src = ""
        h = hashlib.sha256(src.encode("utf-8")).hexdigest()
        per[mod.__name__] = h
        total.update(f"{mod.__name__}\0{h}\n".encode())
    return {"sha256": total.hexdigest() if per else None, "modules": per}


def git_commit():
    """``{"commit": sha or None, "dirty": bool or None}`` of the checkout holding this package."""
    def run(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    try:
        head = run("rev-parse", "HEAD")
        if head.returncode:
            return {"commit": None, "dirty": None}
        dirty = run("status", "--porcelain", "--untracked-files=no")
        return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def environment():
    """Device and software provenance recorded in every report."""
    dev = jax.devices()[0]
    try:
        import jaxlib
        jaxlib_version = jaxlib.__version__
    except Exception:  # noqa: BLE001
        jaxlib_version = None
    return {
        "device_kind": dev.device_kind,
        "platform": dev.platform,
        "device_count": jax.device_count(),
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib_version,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "git": git_commit(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


