"""Test support: deliberately wrong GDN-2 kernels (``gdn2_oracle.kernels.testing:perturbed``, ``...:broken``).

``perturbed`` is the pairwise kernel with its output scaled by ``1 + 1e-3``: far outside the
float32 tolerance, so ``gdn2-oracle validate`` must exit 1 and ``bench`` must refuse to time it.
``anchored_kernel()`` is the chunked kernel with the decay anchored at the chunk start
(:class:`AnchoredDecay`): right under moderate decay, NaN once exp(-G) overflows.
``without_initial_state(fn)`` drops the initial state the harness passes.
"""

from dataclasses import dataclass

import jax.numpy as jnp

from .contract import CHUNK_SIZE, MATMUL_PRECISION
from .decay import Pairwise, gap
from .kernel import ChunkedKernel
from .spec import get

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


def anchored_kernel(chunk_size=CHUNK_SIZE):
    """The chunked kernel with :class:`AnchoredDecay` score tiles."""
    return ChunkedKernel("anchored", AnchoredDecay(), chunk_size)


def without_initial_state(fn):
    """``fn`` always called with ``initial_state=None`` (the harness passes one, zeros when a problem has none),
    so the suite can check that omitting it is the same as a zero state (dh0 then comes back zero)."""

    def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):
        return fn(q, k, v, g, b, w, scale=scale)

    return kernel


# --- graded-verdict test kernels (docs/DESIGN.md §4, "Grades and the precision-loss bound") ----------


class _TileDecay(Pairwise):
    """Pairwise score tiles through a decay-factor tensor ``factors(G) [..., n, n, K]`` (zero above the diagonal)."""

    def factors(self, G):
        raise NotImplementedError

    def scores(self, X, Y, G):
        """Lower-including-diagonal score tile through ``factors(G)``."""
        return jnp.einsum("...prc,...rsc->...prs", X, self.factors(G) * Y[..., None, :, :], precision=MATMUL_PRECISION)

    def scores_vjp(self, dS, X, Y, G):
        """(dX, dY) of the score tile through ``factors(G)``."""
        D = self.factors(G)
        dX = jnp.einsum("...prs,...rsc->...prc", dS, D * Y[..., None, :, :], precision=MATMUL_PRECISION)
        dY = jnp.einsum("...prs,...prc,...rsc->...sc", dS, X, D, precision=MATMUL_PRECISION)
        return dX, dY


def _lower(n):
    return jnp.tril(jnp.ones((n, n), bool))[:, :, None]


@dataclass(frozen=True)
class CumsumDifferenceDecay(_TileDecay):
    """exp(G_r - G_s) with G_r, G_s float32 cumulative sums rounded once (``G.total()``): the common practice of
    public chunked kernels. Logic-correct; each factor loses ``ulp(|G|)`` (exponent cancellation)."""

    def factors(self, G):
        Gt = G.total()
        n = Gt.shape[-2]
        return jnp.exp(jnp.where(_lower(n), Gt[..., :, None, :] - Gt[..., None, :, :], -jnp.inf))


@dataclass(frozen=True)
class ClippedDecay(_TileDecay):
    """The exact pairwise exponent clipped to ``[-limit, limit]`` (like the atomic-ops peer): wrong once a decay
    span passes ``limit``."""

    limit: float = 20.0

    def factors(self, G):
        n = G.hi.shape[-2]
        diff = gap(G.map(lambda x: x[..., :, None, :]), G.map(lambda x: x[..., None, :, :]))
        return jnp.exp(jnp.where(_lower(n), jnp.clip(diff, -self.limit, self.limit), -jnp.inf))


@dataclass(frozen=True)
class DampedDecay(Pairwise):
    """The erase tile T scaled by ``1 - eps`` (so the WY solve inverts ``I + (1 - eps) T``, like the peers'
    ``wy_eps``), with its exact gradient; the q-k tile unchanged."""

    eps: float = 1e-3

    def _factor(self, P):
        return jnp.asarray([1.0 - self.eps] + [1.0] * (P - 1), jnp.float32)[:, None, None]

    def scores(self, X, Y, G):
        """The pairwise tiles, the first (erase, T) damped."""
        return super().scores(X, Y, G) * self._factor(X.shape[-3])

    def scores_vjp(self, dS, X, Y, G):
        """(dX, dY) of the damped tiles."""
        return super().scores_vjp(dS * self._factor(X.shape[-3]), X, Y, G)


def cumsum_kernel(chunk_size=CHUNK_SIZE):
    """The chunked kernel with exponents as differences of float32 cumulative sums: grade PRECISION where
    |G| is large (resets, extreme decay), PASS elsewhere."""
    return ChunkedKernel("cumsum-difference", CumsumDifferenceDecay(), chunk_size)


def clipped_kernel(limit=20.0, chunk_size=CHUNK_SIZE):
    """The chunked kernel with its pairwise decay exponent clipped to [-limit, limit] (a FAIL under extreme decay)."""
    return ChunkedKernel("clipped", ClippedDecay(limit), chunk_size)


def damped_kernel(eps=1e-3, chunk_size=CHUNK_SIZE):
    """The chunked kernel solving ``I + (1 - eps) T`` instead of ``I + T`` (a FAIL wherever the erase gate acts)."""
    return ChunkedKernel("damped", DampedDecay(eps), chunk_size)


RESTART_EVERY = 256
_REAL = get("pairwise")


def restarting(q, k, v, g, b, w, *, scale=None, initial_state=None):
    """The pairwise kernel run on RESTART_EVERY-token blocks, every block after the first from a zero state:
    right on sequences up to RESTART_EVERY tokens, wrong after (a block-boundary bug)."""
    outs, state = [], None
    for start in range(0, q.shape[1], RESTART_EVERY):
        block = [x[:, start : start + RESTART_EVERY] for x in (q, k, v, g, b, w)]
        o, state = _REAL(*block, scale=scale, initial_state=initial_state if start == 0 else None)
        outs.append(o)
    return jnp.concatenate(outs, axis=1), state


# An instance for command lines and the plugin (``gdn2_oracle.kernels.testing:cumsum_difference``).
cumsum_difference = cumsum_kernel()


# --- a planted narrow bug for ``gdn2-oracle hunt`` (ci/commands/hunt.py) --------------------------------------

NARROW_LENGTHS = (56, 72)  # the bug below fires only for lengths in this closed range
NARROW_ERASE = 1.5  # ... and only when some erase gate exceeds this (negative-eigenvalue mode)


def narrow(q, k, v, g, b, w, *, scale=None, initial_state=None):
    """The pairwise kernel with its final state scaled by 1 + 1e-2 only when K != V, the length is in
    NARROW_LENGTHS and some erase gate exceeds NARROW_ERASE: a bug that ``validate --cases quick``
    misses and a search over regimes and shapes finds."""
    o, state = _BASE(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
    lo, hi = NARROW_LENGTHS
    if q.shape[-1] == v.shape[-1] or not lo <= q.shape[1] <= hi:
        return o, state
    return o, state * jnp.where(jnp.any(b > NARROW_ERASE), 1 + 1e-2, 1.0).astype(state.dtype)


def clipped_log_decay(q, k, v, g, b, w, *, scale=None, initial_state=None, limit=0.5):
    """The pairwise kernel with every per-token log-decay clipped at ``-limit``: right while each
    ``|g_t| <= limit``, wrong beyond (a planted decay-strength boundary for ``gdn2-oracle domain``)."""
    return _BASE(q, k, v, jnp.maximum(g, -limit), b, w, scale=scale, initial_state=initial_state)
