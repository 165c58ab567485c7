"""Test support: wrong hand-offs between a prefill kernel and a decode kernel (ci/tests/test_handoff.py).

Prefill kernels in FLA's Gated DeltaNet signature over our ``gdn-factorized`` (``o, final_state = fn(q, k, v, g, beta,
scale=, initial_state=, output_final_state=, cu_seqlens=)``), each handing over a wrong final state:

* :func:`transposed_prefill` -- ``[N, HV, V, K]`` where ``[N, HV, K, V]`` is due (square heads pass every shape check);
* :func:`bf16_twice_prefill` -- its state kept in bfloat16 at the last chunk edge and returned rounded to bfloat16
  (a bfloat16 pool then rounds it again);
* :func:`chunk_early_prefill` -- the state one prefill chunk early: after the last whole 64-token chunk before the
  end of each sequence.

And a decode kernel, :func:`fork_writing_decode`: ``gdn-decode`` that also writes a sequence's last state into the
slot it read when it reads one slot and writes others (a fork writing into the shared slot).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .contract import CHUNK_SIZE
from .families import gdn_factorized
from .family_decode import gdn_decode

PREFILL = gdn_factorized()  # the correct prefill the mutants wrap (one set of compiled programs)
DECODE = gdn_decode()  # the correct decode kernel the fork writer wraps


def _bf16(x):
    return jnp.asarray(x, jnp.float32).astype(jnp.bfloat16).astype(jnp.float32)


def _two_parts(q, k, v, g, beta, scale, cu_seqlens, carry):
    """Each packed sequence run in two parts, split at its last chunk edge before the end (``CHUNK_SIZE * ((T_n -
    1) // CHUNK_SIZE)``), the second from ``carry(state at the edge)``: ``(o, state at the edge, final state)``."""
    cu = np.asarray(cu_seqlens).astype(np.int64)
    edges = [CHUNK_SIZE * ((int(t) - 1) // CHUNK_SIZE) for t in np.diff(cu)]
    head = np.concatenate([np.arange(cu[n], cu[n] + e) for n, e in enumerate(edges)])
    tail = np.concatenate([np.arange(cu[n] + e, cu[n + 1]) for n, e in enumerate(edges)])
    xs = (q, k, v, g, beta)

    def run(index, lengths, h0):
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        return PREFILL(*(x[:, index] for x in xs), scale=scale, initial_state=h0, output_final_state=True,
                        cu_seqlens=offsets)

    o_head, mid = run(head, edges, None)
    o_tail, final = run(tail, np.diff(cu) - np.asarray(edges), carry(mid))
    o = jnp.zeros(v.shape, o_head.dtype).at[:, head].set(o_head).at[:, tail].set(o_tail)
    return o, mid, final


def transposed_prefill(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """``gdn-factorized`` handing over its final state as ``[N, HV, V, K]``: wrong."""
    o, final = PREFILL(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                        output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    return o, (None if final is None else jnp.swapaxes(final, -1, -2))


def bf16_twice_prefill(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """``gdn-factorized`` (packed, from a zero state) with its state rounded to bfloat16 at the last chunk edge and
    at the end: wrong."""
    o, _, final = _two_parts(q, k, v, g, beta, scale, cu_seqlens, _bf16)
    return o, (_bf16(final) if output_final_state else None)


def chunk_early_prefill(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                        cu_seqlens=None):
    """``gdn-factorized`` (packed, from a zero state) handing over each sequence's state one chunk early: wrong."""
    o, early, _ = _two_parts(q, k, v, g, beta, scale, cu_seqlens, lambda h: h)
    return o, (early if output_final_state else None)


def fork_writing_decode(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                        inplace_final_state=True, cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None):
    """``gdn-decode`` that also stores a row's last written state into the slot it read, when it read a slot it does
    not write (a fork from a shared slot): wrong. Its pool is ``[P, HV, K, V]`` only."""
    o, pool = DECODE(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                      output_final_state=output_final_state, inplace_final_state=inplace_final_state,
                      cu_seqlens=cu_seqlens, ssm_state_indices=ssm_state_indices,
                      num_accepted_tokens=num_accepted_tokens)
    idx = None if ssm_state_indices is None else np.asarray(ssm_state_indices)
    if idx is None or idx.ndim != 2:
        return o, pool
    acc = np.ones(idx.shape[0], np.int64) if num_accepted_tokens is None else np.asarray(num_accepted_tokens)
    lengths = [q.shape[1]] * idx.shape[0] if cu_seqlens is None else np.diff(np.asarray(cu_seqlens))
    for n, row in enumerate(idx):
        read, writes = int(row[acc[n] - 1]), [int(s) for s in row[:lengths[n]] if s >= 0]
        if read >= 0 and writes and read not in writes:
            pool = pool.at[read].set(pool[writes[-1]])
    return o, pool


for _fn in (transposed_prefill, bf16_twice_prefill, chunk_early_prefill, fork_writing_decode):
    _fn.family = "gdn"
fork_writing_decode.state_dtype = "float32"
