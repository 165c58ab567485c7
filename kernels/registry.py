"""Kernel registry: ``get(name, **options)``, ``names()``, ``register(name, factory)``, ``get("pkg.mod:attr")``.

A kernel is named by a *spec*: ``NAME``, ``package.module:attr`` or either with options,
``NAME[key=value,...]`` (values are Python literals, else strings), e.g. ``factorized[leaf=8]``;
``torch:package.module:attr[...]`` is a PyTorch callable run through ``kernels/torch_bridge.py``.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import re

from . import chunked

_FACTORIES = {"pairwise": chunked.pairwise, "factorized": chunked.factorized}
# Names provided by modules imported only when first asked for (they may be absent on this machine).
_LAZY = {"pallas-pairwise": "gdn2_oracle.kernels.pallas", "pallas-factorized": "gdn2_oracle.kernels.pallas",
         "cp-pairwise": "gdn2_oracle.kernels.context_parallel", "cp-factorized": "gdn2_oracle.kernels.context_parallel"}
# Peer kernels (optional extra `peers`): resolved by get(), listed by names(optional=True) only.
_OPTIONAL = {"atomic-ops": "gdn2_oracle.kernels.peers", "atomic-gdn2": "gdn2_oracle.kernels.peers",
             # FLA's GDN-2 / KDA kernels through the torch bridge (optional extra `fla`)
             **dict.fromkeys(("fla-gdn2-naive-recurrent", "fla-gdn2-naive-chunk", "fla-gdn2-chunk",
                              "fla-kda-naive-recurrent", "fla-kda-naive-chunk", "fla-kda-chunk"),
                             "gdn2_oracle.kernels.fla_peers")}
# ``torch:package.module:attr[options]``: a PyTorch kernel behind the contract (kernels/torch_bridge.py).
TORCH_PREFIX = "torch:"
# The kernels validated, benchmarked and property-tested when none is named.
DEFAULTS = ("pairwise", "factorized")
_SPEC = re.compile(r"^(?P<name>[^\[\]]+?)(?:\[(?P<opts>.*)\])?$")


def parse_value(value):
    """An option value: a Python literal (``8``, ``None``, ``'xla'``), else the string itself."""
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


def parse_spec(spec):
    """``"NAME[key=value,...]"`` -> ``(NAME, {key: value})``; ValueError naming ``name`` when malformed."""
    if not isinstance(spec, str):
        raise ValueError(f"name: expected a string, got {type(spec).__name__}")
    m = _SPEC.match(spec.strip())
    if not m:
        raise ValueError(f"name: {spec!r} is not NAME, package.module:attr or NAME[key=value,...]")
    options = {}
    for item in (m.group("opts") or "").split(","):
        if not item.strip():
            continue
        key, eq, value = item.partition("=")
        if not eq or not key.strip().isidentifier():
            raise ValueError(f"name: option {item.strip()!r} of {spec!r} is not of the form key=value")
        options[key.strip()] = parse_value(value.strip())
    return m.group("name").strip(), options


def register(name, factory):
    """Register ``factory(**options) -> kernel`` under ``name`` (re-registering the same factory is a no-op)."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"name: expected a non-empty string without ':', got {name!r}")
    if not callable(factory):
        raise ValueError(f"factory: expected a callable for {name!r}, got {type(factory).__name__}")
    if name in _FACTORIES and _FACTORIES[name] is not factory:
        raise ValueError(f"name: {name!r} is already registered to {_FACTORIES[name]!r}")
    _FACTORIES[name] = factory


def register_all(factories):
    """Register every ``name: factory`` of a module's table (already registered ones are left as they are)."""
    for name, factory in factories.items():
        try:
            register(name, factory)
        except ValueError:
            pass


def _load_lazy(module):
    """Import a lazily registered module (which calls ``register``); return the error message or None."""
    try:
        importlib.import_module(module)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - report any import failure by name
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


def known():
    """Every name the registry can resolve, without importing the lazy or optional modules."""
    return sorted({*_FACTORIES, *_LAZY, *_OPTIONAL})


def resolve(spec):
    """The callable named by ``"package.module:attr"`` (ValueError naming ``name`` if it cannot be loaded)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"name: {spec!r} is not of the form 'package.module:attr'")
    try:
        obj = importlib.import_module(module_name)
    except SystemExit as exc:  # a module that calls sys.exit() on import is an import failure, not an exit
        raise ValueError(f"name: cannot import module {module_name!r} (it called sys.exit({exc.code!r}))") from None
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"name: cannot import module {module_name!r} ({type(exc).__name__}: {exc})") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"name: module {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise ValueError(f"name: {spec!r} is not callable ({type(obj).__name__})")
    return obj


def _external(spec, options):
    """Resolve ``"package.module:attr"`` to a callable; options are bound as keyword arguments."""
    obj = resolve(spec)
    return functools.partial(obj, **options) if options else obj


def get(name, **options):
    """The kernel named by spec ``name`` built with its options and ``options`` (which win), or an
    external ``"pkg.mod:attr"`` callable with the options bound as keyword arguments."""
    name, parsed = parse_spec(name)
    options = {**parsed, **options}
    if name.startswith(TORCH_PREFIX):  # a PyTorch callable, run through the torch bridge
        from .torch_bridge import torch_kernel  # noqa: PLC0415 - imports torch only when asked

        return torch_kernel(name[len(TORCH_PREFIX):], **options)
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
    factory = _FACTORIES[name]
    try:  # options the factory's signature does not take are bad options; a TypeError it raises is its own
        inspect.signature(factory).bind(**options)
    except TypeError as exc:
        raise ValueError(f"options: {name!r} does not accept {sorted(options)} ({exc})") from None
    except ValueError:  # no introspectable signature: let the call decide
        pass
    return factory(**options)
