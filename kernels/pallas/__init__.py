"""Pallas TPU (Mosaic) GDN-2 kernels: the pairwise-decay baseline and the boundary-factorized kernel.

``pallas_pairwise(**tile_options)`` and ``pallas_factorized(**tile_options)`` return callables with
the kernel contract of docs/DESIGN.md §2 (``fn(q, k, v, g, b, w, *, scale=None, initial_state=None,
check_values=False) -> (o, final_state)``, differentiable in all seven inputs), as the pure-JAX kernels.
Tile options, named as the pure-JAX kernels' options: ``chunk_size`` (64/128/256),
``split`` (top-level boundary, a multiple of ``leaf``), ``leaf`` (8/16/32), ``interpret``
(``None``/"auto" = Mosaic on a TPU backend, else the TPU interpreter; ``True``/"tpu" = TPU
interpreter; "xla" = the fast generic interpreter; ``False`` = Mosaic; or a
``pltpu.InterpretParams``).
"""

from __future__ import annotations

import functools

from ..contract import CHUNK_SIZE
from .api import check_interpret, gdn2, resolve_interpret
from .config import SWEEP, TileConfig, vmem_footprint, vmem_limit_bytes

__all__ = ["gdn2", "check_interpret", "pallas_pairwise", "pallas_factorized", "make_kernel", "SWEEP",
           "TileConfig", "vmem_footprint", "vmem_limit_bytes", "resolve_interpret"]


def make_kernel(method, *, chunk_size=CHUNK_SIZE, split=None, leaf=16, interpret=None):
    """A contract callable for ``method`` with a validated :class:`TileConfig` (ValueError naming the option).

    Value checks are a call argument, as for the pure-JAX kernels: ``kernel(..., check_values=True)``.
    """
    cfg = TileConfig(method=method, chunk_size=chunk_size, split=split, leaf=leaf)
    check_interpret(interpret)

    def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None, check_values=False):
        """Return (o [B,T,H,V] in v.dtype, final_state [B,H,K,V] float32)."""
        return gdn2(q, k, v, g, b, w, scale=scale, initial_state=initial_state, config=cfg,
                    interpret=interpret, check_values=check_values)

    kernel.__name__ = f"pallas_{cfg.method}"
    kernel.__qualname__ = kernel.__name__
    kernel.config = cfg
    kernel.interpret = interpret
    return kernel


pallas_pairwise = functools.partial(make_kernel, "pairwise")
pallas_factorized = functools.partial(make_kernel, "factorized")
