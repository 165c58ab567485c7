"""A kernel's own warnings reported at the kernel, not at the line of the suite that called it.

The suite calls a user's kernel from its own code (the spec layer, the options of kernels/adapt.py, the torch
bridge, the peers' adapters, the harness), so a warning the kernel raises with ``stacklevel=2`` (or a library under
it with a higher one) would name a line of the suite as its place. :func:`call` runs the kernel recording its
warnings (``catch_warnings(record=True)``, every one let through) and re-emits each once when it returns or raises,
with ``warnings.warn_explicit``, so the filters in force then apply to it as they would have to the original
(``-W error`` raises it, an ``ignore`` filter drops it):

* a warning placed at a line of this package that is on the stack of the call (a wrapper's or the harness's line
  calling the kernel) is re-emitted at the kernel function's own source file and first line (through partials and
  ``__wrapped__``; its module's name where it has no source), its message prefixed ``kernel 'NAME': ``, its
  category kept;
* any other warning (placed in the kernel, a library, or a line of ours the kernel called) keeps its file and line.

Recording shows every warning, and entering ``catch_warnings`` resets Python's once-per-place registries, so the
``default`` and ``module`` actions' once-per-place is kept here, until the filters change (as Python does). Under
``jax.jit`` the recording happens at trace time. Stdlib only: wrapping a user's kernel adds this one module to its
fingerprint (ci/running/fingerprint.py).
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import warnings

PACKAGE = __name__.split(".", 1)[0]  # gdn2_oracle: the lines of the suite
PREFIX = "kernel {name!r}: "
_LOCAL = threading.local()  # .depth: the calls of :func:`call` recording on this thread
_ONCE = {"filters": None, "snapshot": None, "shown": set()}  # what default/module showed under these filters
_MODULES = {}  # a file name -> (module name, its globals), for the warnings that keep their place


def call(fn, name, /, *args, **kwargs):
    """``fn(*args, **kwargs)``, the warnings it raises reported at kernel ``name`` (see the module docstring)."""
    caught = []
    depth = getattr(_LOCAL, "depth", 0)
    _LOCAL.depth = depth + 1
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            return fn(*args, **kwargs)
    finally:
        _LOCAL.depth = depth
        if caught:
            relay(caught, fn, name, sys._getframe(), nested=depth > 0)


def attributed(fn, name):
    """``fn`` called through :func:`call` (its warnings reported at kernel ``name``); ``functools.wraps``: the same
    name, attributes and signature (``__wrapped__``)."""

    @functools.wraps(fn)
    def kernel(*args, **kwargs):
        return call(fn, name, *args, **kwargs)

    return kernel


def relay(caught, fn, name, frame, *, nested=False):
    """Re-emit the warnings ``caught`` (``warnings.WarningMessage``) recorded while ``frame`` called kernel ``fn``
    named ``name``. ``nested``: an outer :func:`call` records them again, and keeps the once-per-place."""
    origin = None
    for w in caught:
        if suite_place(w.filename, w.lineno, frame):
            origin = origin or kernel_origin(fn)
            filename, lineno, module, scope = origin
            message = prefixed(w.message, PREFIX.format(name=name))
        else:
            filename, lineno, message = w.filename, w.lineno, w.message
            module, scope = _module_at(filename)
        if nested or _first_time(str(message), w.category, filename, lineno, module):
            warnings.warn_explicit(message, w.category, filename, lineno, module=module, registry={},
                                   module_globals=scope, source=w.source)


def suite_place(filename, lineno, frame):
    """Whether a warning placed at ``filename:lineno`` was placed at the suite: a line of this module, or the line a
    frame of this package on the stack from ``frame`` up is at (a wrapper's or the harness's call)."""
    if filename == call.__code__.co_filename:
        return True
    while frame is not None:
        if frame.f_lineno == lineno and frame.f_code.co_filename == filename:
            module = frame.f_globals.get("__name__") or ""
            if module == PACKAGE or module.startswith(PACKAGE + "."):
                return True
        frame = frame.f_back
    return False


def kernel_origin(fn):
    """``(filename, first line, module name, module globals)`` of kernel ``fn``, unwrapped (partials,
    ``__wrapped__``); ``(module name, 1, ...)`` when its source cannot be found (a C or compiled function)."""
    seen = set()
    while id(fn) not in seen:
        seen.add(id(fn))
        inner = fn.func if isinstance(fn, functools.partial) else getattr(fn, "__wrapped__", None)
        if inner is None:
            break
        fn = inner
    target = fn if inspect.isroutine(fn) or inspect.isclass(fn) else type(fn)
    module = getattr(fn, "__module__", None) or getattr(target, "__module__", None) or "<unknown>"
    scope = getattr(fn, "__globals__", None) or getattr(sys.modules.get(module), "__dict__", None)
    try:
        filename, lineno = inspect.getsourcefile(target), inspect.getsourcelines(target)[1]
    except (TypeError, OSError):
        filename = lineno = None
    return (filename, max(lineno, 1), module, scope) if filename else (module, 1, module, scope)


def prefixed(message, prefix):
    """Warning ``message`` (an instance) with ``prefix`` before its text, of the same class."""
    text = prefix + str(message)
    if not isinstance(message, Warning):
        return text
    cls = type(message)
    try:
        return cls(text)
    except Exception:  # noqa: BLE001 - a Warning class whose __init__ wants more: the same class, the new text
        out = cls.__new__(cls, text)
        out.__dict__.update(getattr(message, "__dict__", {}))
        return out


def _module_at(filename):
    """``(name, globals)`` of the loaded module whose file is ``filename`` (the name ``warnings.warn`` matched the
    filters against), else the file name less ``.py`` and None, as ``warnings.warn_explicit`` does."""
    if filename not in _MODULES:
        for name, mod in sys.modules.copy().items():  # copied at once: another thread may be importing
            if getattr(mod, "__file__", None) == filename:
                _MODULES[filename] = (name, vars(mod))
                break
        else:
            return (filename[:-3] if filename.lower().endswith(".py") else filename), None
    return _MODULES[filename]


def _action(text, category, module, lineno):
    """The action of the first filter in force matching the warning, as ``warnings.warn_explicit`` finds it."""
    for action, msg, cat, mod, ln in warnings.filters:
        if ((msg is None or msg.match(text)) and issubclass(category, cat) and (mod is None or mod.match(module))
                and (ln == 0 or lineno == ln)):
            return action
    return warnings.defaultaction


def _first_time(text, category, filename, lineno, module):
    """False for a warning the ``default`` (once per place) or ``module`` (once per module) action already showed
    under the filters in force; it is then marked shown."""
    filters = warnings.filters
    if _ONCE["filters"] is not filters or _ONCE["snapshot"] != filters:
        _ONCE.update(filters=filters, snapshot=list(filters), shown=set())
    action = _action(text, category, module, lineno)
    if action not in ("default", "module"):
        return True
    key = (text, category, module) if action == "module" else (text, category, filename, lineno)
    if key in _ONCE["shown"]:
        return False
    _ONCE["shown"].add(key)
    return True
