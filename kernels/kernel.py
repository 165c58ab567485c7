"""The chunked kernels as callables with the contract of docs/DESIGN.md §2: ``pairwise`` and ``factorized``.

``ChunkedKernel`` checks the arguments and runs the chunked core (kernels/chunked.py); with any of FLA
chunk_gdn2's mode keywords it runs kernels/modes.py instead. The factories validate the options
(``chunk_size``, ``split``, ``leaf``) and are what the registry names.
"""

from __future__ import annotations

from . import modes as fla_modes
from .chunked import Config, run
from .contract import CHUNK_SIZE, check_inputs
from .decay import Factorized, Pairwise

CHUNK_RANGE = (16, 256)


class ChunkedKernel:
    """A GDN-2 kernel with the contract ``fn(q, k, v, g, b, w, *, scale=None, initial_state=None)``."""

    def __init__(self, name, decay, chunk_size):
        self.name, self.decay, self.chunk_size = name, decay, chunk_size

    def __call__(self, q, k, v, g, b, w, *, scale=None, initial_state=None, check_values=False, cu_seqlens=None,
                 use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, A_log=None, dt_bias=None, lower_bound=None,
                 state_v_first=False, return_intermediate_states=False):
        """Return (o [B,T,H,V] in v.dtype, final_state [B,H,K,V] float32).

        The other keywords are FLA chunk_gdn2's training-call modes, with its names and semantics
        (kernels/modes.py); ``return_intermediate_states`` adds a third result.
        """
        modes = dict(cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                     use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
                     state_v_first=state_v_first, return_intermediate_states=return_intermediate_states)
        if fla_modes.requested(**modes):
            return fla_modes.call(self, q, k, v, g, b, w, scale=scale, initial_state=initial_state,
                                  check_values=check_values, **modes)
        _, scale = check_inputs(q, k, v, g, b, w, scale=scale, initial_state=initial_state, check_values=check_values)
        return run(Config(self.chunk_size, scale, self.decay), q, k, v, g, b, w, initial_state)

    def __repr__(self):
        return f"ChunkedKernel({self.name!r}, chunk_size={self.chunk_size}, decay={self.decay})"


def _check_int(name, value, lo, hi):
    """Validate an integer option in [lo, hi]; ValueError naming it otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name}: expected an integer in [{lo}, {hi}], got {value!r}")
    return value


def pairwise(chunk_size=CHUNK_SIZE):
    """Chunked kernel whose score tiles materialise exp(G_r - G_s) per pair and channel (C x C x K)."""
    C = _check_int("chunk_size", chunk_size, *CHUNK_RANGE)
    return ChunkedKernel("pairwise", Pairwise(), C)


def factorized(chunk_size=CHUNK_SIZE, split=None, leaf=16):
    """Chunked kernel with boundary-factorized score tiles: split at ``split`` (default middle), recurse to ``leaf``.

    Blocks of at most ``leaf`` tokens are done pairwise (so ``leaf == chunk_size`` is the pairwise kernel).
    Default leaf 16; on CPU ``leaf=4`` is faster (docs/oracles-and-kernels.md).
    """
    C = _check_int("chunk_size", chunk_size, *CHUNK_RANGE)
    if split is not None:
        _check_int("split", split, 1, C - 1)
    _check_int("leaf", leaf, 1, C)
    return ChunkedKernel("factorized", Factorized(split, leaf), C)
