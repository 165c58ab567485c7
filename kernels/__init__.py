"""GDN-2 kernels under test (JAX / Pallas only; never imports ``oracle``).

``kernels.get("pairwise" | "factorized", **options)`` returns a callable with the contract of
DESIGN.md §2; ``kernels.get("package.module:attr")`` loads any external kernel with that contract.
"""

from .registry import get, names, register

__all__ = ["get", "names", "register"]
