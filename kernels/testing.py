"""Test support: deliberately wrong GDN-2 kernels (``gdn2_oracle.kernels.testing:perturbed``, ``...:broken``).

``perturbed`` is the pairwise kernel with its output scaled by ``1 + 1e-3``: far outside the
float32 tolerance, so ``gdn2-oracle validate`` must exit 1 and ``bench`` must refuse to time it.
``anchored_kernel()`` is the chunked kernel with the decay anchored at the chunk start
(:class:`AnchoredDecay`): right under moderate decay, NaN once exp(-G) overflows.
``without_initial_state(fn)`` drops the initial state the harness passes.
"""

import jax.numpy as jnp

from .chunked import ChunkedKernel
from .contract import MATMUL_PRECISION
from .decay import Pairwise
from .registry import get

_BASE = get("pairwise", chunk_size=16)


def perturbed(q, k, v, g, b, w, *, scale=None, initial_state=None):
    o, s = _BASE(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
    return (o * (1 + 1e-3)).astype(o.dtype), s


def broken(q, k, v, g, b, w, *, scale=None, initial_state=None):
    raise RuntimeError("this kernel always fails")


def correct(q, k, v, g, b, w, *, scale=None, initial_state=None):
    return _BASE(q, k, v, g, b, w, scale=scale, initial_state=initial_state)


class AnchoredDecay(Pairwise):
    """Score tiles with the decay anchored at the chunk start: (X exp(G_r)) @ (Y exp(-G_s))^T.

    The decay-strategy interface of kernels/decay.py (G a ``LogDecay``; used here as one array,
    ``G.total()``). Algebraically the same tile; numerically exp(-G_s) overflows float32 once the
    within-chunk decay span passes ~88 (docs/DESIGN.md §1) and inf * 0 gives NaN.
    """

    @staticmethod
    def _mask(n):
        return jnp.tril(jnp.ones((n, n), bool))

    def scores(self, X, Y, G):
        """Lower-including-diagonal score tile through exp(G_r) and exp(-G_s)."""
        G = G.total()
        S = jnp.einsum("...prc,...sc->...prs", X * jnp.exp(G)[..., None, :, :], Y * jnp.exp(-G),
                       precision=MATMUL_PRECISION)
        return jnp.where(self._mask(G.shape[-2]), S, 0.0)

    def scores_vjp(self, dS, X, Y, G):
        """(dX, dY) of the anchored score tile."""
        G = G.total()
        dS = jnp.where(self._mask(G.shape[-2]), dS, 0.0)
        up, down = jnp.exp(G), jnp.exp(-G)
        dX = jnp.einsum("...prs,...sc->...prc", dS, Y * down, precision=MATMUL_PRECISION) * up[..., None, :, :]
        dY = jnp.einsum("...prs,...prc->...sc", dS, X * up[..., None, :, :], precision=MATMUL_PRECISION) * down
        return dX, dY


def anchored_kernel(chunk_size=64):
    """The chunked kernel with :class:`AnchoredDecay` score tiles."""
    return ChunkedKernel("anchored", AnchoredDecay(), chunk_size)


def without_initial_state(fn):
    """``fn`` always called with ``initial_state=None`` (the harness passes one, zeros when a problem has none),
    so the suite can check that omitting it is the same as a zero state (dh0 then comes back zero)."""

    def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):
        return fn(q, k, v, g, b, w, scale=scale)

    return kernel
