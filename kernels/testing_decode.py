"""Test support: deliberately wrong decode kernels (kernels/decode.py), one bookkeeping bug each.

``kernels/tests/test_decode.py`` proves each of them is caught by the checks that pass the correct kernel:

* ``rejected_committed``: ignores the accepted count and starts from the last draft column, i.e. from the
  state after every draft token of the previous call, rejected ones included.
* ``accept_off_by_one``: starts from column ``a`` instead of ``a - 1`` (one rejected token committed).
* ``wrong_slot``: starts from the slot numbered like the sequence (``pool[n]``) instead of ``pool[idx[n]]``.
* ``padding_writes_slot0``: clamps the padding index -1 to 0, so a padding row reads and writes slot 0.
* ``bf16_in_loop``: a float32-pool kernel whose running state is rounded to bfloat16 after every token.

:class:`WindowZeroTimes` (not in :data:`MUTANTS`: right on every finite input): the correct kernel, but in a batched
call with draft slots each live token's output adds ``0 *`` the sum of the later tokens of its window, as a kernel that
computes a window's tokens together with structural zeros (a triangular solve by matrix products) does: a NaN draft
the next call rejects reaches the accepted outputs through ``0 * NaN``; any finite draft leaves them exact
(module-level instance ``window_zero_times``).

:class:`NextTokenGate` (not in :data:`MUTANTS`): in a batched call with draft slots, token t decays by token t + 1's
gate (the window's gates shifted by one, the last keeps its own): the last accepted token reads the first rejected
draft, so the accepted outputs move with the rejected drafts' values (module-level instance ``next_token_gate``).

:class:`NanPadding` (not in :data:`MUTANTS`): the correct kernel, but its outputs at padding rows and tokens of no
live sequence are NaN, as a kernel that never stores them (vLLM's fused recurrent kernel) leaves them; its
``padding_output`` is the default contract (exact zeros: caught) or, in ``nan_padding_unwritten``, ``"unwritten"``
(not judged). ``padding_writes_slot0_unwritten``: the ``padding_writes_slot0`` mutant declaring ``"unwritten"``, whose
padding rows still write a slot (caught by the untouched slots).

:class:`KeyHeadModulo` (not in :data:`MUTANTS`: with ``HV == H`` it is the correct kernel): with grouped value heads,
value head ``hv`` reads key head ``hv % H`` instead of ``hv // G``.

Family serving kernels (kernels/family_decode.py), :func:`family_mutant`:

* ``gva_modulo``: over the ``key_head_modulo`` core;
* ``kv_in_vk_pool``: ignores the ``[V, K]`` layout: reads and writes the pool's memory as ``[K, V]`` states (a
  reshape, not a transpose), as a kernel indexing the pool with ``[K, V]`` strides does.
Module-level instances (``gdn_gva_modulo``, ``kda_gva_modulo``, ``gdn_kv_in_vk_pool``, ``kda_kv_in_vk_pool``) serve
as ``module:attr`` kernel specs.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .decode import DecodeKernel
from .family_decode import FamilyDecodeKernel


class RejectedCommitted(DecodeKernel):
    name = "rejected_committed"

    def read_slots(self, indices, accepted):
        return indices if indices.ndim == 1 else indices[:, -1]


class AcceptOffByOne(DecodeKernel):
    name = "accept_off_by_one"

    def read_slots(self, indices, accepted):
        if indices.ndim == 1 or accepted is None:
            return super().read_slots(indices, accepted)
        col = jnp.clip(accepted.astype(indices.dtype), 0, indices.shape[1] - 1)  # forgot the - 1
        return jnp.take_along_axis(indices, col[:, None], axis=1)[:, 0]


class WrongSlot(DecodeKernel):
    name = "wrong_slot"

    def read_slots(self, indices, accepted):
        return jnp.arange(indices.shape[0], dtype=indices.dtype)


class PaddingWritesSlot0(DecodeKernel):
    name = "padding_writes_slot0"

    def address(self, slots, P):
        return jnp.maximum(slots, 0)


class Bf16InLoop(DecodeKernel):
    name = "bf16_in_loop"

    def carry(self, S):
        return S.astype(jnp.bfloat16).astype(S.dtype)


class KeyHeadModulo(DecodeKernel):
    name = "key_head_modulo"

    def key_heads(self, x, G):
        return jnp.concatenate([x] * G, axis=-2)  # head hv = j H + h reads key head h = hv % H


class WindowZeroTimes(DecodeKernel):
    name = "window_zero_times"

    def __call__(self, q, k, v, g, b, w, *, state_pool=None, state_indices=None, cu_seqlens=None, **kw):
        o, pool = super().__call__(q, k, v, g, b, w, state_pool=state_pool, state_indices=state_indices,
                                   cu_seqlens=cu_seqlens, **kw)
        if state_pool is None or cu_seqlens is not None or jnp.ndim(state_indices) != 2:
            return o, pool
        vf = v.astype(jnp.float32)
        later = jnp.cumsum(vf[:, ::-1], axis=1)[:, ::-1] - vf  # [B, T, HV, V]: the sum of the window's later tokens
        live = (jnp.asarray(state_indices)[:, 0] >= 0)[:, None, None, None]
        return jnp.where(live, o + (0.0 * later).astype(o.dtype), o), pool


class NextTokenGate(DecodeKernel):
    name = "next_token_gate"

    def __call__(self, q, k, v, g, b, w, *, state_pool=None, state_indices=None, cu_seqlens=None, **kw):
        if state_pool is not None and cu_seqlens is None and jnp.ndim(state_indices) == 2:
            g = jnp.concatenate([g[:, 1:], g[:, -1:]], axis=1)
        return super().__call__(q, k, v, g, b, w, state_pool=state_pool, state_indices=state_indices,
                                cu_seqlens=cu_seqlens, **kw)


def padding_tokens(shape, state_indices, cu_seqlens=None):
    """``[B, T]`` bool: the tokens of a serving call that belong to no live sequence (a padding row, index -1 at its
    first column; in a packed call a padding sequence's tokens and those past the last sequence)."""
    B, T = shape
    first = np.asarray(state_indices).reshape(len(np.asarray(state_indices)), -1)[:, 0]
    if cu_seqlens is None:
        return np.broadcast_to((first < 0)[:, None], (B, T))
    cu = np.asarray(cu_seqlens)
    seq = np.searchsorted(cu, np.arange(T), side="right") - 1  # the sequence of each token of the packed row
    inside = seq < len(first)
    return (~inside | (first[np.minimum(seq, len(first) - 1)] < 0))[None, :]


class NanPadding(DecodeKernel):
    name = "nan_padding"
    padding_output = "zero"

    def __call__(self, q, k, v, g, b, w, *, state_pool=None, state_indices=None, cu_seqlens=None, **kw):
        o, pool = super().__call__(q, k, v, g, b, w, state_pool=state_pool, state_indices=state_indices,
                                   cu_seqlens=cu_seqlens, **kw)
        if state_pool is None:
            return o, pool
        idle = padding_tokens(o.shape[:2], state_indices, cu_seqlens)
        return jnp.where(jnp.asarray(idle)[:, :, None, None], jnp.nan, o).astype(o.dtype), pool


class NanPaddingUnwritten(NanPadding):
    name = "nan_padding_unwritten"
    padding_output = "unwritten"


class PaddingWritesSlot0Unwritten(PaddingWritesSlot0):
    name = "padding_writes_slot0_unwritten"
    padding_output = "unwritten"


MUTANTS = {cls.name: cls for cls in (RejectedCommitted, AcceptOffByOne, WrongSlot, PaddingWritesSlot0, Bf16InLoop)}


class KvInVkPool(FamilyDecodeKernel):
    """Reads and writes a ``[V, K]`` pool's memory as ``[K, V]`` states."""

    def pool_to_kv(self, pool, v_first):
        *lead, a, b = pool.shape
        return pool.reshape(*lead, b, a) if v_first else pool

    def pool_from_kv(self, pool, v_first):
        *lead, a, b = pool.shape
        return pool.reshape(*lead, b, a) if v_first else pool


FAMILY_MUTANTS = ("gva_modulo", "kv_in_vk_pool")


def mutant(name, state_dtype="float32"):
    """A wrong decode kernel by name (one of MUTANTS)."""
    if name not in MUTANTS:
        raise ValueError(f"name: {name!r} not one of {tuple(MUTANTS)}")
    return MUTANTS[name](state_dtype)


def family_mutant(name, family, state_dtype="float32"):
    """A wrong family serving kernel by name (one of FAMILY_MUTANTS), ``family`` ``gdn`` or ``kda``."""
    label = f"{family}-decode-{name}"
    if name == "gva_modulo":
        return FamilyDecodeKernel(label, family, decoder=KeyHeadModulo(state_dtype))
    if name == "kv_in_vk_pool":
        return KvInVkPool(label, family, state_dtype=state_dtype)
    raise ValueError(f"name: {name!r} not one of {FAMILY_MUTANTS}")


gdn_gva_modulo = family_mutant("gva_modulo", "gdn")
kda_gva_modulo = family_mutant("gva_modulo", "kda")
gdn_kv_in_vk_pool = family_mutant("kv_in_vk_pool", "gdn")
kda_kv_in_vk_pool = family_mutant("kv_in_vk_pool", "kda")
window_zero_times = WindowZeroTimes()
next_token_gate = NextTokenGate()
nan_padding = NanPadding()
nan_padding_unwritten = NanPaddingUnwritten()
padding_writes_slot0_unwritten = PaddingWritesSlot0Unwritten()
# Module-level instances of the GDN-2 mutants, for ``module:attr`` kernel specs (``validate --kernel``).
rejected_committed = mutant("rejected_committed")
accept_off_by_one = mutant("accept_off_by_one")
