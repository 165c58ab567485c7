"""Hand-off sessions: a request prefilled by one kernel, its final states handed into another kernel's pool, decoded.

A :class:`HandoffScript` is a Gated DeltaNet or KDA request (FLA's ``gdn`` or ``kda`` family, :data:`FAMILIES`;
``G = 2`` value heads per key head, square heads ``K = V`` so that a transposed state has the right shape): a packed
prefill of a few sequences (lengths 100 and 128: one that ends inside a 64-token chunk, one on its edge), the slots
each sequence's final state is written to (a fork: several), and the decode calls (steps, a packed call, a
speculative window with an accept count) that continue on those slots (docs/DESIGN.md §2, "Hand-off sessions"). The
oracle's pieces:

* :meth:`HandoffScript.prefill_states` -- the final state of every prefilled sequence, ``[N, HV, K, V]`` (float64,
  or float32 for the baseline), the token-by-token recurrence from a zero state;
* :meth:`HandoffScript.chunk_early_states` -- the state one prefill chunk early (after the last whole 64-token chunk
  before the end), what a prefill that drops its last chunk hands over;
* :meth:`HandoffScript.handed_pool` -- the pool the decode kernel starts from: the other slots' values with each
  sequence's state written to its slots, rounded once to the storage dtype;
* :meth:`HandoffScript.session` -- the decode calls as a :class:`oracle.serving.SessionScript` from a handed pool;
* :func:`request_chain` -- the whole request (prefill, hand-off, decode calls) in one precision: the float64
  reference and the float32 baseline (the prefill's float32 state rounded to the storage dtype once).

Variants (:data:`RECIPES`): ``pool`` (two prefills continued on their own slots), ``fork`` (one prefilled state
copied into two slots and continued by two continuations, a third one reading the shared slot through a draft
column; the shared slot stays bit-identical until its own sequence writes it) and ``installed`` (the session starts
from a given state: another kernel's final state in bfloat16 storage, :attr:`HandoffScript.installed`).

NumPy only (no JAX, no kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import call_modes
from .serving import DECODE_MODE, SPECULATIVE_MODE, DecodeCall, SessionScript, round_state
from .serving_recipes import family_expressed, pool_values, tokens

MODE = call_modes.get("handoff").name  # the registry's name of hand-off sessions (``--modes``)
FAMILY = "gdn"
FAMILIES = ("gdn", "kda")  # FLA's families a session is written in (the prefill's and the decode kernel's)
CHUNK = call_modes.FLA_CHUNK  # the prefill's chunk: "one chunk early" is the state at the last edge before the end
H, K, V, G = 2, 16, 16, 2  # square heads: a [V, K] state passes every shape check
LENGTHS = (100, 128)  # a prefill ending inside a chunk, one ending on a chunk edge


def _inputs(B, T, dtype, seed, family=FAMILY):
    """Six GDN-2 inputs ``[B, T, ...]`` ``family`` expresses (``oracle.serving_recipes.family_expressed``)."""
    return family_expressed(tokens(B, T, dtype, seed, h=H, k=K, v=V, hv=G * H), family)


def _call(xs, idx, cu=None, acc=None):
    """A :class:`DecodeCall` of inputs ``xs`` on slots ``idx`` (int64 bookkeeping)."""
    return DecodeCall(*xs, state_indices=np.asarray(idx, np.int64),
                      cu_seqlens=None if cu is None else np.asarray(cu, np.int64),
                      num_accepted_tokens=None if acc is None else np.asarray(acc, np.int64))


@dataclass(frozen=True, eq=False)
class HandoffScript:
    """A hand-off session (module docstring): ``prefill`` (a packed :class:`DecodeCall` of the prefilled sequences on
    slots ``0..N-1`` of a zero pool: its GDN-2 inputs, ``cu_seqlens``), ``slots`` (per sequence, the decode pool's
    slots its final state is written to), ``pool`` ``[P, HV, K, V]`` (every other slot's value, exact in bfloat16),
    ``calls`` (the decode calls), ``dtype`` (the inputs'), ``mode`` (the calls' serving mode), ``installed`` (None,
    or the storage dtype a given state arrives in: the session starts from the prefill kernel's final state rounded
    to it, judged against the oracle continuing from that same state) and ``purpose``."""

    name: str
    prefill: DecodeCall
    slots: tuple
    pool: np.ndarray
    calls: tuple
    dtype: str = "float32"
    mode: str = DECODE_MODE
    installed: str | None = None
    purpose: str = ""
    family: str = FAMILY

    def __post_init__(self):
        N = len(self.prefill.cu_seqlens) - 1
        if len(self.slots) != N or not all(self.slots):
            raise ValueError(f"slots: expected a non-empty tuple of slots for each of the {N} prefilled sequences")
        flat = [s for group in self.slots for s in group]
        if len(set(flat)) != len(flat) or min(flat) < 0 or max(flat) >= self.pool.shape[0]:
            raise ValueError(f"slots: expected distinct slots in 0..{self.pool.shape[0] - 1}, got {self.slots}")

    @property
    def lengths(self):
        """The prefilled sequences' lengths."""
        return tuple(int(n) for n in np.diff(self.prefill.cu_seqlens))

    def prefill_inputs(self):
        """FLA's inputs ``{q, k, v, g, beta}`` of the prefill (in :attr:`family`) and its ``cu_seqlens``."""
        return self.prefill.family_inputs(self.family), self.prefill.cu_seqlens

    def prefill_states(self, dtype=np.float64, lengths=None):
        """The oracle's state of every prefilled sequence after ``lengths`` tokens (default: all of them), ``[N, HV,
        K, V]`` in ``dtype`` (float64 or float32), from a zero state."""
        lengths = self.lengths if lengths is None else tuple(lengths)
        cu = self.prefill.cu_seqlens
        keep = np.concatenate([np.arange(cu[n], cu[n] + t) for n, t in enumerate(lengths)])
        N, HV = len(lengths), self.prefill.HV
        call = _call([x[:, keep] for x in self.prefill.inputs()], np.arange(N), np.cumsum((0,) + lengths))
        return call.apply(np.zeros((N, HV, K, V)), dtype=dtype).pool

    def chunk_early_states(self):
        """The float64 state one prefill chunk early: after ``CHUNK * ((T_n - 1) // CHUNK)`` tokens of sequence n."""
        return self.prefill_states(lengths=[CHUNK * ((t - 1) // CHUNK) for t in self.lengths])

    def handed_pool(self, states, storage=None):
        """The decode pool after the hand-off: :attr:`pool` with sequence n's ``states[n]`` in each of its slots,
        rounded once to ``storage`` (one of ``oracle.serving.STATE_DTYPES``; None: not rounded), float64."""
        states = np.asarray(states, np.float64)
        if states.shape != (len(self.slots),) + self.pool.shape[1:]:
            raise ValueError(f"states: expected shape {(len(self.slots),) + self.pool.shape[1:]}, got {states.shape}")
        pool = self.pool.copy()
        for n, group in enumerate(self.slots):
            pool[list(group)] = states[n] if storage is None else round_state(states[n], storage)
        return pool

    def session(self, states, storage=None):
        """The decode calls as a :class:`SessionScript` starting from :meth:`handed_pool` ``(states, storage)``."""
        return SessionScript(self.name, self.calls, self.handed_pool(states, storage), dtype=self.dtype,
                             mode=self.mode, regime={"lengths": list(self.lengths), "slots": [list(s) for s in
                                                                                            self.slots]},
                             purpose=self.purpose, family=self.family)


def request_chain(script, states, dtype=np.float64, storage=None):
    """The decode calls of ``script`` chained from ``states`` handed over (rounded once to ``storage``) in ``dtype``,
    every stored state rounded to ``storage``: the :class:`oracle.serving.DecodeResult` of each call."""
    pool = script.handed_pool(states, storage).astype(dtype)
    out = []
    for c in script.calls:
        r = c.apply(pool, dtype=dtype, store_dtype=storage)
        out.append(r)
        pool = r.pool
    return out


def _prefill(dtype, seed, family=FAMILY):
    """The packed prefill of :data:`LENGTHS` on slots ``0..N-1``."""
    cu = np.concatenate([[0], np.cumsum(LENGTHS)])
    return _call(_inputs(1, int(cu[-1]), dtype, seed, family), np.arange(len(LENGTHS)), cu)


def _suffix(dtype):
    return "" if dtype == "float32" else "_bf16"


def pool_session(dtype="float32", seed=0, family=FAMILY):
    """Two prefills continued on their own slots (0, 1; slots 2-4 other sequences' states, never addressed): a
    decode step, a packed call of 2 and 1 tokens, a speculative window of 3 drafts and a call whose accept count
    (2, 1) commits part of it."""
    calls = [_call(_inputs(2, 1, dtype, seed + 1, family), [0, 1]),
             _call(_inputs(1, 3, dtype, seed + 2, family), [1, 0], cu=[0, 2, 3]),
             _call(_inputs(2, 3, dtype, seed + 3, family), [[0, 2, 3], [1, 4, 5]]),
             _call(_inputs(2, 1, dtype, seed + 4, family), [[0, 2, 3], [1, 4, 5]], acc=[2, 1])]
    # the window's draft slots 2..5 start as copies of other sequences' states (never read before written)
    return HandoffScript(f"handoff_{family}_pool{_suffix(dtype)}", _prefill(dtype, seed, family), ((0,), (1,)),
                         pool_values(7, G * H, K, V, seed + 5), tuple(calls), dtype, SPECULATIVE_MODE,
                         purpose="two prefilled sequences (100 and 128 tokens) continued on their slots: steps, a "
                                 "packed call, a speculative window and its accept count", family=family)


def fork_session(dtype="float32", seed=0, family=FAMILY):
    """One prefilled state (sequence 0) copied into slots 0 and 2 and continued by two continuations, a third reading
    the shared slot 0 through a draft column (accept count 2: reads slot 0, writes slot 3) before sequence 0 writes
    it; sequence 1 on slot 1; a window on slots 2, 4 and its
    accept count; slot 5 never addressed."""
    calls = [_call(_inputs(3, 1, dtype, seed + 11, family), [[3, 0], [2, -1], [1, -1]], acc=[2, 1, 1]),
             _call(_inputs(3, 2, dtype, seed + 12, family), [[0, -1], [2, 4], [3, -1]]),
             _call(_inputs(2, 1, dtype, seed + 13, family), [[2, 4], [0, -1]], acc=[2, 1])]
    return HandoffScript(f"handoff_{family}_fork{_suffix(dtype)}", _prefill(dtype, seed, family), ((0, 2), (1,)),
                         pool_values(6, G * H, K, V, seed + 14), tuple(calls), dtype, SPECULATIVE_MODE,
                         purpose="a prefilled state copied into two slots and continued twice, a third "
                                 "continuation reading the shared slot; it stays bit-identical until written",
                         family=family)


def installed_session(dtype="float32", seed=0, family=FAMILY):
    """The pool session started from given states: the prefill kernel's final states rounded to bfloat16 (another
    kernel's run in another storage dtype), judged against the oracle continuing from those states."""
    base = pool_session(dtype, seed, family)
    return HandoffScript(f"handoff_{family}_installed{_suffix(dtype)}", base.prefill, base.slots, base.pool, base.calls,
                         dtype, base.mode, installed="bfloat16",
                         purpose="a session from installed states (another kernel's final states in bfloat16)",
                         family=family)


RECIPES = {"pool": pool_session, "fork": fork_session, "installed": installed_session}


def scripts(dtypes=("float32",), seed=0, family=FAMILY):
    """Every hand-off script (:data:`RECIPES`) in ``family`` (one of :data:`FAMILIES`) for each input dtype."""
    if family not in FAMILIES:
        raise ValueError(f"family: {family!r} not one of {FAMILIES}")
    return [build(dtype, seed, family) for dtype in dtypes for build in RECIPES.values()]
