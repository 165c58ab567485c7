"""The serving (decode) contract of GDN-2: a pool of states, slot indices, packed and speculative steps.

Exact references (float32 / float64 / longdouble and mpmath) of one decode call as serving engines make it
(docs/DESIGN.md, "Decode contract (serving)"; pinned from FLA ``fla/ops/gdn2/fused_recurrent.py``,
``fused_recurrent_gdn2_fwd`` with ``ssm_state_indices``, ``num_accepted_tokens`` and ``inplace_final_state``,
fla-core 0.6.0). The arithmetic is :mod:`oracle.recurrence`'s ``_token`` / ``_read_out``, token by token;
only the bookkeeping of which slot is read and written is new here.

* ``state_pool: [P, HV, K, V]``: P state slots. Inputs in the layout of docs/DESIGN.md §2 with grouped value heads
  (§1, "Grouped value heads"): ``q, k: [B, T, H, K]``, ``g, b: [B, T, HV, K]``, ``v, w: [B, T, HV, V]``, ``HV = G H``,
  value head ``hv`` reading key head ``hv // G``; ``HV == H`` is the plain layout. ``q, k`` are repeated to the value
  heads (``problem.repeat_heads``) and every value head runs on its own.
* Sequences: without ``cu_seqlens`` each of the B rows is one sequence of T tokens; with ``cu_seqlens``
  (``[N+1]``, ``0 = cu[0] <= ... <= cu[N] = T``) B must be 1 and sequence n is tokens ``cu[n]:cu[n+1]``.
* ``state_indices: [N]`` (one slot per sequence): sequence n starts from ``pool[idx[n]]`` and its final
  state is written back to ``idx[n]``.
* ``state_indices: [N, S]`` (one slot per draft position, speculative decoding): sequence n starts from
  ``pool[idx[n, a_n - 1]]`` with ``a_n = num_accepted_tokens[n]`` (``a_n = 1`` when not given), and the
  state after its token t is written to ``idx[n, t]`` (t < T_n <= S). ``a_n`` is the number of tokens of the
  *previous* call that were accepted, so the slot read is the one that call wrote after its last accepted
  token: the accepted prefix is committed, rejected draft tokens are never read again. Valid: 1 <= a_n <= S.
* Index -1: a padding row (its starting slot is -1): nothing read, nothing written, outputs 0. A -1 at a
  draft column of a live row: that token's state is not written. A sequence with no tokens reads and
  writes nothing (FLA's ``T == 0`` early return). Slots not written are exact copies afterwards.
* Two live sequences (>= 1 token, a starting slot) may not share a slot (read or written): in a kernel
  that is a race. Within one row later writes win, as in FLA's sequential token loop.
* Non-finite inputs are allowed where a serving engine feeds garbage: tokens of padding rows and, with
  ``[N, S]`` indices, draft tokens (a rejected draft may be anything; it makes only its own and later
  outputs and draft slots of its row non-finite, which the next call does not read once it is rejected).
  Everything a live ``[N]`` sequence reads (its tokens and its starting slot) must be finite, and every
  starting slot read must be finite.

Stored-state precision (``decode(..., store_dtype=, carry_dtype=)``): the same call with every stored state rounded to
a 16-bit format (what a kernel with a bfloat16 / float16 pool does: float32 through a call's tokens, one rounding per
store), or with the running state rounded after every token (a kernel that keeps the state in that format inside
its token loop). They are the baselines of the stored-state bound (docs/serving.md, ``ci/grading/serving.py``).

A scripted session (:class:`SessionScript`): :class:`DecodeCall` s chained from an initial pool, as the recipes of
``oracle/serving_recipes.py`` build them and the judge (``ci/grading/serving.py``) grades a kernel on them.

Also the replay identity (:class:`ReplayBuffer`): a checkpoint plus the inputs of the last L tokens
reconstruct the state after any of those tokens. Decode is inference: no gradients here.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import NamedTuple

import mpmath
import numpy as np

from . import call_modes, families, mp, recurrence
from .generate import round_to_bfloat16
from .problem import EXTENSION_FLOATS, INPUTS, check_grouped_layout, check_layout, check_scale, repeat_heads

PAD_SLOT = -1
STATE_DTYPES = ("float32", "bfloat16", "float16")  # what a pool may be stored in (store_dtype / carry_dtype)
MODES = call_modes.names("serving")  # the registry's serving modes: what a scripted session may be
DECODE_MODE = call_modes.get("decode").name  # calls chained on a pool, one slot per sequence (or speculative ones)
SPECULATIVE_MODE = call_modes.get("speculative").name  # draft slots and accepted counts on a pool
# FLA's keyword for the [V, K] layout of a family kernel's pool ([P, HV, V, K]; docs/DESIGN.md §2, "Decode contract")
V_FIRST_KEYWORD = call_modes.STATE_LAYOUT.keywords[0]
GDN2 = families.GDN2.name  # a session's family: GDN-2's own gates, or one of families.MAPPED (FLA's signatures)


class Sequence(NamedTuple):
    """One sequence of a decode call: where its tokens are and which slots it reads and writes."""

    n: int  # sequence number
    row: int  # batch row of its tokens
    start: int  # first token (position on the T axis)
    length: int  # number of tokens T_n
    read: int  # starting slot, PAD_SLOT for a padding row
    writes: tuple  # ((token offset i, slot), ...) in token order
    live: bool  # has tokens and a starting slot: the only sequences that read, write or output anything


class Plan(NamedTuple):
    """The validated bookkeeping of one decode call (shared by every precision)."""

    shape: tuple  # (B, T, HV, K, V): the value heads (q, k repeated to them)
    P: int
    speculative: bool  # state_indices has a draft axis ([N, S])
    sequences: tuple

    @property
    def read_slots(self):
        """Starting slot of every sequence (PAD_SLOT for padding rows), ``[N]``."""
        return np.array([s.read for s in self.sequences], dtype=np.int64)

    @property
    def written_slots(self):
        """Sorted slots a call writes (live sequences only)."""
        return np.array(sorted({slot for s in self.sequences if s.live for _, slot in s.writes}), dtype=np.int64)


class DecodeResult(NamedTuple):
    """One decode call: ``o [B, T, HV, V]`` (0 for padding rows), the new ``pool [P, HV, K, V]``, ``states``
    ``[B, T, HV, K, V]`` (the state after every token, 0 for padding rows), all in the working precision;
    ``read_slots [N]`` and ``written_slots`` (sorted) of the call."""

    o: np.ndarray
    pool: np.ndarray
    states: np.ndarray
    read_slots: np.ndarray
    written_slots: np.ndarray


class DecodeMP(NamedTuple):
    """A decode call in mpmath, rounded to float64, plus per-element error estimates ``errors`` (``o``,
    ``pool``, ``states``: ``|x_prec - x_2prec|``, 0 where nothing was computed)."""

    o: np.ndarray
    pool: np.ndarray
    states: np.ndarray
    read_slots: np.ndarray
    written_slots: np.ndarray
    errors: dict


# --- validation -------------------------------------------------------------------------------------------

def _floats(name, x):
    """A float64 copy of a floating array (float16/32/64, bfloat16 exactly upcast); finiteness checked later."""
    try:
        a = np.asarray(x)
    except Exception as exc:  # noqa: BLE001 - ragged nesting, objects NumPy cannot hold, ...
        raise ValueError(f"{name}: not convertible to an array ({type(exc).__name__}: {exc})") from None
    if not (np.issubdtype(a.dtype, np.floating) or a.dtype.name in EXTENSION_FLOATS):
        raise ValueError(f"{name}: expected a floating-point array, got dtype {a.dtype}")
    return np.array(a, dtype=np.float64)


def _ints(name, x, ndims):
    """An int64 copy of an integer array of rank in ``ndims``."""
    try:
        a = np.asarray(x)
    except Exception as exc:  # noqa: BLE001 - whatever np.asarray raises is a ValueError for the caller
        raise ValueError(f"{name}: not convertible to an array ({type(exc).__name__}: {exc})") from None
    if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name}: expected an integer array, got dtype {a.dtype}")
    if a.ndim not in ndims:
        raise ValueError(f"{name}: expected rank {' or '.join(map(str, ndims))}, got shape {a.shape}")
    return a.astype(np.int64)


def _check_shapes(arrays, pool):
    """The inputs' layout (``problem.check_layout``, or ``check_grouped_layout`` when v has more heads than q) and
    the pool's ``[P >= 1, HV, K, V]``; returns ``(B, T, H, K, V, HV)``."""
    if arrays["v"].ndim == 4 and arrays["q"].ndim == 4 and arrays["v"].shape[2] != arrays["q"].shape[2]:
        B, T, H, K, V, HV = check_grouped_layout(arrays)
    else:
        B, T, H, K, V = check_layout(arrays)
        HV = H
    if pool.ndim != 4 or pool.shape[1:] != (HV, K, V) or pool.shape[0] == 0:
        heads = "H" if HV == H else "HV"
        raise ValueError(f"state_pool: expected shape [P >= 1, {heads}, K, V] = [P, {HV}, {K}, {V}], got {pool.shape}")
    return B, T, H, K, V, HV


def plan(shape, P, state_indices, cu_seqlens=None, num_accepted_tokens=None):
    """Validate the bookkeeping arguments of a decode call of ``shape = (B, T, heads, K, V)`` on a pool of P slots.

    Returns a :class:`Plan`; ValueError naming the argument for anything invalid (see the module docstring).
    """
    B, T = shape[:2]
    idx = _ints("state_indices", state_indices, (1, 2))
    if cu_seqlens is None:
        N = B
        bounds = [(n, 0, T) for n in range(B)]  # (row, start, stop)
    else:
        cu = _ints("cu_seqlens", cu_seqlens, (1,))
        if B != 1:
            raise ValueError(f"cu_seqlens: packed sequences need batch size 1, got B = {B}")
        if cu.size < 2:
            raise ValueError(f"cu_seqlens: expected N + 1 >= 2 offsets, got {cu.size}")
        if cu[0] != 0 or cu[-1] != T or np.any(np.diff(cu) < 0):
            raise ValueError(f"cu_seqlens: expected nondecreasing offsets from 0 to T = {T}, got {cu.tolist()}")
        N = cu.size - 1
        bounds = [(0, int(cu[n]), int(cu[n + 1])) for n in range(N)]
    if idx.shape[0] != N:
        raise ValueError(f"state_indices: expected {N} rows (one per sequence), got shape {idx.shape}")
    speculative = idx.ndim == 2
    if speculative and idx.shape[1] == 0:
        raise ValueError(f"state_indices: no draft columns in shape {idx.shape}")
    if np.any(idx < PAD_SLOT) or np.any(idx >= P):
        bad = idx[(idx < PAD_SLOT) | (idx >= P)]
        raise ValueError(f"state_indices: slot {int(bad[0])} out of range (-1 for padding, else 0..{P - 1})")
    if num_accepted_tokens is not None:
        if not speculative:
            raise ValueError("num_accepted_tokens: needs state_indices of shape [N, S] (one slot per draft token)")
        acc = _ints("num_accepted_tokens", num_accepted_tokens, (1,))
        if acc.shape != (N,):
            raise ValueError(f"num_accepted_tokens: expected shape {(N,)}, got {acc.shape}")
    sequences, owner = [], {}
    for n, (row, start, stop) in enumerate(bounds):
        length = stop - start
        if speculative:
            a = 1 if num_accepted_tokens is None else int(acc[n])
            if length > 0 and not 1 <= a <= idx.shape[1]:
                raise ValueError(f"num_accepted_tokens: sequence {n} has {a}; expected 1..{idx.shape[1]} "
                                 f"(the previous call's accepted tokens, the first of which is always kept)")
            if length > idx.shape[1]:
                raise ValueError(f"state_indices: sequence {n} has {length} tokens but only {idx.shape[1]} "
                                 "draft slots")
            read = int(idx[n, a - 1]) if length > 0 else PAD_SLOT
            writes = tuple((i, int(idx[n, i])) for i in range(length) if idx[n, i] != PAD_SLOT)
        else:
            read = int(idx[n])
            writes = ((length - 1, read),) if length > 0 and read != PAD_SLOT else ()
        live = length > 0 and read != PAD_SLOT
        seq = Sequence(n, row, start, length, read, writes if live else (), live)
        if live:
            for slot in {read, *(s for _, s in seq.writes)}:
                if owner.setdefault(slot, n) != n:
                    raise ValueError(f"state_indices: slot {slot} is used by live sequences {owner[slot]} and {n}")
        sequences.append(seq)
    return Plan(tuple(shape), P, speculative, tuple(sequences))


def _check_values(p, arrays, pool):
    """Finiteness of what a live sequence reads (see the module docstring) and g <= 0 on live tokens."""
    for s in p.sequences:
        if not s.live:
            continue
        if not np.all(np.isfinite(pool[s.read])):
            raise ValueError(f"state_pool: slot {s.read} (read by sequence {s.n}) contains NaN or inf")
        for name in INPUTS:
            x = arrays[name][s.row, s.start:s.start + s.length]
            if not p.speculative and not np.all(np.isfinite(x)):
                raise ValueError(f"{name}: contains NaN or inf (sequence {s.n})")
            if name == "g" and np.any(x > 0):
                raise ValueError(f"g: log-decay must be <= 0 (found a positive entry in sequence {s.n})")


def _prepare(q, k, v, g, b, w, state_pool, state_indices, cu_seqlens, num_accepted_tokens, scale):
    arrays = {name: _floats(name, x) for name, x in zip(INPUTS, (q, k, v, g, b, w))}
    pool = _floats("state_pool", state_pool)
    B, T, H, K, V, HV = _check_shapes(arrays, pool)
    for name in ("q", "k"):  # value head hv reads key head hv // G
        arrays[name] = repeat_heads(arrays[name], HV // H)
    shape = (B, T, HV, K, V)
    p = plan(shape, pool.shape[0], state_indices, cu_seqlens, num_accepted_tokens)
    _check_values(p, arrays, pool)
    return p, arrays, pool, check_scale(scale, shape[3])


# --- execution --------------------------------------------------------------------------------------------

def _state_dtype(name, value):
    """``store_dtype`` / ``carry_dtype``: None or one of STATE_DTYPES (a name or a NumPy dtype)."""
    if value is None:
        return None
    try:
        key = value if isinstance(value, str) else np.dtype(value).name
    except TypeError:
        key = None
    if key not in STATE_DTYPES:
        raise ValueError(f"{name}: expected None or one of {STATE_DTYPES}, got {value!r}")
    return key


def round_state(x, dtype):
    """``x`` rounded to the storage format ``dtype`` (one of STATE_DTYPES; round to nearest even), in x's dtype.

    bfloat16 rounds the float32 value (through :func:`generate.round_to_bfloat16`), as a float32 kernel does;
    float16 rounds directly; NaN stays NaN and values beyond the format's range become inf, as in a kernel.
    """
    x = np.asarray(x)
    if dtype == "float32":
        return x.astype(np.float32).astype(x.dtype)
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(x.dtype)
    if dtype == "bfloat16":
        return round_to_bfloat16(x).astype(x.dtype)
    raise ValueError(f"dtype: {dtype!r} not one of {STATE_DTYPES}")


def _execute(p, arrays, pool, scale, ar, zeros, store=None, carry=None):
    """Run every live sequence token by token with recurrence's core; returns (o, states, {slot: state}).

    ``store`` (a storage dtype name or None): every state written to a slot is rounded to it; ``carry``: the
    running state is rounded to it after every token (before the read-out, as a kernel holding it so would)."""
    B, T, H, K, V = p.shape
    q, k, v, g, b, w = (ar.array(arrays[name]) for name in INPUTS)
    scale = ar.array(scale)[()]
    o, states, written = zeros((B, T, H, V)), zeros((B, T, H, K, V)), {}
    for s in p.sequences:
        if not s.live:
            continue
        S = np.array(ar.array(pool[s.read][None]))  # [1, H, K, V], as recurrence.forward's [B, H, K, V]
        buf = np.empty_like(S)
        write_at = dict(s.writes) if p.speculative else {s.length - 1: s.read}
        for i in range(s.length):
            r, t = s.row, s.start + i
            recurrence.token_step(S, ar.exp(g[r, t][None]), k[r, t][None], b[r, t][None], v[r, t][None],
                              w[r, t][None], buf)
            if carry is not None:
                S[...] = round_state(S, carry)
            o[r, t] = recurrence.read_out(S, q[r, t][None], scale)[0]
            states[r, t] = S[0]
            if i in write_at:  # a later write to the same slot replaces it
                written[write_at[i]] = S[0].copy() if store is None else round_state(S[0], store)
    return o, states, written


def decode(q, k, v, g, b, w, *, state_pool, state_indices, cu_seqlens=None, num_accepted_tokens=None,
           scale=None, dtype=np.float64, store_dtype=None, carry_dtype=None) -> DecodeResult:
    """One decode call in working precision ``dtype`` (float32, float64 or longdouble).

    Inputs ``q, k: [B, T, H, K]``, ``g, b: [B, T, HV, K]``, ``v, w: [B, T, HV, V]`` (any float dtype, upcast
    exactly; ``HV`` a multiple of ``H``, value head ``hv`` reading key head ``hv // (HV // H)``);
    ``state_pool: [P, HV, K, V]``; ``state_indices: [N]`` or ``[N, S]``; ``cu_seqlens: [N+1]`` (then B = 1);
    ``num_accepted_tokens: [N]`` (speculative, with ``[N, S]`` indices). Semantics: module docstring.
    Returns :class:`DecodeResult`; the pool is the input pool converted to ``dtype`` with the written slots
    replaced (so in float64 every other slot keeps its exact value, NaN included).

    Stored-state baselines (module docstring): ``store_dtype`` (one of STATE_DTYPES) rounds every state written
    to a slot to that format, as a kernel whose pool is stored in it (the states it returns stay unrounded: the
    running state is carried in ``dtype``); ``carry_dtype`` rounds the running state after every token (a kernel
    that keeps it in that format inside its loop; then ``states`` and ``o`` see the rounded state). The values
    stay in ``dtype``. None (default): no rounding.
    """
    ar = recurrence.Arith(dtype)
    store, carry = _state_dtype("store_dtype", store_dtype), _state_dtype("carry_dtype", carry_dtype)
    p, arrays, pool, scale = _prepare(q, k, v, g, b, w, state_pool, state_indices, cu_seqlens,
                                      num_accepted_tokens, scale)
    o, states, written = _execute(p, arrays, pool, scale, ar, lambda shape: np.zeros(shape, dtype=ar.dtype),
                                  store, carry)
    new_pool = pool.astype(ar.dtype)
    for slot, S in written.items():
        new_pool[slot] = S
    return DecodeResult(o, new_pool, states, p.read_slots, p.written_slots)


def decode_mp(q, k, v, g, b, w, *, state_pool, state_indices, cu_seqlens=None, num_accepted_tokens=None,
              scale=None, prec=mp.DEFAULT_PREC) -> DecodeMP:
    """:func:`decode` in mpmath at ``prec`` bits (and at 2 prec for the error estimates), rounded to float64."""
    mp.check_prec(prec)
    p, arrays, pool, scale = _prepare(q, k, v, g, b, w, state_pool, state_indices, cu_seqlens,
                                      num_accepted_tokens, scale)
    runs = []
    with np.errstate(invalid="ignore"):  # NaN in tokens nobody reads (rejected drafts, padding rows)
        for bits in (int(prec), 2 * int(prec)):
            with mpmath.workprec(bits):
                runs.append(_execute(p, arrays, pool, scale, mp.MPArith(),
                                     lambda shape: np.zeros(shape, dtype=object)))
        (o, states, written), (o2, states2, written2) = runs
        new_pool, err_pool = pool.copy(), np.zeros_like(pool)
        for slot, S in written.items():
            new_pool[slot] = mp.to_float64(S)
            err_pool[slot] = mp.error_estimate(S, written2[slot])
        errors = {"o": mp.error_estimate(o, o2), "pool": err_pool, "states": mp.error_estimate(states, states2)}
        return DecodeMP(mp.to_float64(o), new_pool, mp.to_float64(states), p.read_slots, p.written_slots, errors)


def read_slots(state_indices, num_accepted_tokens=None):
    """The slot each sequence's next call starts from: ``idx[n]`` or ``idx[n, a_n - 1]`` (PAD_SLOT kept).

    No range checks beyond the accepted counts (use :func:`plan` for a full validation).
    """
    idx = _ints("state_indices", state_indices, (1, 2))
    if idx.ndim == 1:
        if num_accepted_tokens is not None:
            raise ValueError("num_accepted_tokens: needs state_indices of shape [N, S]")
        return idx
    acc = np.ones(idx.shape[0], np.int64) if num_accepted_tokens is None else \
        _ints("num_accepted_tokens", num_accepted_tokens, (1,))
    if acc.shape != idx.shape[:1] or np.any(acc < 1) or np.any(acc > idx.shape[1]):
        raise ValueError(f"num_accepted_tokens: expected {idx.shape[0]} counts in 1..{idx.shape[1]}, "
                         f"got {acc.tolist()}")
    return idx[np.arange(idx.shape[0]), acc - 1]


def committed_state(pool, state_indices, num_accepted_tokens=None):
    """The committed state of every sequence, ``[N, HV, K, V]`` (zeros for padding rows): the slot its next
    call reads, i.e. after a speculative call with ``a_n`` accepted tokens the state after the accepted prefix."""
    pool = np.asarray(pool)
    slots = read_slots(state_indices, num_accepted_tokens)
    if np.any(slots >= pool.shape[0]) or np.any(slots < PAD_SLOT):
        raise ValueError(f"state_indices: slot out of range 0..{pool.shape[0] - 1}")
    out = pool[np.maximum(slots, 0)].copy()
    out[slots == PAD_SLOT] = 0
    return out


# --- scripted sessions: calls chained on a pool -----------------------------------------------------------

@dataclass(frozen=True, eq=False)
class DecodeCall:
    """One decode call's arguments: the six inputs (float64 values, exact in the session's input dtype) and the
    bookkeeping (``state_indices [N]`` or ``[N, S]``, ``cu_seqlens [N+1]``, ``num_accepted_tokens [N]``)."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    g: np.ndarray
    b: np.ndarray
    w: np.ndarray
    state_indices: np.ndarray
    cu_seqlens: np.ndarray | None = None
    num_accepted_tokens: np.ndarray | None = None
    scale: float | None = None

    def inputs(self):
        """The six inputs ``(q, k, v, g, b, w)``."""
        return (self.q, self.k, self.v, self.g, self.b, self.w)

    def bookkeeping(self):
        """The non-None keyword arguments besides the inputs and the pool (``scale`` included)."""
        out = {"state_indices": self.state_indices, "cu_seqlens": self.cu_seqlens,
               "num_accepted_tokens": self.num_accepted_tokens, "scale": self.scale}
        return {k: v for k, v in out.items() if v is not None}

    @property
    def shape(self):
        """``(B, T, H, K, V)`` of the call (``H``: the key heads, q's)."""
        return self.q.shape[:3] + (self.q.shape[3], self.v.shape[3])

    @property
    def HV(self):
        """The value heads (v's): a multiple of ``H`` (docs/DESIGN.md §1, "Grouped value heads")."""
        return self.v.shape[2]

    def family_inputs(self, family):
        """FLA's inputs ``{q, k, v, g, beta}`` of this call in ``family``'s signature (docs/DESIGN.md §1,
        "Families"): ``beta [B, T, HV]`` with ``b = beta 1_K``, ``w = beta 1_V``; ``g [B, T, HV, K]`` (kda) or
        ``[B, T, HV]`` (gdn, ``g = g_gdn 1_K``). ValueError naming the input the family cannot express."""
        if family not in families.MAPPED:
            raise ValueError(f"family: {family!r} not one of {families.MAPPED}")
        beta = self.b[..., 0]
        g = self.g[..., 0] if family == "gdn" else self.g
        for name, x, y in (("b", self.b, beta), ("w", self.w, beta), ("g", self.g, g)):
            if not np.array_equal(x, np.broadcast_to(y[..., None], x.shape) if y.ndim < x.ndim else y,
                                  equal_nan=True):
                raise ValueError(f"{name}: not expressible in the {family} family (b = beta 1_K, w = beta 1_V"
                                 f"{', g = g_gdn 1_K' if family == 'gdn' else ''})")
        return {"q": self.q, "k": self.k, "v": self.v, "g": g, "beta": beta}

    def apply(self, pool, **options):
        """The oracle's :class:`DecodeResult` of this call on ``pool`` (:func:`decode`'s options: ``dtype``,
        ``store_dtype``, ``carry_dtype``)."""
        return decode(*self.inputs(), state_pool=pool, **self.bookkeeping(), **options)

    def plan(self, P):
        """The validated :class:`Plan` of this call on a pool of ``P`` slots (its shape with the value heads)."""
        B, T, _, K, V = self.shape
        return plan((B, T, self.HV, K, V), P, self.state_indices, self.cu_seqlens, self.num_accepted_tokens)


@dataclass(frozen=True, eq=False)
class SessionScript:
    """A scripted serving session: ``calls`` (:class:`DecodeCall`) chained from the initial ``pool [P, HV, K, V]``,
    inputs exact in ``dtype``; ``mode`` (one of :data:`MODES`), ``regime`` and ``purpose`` describe it. What a
    recipe (``oracle/serving_recipes.py``) builds and the judge's session (``ci/grading/serving.py``) is built
    from. ``family``: :data:`GDN2`, or a family of ``families.MAPPED`` whose kernels are called in FLA's signature
    (``q, k, v, g, beta``): every call is then a GDN-2 call that family expresses (:meth:`DecodeCall.family_inputs`),
    so the oracle and the judge run it as GDN-2."""

    name: str
    calls: tuple
    pool: np.ndarray
    dtype: str = "float32"
    mode: str = DECODE_MODE
    regime: dict = field(default_factory=dict)
    purpose: str = ""
    family: str = GDN2

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode: {self.mode!r} not one of the serving modes {MODES}")
        if self.family != GDN2:
            for c in self.calls:
                c.family_inputs(self.family)


# --- the replay identity ----------------------------------------------------------------------------------

def replay(checkpoint, k, v, g, b, w, *, dtype=np.float64):
    """States after each of L tokens replayed from ``checkpoint [..., K, V]``: ``[L, ..., K, V]``.

    Token-major inputs ``k, g, b: [L, ..., K]``, ``v, w: [L, ..., V]`` (leading axes as the checkpoint's).
    """
    ar = recurrence.Arith(dtype)
    S = np.array(ar.array(_state("checkpoint", checkpoint)))
    toks = _tokens(S.shape, k, v, g, b, w, token_axis=True)
    L = toks["k"].shape[0]
    out = np.empty((L,) + S.shape, dtype=S.dtype)
    buf = np.empty_like(S)
    for i in range(L):
        _apply(S, {n: x[i] for n, x in toks.items()}, ar, buf)
        out[i] = S
    return out


class ReplayBuffer:
    """A checkpoint plus a ring buffer of the inputs of the last ``capacity`` tokens (the replay identity).

    ``checkpoint [..., K, V]`` is the state after ``position`` tokens. :meth:`push` appends one token's
    ``k, g, b [..., K]``, ``v, w [..., V]``; when the ring is full the oldest buffered token is folded into
    the checkpoint first (same arithmetic, so nothing is lost). :meth:`state_at` ``(t)`` is the state after
    ``t`` tokens for any ``start <= t <= end`` (the checkpoint's position up to the latest token), recomputed
    from the checkpoint: equal to the token-by-token recurrence's state after token t.
    """

    def __init__(self, checkpoint, capacity, *, position=0, dtype=np.float64):
        self._ar = recurrence.Arith(dtype)
        for name, n, lo in (("capacity", capacity, 1), ("position", position, 0)):
            if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < lo:
                raise ValueError(f"{name}: expected an integer >= {lo}, got {n!r}")
        self._S = np.array(self._ar.array(_state("checkpoint", checkpoint)))
        self._buf = np.empty_like(self._S)
        self._ring = [None] * int(capacity)
        self._head, self._count, self._start = 0, 0, int(position)

    @property
    def capacity(self):
        return len(self._ring)

    @property
    def start(self):
        """Tokens folded into the checkpoint."""
        return self._start

    @property
    def end(self):
        """Tokens seen: the latest state :meth:`state_at` can give."""
        return self._start + self._count

    def push(self, k, v, g, b, w):
        """Buffer one token's inputs (folding the oldest into the checkpoint when the ring is full)."""
        tok = {n: self._ar.array(x) for n, x in _tokens(self._S.shape, k, v, g, b, w, token_axis=False).items()}
        if self._count == self.capacity:
            _apply(self._S, self._ring[self._head], self._ar, self._buf)
            self._head = (self._head + 1) % self.capacity
            self._start += 1
            self._count -= 1
        self._ring[(self._head + self._count) % self.capacity] = tok
        self._count += 1

    def state_at(self, t):
        """The state after ``t`` tokens, ``start <= t <= end``, replayed from the checkpoint."""
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not self.start <= t <= self.end:
            raise ValueError(f"t: expected an integer in [{self.start}, {self.end}] (checkpoint .. latest), got {t!r}")
        S = self._S.copy()
        for i in range(int(t) - self.start):
            _apply(S, self._ring[(self._head + i) % self.capacity], self._ar, self._buf)
        return S


def _state(name, x):
    S = _floats(name, x)
    if S.ndim < 2 or 0 in S.shape:
        raise ValueError(f"{name}: expected a state [..., K, V], got shape {S.shape}")
    if not np.all(np.isfinite(S)):
        raise ValueError(f"{name}: contains NaN or inf")
    return S


def _tokens(state_shape, k, v, g, b, w, *, token_axis):
    """Validated token inputs for a state of ``state_shape [..., K, V]`` (with a leading token axis or not)."""
    *lead, K, V = state_shape
    toks = {}
    for name, x, dim in (("k", k, K), ("v", v, V), ("g", g, K), ("b", b, K), ("w", w, V)):
        a = _floats(name, x)
        want = tuple(lead) + (dim,)
        got = a.shape[1:] if token_axis else a.shape
        if got != want or (token_axis and a.ndim != len(want) + 1):
            raise ValueError(f"{name}: expected shape {('[L] + ' if token_axis else '')}{list(want)}, got {a.shape}")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{name}: contains NaN or inf")
        toks[name] = a
    if token_axis and len({a.shape[0] for a in toks.values()}) != 1:
        raise ValueError(f"v: token counts differ: { {n: a.shape[0] for n, a in toks.items()} }")
    if np.any(toks["g"] > 0):
        raise ValueError("g: log-decay must be <= 0 (found a positive entry)")
    return toks


def _apply(S, tok, ar, buf):
    recurrence.token_step(S, ar.exp(ar.array(tok["g"])), ar.array(tok["k"]), ar.array(tok["b"]), ar.array(tok["v"]),
                      ar.array(tok["w"]), buf)
