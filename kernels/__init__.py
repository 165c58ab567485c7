"""GDN-2 kernels under test (JAX / Pallas only; nothing outside ``kernels/tests`` depends on ``oracle``).

``kernels.get("pairwise" | "factorized" | "factorized[leaf=8]", **options)`` returns a callable with
the contract of docs/DESIGN.md §2; ``kernels.get("package.module:attr")`` loads any external kernel
with that contract.
"""

from .registry import DEFAULTS, get, known, names, parse_spec, parse_value, register

__all__ = ["DEFAULTS", "get", "known", "names", "parse_spec", "parse_value", "register"]
