"""Test support: deliberately wrong kernels for FLA ``chunk_gdn2``'s training-call modes (JAX only).

Each is the pairwise kernel (chunk 64, FLA's) with FLA's keywords and one planted bug that the mode judge
(``ci/grading/modes.py``, ``gdn2-oracle validate --modes``) and the mode properties
(``property_tests/test_modes.py``) must catch. A call without the mode a bug lives in is the correct kernel's.
Use them as ``gdn2_oracle.kernels.testing_modes:NAME``.

* ``leaky_state``: packed sequence n > 0 starts from sequence n - 1's final state (the state leaks across a
  sequence start) instead of its own ``h0[n]``;
* ``leak_inside_chunk``: a sequence that starts inside a 64-token chunk starts from the previous sequence's final
  state (a chunk kernel that resets its state only at chunk starts); one starting on a chunk edge from its ``h0[n]``;
* ``zero_later_states``: every sequence (or batch row) but the first starts from zeros instead of its ``h0[n]``;
* ``final_one_early``: the final state is taken one token early (the state before each sequence's last token);
* ``l2norm_eps_outside``: the q/k L2 norm as ``x / (||x|| + eps)`` instead of ``x / sqrt(||x||^2 + eps)``;
* ``lower_bound_outside``: the bounded gate scales the result instead of the argument,
  ``lower_bound * exp(A_log) * sigmoid(x)`` instead of ``lower_bound * sigmoid(exp(A_log) * x)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .kernel import pairwise
from .modes import L2NORM_EPS

_BASE = pairwise()  # chunk 64: its states at chunk starts are FLA's


class ModeMutant:
    """A kernel with FLA's keywords whose ``__call__`` routes through ``bug`` (``bug(kw) -> (o, final, ...)``)."""

    chunk_size = _BASE.chunk_size

    def __init__(self, name, bug):
        self.name, self._bug = name, bug

    def __call__(self, q, k, v, g, b, w, *, scale=None, initial_state=None, check_values=False, cu_seqlens=None,
                 use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, A_log=None, dt_bias=None, lower_bound=None,
                 state_v_first=False, return_intermediate_states=False):
        kw = dict(scale=scale, initial_state=initial_state, check_values=check_values, cu_seqlens=cu_seqlens,
                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
                  A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound, state_v_first=state_v_first,
                  return_intermediate_states=return_intermediate_states)
        return self._bug((q, k, v, g, b, w), kw)

    def __repr__(self):
        return f"ModeMutant({self.name!r})"


def _base(xs, kw):
    return _BASE(*xs, **kw)


def _lengths(kw, T):
    cu = kw["cu_seqlens"]
    return [T] if cu is None else np.diff(np.asarray(cu)).tolist()


def _leak(xs, kw, carried=lambda t0: True):
    """Packed: each sequence alone (dense calls), sequence n > 0 starting at token ``t0`` from sequence n - 1's final
    state where ``carried(t0)``, else from its own ``h0[n]`` (zeros without h0)."""
    if kw["cu_seqlens"] is None:
        return _base(xs, kw)
    cu = np.asarray(kw["cu_seqlens"])
    h0 = kw["initial_state"]
    dense = dict(kw, cu_seqlens=None)
    outs, finals, inter, state = [], [], [], None
    for n in range(len(cu) - 1):
        t0, t1 = int(cu[n]), int(cu[n + 1])
        start = (None if h0 is None else h0[n:n + 1]) if n == 0 or not carried(t0) else state
        if t1 == t0:
            state = start if start is not None else _zero_state(xs, kw)
            finals.append(state)
            continue
        res = _BASE(*(x[:, t0:t1] for x in xs), **dict(dense, initial_state=start))
        outs.append(res[0])
        state = res[1]
        finals.append(state)
        if kw["return_intermediate_states"]:
            inter.append(res[2])
    out = (jnp.concatenate(outs, axis=1), jnp.concatenate(finals, axis=0))
    return out + ((jnp.concatenate(inter, axis=1),) if kw["return_intermediate_states"] else ())


def _leak_inside_chunk(xs, kw):
    """Packed: the state carried across a sequence start only where it falls inside a chunk of the kernel's."""
    return _leak(xs, kw, carried=lambda t0: t0 % _BASE.chunk_size != 0)


def _zero_state(xs, kw):
    """A zero state of one sequence in the call's layout."""
    _, _, H, K = xs[0].shape
    V = xs[2].shape[-1]
    return jnp.zeros((1, H) + ((V, K) if kw["state_v_first"] else (K, V)), jnp.float32)


def _zero_later(xs, kw):
    h0 = kw["initial_state"]
    if h0 is None or h0.shape[0] < 2:
        return _base(xs, kw)
    return _base(xs, dict(kw, initial_state=h0.at[1:].set(0.0)))


def _final_early(xs, kw):
    """o (and the chunk-start states) from the real call; the final state from a call in which each sequence's
    last token is an identity token (k = b = w = 0, log-decay 0), i.e. the state one token early."""
    res = _base(xs, kw)
    q, k, v, g, b, w = xs
    T = q.shape[1]
    last = np.zeros(T, bool)
    ends = np.cumsum(_lengths(kw, T))
    for n, L in enumerate(_lengths(kw, T)):
        if L:
            last[ends[n] - 1] = True
    keep = jnp.asarray(~last)[None, :, None, None]
    # the raw gate's pre-activation for a log-decay of 0: softplus / sigmoid of -1e4 is 0 in float32
    g_id = jnp.where(keep, g, -1e4 if kw["use_gate_in_kernel"] else 0.0).astype(g.dtype)
    early = _base((q, k * keep, v, g_id, b * keep, w * keep), dict(kw, return_intermediate_states=False))
    return (res[0], early[1]) + tuple(res[2:])


def _l2norm_outside(xs, kw):
    if not kw["use_qk_l2norm_in_kernel"]:
        return _base(xs, kw)
    q, k, *rest = xs

    def wrong(x):
        x = x.astype(jnp.float32)
        # the norm's gradient at a zero row taken as 0 (not NaN), so the bug shows as a value, not a NaN
        norm = jnp.sqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), 1e-30))
        return x / (norm + L2NORM_EPS)

    return _base((wrong(q), wrong(k), *rest), dict(kw, use_qk_l2norm_in_kernel=False))


def _lower_bound_outside(xs, kw):
    if not (kw["use_gate_in_kernel"] and kw["lower_bound"] is not None):
        return _base(xs, kw)
    q, k, v, g, b, w = xs
    H, K = g.shape[-2:]
    x = g.astype(jnp.float32)
    if kw["dt_bias"] is not None:
        x = x + kw["dt_bias"].astype(jnp.float32).reshape(H, K)
    A = 1.0 if kw["A_log"] is None else jnp.exp(kw["A_log"].astype(jnp.float32))[:, None]
    g_log = kw["lower_bound"] * A * jax.nn.sigmoid(x)  # the bug: A scales the result, not the argument
    plain = dict(kw, use_gate_in_kernel=False, A_log=None, dt_bias=None, lower_bound=None)
    return _base((q, k, v, g_log, b, w), plain)


leaky_state = ModeMutant("leaky_state", _leak)
leak_inside_chunk = ModeMutant("leak_inside_chunk", _leak_inside_chunk)
zero_later_states = ModeMutant("zero_later_states", _zero_later)
final_one_early = ModeMutant("final_one_early", _final_early)
l2norm_eps_outside = ModeMutant("l2norm_eps_outside", _l2norm_outside)
lower_bound_outside = ModeMutant("lower_bound_outside", _lower_bound_outside)
# The correct kernel behind the same wrapper (a control for the tests).
correct = ModeMutant("correct", _base)

MUTANTS = {m.name: m for m in (leaky_state, leak_inside_chunk, zero_later_states, final_one_early, l2norm_eps_outside,
                               lower_bound_outside)}
