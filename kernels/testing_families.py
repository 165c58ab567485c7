"""Test support: deliberately wrong family kernels (``gdn`` / ``kda``, kernels/families.py), JAX only.

Each is the family kernel over the pairwise chunked kernel (chunk 16) with one planted bug in the map onto
GDN-2, in both families: ``gdn_NAME`` and ``kda_NAME`` (use them as ``gdn2_oracle.kernels.testing_families:
kda_gva_modulo``), each a complete kernel in the family signature with its ``family``. A call that does not
reach the bug (``G = 1``, no beta sigmoid, no gate) is the correct kernel's.

* ``gva_modulo``: value head ``hv`` reads key head ``hv % H`` instead of ``hv // G`` (``jnp.tile`` for
  ``jnp.repeat``; the same when ``G = 1`` or ``H = 1``);
* ``beta_write_only``: beta gates the write only, the erase gate is ``1_K`` instead of ``beta 1_K``
  (``u = beta v - Sbar^T k``);
* ``read_before_decay``: the erase reads the state before the decay, ``r = S_{t-1}^T (beta k)`` instead of
  ``Sbar_t^T (beta k)`` (a token-by-token scan: no chunked kernel can express it);
* ``dt_bias_after_softplus``: the in-kernel gate adds ``dt_bias`` after the softplus,
  ``-exp(A_log) (softplus(g) + dt_bias)`` instead of ``-exp(A_log) softplus(g + dt_bias)`` (KDA's bounded gate
  is left correct);
* ``sigmoid_twice``: beta's sigmoid applied twice, ``s sigmoid(sigmoid(beta))``;
* ``no_neg_eigval``: ``allow_neg_eigval`` ignored, ``sigmoid(beta)`` instead of ``2 sigmoid(beta)``;
* ``bf16_decay``: with bfloat16 inputs the within-chunk cumulative log-decay ``G`` (over 64-token chunks, as FLA's
  ``chunk_local_cumsum``) is kept in bfloat16, so the core decays by ``round_bf16(G_t) - round_bf16(G_{t-1})``
  (float32 inputs: the correct kernel);
* ``padded_tail_gate``: with the in-kernel gate, a dense call is padded to a multiple of 64 tokens with zero
  tokens and the gate applied to the padded raw gates too, so the padded tokens decay the final state (``o`` is
  untouched; exact when ``T`` is a multiple of 64; a packed call is the correct kernel's).

Kernels with a declared domain (``refuses(inputs, keywords)``, the reason a call is outside it, or None), each the
correct kernel inside it: ``gdn_refuses_beta_over_one`` refuses a call with some beta above 1 (as vLLM's raw-gate
kernels, whose ``beta = sigmoid(b)`` cannot express it); ``gdn_refuses_every_call`` refuses every call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .contract import ACC_DTYPE, CHUNK_SIZE, MATMUL_PRECISION, floor_log_decay
from .families import FamilyKernel
from .kernel import pairwise
from .modes import gated_log_decay

_CORE = pairwise(chunk_size=16)


class GvaModulo(FamilyKernel):
    def heads(self, x, G):
        return jnp.tile(x, (1, 1, G, 1))


class BetaWriteOnly(FamilyKernel):
    def gates(self, beta, K, V):
        b, w = super().gates(beta, K, V)
        return jnp.ones_like(b), w


class ReadBeforeDecay(FamilyKernel):
    def run_core(self, q, k, v, g, b, w, scale, h0, structure=None):
        """Token by token: ``S_t = D_t S_{t-1} + k (w v - S_{t-1}^T (b k))^T`` (the read skips the decay); dense calls
        only (``structure``: ValueError)."""
        if structure:
            raise ValueError(f"{next(iter(structure))}: this mutant runs plain calls only (no call modes)")
        B, T, HV, K = q.shape
        V = v.shape[-1]
        S = jnp.zeros((B, HV, K, V), ACC_DTYPE) if h0 is None else h0.astype(ACC_DTYPE)
        g = floor_log_decay(g)

        def step(S, x):
            qt, kt, vt, gt, bt, wt = x
            r = jnp.einsum("bhkv,bhk->bhv", S, bt * kt, precision=MATMUL_PRECISION)
            S = jnp.exp(gt)[..., None] * S + kt[..., None] * (wt * vt - r)[..., None, :]
            return S, scale * jnp.einsum("bhkv,bhk->bhv", S, qt, precision=MATMUL_PRECISION)

        xs = tuple(jnp.moveaxis(x.astype(ACC_DTYPE), 1, 0) for x in (q, k, v, g, b, w))
        S, o = jax.lax.scan(step, S, xs)
        return jnp.moveaxis(o, 0, 1), S


class DtBiasAfterSoftplus(FamilyKernel):
    def log_decay(self, g, A_log, dt_bias, lower_bound, use_gate):
        if not use_gate or dt_bias is None or lower_bound is not None:
            return super().log_decay(g, A_log, dt_bias, lower_bound, use_gate)
        bias = dt_bias.astype(ACC_DTYPE).reshape(g.shape[2:])
        softplus_part = gated_log_decay(g[..., None] if self.family == "gdn" else g, A_log, None, None)
        rate = jnp.exp(A_log.astype(ACC_DTYPE)).reshape((-1,) + (1,) * (g.ndim - 3))
        return softplus_part.reshape(g.shape) - rate * bias


class SigmoidTwice(FamilyKernel):
    def activate_beta(self, beta, sigmoid, neg):
        return super().activate_beta(jax.nn.sigmoid(beta) if sigmoid else beta, sigmoid, neg)


class NoNegEigval(FamilyKernel):
    def activate_beta(self, beta, sigmoid, neg):
        return super().activate_beta(beta, sigmoid, False)


class Bf16Decay(FamilyKernel):
    def to_gdn2(self, q, k, v, g, beta, **kw):
        """The mapped problem, its log-decay rebuilt from a within-chunk cumulative sum rounded to bfloat16 when the
        inputs are bfloat16."""
        out = super().to_gdn2(q, k, v, g, beta, **kw)
        if v.dtype != jnp.bfloat16:
            return out
        qm, km, vm, gm, b, w = out
        T = gm.shape[1]
        pad = -T % CHUNK_SIZE
        G = jnp.pad(gm, [(0, 0), (0, pad), (0, 0), (0, 0)]).reshape(gm.shape[0], -1, CHUNK_SIZE, *gm.shape[2:])
        G = jnp.cumsum(G, axis=2).astype(jnp.bfloat16).astype(ACC_DTYPE)
        G = jnp.concatenate([jnp.zeros_like(G[:, :, :1]), G], axis=2)
        steps = (G[:, :, 1:] - G[:, :, :-1]).reshape(gm.shape[0], -1, *gm.shape[2:])[:, :T]
        return qm, km, vm, steps, b, w


class PaddedTailGate(FamilyKernel):
    def _run(self, scale, static, lower_bound, q, k, v, g, beta, h0, A_log, dt_bias, structure=None):
        """A dense gated call padded with zero tokens to a multiple of 64 (the padded raw gates still decay the
        state), ``o`` cut back to ``T``."""
        T = q.shape[1]
        pad = -T % CHUNK_SIZE
        if not static[3] or structure or not pad:
            return super()._run(scale, static, lower_bound, q, k, v, g, beta, h0, A_log, dt_bias, structure)
        padded = [jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)) for x in (q, k, v, g, beta)]
        o, *rest = super()._run(scale, static, lower_bound, *padded, h0, A_log, dt_bias)
        return (o[:, :T], *rest)


MUTANTS = {"gva_modulo": GvaModulo, "beta_write_only": BetaWriteOnly, "read_before_decay": ReadBeforeDecay,
           "dt_bias_after_softplus": DtBiasAfterSoftplus, "sigmoid_twice": SigmoidTwice,
           "no_neg_eigval": NoNegEigval, "bf16_decay": Bf16Decay, "padded_tail_gate": PaddedTailGate}


def mutant(name, family):
    """The mutant ``name`` (:data:`MUTANTS`) of ``family`` ("gdn" / "kda")."""
    return MUTANTS[name](f"{family}_{name}", family, _CORE)


gdn_gva_modulo, kda_gva_modulo = mutant("gva_modulo", "gdn"), mutant("gva_modulo", "kda")
gdn_beta_write_only, kda_beta_write_only = mutant("beta_write_only", "gdn"), mutant("beta_write_only", "kda")
gdn_read_before_decay, kda_read_before_decay = mutant("read_before_decay", "gdn"), mutant("read_before_decay", "kda")
gdn_dt_bias_after_softplus = mutant("dt_bias_after_softplus", "gdn")
kda_dt_bias_after_softplus = mutant("dt_bias_after_softplus", "kda")
gdn_sigmoid_twice, kda_sigmoid_twice = mutant("sigmoid_twice", "gdn"), mutant("sigmoid_twice", "kda")
gdn_no_neg_eigval, kda_no_neg_eigval = mutant("no_neg_eigval", "gdn"), mutant("no_neg_eigval", "kda")
gdn_bf16_decay, kda_bf16_decay = mutant("bf16_decay", "gdn"), mutant("bf16_decay", "kda")
gdn_padded_tail_gate, kda_padded_tail_gate = mutant("padded_tail_gate", "gdn"), mutant("padded_tail_gate", "kda")


class RefusesBetaOverOne(FamilyKernel):
    def refuses(self, inputs, keywords):
        """Why a call with some beta above 1 (FLA's in-kernel beta sigmoid aside) is outside this kernel's domain."""
        beta = inputs.get("beta")
        if keywords.get("use_beta_sigmoid_in_kernel") or beta is None or np.all(beta <= 1):
            return None
        return f"beta: this kernel takes 0 <= beta <= 1; this call has beta up to {float(np.max(beta)):g}"


class RefusesEveryCall(FamilyKernel):
    def refuses(self, inputs, keywords):
        """Every call is outside this kernel's domain."""
        return "this kernel refuses every call"


gdn_refuses_beta_over_one = RefusesBetaOverOne("gdn_refuses_beta_over_one", "gdn", _CORE)
gdn_refuses_every_call = RefusesEveryCall("gdn_refuses_every_call", "gdn", _CORE)
