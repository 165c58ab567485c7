"""``gdn-scalar``: Gated DeltaNet with a scalar-decay chunked forward (a fast path worth measuring).

GDN's log-decay is one number per head and token, so every channel has the same factor ``exp(G_r - G_s)``
(docs/DESIGN.md §1, "Where the cost is"): the score tiles need only one C x C decay matrix per chunk,
``T = strict_lower((beta k k^T) * D)``, ``Aqk = lower((q k^T) * D)``, ``D_rs = exp(G_r - G_s)``, instead of the
C x C x K tensor (pairwise) or the boundary factorization's per-channel factors. The rest is the chunk form of
§1 with ``b = beta 1_K``, ``w = beta 1_V``: ``A = (I + T)^{-1}`` (kernels/wy.py), ``Y = A (gamma beta k)``,
``U = A (beta v)``, then a scan over chunks ``R = U - Y S0``, ``O = scale((gamma q) S0 + Aqk R)``,
``S_C = gamma_C S0 + (exp(G_C - G) k)^T R``. The cumulative sums and their differences go through
kernels/decay.py (``log_decay``, ``gap``: no cancellation) on a one-channel view, so the exponents are as
accurate as the other kernels'. Differentiable by JAX autodiff through the scan (no hand-written backward).

Known limit (found by ``validate --cases quick``, case ``gdn_gva2_mixed_logits``: FAIL on ``dg`` only): under extreme
per-head decay (``g ~ -40`` a token) autodiff differentiates ``exp(G_r)`` and ``exp(G_C - G_r)`` after they underflow,
so the tiny ``dg`` of those heads comes out 0 (the factorized kernel's hand-written backward keeps them). The forward
and the other gradients pass; it is a speed experiment, not one of the kernels ``make check`` validates.

:func:`benchmark` times it against ``gdn-factorized`` (the lead's measurement; ci/benchmarks is separate).
"""

from __future__ import annotations

import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from . import wy
from .chunked import from_chunks, to_chunks
from .contract import ACC_DTYPE, CHUNK_SIZE, MATMUL_PRECISION, floor_log_decay
from .decay import gap, log_decay, pair_decay
from .families import FamilyKernel
from .kernel import CHUNK_RANGE
from .modes import l2norm


def _mm(spec, a, b):
    return jnp.einsum(spec, a, b, precision=MATMUL_PRECISION)


@partial(jax.jit, static_argnums=(0, 1))
def scalar_chunked(chunk_size, scale, q, k, v, a, beta, h0):
    """Delta rule with scalar decay on value heads: ``q, k [B, T, HV, K]``, ``v [B, T, HV, V]``, log-decay
    ``a [B, T, HV]``, ``beta [B, T, HV]``, ``h0 [B, HV, K, V]`` or None -> ``(o float32, final_state)``."""
    B, T, HV, K = q.shape
    V = v.shape[-1]
    if h0 is None:
        h0 = jnp.zeros((B, HV, K, V), ACC_DTYPE)
    a = floor_log_decay(a.astype(ACC_DTYPE))
    qc, kc, vc, ac, bc = (to_chunks(x, chunk_size) for x in (q, k, v, a[..., None], beta[..., None]))
    G = log_decay(ac)  # [N, B, HV, C, 1]
    D = pair_decay(G)[..., 0]  # [N, B, HV, C, C], zero above the diagonal
    gamma = jnp.exp(G.total())  # [..., C, 1]
    GC = G.rows(-1)
    Kd = jnp.exp(gap(GC, G)) * kc  # exp(G_C - G_r) k_r
    gC = jnp.exp(GC.total())  # [N, B, HV, 1, 1]: broadcasts on the [K, V] state
    kb = bc * kc
    C = qc.shape[-2]
    strict = jnp.tril(jnp.ones((C, C), bool), -1)
    Tm = jnp.where(strict, _mm("...rk,...sk->...rs", kb, kc) * D, 0.0)
    A = wy.inverse(Tm)
    Y = _mm("...rs,...sk->...rk", A, gamma * kb)
    U = _mm("...rs,...sv->...rv", A, bc * vc)
    Aqk = _mm("...rk,...sk->...rs", qc, kc) * D
    Qg = gamma * qc

    def step(S0, xs):
        Yi, Ui, Aqki, Qgi, Kdi, gCi = xs
        R = Ui - _mm("...rk,...kv->...rv", Yi, S0)
        out = scale * (_mm("...rk,...kv->...rv", Qgi, S0) + _mm("...rs,...sv->...rv", Aqki, R))
        S = gCi * S0 + _mm("...rk,...rv->...kv", Kdi, R)
        return S, out

    hT, o = jax.lax.scan(step, h0.astype(ACC_DTYPE), (Y, U, Aqk, Qg, Kd, gC))
    return from_chunks(o, T), hT


class ScalarGDNKernel(FamilyKernel):
    """``gdn-scalar``: the gdn family's map (L2 norm, GVA, beta sigmoid, gate) around :func:`scalar_chunked`."""

    def __init__(self, chunk_size):
        self.__name__ = self.name = "gdn-scalar"
        self.family, self.core, self.chunk_size = "gdn", None, chunk_size
        self._jitted = jax.jit(self._run, static_argnums=(0, 1, 2))

    def __repr__(self):
        return f"ScalarGDNKernel(chunk_size={self.chunk_size})"

    def __call__(self, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                 use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                 use_gate_in_kernel=False, A_log=None, dt_bias=None, lower_bound=None, check_values=False):
        """The family call without the structural modes (dense ``[K, V]`` states; no packed sequences)."""
        return super().__call__(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                                use_beta_sigmoid_in_kernel, allow_neg_eigval, use_gate_in_kernel, A_log, dt_bias,
                                lower_bound, check_values)

    def _run(self, scale, static, lower_bound, q, k, v, g, beta, h0, A_log, dt_bias):
        l2, sigmoid, neg, use_gate = static
        dtype = v.dtype
        q, k, v, g, beta = (x.astype(ACC_DTYPE) for x in (q, k, v, g, beta))
        G = v.shape[2] // q.shape[2]
        if l2:
            q, k = l2norm(q), l2norm(k)
        q, k = self.heads(q, G), self.heads(k, G)
        beta = self.activate_beta(beta, sigmoid, neg)
        a = self.log_decay(g, A_log, dt_bias, lower_bound, use_gate)
        o, final = scalar_chunked(self.chunk_size, scale, q, k, v, a, beta, h0)
        return o.astype(dtype), final


def gdn_scalar(chunk_size=CHUNK_SIZE):
    """``gdn-scalar``: Gated DeltaNet whose score tiles use one scalar C x C decay matrix per chunk."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or not (
            CHUNK_RANGE[0] <= chunk_size <= CHUNK_RANGE[1]):
        raise ValueError(f"chunk_size: expected an integer in [{CHUNK_RANGE[0]}, {CHUNK_RANGE[1]}], got {chunk_size!r}")
    return ScalarGDNKernel(chunk_size)


def _inputs(B, T, H, HV, K, V, seed=0):
    rng = np.random.default_rng(seed)
    f = partial(jnp.asarray, dtype=jnp.float32)
    return dict(q=f(rng.standard_normal((B, T, H, K))), k=f(rng.standard_normal((B, T, H, K)) / np.sqrt(K)),
                v=f(rng.standard_normal((B, T, HV, V))), g=f(-rng.uniform(0.01, 0.5, (B, T, HV))),
                beta=f(rng.uniform(0, 1, (B, T, HV))), initial_state=f(rng.standard_normal((B, HV, K, V))))


def benchmark(kernels=("gdn-scalar", "gdn-factorized", "gdn-pairwise"), B=1, T=4096, H=4, HV=None, K=64, V=64,
              chunk_size=CHUNK_SIZE, repeats=9, backward=True):
    """Median wall seconds per kernel (forward, and forward + backward through ``jax.vjp`` when ``backward``)
    on one random gdn call, kernels interleaved so that drift hits them alike; compiled before timing.
    Returns ``{name: {"fwd": s, "fwd_bwd": s}}``."""
    from .spec import get  # the registry's names; spec imports nothing of this module at import

    HV = H if HV is None else HV
    x = _inputs(B, T, H, HV, K, V)
    fns = {}
    for name in kernels:
        kern = get(name, chunk_size=chunk_size)

        def fwd(q, k, v, g, beta, h0, kern=kern):
            return kern(q, k, v, g, beta, initial_state=h0, output_final_state=True)

        def fwd_bwd(q, k, v, g, beta, h0, fwd=fwd):
            out, pull = jax.vjp(fwd, q, k, v, g, beta, h0)
            return out, pull(jax.tree_util.tree_map(jnp.ones_like, out))

        fns[name] = {"fwd": jax.jit(fwd), **({"fwd_bwd": jax.jit(fwd_bwd)} if backward else {})}
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"])
    for per in fns.values():
        for fn in per.values():
            jax.block_until_ready(fn(*args))
    times = {name: {mode: [] for mode in per} for name, per in fns.items()}
    for _ in range(repeats):
        for name, per in fns.items():
            for mode, fn in per.items():
                t0 = time.perf_counter()
                jax.block_until_ready(fn(*args))
                times[name][mode].append(time.perf_counter() - t0)
    return {name: {mode: float(np.median(ts)) for mode, ts in per.items()} for name, per in times.items()}
