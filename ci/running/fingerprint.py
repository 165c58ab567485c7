"""A kernel's fingerprint: the sha256 of the sources of the modules that define it, through its wrappers.

Reports record it (``ci/commands/validate.py``, ``bench.py``: the JSON's ``kernels[].source`` and the console
header) so a verdict names the code it judged. It is provenance, not a cache key: the program cache keys a program
by what was traced (``ci/running/program_key.py``).

The kernel under test is found through everything that wraps it: ``functools.partial`` (its function and bound
arguments), ``__wrapped__`` (the mapping and padding options of ``kernels/adapt.py``, ``functools.wraps``), a
closure's cells (a factory's kernel and what it closed over: a peer's imported function, a wrapped kernel), a
bound method's object and a callable object's class. Each such object's module is a start; from each start the
modules of the same top-level package it refers to are added (for ours the subpackage, ``gdn2_oracle.kernels``,
so a kernel's hash never covers the oracle or the CLI). A kernel may list its modules itself (``fn.modules``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import sys
import types

MAX_OBJECTS = 500  # objects looked at through wrappers and closures (a kernel's closure graph is small)
# Libraries a kernel is built on, not kernel code: their versions are in the report's environment instead.
INFRASTRUCTURE = frozenset({"jax", "jaxlib", "numpy", "ml_dtypes", "torch", "triton", "scipy", "einops",
                            "opt_einsum", "gdn2_oracle.ci", "gdn2_oracle.oracle"}) | frozenset(sys.stdlib_module_names)


def _module_of(obj):
    """The module defining ``obj``: for a function the one whose globals it runs in (``functools.wraps`` copies
    ``__module__`` from the function it wraps)."""
    defined_in = getattr(obj, "__globals__", {}).get("__name__") if inspect.isfunction(obj) else None
    if defined_in in sys.modules:
        return sys.modules[defined_in]
    mod = inspect.getmodule(obj)
    if mod is None and not inspect.isfunction(obj) and not inspect.isclass(obj):
        mod = sys.modules.get(type(obj).__module__)
    return mod


def _package_of(module_name):
    """The package a module's kernel code belongs to: its top-level package, or for ours the
    subpackage (``gdn2_oracle.kernels``), so a kernel's hash never covers the oracle or the CLI."""
    parts = module_name.split(".")
    return ".".join(parts[:2]) if parts[0] == "gdn2_oracle" else parts[0]


def _inner(obj):
    """The objects ``obj`` wraps or closes over that may hold kernel code."""
    if isinstance(obj, functools.partial):
        yield obj.func
        yield from obj.args
        yield from obj.keywords.values()
    wrapped = getattr(obj, "__wrapped__", None)
    if wrapped is not None:
        yield wrapped
    if inspect.ismethod(obj):
        yield obj.__func__
        yield obj.__self__
    code = getattr(obj, "__code__", None)
    if isinstance(code, types.CodeType):  # the globals its code (and nested code) names: a helper, another kernel
        names, codes = set(), [code]
        while codes:
            c = codes.pop()
            names.update(c.co_names)
            codes.extend(x for x in c.co_consts if isinstance(x, types.CodeType))
        scope = getattr(obj, "__globals__", {})
        yield from (scope[n] for n in sorted(names) if n in scope)
    for cell in getattr(obj, "__closure__", None) or ():
        try:
            yield cell.cell_contents
        except ValueError:  # an empty cell
            continue
    if not inspect.isroutine(obj) and not inspect.isclass(obj) and callable(obj) and not isinstance(
            obj, functools.partial):
        yield type(obj)


def wrapped_objects(fn):
    """``fn`` and every function, class or callable object reached through its wrappers and closures."""
    seen, todo, out = set(), [fn], []
    while todo and len(seen) < MAX_OBJECTS:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type(None))):
            continue
        seen.add(id(obj))
        if inspect.isroutine(obj) or inspect.isclass(obj) or callable(obj) or isinstance(obj, types.ModuleType):
            out.append(obj)
        if not isinstance(obj, types.ModuleType) and (callable(obj) or isinstance(obj, (tuple, list))):
            todo.extend(obj if isinstance(obj, (tuple, list)) else _inner(obj))
    return out


def kernel_modules(fn):
    """The modules whose source defines kernel ``fn``: the modules of everything it wraps (:func:`wrapped_objects`)
    and, recursively, the modules of the same top-level package they refer to (or ``fn.modules`` when the kernel
    lists them)."""
    listed = getattr(fn, "modules", None)
    if listed:
        return [importlib.import_module(m) for m in listed]
    starts = [m for m in (o if isinstance(o, types.ModuleType) else _module_of(o) for o in wrapped_objects(fn))
              if m is not None and _package_of(m.__name__) not in INFRASTRUCTURE]
    seen = {}
    for start in starts:
        top = _package_of(start.__name__)
        todo = [start]
        while todo:
            mod = todo.pop()
            if mod.__name__ in seen:
                continue
            seen[mod.__name__] = mod
            if top == "__main__":
                continue
            for value in list(vars(mod).values()):
                dep = value if inspect.ismodule(value) else sys.modules.get(getattr(value, "__module__", None) or "")
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
