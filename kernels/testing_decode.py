"""Test support: deliberately wrong decode kernels (kernels/decode.py), one bookkeeping bug each.

``kernels/tests/test_decode.py`` proves each of them is caught by the checks that pass the correct kernel:

* ``rejected_committed``: ignores the accepted count and starts from the last draft column, i.e. from the
  state after every draft token of the previous call, rejected ones included.
* ``accept_off_by_one``: starts from column ``a`` instead of ``a - 1`` (one rejected token committed).
* ``wrong_slot``: starts from the slot numbered like the sequence (``pool[n]``) instead of ``pool[idx[n]]``.
* ``padding_writes_slot0``: clamps the padding index -1 to 0, so a padding row reads and writes slot 0.
* ``bf16_in_loop``: a float32-pool kernel whose running state is rounded to bfloat16 after every token.
"""

from __future__ import annotations

import jax.numpy as jnp

from .decode import DecodeKernel


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


MUTANTS = {cls.name: cls for cls in (RejectedCommitted, AcceptOffByOne, WrongSlot, PaddingWritesSlot0, Bf16InLoop)}


def mutant(name, state_dtype="float32"):
    """A wrong decode kernel by name (one of MUTANTS)."""
    if name not in MUTANTS:
        raise ValueError(f"name: {name!r} not one of {tuple(MUTANTS)}")
    return MUTANTS[name](state_dtype)
