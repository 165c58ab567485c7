"""GDN-2 kernels under test (JAX / Pallas only; nothing outside ``kernels/tests`` depends on ``oracle``).

``kernels.get("pairwise" | "factorized" | "factorized[leaf=8]", **options)`` returns a callable with
the contract of docs/DESIGN.md §2; ``kernels.get("package.module:attr")`` loads any external kernel
with that contract. The spec grammar and resolution live in ``kernels/spec.py``, the names in
``kernels/registry.py``.
"""

from .spec import (
    DEFAULTS,
    KernelSpec,
    accepts,
    get,
    known,
    names,
    parse_spec,
    parse_value,
    register,
    resolve,
    split_specs,
)

__all__ = ["DEFAULTS", "KernelSpec", "accepts", "get", "known", "names", "parse_spec", "parse_value", "register",
           "resolve", "split_specs"]
