"""Test support: Gated DeltaNet kernels in serving engines' packed layout, for ``layout=mixed_qkv`` (kernels/adapt.py).

``mixed_gdn(mixed_qkv, a, b, A_log, dt_bias, *, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
cu_seqlens)`` unpacks ``mixed_qkv [B, T, 2 H K + HV V]`` (q | k | v, vLLM's order) and runs our ``gdn-factorized``
with FLA's in-kernel gate (``g = -exp(A_log) softplus(a + dt_bias)``) and beta sigmoid (``beta = sigmoid(b)``): a
correct kernel in that layout. ``mixed_gdn_k_first`` reads k before q (a wrong unpacking). As vLLM's kernels do, they
read ``HV`` from ``a`` and ``K``, ``V`` from the state (``layout=mixed_qkv`` always passes one), hence ``H``.
"""

from __future__ import annotations

from .families import gdn_factorized

_KERNEL = gdn_factorized()


def unpack(mixed_qkv, HV, K, V, *, k_first=False):
    """``(q, k, v)`` of ``mixed_qkv [B, T, 2 H K + HV V]`` (``H = (width - HV V) / 2 / K``)."""
    B, T, width = mixed_qkv.shape
    qk = (width - HV * V) // 2
    q, k, v = (mixed_qkv[..., :qk], mixed_qkv[..., qk:2 * qk], mixed_qkv[..., 2 * qk:])
    if k_first:
        q, k = k, q
    return q.reshape(B, T, qk // K, K), k.reshape(B, T, qk // K, K), v.reshape(B, T, HV, V)


def _run(mixed_qkv, a, b, A_log, dt_bias, *, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
         cu_seqlens, k_first=False):
    q, k, v = unpack(mixed_qkv, a.shape[-1], *initial_state.shape[-2:], k_first=k_first)
    return _KERNEL(q, k, v, a, b, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                   use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=True, A_log=A_log,
                   dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True, cu_seqlens=cu_seqlens)


def mixed_gdn(mixed_qkv, a, b, A_log, dt_bias, *, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, cu_seqlens=None):
    """A correct Gated DeltaNet kernel in the packed layout (module docstring)."""
    return _run(mixed_qkv, a, b, A_log, dt_bias, scale=scale, initial_state=initial_state,
                output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                cu_seqlens=cu_seqlens)


def mixed_gdn_k_first(mixed_qkv, a, b, A_log, dt_bias, *, scale=None, initial_state=None, output_final_state=False,
                      use_qk_l2norm_in_kernel=False, cu_seqlens=None):
    """The same reading k before q: wrong."""
    return _run(mixed_qkv, a, b, A_log, dt_bias, scale=scale, initial_state=initial_state,
                output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                cu_seqlens=cu_seqlens, k_first=True)


