"""Exact GDN-2 references: NumPy and mpmath token-by-token recurrences with hand-derived adjoints.

This package never imports JAX or ``kernels`` (docs/DESIGN.md §3).
"""

from . import chunked32, mp, recurrence, reductions
from .generate import DECAYS, GATES, KERNEL_DTYPES, QK_MODES, Recipe, make_problem, random_cotangents
from .problem import GRADS, INPUTS, RESULTS, Grads, Problem, named_results

__all__ = ["Problem", "Grads", "GRADS", "INPUTS", "RESULTS", "named_results", "Recipe", "make_problem",
           "random_cotangents",
           "DECAYS", "GATES", "QK_MODES", "KERNEL_DTYPES", "recurrence", "reductions", "mp", "chunked32"]

# FLA chunk_gdn2's training-call modes (packed sequences, in-kernel gate and L2 norm, [V, K] state, chunk-start states),
# and FLA's KDA and Gated DeltaNet families as parametrisations of GDN-2 (docs/DESIGN.md §1, "Families").
from . import call, families, modes, preprocess
from .call import Call
from .modes import ModesForward, ModesGrads

__all__ += ["call", "families", "modes", "preprocess", "Call", "ModesForward", "ModesGrads"]
