"""A kernel's fingerprint: the sha256 of the sources of the modules that define it (its package's modules it refers to).

Reports record it (``ci/commands/provenance.py``) and the program cache keys a kernel's compiled programs by it
(``ci/running/program_cache.py``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import sys


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
