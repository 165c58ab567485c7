"""The content key of a traced program: a canonical text of its jaxpr, every value in it, hashed (sha256).

The program cache (``program_cache.py``) names a stored program by what was traced, never by a function's name:
two kernels from one factory, a kernel behind a mapping or padding option, a peer with other options or an edited
file trace to other jaxprs and so to other keys. JAX's own pretty-printer is not enough for that: it prints a
Pallas kernel's body by name (``jaxpr=gdn2_fwd_factorized_c64``), hides a block's index map inside
``BlockMapping(...)`` and prints a large constant as a name. So the text here is written from the objects:

* a jaxpr: its variables numbered in order of appearance, each with its type; every equation as primitive,
  inputs (a literal by its dtype, shape and bytes), outputs, effects and parameters;
* a parameter: scalars, strings, dtypes, enums and arrays (by their bytes) as themselves; tuples, lists, dicts,
  dataclasses, named tuples and plain objects field by field; nested jaxprs (a Pallas kernel body, an index map,
  a ``jit`` or ``cond`` branch) in full, with their constants' bytes;
* anything else -- a Python function (a host callback, a custom rule not yet traced), an object with
  ``__slots__`` or a C type whose state cannot be read -- makes the program **unkeyable** (:class:`Unkeyable`):
  it is then traced and lowered every run, never stored;
* a primitive lowered by user code (:func:`user_lowering`) -- a lowering rule whose code (or a function it closes
  over, e.g. the one given to ``mlir.lower_fun``) lies outside the installed distributions, or a primitive defined
  in a user module -- makes it unkeyable too: the key covers the installed distributions' versions (JAX's own rules
  among them), never a user's file, so a rule reading a user's setting would come back from the cache unchanged.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import site
import sys
import sysconfig
import types
from pathlib import Path

import numpy as np

# Types written by their repr: they hold no state beyond what it shows (checked by name: some are private).
_BY_REPR = frozenset({"Mesh", "AbstractMesh", "ShapedArray", "AbstractRef", "NamedSharding", "PartitionSpec",
                      "UnspecifiedValue", "AutoLayout", "Layout", "Format", "SingleDeviceSharding",
                      "GatherDimensionNumbers", "ScatterDimensionNumbers", "ConvDimensionNumbers",
                      "DotAlgorithmPreset", "RoundingMethod", "Squeezed", "Element", "Blocked", "BoundedSlice",
                      "PyTreeDef", "P"})
# Parameters lowering never reads: the rules for differentiating a custom_jvp / custom_vjp call again (the program
# is lowered as traced, its ``call_jaxpr``; nothing differentiates a stored program).
_RULES_NOT_LOWERED = frozenset({("custom_jvp_call", "jvp_jaxpr_fun"), ("custom_jvp_call", "jvp_jaxpr_thunk"),
                                ("custom_vjp_call", "fwd_jaxpr_thunk"), ("custom_vjp_call", "bwd"),
                                ("custom_vjp_call_jaxpr", "fwd_jaxpr_thunk"), ("custom_vjp_call_jaxpr", "bwd")})


class Unkeyable(ValueError):
    """A traced program holds something whose content cannot be written down (e.g. a Python callback)."""


@functools.cache
def _installed_roots():
    """The folders installed distributions and the standard library live in (site-packages, user site, stdlib)."""
    paths = {*site.getsitepackages(), site.getusersitepackages(),
             *(sysconfig.get_paths().get(k) for k in ("purelib", "platlib", "stdlib", "platstdlib"))}
    return tuple(Path(p).resolve() for p in paths if p)


@functools.lru_cache(maxsize=4096)
def installed_file(filename):
    """Whether the source file ``filename`` belongs to an installed distribution or the standard library (under
    site-packages or the stdlib), as opposed to a user's file found through ``sys.path`` / ``PYTHONPATH``, an
    editable checkout or code made by ``exec`` (``<string>``)."""
    if not isinstance(filename, str) or not filename:
        raise ValueError(f"filename: expected a file name, got {filename!r}")
    if filename.startswith("<"):
        return filename.startswith("<frozen ")  # a frozen stdlib module; other <...> is exec'd code
    path = Path(filename).resolve()
    return any(path.is_relative_to(root) for root in _installed_roots())


def _module_file(name):
    """The source file of module ``name`` ('' for a built-in one; None for ``__main__`` or an unknown module)."""
    module = sys.modules.get(name) if name and name != "__main__" else None
    return None if module is None else getattr(module, "__file__", None) or ""


def _user_code(obj, seen, depth=6):
    """The user's file (or module) defining ``obj`` -- a lowering rule -- or a function it holds (closure cells,
    ``functools.partial`` arguments, ``__wrapped__``, a bound method's function and object, a callable object's
    class); None when all of it is an installed distribution's or the standard library's."""
    if depth < 0 or id(obj) in seen:
        return None
    seen.add(id(obj))
    parts = []
    if isinstance(obj, functools.partial):
        parts = [obj.func, *obj.args, *obj.keywords.values()]
    elif isinstance(obj, types.MethodType):
        parts = [obj.__func__, obj.__self__]
    elif isinstance(obj, types.FunctionType):
        file = obj.__code__.co_filename
        if obj.__module__ == "__main__" or not installed_file(file):
            return file
        parts = [c.cell_contents for c in obj.__closure__ or () if _cell_full(c)]
        parts += [getattr(obj, "__wrapped__", None)]
    elif isinstance(obj, (tuple, list)):
        parts = list(obj)
    elif isinstance(obj, (types.BuiltinFunctionType, type)) or callable(obj):
        cls = obj if isinstance(obj, type) else None if isinstance(obj, types.BuiltinFunctionType) else type(obj)
        name = getattr(cls if cls is not None else obj, "__module__", None)
        file = _module_file(name)
        if name == "__main__" or (file and not installed_file(file)):
            return file or name
        if cls is not None and not isinstance(obj, type):
            parts = [cls.__call__, *getattr(obj, "__dict__", {}).copy().values()]
    for part in parts:
        if callable(part) or isinstance(part, (tuple, list)):
            found = _user_code(part, seen, depth - 1)
            if found is not None:
                return found
    return None


def _cell_full(cell):
    """Whether closure ``cell`` holds a value (a cell not yet assigned holds none)."""
    try:
        cell.cell_contents  # noqa: B018 - reading an empty cell raises ValueError
    except ValueError:
        return False
    return True


def _lowering_rules(primitive):
    """The lowering rules registered for ``primitive`` with ``jax.interpreters.mlir.register_lowering``: the one
    for every platform and each platform's own (JAX keeps them in ``mlir._lowerings`` and
    ``mlir._platform_specific_lowerings``)."""
    from jax._src.interpreters import mlir

    entries = [mlir._lowerings.get(primitive),
               *(rules.get(primitive) for rules in list(mlir._platform_specific_lowerings.values()))]
    return [getattr(e, "rule", e) for e in entries if e is not None]


def _user_primitives():
    """``{id(primitive): (primitive, module name)}`` for each primitive a user module (one not under an installed
    distribution or the standard library, or ``__main__``) holds as a global and no installed module holds."""
    from jax.extend.core import Primitive

    user, installed = {}, []
    # copy() makes no object per entry, so no gc callback -- and no thread importing a module -- can run inside it;
    # list(sys.modules.items()) makes a tuple per entry and raised 'dictionary changed size during iteration'
    for name, module in sys.modules.copy().items():
        file = getattr(module, "__file__", None)
        values = getattr(module, "__dict__", None)
        if not isinstance(values, dict):
            continue
        held = [v for v in values.copy().values() if issubclass(type(v), Primitive)]  # type(): no __class__ hook
        if name == "__main__" or (file and not installed_file(file)):
            user.update((id(p), (p, name)) for p in held)
        else:
            installed.append(held)
    for held in installed if user else ():
        for p in held:
            user.pop(id(p), None)
    return user


def user_lowering(primitive, user_primitives=None):
    """Why ``primitive`` is lowered by user code (a sentence), or None: a registered lowering rule (or a function
    it holds) defined outside the installed distributions and the standard library, or the primitive defined in a
    user module (``user_primitives``: :func:`_user_primitives`, computed when not given) with a rule registered."""
    rules = _lowering_rules(primitive)
    for rule in rules:
        where = _user_code(rule, set())
        if where is not None:
            what = getattr(rule, "__qualname__", type(rule).__qualname__)
            return (f"primitive {primitive.name}: its lowering rule ({what}) is user code ({where}), which the key "
                    f"cannot see")
    user_primitives = _user_primitives() if user_primitives is None else user_primitives
    if rules and id(primitive) in user_primitives:
        return (f"primitive {primitive.name} is defined in the user module {user_primitives[id(primitive)][1]}, "
                f"with a lowering rule registered, which the key cannot see")
    return None


def _jaxpr_types():
    from jax.extend import core

    return core.Jaxpr, core.ClosedJaxpr, core.Literal, core.Var


class _Writer:
    """Writes one program's canonical text into a sha256 (parts separated by NUL-free markers)."""

    def __init__(self):
        self.h = hashlib.sha256()
        self.Jaxpr, self.ClosedJaxpr, self.Literal, self.Var = _jaxpr_types()
        self.seen_jaxprs = {}  # id -> (index, jaxpr): a jaxpr used twice (a shared branch) is written once; the
        # jaxpr is held so that its id cannot be reused by another object during the walk
        self.lowered_by = {}  # id(primitive) -> (primitive, why it is lowered by user code or None), checked once
        self.user_primitives = None  # _user_primitives(), found at the first primitive checked

    def put(self, text):
        self.h.update(text.encode("utf-8", "surrogatepass"))
        self.h.update(b"\x1f")

    def array(self, x):
        a = np.asarray(x)
        self.put(f"array {a.dtype.str} {a.shape}")
        self.h.update(np.ascontiguousarray(a).tobytes())

    def jaxpr(self, jaxpr, consts=()):
        """Write ``jaxpr`` (its constants ``consts`` by value)."""
        if id(jaxpr) in self.seen_jaxprs:
            self.put(f"jaxpr#{self.seen_jaxprs[id(jaxpr)][0]}")
            return
        self.seen_jaxprs[id(jaxpr)] = (len(self.seen_jaxprs), jaxpr)
        names = {}

        def var(v):
            if isinstance(v, self.Literal):
                self.put(f"lit {v.aval}")
                self.value(v.val)
                return
            if v not in names:
                names[v] = len(names)
            self.put(f"v{names[v]}:{v.aval}")

        self.put(f"jaxpr consts={len(jaxpr.constvars)} in={len(jaxpr.invars)} effects={_effects(jaxpr.effects)}")
        for v in (*jaxpr.constvars, *jaxpr.invars):
            var(v)
        for c in consts:
            self.value(c)
        for eqn in jaxpr.eqns:
            self.primitive(eqn.primitive)
            self.put(f"eqn {eqn.primitive.name} {len(eqn.invars)} {len(eqn.outvars)} {_effects(eqn.effects)}")
            for v in (*eqn.invars, *eqn.outvars):
                var(v)
            for name in sorted(eqn.params):
                if (eqn.primitive.name, name) in _RULES_NOT_LOWERED:
                    continue
                self.put(f"param {name}")
                try:
                    self.value(eqn.params[name])
                except Unkeyable as exc:
                    raise Unkeyable(f"{eqn.primitive.name}[{name}]: {exc}") from None
        self.put("out")
        for v in jaxpr.outvars:
            var(v)

    def primitive(self, primitive):
        """Raise :class:`Unkeyable` when ``primitive`` is lowered by user code (:func:`user_lowering`)."""
        held = self.lowered_by.get(id(primitive))
        if held is None:
            if self.user_primitives is None:
                self.user_primitives = _user_primitives()
            held = self.lowered_by[id(primitive)] = (primitive, user_lowering(primitive, self.user_primitives))
        if held[1] is not None:
            raise Unkeyable(held[1])

    def value(self, x):  # noqa: C901 - one branch per kind of value, in order of frequency
        if x is None or isinstance(x, (bool, int, float, complex, str, bytes)):
            self.put(f"{type(x).__name__} {x!r}")
        elif isinstance(x, enum.Enum):
            self.put(f"enum {type(x).__module__}.{type(x).__qualname__}.{x.name}")
        elif isinstance(x, np.dtype):
            self.put(f"dtype {x!r}")
        elif isinstance(x, type):
            self.put(f"type {x.__module__}.{x.__qualname__}")
        elif isinstance(x, self.ClosedJaxpr):
            self.jaxpr(x.jaxpr, x.consts)
        elif isinstance(x, self.Jaxpr):
            self.jaxpr(x)
        elif isinstance(x, (np.ndarray, np.generic)) or type(x).__name__ in ("ArrayImpl", "Array"):
            self.array(x)
        elif isinstance(x, (tuple, list, frozenset, set)):
            items = sorted(x, key=repr) if isinstance(x, (set, frozenset)) else x
            self.put(f"{type(x).__name__} {len(items)}")
            if hasattr(x, "_fields"):  # a named tuple: its type and field names matter
                self.put(f"{type(x).__qualname__} {x._fields}")
            for item in items:
                self.value(item)
        elif isinstance(x, dict):
            self.put(f"dict {len(x)}")
            for k in sorted(x, key=repr):
                self.value(k)
                self.value(x[k])
        elif type(x).__name__ in _BY_REPR:
            text = repr(x)
            if " at 0x" in text:
                raise Unkeyable(f"a {type(x).__name__} whose repr is its address")
            self.put(f"{type(x).__qualname__} {text}")
        elif dataclasses.is_dataclass(x):
            self.put(f"dataclass {type(x).__module__}.{type(x).__qualname__}")
            for f in dataclasses.fields(x):
                self.put(f.name)
                self.value(getattr(x, f.name))
        elif callable(x):
            raise Unkeyable(f"a Python callable ({getattr(x, '__qualname__', type(x).__name__)}) in the program")
        elif hasattr(x, "__dict__") and not hasattr(type(x), "__slots__"):
            self.put(f"object {type(x).__module__}.{type(x).__qualname__}")
            self.value(dict(vars(x)))
        else:
            raise Unkeyable(f"a {type(x).__module__}.{type(x).__qualname__} whose content cannot be read")


def _effects(effects):
    """The effects of a jaxpr or equation without object ids: kind and, for a state effect, the input's index (a
    variable operand's effect follows from the equations written anyway)."""
    return sorted(f"{type(e).__name__}:{i if isinstance(i := getattr(e, 'input_index', None), int) else ''}"
                  for e in effects)


def sha256(closed_jaxpr, *extra):
    """sha256 of ``closed_jaxpr``'s canonical text followed by the JSON-ready ``extra`` parts; raises
    :class:`Unkeyable` when the program holds something whose content cannot be written."""
    w = _Writer()
    w.value(closed_jaxpr)
    for part in extra:
        w.put("extra")
        w.value(part)
    return w.h.hexdigest()
