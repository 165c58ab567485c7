"""Gated DeltaNet and KDA serving kernels in FLA's fused recurrent signature: ``gdn-decode`` and ``kda-decode``.

Called as serving engines call FLA's fused recurrent kernels (fla-core 0.6.0 ``fla/ops/kda/fused_recurrent.py:
fused_recurrent_kda_fwd``; vLLM's copy of ``fused_recurrent_gated_delta_rule``; docs/DESIGN.md §2, "Decode contract
(serving)")::

    o, new_pool = fn(q, k, v, g, beta, scale=None, initial_state=pool, inplace_final_state=True, cu_seqlens=None,
                     ssm_state_indices=idx, num_accepted_tokens=None, state_v_first=False,
                     use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                     check_values=False)

``q, k: [B, T, H, K]``, ``v: [B, T, HV, V]`` (``HV = G H``, value head ``hv`` reading key head ``hv // G``),
``beta: [B, T, HV]``, ``g: [B, T, HV]`` (gdn) or ``[B, T, HV, K]`` (kda); the pool ``[P, HV, K, V]`` in the
kernel's ``state_dtype``, or ``[P, HV, V, K]`` with ``state_v_first=True``; the bookkeeping (``ssm_state_indices
[N]`` or ``[N, S]``, ``cu_seqlens``, ``num_accepted_tokens``, -1 padding) is kernels/decode.py's. The pool comes back
updated functionally (JAX): ``inplace_final_state=False`` (FLA's per-token state buffer) is refused.

The map onto GDN-2 is kernels/families.py's :class:`FamilyKernel` steps (L2 norm, ``beta``'s sigmoid, GDN's decay
broadcast over K, ``b = beta 1_K``, ``w = beta 1_V``) with one change: the key heads are not repeated here, the
decode core (:class:`kernels.decode.DecodeKernel`) reads key head ``hv // G`` itself. The pool layout is
:meth:`FamilyDecodeKernel.pool_to_kv` / :meth:`FamilyDecodeKernel.pool_from_kv` (a transpose with
``state_v_first``), so a deliberately wrong kernel (kernels/testing_decode.py) overrides exactly one step.

Without ``ssm_state_indices`` it is the family's training call: packed sequences (``cu_seqlens``, on the host) run
one by one, each from its own initial state; otherwise the dense family call (``initial_state
[B, HV, K, V]``, or ``[B, HV, V, K]`` with ``state_v_first``; ``output_final_state``), differentiable by ``jax.vjp``
through the decode core's token-by-token scan, so ``validate`` judges it on the family's training cases too. Each
kernel has ``family``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .decode import DecodeKernel
from .families import FamilyKernel, check_family_call

V_FIRST = "state_v_first"  # FLA's keyword for the [V, K] state layout


class FamilyDecodeKernel(FamilyKernel):
    """A ``gdn`` / ``kda`` serving kernel over a :class:`DecodeKernel` ``decoder`` (module docstring)."""

    def __init__(self, name, family, decoder=None, state_dtype="float32"):
        decoder = DecodeKernel(state_dtype) if decoder is None else decoder
        super().__init__(name, family, decoder)
        self.decoder, self.state_dtype = decoder, decoder.state_dtype
        self._mapped = jax.jit(self._map, static_argnums=(0,))

    def __repr__(self):
        return f"{type(self).__name__}({self.name!r}, family={self.family!r}, state_dtype={self.state_dtype!r})"

    def __call__(self, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                 inplace_final_state=True, cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None,
                 state_v_first=False, use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                 allow_neg_eigval=False, check_values=False):
        """``(o [B, T, HV, V] in v.dtype, new_pool)`` with ``ssm_state_indices``; else the dense family call
        ``(o, final_state or None)`` (module docstring)."""
        flags = dict(use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                     use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval)
        if ssm_state_indices is None and cu_seqlens is not None and num_accepted_tokens is None:
            return self._packed(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
                                state_v_first, check_values, flags)
        if ssm_state_indices is None:
            if num_accepted_tokens is not None:
                raise ValueError("num_accepted_tokens: needs ssm_state_indices (speculative decoding on a pool)")
            h0 = None if initial_state is None else self.pool_to_kv(initial_state, state_v_first)
            o, final = super().__call__(q, k, v, g, beta, scale=scale, initial_state=h0,
                                        output_final_state=output_final_state, check_values=check_values, **flags)
            return o, (None if final is None else self.pool_from_kv(final, state_v_first))
        if not inplace_final_state:
            raise ValueError("inplace_final_state: must be True with ssm_state_indices (the pool is updated; FLA's "
                             "per-token state buffer is not covered)")
        if not hasattr(initial_state, "shape") or len(initial_state.shape) != 4:
            raise ValueError(f"initial_state: the state pool [P, HV, K, V] is required with ssm_state_indices, got "
                             f"{tuple(getattr(initial_state, 'shape', ())) or type(initial_state).__name__}")
        _, scale, _ = check_family_call(self.family, q, k, v, g, beta, scale=scale, flags=flags)
        xs = self._mapped(tuple(bool(flags[f]) for f in flags), q, k, v, g, beta)
        o, pool = self.decoder(*xs, state_pool=self.pool_to_kv(initial_state, state_v_first),
                               state_indices=ssm_state_indices, cu_seqlens=cu_seqlens,
                               num_accepted_tokens=num_accepted_tokens, scale=scale, check_values=check_values)
        return o.astype(v.dtype), self.pool_from_kv(pool, state_v_first)

    def _packed(self, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, v_first, check_values,
                flags):
        """FLA's varlen training call without a pool: each packed sequence as its own dense call (``cu_seqlens`` on
        the host: ValueError naming it when traced), its final state that of a pool of initial states."""
        try:
            cu = np.asarray(cu_seqlens).astype(np.int64)
        except Exception:  # noqa: BLE001 - a tracer refuses conversion (TracerArrayConversionError or others)
            raise ValueError("cu_seqlens: the packed call without a pool needs host offsets, got a traced array") \
                from None
        N, (HV, V), K = len(cu) - 1, v.shape[2:], q.shape[3]
        if cu.ndim != 1 or N < 1 or cu[0] != 0 or cu[-1] != q.shape[1] or np.any(np.diff(cu) < 0):
            raise ValueError(f"cu_seqlens: expected non-decreasing offsets from 0 to T = {q.shape[1]}, got {cu}")
        shape = (N, HV) + ((V, K) if v_first else (K, V))
        pool = jnp.zeros(shape, jnp.float32) if initial_state is None else initial_state
        outs, finals = [], []
        for n in range(N):
            t0, t1 = int(cu[n]), int(cu[n + 1])
            if t1 == t0:
                finals.append(pool[n])
                continue
            o, final = self(*(x[:, t0:t1] for x in (q, k, v, g, beta)), scale=scale, initial_state=pool[n:n + 1],
                            output_final_state=True, state_v_first=v_first, check_values=check_values, **flags)
            outs.append(o)
            finals.append(final[0])
        o = jnp.concatenate(outs, axis=1) if outs else jnp.zeros(v.shape, v.dtype)
        return o, (jnp.stack(finals) if output_final_state else None)

    # --- the steps (overridden by the mutants of kernels/testing_decode.py) -----------------------------------

    def heads(self, x, G):
        """Key heads stay key heads: the decode core reads key head ``hv // G`` (``DecodeKernel.key_heads``)."""
        return x

    def pool_to_kv(self, pool, v_first):
        """The states ``[..., K, V]`` of a pool in the caller's layout (``[..., V, K]`` with ``state_v_first``)."""
        return jnp.swapaxes(pool, -1, -2) if v_first else pool

    def pool_from_kv(self, pool, v_first):
        """States ``[..., K, V]`` back in the caller's layout."""
        return jnp.swapaxes(pool, -1, -2) if v_first else pool

    def _map(self, static, q, k, v, g, beta):
        l2, sigmoid, neg = static
        return self.to_gdn2(q, k, v, g, beta, l2norm_qk=l2, sigmoid=sigmoid, neg=neg)


def gdn_decode(state_dtype="float32"):
    """``gdn-decode``: Gated DeltaNet serving kernel, pool stored in ``state_dtype`` (float32, bfloat16, float16)."""
    return FamilyDecodeKernel("gdn-decode", "gdn", state_dtype=state_dtype)


def kda_decode(state_dtype="float32"):
    """``kda-decode``: KDA serving kernel, pool stored in ``state_dtype`` (float32, bfloat16, float16)."""
    return FamilyDecodeKernel("kda-decode", "kda", state_dtype=state_dtype)


__all__ = ["V_FIRST", "FamilyDecodeKernel", "gdn_decode", "kda_decode"]
