"""Exact GDN-2 references: NumPy and mpmath token-by-token recurrences with hand-derived adjoints.

This package never imports JAX or ``kernels`` (DESIGN.md §3).
"""

from .problem import GRADS, INPUTS, Grads, Problem
from .generate import DECAYS, GATES, make_problem, random_cotangents
from . import recurrence, reductions, mp

__all__ = ["Problem", "Grads", "GRADS", "INPUTS", "make_problem", "random_cotangents",
           "DECAYS", "GATES", "recurrence", "reductions", "mp"]
