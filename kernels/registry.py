"""Kernel registry: ``get(name, **options)``, ``names()``, ``register(name, factory)``, ``get("pkg.mod:attr")``."""

from __future__ import annotations

import functools
import importlib

from . import chunked

_FACTORIES = {"pairwise": chunked.pairwise, "factorized": chunked.factorized}
# Names provided by modules imported only when first asked for (they may be absent on this machine).
_LAZY = {"pallas-pairwise": "kernels.pallas", "pallas-factorized": "kernels.pallas"}
# Peer kernels (optional extra `peers`): resolved by get(), listed by names(optional=True) only.
_OPTIONAL = {"atomic-ops": "kernels.peers", "atomic-gdn2": "kernels.peers"}


def register(name, factory):
    """Register ``factory(**options) -> kernel`` under ``name`` (re-registering the same factory is a no-op)."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"name: expected a non-empty string without ':', got {name!r}")
    if not callable(factory):
        raise ValueError(f"factory: expected a callable for {name!r}, got {type(factory).__name__}")
    if name in _FACTORIES and _FACTORIES[name] is not factory:
        raise ValueError(f"name: {name!r} is already registered to {_FACTORIES[name]!r}")
    _FACTORIES[name] = factory


def _load_lazy(module):
    """Import a lazily registered module (which calls ``register``); return the error message or None."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - report any import failure by name
        return f"{type(exc).__name__}: {exc}"
    return None


def names(optional=False):
    """Registered kernel names (lazy modules that import cleanly are loaded first); peer kernels
    of the optional extra only with ``optional=True``."""
    lazy = {**_LAZY, **_OPTIONAL} if optional else _LAZY
    for module in sorted(set(lazy.values())):
        if any(n not in _FACTORIES for n, m in lazy.items() if m == module):
            _load_lazy(module)
    return sorted(n for n in _FACTORIES if optional or n not in _OPTIONAL)


def _external(spec, options):
    """Resolve ``"package.module:attr"`` to a callable; options are bound as keyword arguments."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"name: {spec!r} is not of the form 'package.module:attr'")
    try:
        obj = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"name: cannot import module {module_name!r} ({type(exc).__name__}: {exc})") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"name: module {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise ValueError(f"name: {spec!r} is not callable ({type(obj).__name__})")
    return functools.partial(obj, **options) if options else obj


def get(name, **options):
    """The kernel registered as ``name`` built with ``options``, or an external ``"pkg.mod:attr"`` callable."""
    if not isinstance(name, str):
        raise ValueError(f"name: expected a string, got {type(name).__name__}")
    if ":" in name:
        return _external(name, options)
    lazy = {**_LAZY, **_OPTIONAL}
    if name not in _FACTORIES and name in lazy:
        error = _load_lazy(lazy[name])
        if name not in _FACTORIES:
            why = error or f"{lazy[name]} did not register it"
            raise ValueError(f"name: kernel {name!r} is unavailable ({why})")
    if name not in _FACTORIES:
        raise ValueError(f"name: unknown kernel {name!r}; registered: {', '.join(names(optional=True))}")
    try:
        return _FACTORIES[name](**options)
    except TypeError as exc:
        raise ValueError(f"options: {name!r} does not accept {sorted(options)} ({exc})") from exc
