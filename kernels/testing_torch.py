"""Test support: tiny PyTorch GDN-2 kernels, one correct and several wrong, for the torch bridge's tests.

All take FLA's signature ``(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False)``
on ``[B, T, H, dim]`` tensors, so ``torch:gdn2_oracle.kernels.testing_torch:NAME[output_final_state=True]``
runs them. ``recurrent`` is right (the recurrence of docs/DESIGN.md §1, float32); ``perturbed`` is off by
1e-3; the others break the contract one way each (the message the suite must print is in each
docstring). ``head_major_base2`` is ``recurrent`` behind another argument order, layout, decay base
and keyword names, for the argument-mapping options. Imports torch: load only where it is installed.
"""

import math

import torch


def recurrent(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False):
    """GDN-2 token by token in float32: ``S = Diag(exp g) S``, ``S += k (w*v - S^T (b*k))^T``, ``o = scale S^T q``."""
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    state = (torch.zeros(B, H, K, v.shape[-1], dtype=torch.float32, device=q.device) if initial_state is None
             else initial_state.float())
    outs = []
    for t in range(T):
        qt, kt, vt, gt, bt, wt = (x[:, t].float() for x in (q, k, v, g, b, w))  # [B, H, dim]
        state = state * gt.exp()[..., None]
        read = torch.einsum("bhk,bhkv->bhv", bt * kt, state)
        state = state + kt[..., None] * (wt * vt - read)[..., None, :]
        outs.append(scale * torch.einsum("bhk,bhkv->bhv", qt, state))
    return torch.stack(outs, 1).to(v.dtype), (state if output_final_state else None)


def perturbed(*args, **kwargs):
    """``recurrent`` with its output scaled by ``1 + 1e-3``: far outside the float32 tolerance."""
    o, state = recurrent(*args, **kwargs)
    return o * (1 + 1e-3), state


def raises(*args, **kwargs):
    """Always raises: ``RuntimeError: this torch kernel always fails``."""
    raise RuntimeError("this torch kernel always fails")


def rejects_strong_decay(q, k, v, g, b, w, **kwargs):
    """Raises on values (inside the host callback) when some ``g < -20``; right elsewhere."""
    if bool((g < -20).any()):
        raise ValueError("g: log-decay below -20 is not supported by this kernel")
    return recurrent(q, k, v, g, b, w, **kwargs)


def three_results(*args, **kwargs):
    """Returns ``(o, final_state, final_state)``: 3 results, expected 2."""
    o, state = recurrent(*args, **kwargs)
    return o, state, state


def narrow_output(*args, **kwargs):
    """Returns ``o`` without its last value channel: ``o of shape (..., V-1), expected (..., V)``."""
    o, state = recurrent(*args, **kwargs)
    return o[..., :-1], state


def bf16_state(*args, **kwargs):
    """Returns the final state in bfloat16: ``final_state of dtype bfloat16, expected float32``."""
    o, state = recurrent(*args, **kwargs)
    return o, state.to(torch.bfloat16)


def nan_output(*args, **kwargs):
    """Returns NaN in every output element (judged by the tolerance model: rule ``non-finite``)."""
    o, state = recurrent(*args, **kwargs)
    return o * float("nan"), state


def detached(*args, **kwargs):
    """Returns ``o`` detached from autograd: not differentiable."""
    o, state = recurrent(*args, **kwargs)
    return o.detach(), state


def off_device(*args, **kwargs):
    """Returns ``o`` on torch's ``meta`` device instead of the inputs' device."""
    o, state = recurrent(*args, **kwargs)
    return o.to("meta"), state


def no_final_state(*args, **kwargs):
    """Returns ``(o, None)`` unless asked for the final state, as FLA's kernels do."""
    o, state = recurrent(*args, **kwargs)
    return o, state if kwargs.get("output_final_state") else None


def head_major_base2(q, k, v, w, b, g2, sm_scale=None, h0=None):
    """``recurrent`` with order ``q, k, v, w, b, g``, head-major ``[B, H, T, dim]`` tensors and output,
    a base-2 log-decay ``g2 = g / ln 2``, and keywords ``sm_scale`` / ``h0``; always returns the state."""
    g = (g2.double() * math.log(2.0)).float()
    o, state = recurrent(*(x.transpose(1, 2) for x in (q, k, v, g, b, w)), scale=sm_scale, initial_state=h0,
                         output_final_state=True)
    return o.transpose(1, 2), state


def refuses_zeros(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False):
    """Correct, but raises on all-zero keys (it normalises them by their norm, as some kernels assert)."""
    if not bool(torch.any(k != 0)):
        raise ZeroDivisionError("all-zero keys")
    return recurrent(q, k, v, g, b, w, scale=scale, initial_state=initial_state, output_final_state=output_final_state)
