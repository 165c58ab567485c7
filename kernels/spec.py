"""The one kernel-spec grammar and its resolution (docs/DESIGN.md §2, "Kernel specs").

A spec is ``NAME``, ``package.module:attr`` or ``torch:package.module:attr``, optionally with options
``[key=value,...]`` (values are Python literals, else strings; an unquoted ``@package.module:attr`` is a
:class:`Reference` to that object, loaded when the kernel is built). ``factory=1`` on ``package.module:attr``
calls it with the other options and uses its result as the kernel. Several specs are separated by commas
outside brackets: ``factorized[chunk_size=32,leaf=8],pairwise`` is two specs. The CLI, the pytest plugin,
``GDN2_KERNEL``, bench and cost all parse with :func:`split_specs` and :func:`parse_spec`.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import sys
from dataclasses import dataclass, field

from . import adapt, kernel_warnings
from .registry import BUILTIN, DEFAULTS, OPTIONAL, REPLAYSSM_FACTORY, REPLAYSSM_PREFIX, TORCH_FACTORY, TORCH_PREFIX

__all__ = ["DEFAULTS", "FACTORY", "KernelSpec", "Reference", "accepts", "get", "known", "names", "parse_spec",
           "parse_value", "register",
           "resolve", "signature_of", "split_specs"]

# Names registered at run time (``register``): name -> factory callable or "module:attr".
_REGISTERED: dict = {}
_OPEN, _CLOSE = "([{", ")]}"


FACTORY = "factory"  # the option that calls a ``package.module:attr`` with the options to make the kernel
# ``family`` / ``flags`` on a ``package.module:attr``: a family kernel and the FLA keywords it takes
FAMILY_OPTIONS = ("family", "flags")
FAMILY_FUNCTION = "gdn2_oracle.kernels.family_keywords:family_function"  # resolved by name: it imports this module


class Reference(str):
    """An option value ``@package.module:attr`` (unquoted): the object it names, loaded by :meth:`load`."""

    def load(self, option):
        """The object named; ValueError naming ``option`` if it cannot be loaded."""
        try:
            return load(self[1:])
        except ValueError as exc:
            raise ValueError(f"{option}: {self}: {str(exc).removeprefix('name: ')}") from None


def parse_value(value):
    """An option value: ``@package.module:attr`` unquoted (a :class:`Reference`), a Python literal (``8``, ``None``,
    ``'xla'``), else the string itself."""
    if isinstance(value, str) and value.startswith("@"):
        return Reference(value)
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return value


def _split_top(text, what):
    """``text`` split at commas outside brackets; ValueError naming ``what`` for unbalanced brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
            if depth < 0:
                break
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"{what}: {text!r} has unbalanced brackets")
    return items + [text[start:]]


def split_specs(text):
    """The specs in a comma-separated list: ``"a,b[x=1,y=2]"`` -> ``["a", "b[x=1,y=2]"]``."""
    if not isinstance(text, str):
        raise ValueError(f"name: expected a string, got {type(text).__name__}")
    items = [item.strip() for item in _split_top(text, "name")]
    if not all(items):
        raise ValueError(f"name: {text!r} has an empty kernel name in its comma-separated list")
    return items


def parse_options(text, what="options"):
    """``"a=1,b=x"`` -> ``{"a": 1, "b": "x"}``; ValueError naming ``what`` for a malformed or repeated key."""
    options = {}
    for item in _split_top(text, what):
        if not item.strip():
            continue
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key.isidentifier():
            raise ValueError(f"{what}: {item.strip()!r} is not of the form key=value")
        if key in options:
            raise ValueError(f"{what}: {key!r} is given twice in {text!r}")
        options[key] = parse_value(value.strip())
        module, colon, attr = options[key][1:].partition(":") if isinstance(options[key], Reference) else "x:x"
        if not (colon and all(p.isidentifier() for p in (*module.split("."), *attr.split(".")))):
            raise ValueError(f"{what}: {key}={value.strip()} is not a reference @package.module:attr")
    return options


def parse_spec(spec):
    """``"NAME[key=value,...]"`` -> ``(NAME, {key: value})``; ValueError naming ``name`` when malformed."""
    if not isinstance(spec, str):
        raise ValueError(f"name: expected a string, got {type(spec).__name__}")
    text = spec.strip()
    name, bracket, rest = text.partition("[")
    name = name.strip()
    if bracket and not rest.endswith("]"):
        raise ValueError(f"name: {spec!r} is not NAME, package.module:attr or NAME[key=value,...]")
    if not name or "]" in name or (not bracket and "]" in text):
        raise ValueError(f"name: {spec!r} is not NAME, package.module:attr or NAME[key=value,...]")
    try:
        options = parse_options(rest[:-1], "options") if bracket else {}
    except ValueError as exc:
        raise ValueError(f"name: {spec!r}: {str(exc).removeprefix('options: ')}") from None
    return name, options


def resolve(target):
    """The callable named by ``"package.module:attr"`` (ValueError naming ``name`` if it cannot be loaded)."""
    obj = load(target)
    if not callable(obj):
        raise ValueError(f"name: {target!r} is not callable ({type(obj).__name__})")
    return obj


def load(target):
    """The object named by ``"package.module:attr"`` (ValueError naming ``name`` if it cannot be loaded)."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"name: {target!r} is not of the form 'package.module:attr'")
    try:
        obj = importlib.import_module(module_name)
    except SystemExit as exc:  # a module that calls sys.exit() on import is an import failure, not an exit
        raise ValueError(f"name: cannot import module {module_name!r} (it called sys.exit({exc.code!r}))") from None
    except Exception as exc:
        raise ValueError(f"name: cannot import module {module_name!r} ({type(exc).__name__}: {exc})") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"name: module {module_name!r} has no attribute {attr!r}") from None
    return obj


def register(name, factory):
    """Register ``factory(**options) -> kernel`` (a callable or ``"module:attr"``) under ``name``."""
    if not isinstance(name, str) or not name or ":" in name or "[" in name or "," in name:
        raise ValueError(f"name: expected a non-empty string without ':', '[' or ',', got {name!r}")
    if not (callable(factory) or (isinstance(factory, str) and ":" in factory)):
        raise ValueError(f"factory: expected a callable or 'module:attr' for {name!r}, got {type(factory).__name__}")
    current = _REGISTERED.get(name, BUILTIN.get(name, OPTIONAL.get(name)))
    if current is not None and current is not factory and current != factory:
        raise ValueError(f"name: {name!r} is already registered to {current!r}")
    _REGISTERED[name] = factory


def unregister(name):
    """Forget a name registered with :func:`register` (the built-in names stay)."""
    _REGISTERED.pop(name, None)


def known():
    """Every name the registry can resolve, without importing anything."""
    return sorted({*BUILTIN, *OPTIONAL, *_REGISTERED})


def _table():
    return {**BUILTIN, **OPTIONAL, **_REGISTERED}


def factory(name):
    """The factory registered under ``name``; ValueError naming ``name`` if unknown or its module fails to load."""
    table = _table()
    if name not in table:
        raise ValueError(f"name: unknown kernel {name!r}; registered: {', '.join(known())}")
    target = table[name]
    if callable(target):
        return target
    try:
        return resolve(target)
    except ValueError as exc:
        raise ValueError(f"name: kernel {name!r} is unavailable ({str(exc).removeprefix('name: ')})") from None


def names(optional=False):
    """Registered names whose module loads here; the optional peers only with ``optional=True``."""
    out = []
    for name in known():
        if name in OPTIONAL and not optional:
            continue
        try:
            factory(name)
        except ValueError:
            continue
        out.append(name)
    return out


def _pass_through(sig):
    """Whether signature ``sig`` is a pass-through wrapper's ``(*args, **kwargs)``: it names no parameter."""
    return all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()) and bool(sig.parameters)


def inner_callable(fn):
    """The one callable a pass-through wrapper ``fn`` calls, or None: its ``__wrapped__``; for a callable object
    whose ``__call__`` passes through (a ``torch.nn.Module``, as the Hub kernels' ``Func`` around transformers'
    fallbacks), its bound ``forward``; for a function, the single callable (not a class, not a module) among its
    closure's cells."""
    inner = getattr(fn, "__wrapped__", None) if inspect.isfunction(fn) or inspect.ismethod(fn) else None
    if inner is None and not (inspect.isfunction(fn) or inspect.ismethod(fn)):
        try:
            inner = inspect.getattr_static(fn, "__wrapped__")
        except AttributeError:
            inner = None
        forward = getattr(type(fn), "forward", None)
        if inner is None and inspect.isfunction(forward):
            inner = getattr(fn, "forward", None)
    if callable(inner):
        return inner
    code = getattr(fn, "__func__", fn)
    cells = []
    for cell in getattr(code, "__closure__", None) or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    found = [c for c in cells if callable(c) and not isinstance(c, type)]
    return found[0] if len(found) == 1 else None


def signature_of(fn, _depth=0):
    """``fn``'s signature read through pass-through wrappers (``(*args, **kwargs)``: :func:`inner_callable`, up to
    eight deep) to the first that names its parameters; ValueError/TypeError as :func:`inspect.signature` for a
    callable without one."""
    sig = inspect.signature(fn)
    if _depth < 8 and _pass_through(sig):
        inner = inner_callable(fn)
        if inner is not None and inner is not fn:
            try:
                return signature_of(inner, _depth + 1)
            except (TypeError, ValueError):
                return sig
    return sig


def keyword_names(fn):
    """``(names, var_keyword)``: the keyword parameters ``fn``'s signature names (read through pass-through
    wrappers, :func:`signature_of`) and whether it takes ``**kwargs``; None for a callable without a signature (a
    builtin or C callable). A ``TorchKernel`` has the signature of the keywords its torch function takes."""
    try:
        params = signature_of(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    return (frozenset(p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)),
            any(p.kind is p.VAR_KEYWORD for p in params))


def accepts_keywords(fn, names, *, var_keyword=True, unknown=False):
    """Whether ``fn`` can be called with every keyword of ``names``: its signature names them, or (with
    ``var_keyword``) it takes ``**kwargs``; ``unknown`` for a callable without a signature."""
    found = keyword_names(fn)
    if found is None:
        return unknown
    named, var = found
    return set(names) <= named or (var_keyword and var)


def _takes(fn, option):
    """Whether ``fn``'s signature has a keyword parameter ``option`` (or ``**kwargs``); True if not introspectable."""
    return accepts_keywords(fn, (option,), unknown=True)


def accepts(name, option):
    """Whether the kernel ``name`` takes ``option``: its factory declares it (for ``pkg.mod:attr``, the callable's
    keyword or a mapping option; a ``torch:`` kernel passes unknown options to the torch function, so it takes
    any); every kernel takes the wrapping options ``pad`` and ``o_dtype`` (kernels/adapt.py)."""
    name = parse_spec(name)[0]
    if name.startswith(TORCH_PREFIX) or option in adapt.WRAPPING:
        return True
    if name.startswith(REPLAYSSM_PREFIX):
        return _takes(resolve(REPLAYSSM_FACTORY), option)
    if ":" in name:
        return option in (*adapt.MAPPING, *FAMILY_OPTIONS, FACTORY) or _takes(resolve(name), option)
    return _takes(factory(name), option)


def get(spec, **options):
    """The kernel named by ``spec`` built with its options and ``options`` (which win). An external
    ``"pkg.mod:attr"`` callable gets the mapping options (``order``, ``layout``, ``scale_arg``, ``state_arg``,
    ``decay_base``) applied and the others bound as keyword arguments of every call; ``pad`` and ``o_dtype``
    wrap any kernel (kernels/adapt.py), and ``interpret`` any but a ``torch:`` one, where it is the torch bridge's
    (Triton's interpreter). ``family`` / ``flags`` on a ``pkg.mod:attr``: a family kernel and the FLA keywords it
    takes (kernels/family_keywords.py), outermost. A user's kernel function (``pkg.mod:attr``, what a ``factory=1`` or
    registered factory makes) is called through kernels/kernel_warnings.py: its warnings are reported at it."""
    name, parsed = parse_spec(spec)
    options = {k: v.load(k) if isinstance(v, Reference) else v for k, v in {**parsed, **options}.items()}
    # a factory's own option of that name wins (the torch bridge's interpret=1 is Triton's interpreter, not Pallas's)
    own = (_declared(factory(name)) if ":" not in name
           else _declared(resolve(TORCH_FACTORY)) if name.startswith(TORCH_PREFIX) else set())
    wrapping = {k: options.pop(k) for k in adapt.WRAPPING if k in options and k not in own}
    packed = options.get("layout") == adapt.MIXED_QKV and "layout" not in own and options.pop("layout")
    plain = ":" in name and not name.startswith((TORCH_PREFIX, REPLAYSSM_PREFIX))
    family = {k: options.pop(k) for k in FAMILY_OPTIONS if k in options} if plain else {}
    fn = adapt.wrap(adapt.mixed_qkv(_build(name, options)) if packed else _build(name, options), **wrapping)
    return resolve(FAMILY_FUNCTION)(fn, family.get("family"), family.get("flags")) if family else fn


def _declared(fn):
    """The keyword parameters ``fn`` names explicitly (not through ``**kwargs``)."""
    found = keyword_names(fn)
    return set() if found is None else set(found[0])


def _build(name, options):
    if name.startswith(TORCH_PREFIX):
        return resolve(TORCH_FACTORY)(name[len(TORCH_PREFIX):], **options)
    if name.startswith(REPLAYSSM_PREFIX):
        return resolve(REPLAYSSM_FACTORY)(name[len(REPLAYSSM_PREFIX):], **options)
    if ":" in name:
        fn = resolve(name)
        if options.pop(FACTORY, False):
            fn = _made(fn, {k: options.pop(k) for k in list(options) if k not in adapt.MAPPING}, name)
        check_kernel(fn, name, [k for k in options if k not in adapt.MAPPING])
        fn = _reported(fn, name)
        if any(k in adapt.MAPPING for k in options):
            return adapt.mapped(fn, **options)
        return functools.partial(fn, **options) if options else fn
    make = factory(name)
    refused = sorted(o for o in options if not _takes(make, o))
    if refused:
        raise ValueError(f"options: {name!r} does not accept {refused}")
    if name in _REGISTERED:  # a user's factory and kernel
        return _reported(kernel_warnings.call(make, name, **options), name)
    return make(**options)


# The fewest positional tensors a kernel is called with: FLA's family call ``q, k, v, g, beta`` (the contract's
# ``q, k, v, g, b, w`` has six, a mapped ``order=...sh`` eight; ``layout=mixed_qkv`` kernels take five too).
POSITIONAL_TENSORS = 5


def check_kernel(fn, name, keywords=()):
    """ValueError unless ``fn`` (what ``package.module:attr`` names, or its factory made) can be a kernel taking
    ``keywords`` (the options bound to every call), the check a ``torch:`` spec gets (kernels/torch_bridge.py): a
    built-in function of the standard library (``os:system``) is none, nor a callable whose signature cannot take
    :data:`POSITIONAL_TENSORS` positional tensors; an option its signature cannot take (no such keyword, no
    ``**kwargs``) is named. A callable without a readable signature passes (a C extension's kernel)."""
    if inspect.isbuiltin(fn) and str(getattr(fn, "__module__", None) or "builtins").partition(".")[0] in (
            *sys.stdlib_module_names, "builtins"):
        raise ValueError(f"name: {name!r} is a built-in function of Python's standard library, not a kernel")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind_partial(*range(POSITIONAL_TENSORS))
    except TypeError:
        raise ValueError(f"name: {name!r} is not a kernel: its signature {sig} cannot take the positional tensors "
                         "q, k, v, g, b(eta), w (a factory of kernels needs factory=1)") from None
    refused = sorted(k for k in keywords if not accepts_keywords(fn, (k,), unknown=True))
    if refused:
        raise ValueError(f"options: {name!r} does not accept {refused} (its signature {sig} has no such parameter "
                         "and no **kwargs)")


def _reported(fn, name):
    """A user's kernel ``fn`` whose warnings are reported at it, not at the suite's line calling it
    (kernels/kernel_warnings.py); a callable object other than a function is left as it is (the suite reads its
    type and attributes)."""
    if inspect.isfunction(fn) or inspect.ismethod(fn):
        return kernel_warnings.attributed(fn, name)
    return fn


def _made(make, options, name):
    """The kernel ``make(**options)`` returns (``factory=1``; its warnings reported at ``name``); ValueError naming
    ``factory`` if it is not callable."""
    kernel = kernel_warnings.call(make, name, **options)
    if not callable(kernel):
        raise ValueError(f"{FACTORY}: {getattr(make, '__name__', make)!r} returned a {type(kernel).__name__}, "
                         "not a kernel")
    return kernel


@dataclass
class KernelSpec:
    """One kernel named by a spec: ``spec`` as given, its ``name`` and ``options``."""

    spec: str
    name: str
    options: dict = field(default_factory=dict)

    @classmethod
    def parse(cls, text):
        """The spec of one kernel; ValueError naming ``name`` when malformed."""
        name, options = parse_spec(text)
        return cls(text.strip(), name, options)

    def label(self, extra=None):
        """``NAME[key=value,...]`` with the options (and ``extra``) spelled out."""
        opts = {**self.options, **(extra or {})}
        return f"{self.name}[{','.join(f'{k}={v}' for k, v in opts.items())}]" if opts else self.name

    def accepts(self, option):
        """Whether this kernel takes ``option`` (see :func:`accepts`)."""
        return accepts(self.name, option)

    def build(self, **extra):
        """The kernel callable; ValueError with the reason for anything that stops building it."""
        try:
            return get(self.name, **{**self.options, **extra})
        except ValueError:
            raise
        except SystemExit as exc:  # a kernel module that calls sys.exit() on import
            raise ValueError(f"building it called sys.exit({exc.code!r})") from None
        except MemoryError as exc:  # an option asking for more memory than there is (a ring, a buffer)
            given = {**self.options, **extra}
            named = f"options {', '.join(f'{k}={v!r}' for k, v in given.items())}: " if given else ""
            raise ValueError(f"{named}building the kernel ran out of memory ({exc or 'MemoryError'})") from None
        except Exception as exc:  # noqa: BLE001 - a broken external factory is reported, not raised
            raise ValueError(f"{type(exc).__name__}: {exc}") from None


def module_root(spec):
    """The folder to put on ``PYTHONPATH`` so that a fresh ``python`` finds the module of kernel ``spec``
    (``pkg.mod:attr``, ``torch:pkg.mod:attr``, ``replayssm:PACKAGE``): the folder holding its top-level package when
    that is not an installed one (site-packages, this package), e.g. a kernel in the user's repository found through
    ``PYTHONPATH=.``; None for a registered name or an installed module. Nothing is imported."""
    import importlib.util
    import site
    from pathlib import Path

    name = parse_spec(spec)[0].removeprefix(TORCH_PREFIX)
    if name.startswith(REPLAYSSM_PREFIX):
        module = name.removeprefix(REPLAYSSM_PREFIX)
    elif ":" in name:
        module = name.split(":", 1)[0]
    else:
        return None
    top = module.split(".", 1)[0]
    if top == __name__.split(".", 1)[0]:
        return None
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        found = None
    if found is None or not found.origin or found.origin in ("built-in", "frozen"):
        return None
    origin = Path(found.origin).resolve()
    folder = origin.parent.parent if found.submodule_search_locations else origin.parent
    installed = [Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]]
    if any(folder == p or p in folder.parents for p in installed):
        return None
    return str(folder)


def python_c(code) -> str:
    """``python -c "code"`` for a POSIX shell: ``code`` double-quoted with ``\\``, ``"``, ``$`` and backquotes
    escaped, so that a kernel spec holding quotes (``replay-recurrent[mutant='late_flush']``, whose repr is
    double-quoted) reaches Python intact (every reproducer's form)."""
    return 'python -c "' + "".join("\\" + c if c in '\\"$`' else c for c in code) + '"'


def runnable(command, spec):
    """Shell ``command`` (a reproducer running kernel ``spec``) self-contained: prefixed with the ``PYTHONPATH`` its
    module needs (:func:`module_root`), when it needs one."""
    import shlex

    root = module_root(spec)
    return command if root is None else f"PYTHONPATH={shlex.quote(root)} {command}"
