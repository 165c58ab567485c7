"""Independent closed forms and reduced models: gated linear attention (b = 0), KDA, Gated DeltaNet."""

from __future__ import annotations

import numpy as np

from .problem import Problem


def gla_forward(problem: Problem):
    """Closed form for ``b = 0``: ``o_t = scale [sum_{j<=t} (sum_c q_tc k_jc e^{G_tc-G_jc}) z_j + (gamma_t q_t) h0]``.

    An explicit O(T^2) sum over token pairs (float64), independent of the recurrence. Returns
    ``(o, final_state)``; only valid when every erase gate ``b`` is zero.
    """
    if np.any(problem.b != 0):
        raise ValueError("b: the gated-linear-attention closed form needs b == 0")
    problem = problem.per_value_head()  # grouped value heads: q, k repeated, so H == HV below
    B, T, H, K, V = problem.shape
    q, k, v, g, _, w = problem.inputs()
    G = np.cumsum(g, axis=1)  # [B, T, H, K]
    z = w * v
    h0 = problem.h0()
    # Pair decay exp(G_t - G_j) for j <= t, per channel; masked pairs get -inf before exp.
    diff = G[:, :, None] - G[:, None, :]  # [B, T(t), T(j), H, K]
    causal = np.tril(np.ones((T, T), dtype=bool))[None, :, :, None, None]
    decay = np.exp(np.where(causal, diff, -np.inf))
    scores = np.einsum("bthc,bjhc,btjhc->bhtj", q, k, decay)
    o = np.einsum("bhtj,bjhv->bthv", scores, z)
    o += np.einsum("bthc,bhcv->bthv", q * np.exp(G), h0)
    final = np.exp(G[:, -1])[..., None] * h0 + np.einsum(
        "bjhc,bjhv->bhcv", k * np.exp(G[:, -1:] - G), z)
    return problem.scale * o, final


def kda_problem(q, k, v, g, beta, *, scale=None, initial_state=None) -> Problem:
    """KDA as GDN-2: erase and write gates both ``beta * 1`` (``beta: [B, T, HV]``, per value head as v)."""
    beta = np.asarray(beta, dtype=np.float64)
    K, V = np.shape(q)[-1], np.shape(v)[-1]
    if beta.shape != np.shape(v)[:3]:
        raise ValueError(f"beta: shape {beta.shape} does not match [B, T, HV] = {np.shape(v)[:3]}")
    b = np.repeat(beta[..., None], K, axis=-1)
    w = np.repeat(beta[..., None], V, axis=-1)
    return Problem(q, k, v, g, b, w, scale=scale, initial_state=initial_state)


def gated_deltanet_problem(q, k, v, g, beta, *, scale=None, initial_state=None) -> Problem:
    """Gated DeltaNet as GDN-2: scalar log-decay per value head and token (``g: [B, T, HV]``), gates ``beta``."""
    g = np.asarray(g, dtype=np.float64)
    if g.shape != np.shape(v)[:3]:
        raise ValueError(f"g: shape {g.shape} does not match [B, T, HV] = {np.shape(v)[:3]}")
    G = np.repeat(g[..., None], np.shape(q)[-1], axis=-1)
    return kda_problem(q, k, v, G, beta, scale=scale, initial_state=initial_state)


REDUCTIONS = ("kda", "gdn")


def reduce(problem: Problem, kind: str) -> Problem:
    """The KDA (``"kda"``) or Gated DeltaNet (``"gdn"``) reduction of a general problem.

    ``beta = b[..., 0]`` (so the erase-gate regime chooses how beta is drawn), ``b = w = beta * 1``;
    Gated DeltaNet also takes a scalar log-decay per head and token, ``g[..., 0]``. The scale and the
    initial state are kept.
    """
    if kind not in REDUCTIONS:
        raise ValueError(f"reduction: {kind!r} not one of {REDUCTIONS}")
    beta = problem.b[..., 0]
    kw = dict(scale=problem.scale, initial_state=problem.initial_state)
    if kind == "kda":
        return kda_problem(problem.q, problem.k, problem.v, problem.g, beta, **kw)
    return gated_deltanet_problem(problem.q, problem.k, problem.v, problem.g[..., 0], beta, **kw)
