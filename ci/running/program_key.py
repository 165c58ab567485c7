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
  it is then traced and lowered every run, never stored.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib

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
