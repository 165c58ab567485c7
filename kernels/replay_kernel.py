"""The replay decode kernel (``kernels/replay_decode.py``) as a registry kernel: ``replay-recurrent[capacity=16]``.

A :class:`ReplayKernel` carries the ring length ``capacity`` (L), the storage dtypes (``state_dtype`` for the
checkpoint and, unless ``cache_dtype`` says otherwise, the ``d`` / ``k`` caches), and the replay operations
(``ops``: ``new_cache``, ``load``, ``recurrent_step``, ``spec_decode``, ``commit``, ``reset``). Its ``session_driver``
tells the suite to run serving sessions through a replay driver (``ci/running/drivers.py``); it is a Gated DeltaNet
kernel (``family = "gdn"``). Called without a session, it is the dense family call (``o, final_state = fn(q, k, v, g,
beta, scale=, initial_state=, output_final_state=)``, differentiable): each batch row loaded into a slot, its tokens
decoded one by one, the final state folded from the checkpoint and the ring.

``mutant=`` (test support) selects one of ``replay_decode.MUTANTS``: a deliberately wrong kernel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import replay_decode
from .contract import storage_dtype

# The longest replay ring a kernel is built with: its ``d`` / ``k`` caches hold ``capacity`` rows per slot and value
# head (``[slots, HV, capacity, K + V]``), allocated by every session; serving engines use 16-64 tokens and the
# suite's sessions run a few hundred, so a longer ring is never flushed in them: it only costs memory, up to more
# than the host has (a per-session allocation failure, graded FAIL on every serving case, were it built).
MAX_CAPACITY = 1 << 16
MAX_CAPACITY_WHY = ("a longer ring is never flushed in the suite's sessions of a few hundred tokens; its caches, "
                    "[slots, HV, capacity, K + V] per session, only grow with it")


class ReplayKernel:
    """A replay kernel's options and operations (module docstring)."""

    session_driver = "replay"
    family = "gdn"

    def __init__(self, capacity=16, state_dtype="float32", cache_dtype=None, mutant=None):
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"capacity: expected an integer >= 1, got {capacity!r}")
        if capacity > MAX_CAPACITY:
            raise ValueError(f"capacity: {capacity} is over {MAX_CAPACITY} tokens ({MAX_CAPACITY_WHY})")
        state_dtype = storage_dtype("state_dtype", state_dtype)
        cache_dtype = storage_dtype("cache_dtype", cache_dtype or state_dtype)
        if mutant is not None and mutant not in replay_decode.MUTANTS:
            raise ValueError(f"mutant: {mutant!r} not one of {sorted(replay_decode.MUTANTS)}")
        self.capacity, self.state_dtype = int(capacity), state_dtype
        self.cache_dtype = cache_dtype or state_dtype
        self.ops = replay_decode
        self.options = {"mutant": mutant} if mutant else {}
        self.__name__ = "replay-recurrent" + (f"[mutant={mutant}]" if mutant else "")

    def __repr__(self):
        mutant = f", mutant={self.options['mutant']!r}" if self.options else ""
        return (f"ReplayKernel(capacity={self.capacity}, state_dtype={self.state_dtype!r}, "
                f"cache_dtype={self.cache_dtype!r}{mutant})")

    def __call__(self, q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False):
        """The dense gdn family call: ``q, k [B, T, H, K]``, ``v [B, T, HV, V]``, ``g, beta [B, T, HV]``,
        ``initial_state [B, HV, K, V]``; returns ``(o, final_state or None)`` (o in v's dtype)."""
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        ops = self.ops
        cache = ops.new_cache(B + 1, H, HV, K, V, self.capacity, state_dtype=self.state_dtype,
                              cache_dtype=self.cache_dtype)
        slots = jnp.arange(1, B + 1, dtype=jnp.int32)
        h0 = jnp.zeros((B, HV, K, V), jnp.float32) if initial_state is None else initial_state.astype(jnp.float32)
        cache = ops.load(cache, slots, jnp.swapaxes(h0, -1, -2))
        xs = tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, beta))  # token-major for the scan

        def token(cache, x):
            t, xt = x
            wp = jnp.full((B,), t % self.capacity, jnp.int32)
            o_t, cache = ops.recurrent_step(*xt, cache, slots, wp, capacity=self.capacity, scale=scale,
                                            **self.options)
            return cache, o_t

        cache, o = jax.lax.scan(token, cache, (jnp.arange(T, dtype=jnp.int32), xs))
        o = jnp.moveaxis(o, 0, 1)
        if not output_final_state:
            return o, None
        n = T % self.capacity
        return o, jax.vmap(lambda p: fold_slot(cache, p, n))(slots)


def fold_slot(cache, p, n):
    """The ``[HV, K, V]`` float32 state slot ``p`` encodes after its first ``n`` ring entries from position 0:
    ``S <- exp(g_j) S + k_j d_j^T`` from the checkpoint (value head hv reading key head ``hv // G``)."""
    HV, H = cache.d.shape[1], cache.k.shape[1]
    heads = jnp.arange(HV) // (HV // H)
    S = jnp.swapaxes(cache.checkpoint[p].astype(jnp.float32), -1, -2)

    def body(j, S):
        kj = cache.k[p, heads, j].astype(jnp.float32)  # [HV, K]
        dj = cache.d[p, :, j].astype(jnp.float32)  # [HV, V]
        return jnp.exp(cache.g[p, :, j])[:, None, None] * S + kj[:, :, None] * dj[:, None, :]

    return jax.lax.fori_loop(0, n, body, S)


def replay_recurrent(capacity=16, state_dtype="float32", cache_dtype=None, mutant=None):
    """The registry's ``replay-recurrent``: a :class:`ReplayKernel`."""
    return ReplayKernel(int(capacity), state_dtype, cache_dtype, mutant)
