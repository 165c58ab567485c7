"""Serving sessions for ``validate --modes decode,speculative`` and the serving properties: deterministic recipes.

Each recipe builds a :class:`oracle.serving.SessionScript` (an initial pool and decode calls chained on it; the
judge's session, ``ci/grading/serving.py``, is built from it) from an input dtype and a seed; its mode is the
registry's (``oracle/call_modes.py``):

* ``pool_gather_scatter`` (decode): packed and batched calls on a 10-slot pool, slots unrelated to sequence
  numbers, an empty sequence, padding rows (-1) fed NaN, a NaN slot never addressed, repeated calls;
* ``chunked_prefill`` (decode): two sequences in different phases packed into each call (prefill chunks of 6, 4,
  3 tokens continuing from their slot, decode steps), with a padding sequence;
* ``speculative_accept`` (speculative): 4 draft slots per sequence; over the calls every sequence is told every
  accept count 1..4; rejected drafts are NaN (:func:`finite_drafts` fills them for a kernel's runs), draft slots
  start NaN, a row with -1 draft columns, a padding row, a final packed call with fewer tokens than draft slots;
* ``long_horizon`` (decode): 4,096 single-token calls at per-step decay 0.99992 (the stored-state figure);
* ``long_horizon_prefill`` (decode): 4,096 tokens as 16 calls of 256 tokens, one head only decaying: one store per
  256 tokens, so a state kept in 16 bits inside the token loop (which stalls the decay) is told apart from a 16-bit
  pool (which does not at 256 tokens a store).

:data:`QUICK` names the few cheap ones of ``validate``'s ``quick`` set (the horizons run in ``full`` only).

Every builder takes a ``size`` (:data:`SIZES`: ``small``, H = 2, K = 16, V = 8, the default; ``k128``, K = V = 128,
the head dimensions real kernels launch at); :func:`builders` / :func:`family_builders` give the builders of a case
set, so a runner builds a session at the size a kernel asks for. Rejected drafts (:func:`rejected_drafts`: tokens of
live sequences fed NaN) stay NaN in the scripts, so the reference never reads them; :func:`finite_drafts` fills them
with finite tokens for the kernel's runs (docs/serving.md, "Rejected drafts").

Family sessions (:data:`FAMILY_RECIPES`, :func:`family_sessions`): the sessions of a ``gdn`` / ``kda`` kernel called
in FLA's signature (``q, k, v, g, beta``), with grouped value heads (G = 2 in the decode kind, G = 4 in the
speculative one) and ``b = beta 1_K``, ``w = beta 1_V`` (for ``gdn`` one log-decay per head and token broadcast
over K): GDN-2 sessions their family expresses (``SessionScript.family``), so the oracle and the judge run them as
GDN-2. Small: every one is in the quick set.

The runner side (``case.run(fn)``, ``serving_cases``, ``accepts_serving``) is ``ci/running/serving.py``.

NumPy only (docs/DESIGN.md §3): no JAX, no kernels, no judge.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from .generate import make_problem, round_to, round_to_bfloat16
from .serving import DECODE_MODE, GDN2, MODES, SPECULATIVE_MODE, DecodeCall, SessionScript

H, K, V = 2, 16, 8  # the short sessions' heads and dimensions
# session sizes a kernel can ask for (``session_size``): the short sessions' (H, K, V), and real launch shapes
SIZES = {"small": (H, K, V), "k128": (H, 128, 128)}
DRAFTS = 4
POISONINGS = (1, 2)  # the finite poisonings of rejected drafts a session's judge may run (``finite_drafts``)
HORIZON, HORIZON_DECAY = 4096, 0.99992
HORIZON_SHAPE = (1, 32, 32)  # H, K, V of the validate horizons (docs/serving.md measures H = 2 as well)


def pool_values(P, H, K, V, seed, nan_slots=()):
    """A ``[P, H, K, V]`` pool of standard normals rounded to bfloat16 (so exact in float32, bfloat16 and float16:
    magnitudes below 2^-12 are set to 0), ``nan_slots`` NaN."""
    x = round_to_bfloat16(np.random.default_rng(seed).standard_normal((P, H, K, V)))
    x[np.abs(x) < 2.0 ** -12] = 0.0
    x[list(nan_slots)] = np.nan
    return x


def tokens(B, T, dtype, seed, *, decay="moderate", gates="uniform", h=H, k=K, v=V, hv=None):
    """Six inputs ``[B, T, h, dim]`` (``hv`` value heads for v, w, g, b; float64 values exact in ``dtype``),
    writable copies."""
    return [x.copy() for x in make_problem(B, T, h, k, v, HV=hv, decay=decay, gates=gates, precision=dtype,
                                           seed=seed).inputs()]


def _dims(size):
    """``{h, k, v}`` of a session size (one of :data:`SIZES`); ValueError naming ``size``."""
    if size not in SIZES:
        raise ValueError(f"size: {size!r} not one of the session sizes {tuple(SIZES)}")
    return dict(zip("hkv", SIZES[size]))


def _packed(lengths, dtype, seed, nan_seqs=(), **kw):
    """Packed inputs ``[1, sum(lengths), ...]`` and ``cu_seqlens``; sequences in ``nan_seqs`` are NaN-filled."""
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    xs = tokens(1, int(cu[-1]), dtype, seed, **kw)
    for n in nan_seqs:
        for x in xs:
            x[0, cu[n]:cu[n + 1]] = np.nan
    return xs, cu


def _call(xs, idx, cu=None, acc=None):
    """A :class:`DecodeCall` of inputs ``xs`` on slots ``idx`` (int64 bookkeeping)."""
    return DecodeCall(*xs, state_indices=np.asarray(idx, np.int64), cu_seqlens=cu,
                      num_accepted_tokens=None if acc is None else np.asarray(acc, np.int64))


def pool_gather_scatter(dtype="float32", seed=0, size="small"):
    """Packed and batched calls on a 10-slot pool (see the module docstring)."""
    dims = _dims(size)
    calls = []
    xs, cu = _packed([3, 0, 1, 5, 2, 1], dtype, seed + 1, nan_seqs=(4,), **dims)
    calls.append(_call(xs, [5, 2, 7, 1, -1, 3], cu))  # sequence 1 is empty (slot 2 untouched), 4 is padding
    xs = tokens(5, 1, dtype, seed + 2, **dims)
    for x in xs:
        x[1] = np.nan
    calls.append(_call(xs, [5, -1, 7, 1, 3]))  # batched decode step, row 1 padding
    xs, cu = _packed([1, 2, 1, 1], dtype, seed + 3, nan_seqs=(3,), **dims)
    calls.append(_call(xs, [3, 5, 1, -1], cu))  # the same sequences in another order, another padding slot
    xs = tokens(5, 1, dtype, seed + 4, **dims)
    for x in xs:
        x[4] = np.nan
    calls.append(_call(xs, [1, 3, 5, 7, -1]))
    pool = pool_values(10, *dims.values(), seed, nan_slots=(8,))  # 0, 2, 4, 6, 9 finite and never written; 8 NaN
    return SessionScript(f"serving_pool_gather_scatter{_suffix(dtype, size)}", calls, pool, dtype=dtype,
                         mode=DECODE_MODE,
                   regime={"seed": seed}, purpose="pool gather/scatter: padding rows, empty sequence, repeated calls")


def chunked_prefill(dtype="float32", seed=0, size="small"):
    """Two sequences (slots 2 and 0) in different phases in every packed call, plus a padding sequence."""
    dims = _dims(size)
    schedule = [(6, 1), (4, 3), (1, 5), (1, 1), (3, 0), (1, 1)]
    calls = []
    for j, (a, b) in enumerate(schedule):
        pad = 2 if j % 2 == 0 else 0
        lengths = [a, b] + ([pad] if pad else [])
        xs, cu = _packed(lengths, dtype, seed + 10 + j, nan_seqs=(2,) if pad else (), decay="weak", **dims)
        calls.append(_call(xs, [2, 0] + ([-1] if pad else []), cu))
    pool = pool_values(4, *dims.values(), seed + 5, nan_slots=(3,))
    return SessionScript(f"serving_chunked_prefill{_suffix(dtype, size)}", calls, pool, dtype=dtype, mode=DECODE_MODE,
                   regime={"seed": seed, "decay": "weak"},
                   purpose="chunked-prefill continuation: prefill chunks and decode steps packed together")


def speculative_accept(dtype="float32", seed=0, size="small"):
    """Every accept count 1..DRAFTS for every sequence, NaN rejected drafts (see the module docstring)."""
    dims = _dims(size)
    S = DRAFTS
    live = 4
    idx = np.full((live + 2, S), -1, np.int64)
    for n in range(live):
        idx[n] = np.arange(n * S, (n + 1) * S)
    idx[live, :2] = (16, 17)  # row 4: two draft slots, later drafts not stored; row 5: padding
    P = 20  # 18 finite, 19 NaN: never addressed

    def accepted(c):  # what call c is told about call c - 1 (call 0: the first column)
        if c == 0:
            return np.ones(live + 2, np.int64)
        return np.array([(n + c) % S + 1 for n in range(live)] + [c % 2 + 1, 1], np.int64)

    calls = []
    n_calls = S + 2
    for c in range(n_calls - 1):  # batched calls of S tokens per row
        xs = tokens(live + 2, S, dtype, seed + 20 + c, **dims)
        nxt = accepted(c + 1)
        for x in xs:
            for n in range(live + 1):
                x[n, nxt[n]:] = np.nan  # drafts the next call rejects
            x[live + 1] = np.nan  # padding row
        calls.append(_call(xs, idx, acc=accepted(c)))
    lengths = [2, 4, 1, 3, 1, 0]  # a final packed call, fewer tokens than draft slots, an empty padding row
    xs, cu = _packed(lengths, dtype, seed + 20 + n_calls, **dims)
    calls.append(_call(xs, idx, cu, accepted(n_calls - 1)))
    pool = pool_values(P, *dims.values(), seed + 6,
                       nan_slots=[s for n in range(live) for s in idx[n, 1:]] + [17, 19])
    return SessionScript(f"serving_speculative_accept{_suffix(dtype, size)}", calls, pool, dtype=dtype,
                         mode=SPECULATIVE_MODE,
                   regime={"seed": seed, "drafts": S},
                   purpose="speculative decoding: every accept count 1..S, NaN-filled rejected drafts")


def long_horizon(dtype="float32", seed=0, size="small", *, steps=HORIZON, tokens_per_call=1, decay=HORIZON_DECAY,
                 shape=HORIZON_SHAPE, gates="uniform", decay_only_heads=0):
    """``steps`` tokens of one sequence (slot 0 of 2) at per-step decay ``decay`` in every channel, as calls of
    ``tokens_per_call`` tokens; the first ``decay_only_heads`` heads have ``b = w = 0`` (the state only decays).
    ``size`` other than ``small`` keeps ``shape``'s heads at that size's K and V."""
    if steps % tokens_per_call:
        raise ValueError(f"tokens_per_call: {tokens_per_call} does not divide steps = {steps}")
    h, k, v = shape if size == "small" else (shape[0], *list(_dims(size).values())[1:])
    p = make_problem(1, steps, h, k, v, decay="none", gates=gates, initial_state=True, precision=dtype, seed=seed)
    xs = [x.copy() for x in p.inputs()]
    xs[3] = np.full(xs[3].shape, float(round_to(np.log(decay), dtype)))
    xs[4][:, :, :decay_only_heads] = 0.0
    xs[5][:, :, :decay_only_heads] = 0.0
    pool = pool_values(2, h, k, v, seed + 7)
    pool[0] = round_to_bfloat16(p.h0()[0])
    idx = np.zeros(1, np.int64)
    calls = [_call([x[:, t:t + tokens_per_call] for x in xs], idx) for t in range(0, steps, tokens_per_call)]
    what = "single-token calls" if tokens_per_call == 1 else f"calls of {tokens_per_call} tokens"
    name = "serving_long_horizon" + ("" if tokens_per_call == 1 else "_prefill")
    return SessionScript(f"{name}{_suffix(dtype, size)}", calls, pool, dtype=dtype, mode=DECODE_MODE,
                   regime={"seed": seed, "decay_per_step": decay, "steps": steps, "tokens_per_call": tokens_per_call,
                           "gates": gates, "decay_only_heads": decay_only_heads},
                   purpose=f"long horizon: {steps} tokens as {what} at per-step decay {decay}")


PREFILL_CHUNK = 256


def long_horizon_prefill(dtype="float32", seed=0, size="small", **kw):
    """4,096 tokens as 16 calls of PREFILL_CHUNK = 256 tokens, two heads: head 0 only decays (a state rounded to 16
    bits after every token stalls there, docs/serving.md), head 1 has uniform gates."""
    kw = {"shape": (2,) + HORIZON_SHAPE[1:], "decay_only_heads": 1, **kw}
    return long_horizon(dtype, seed, size, tokens_per_call=PREFILL_CHUNK, **kw)


def single_token_steps(dtype="float32", seed=0, size="small"):
    """Eight decode steps of one token for three sequences on a 6-slot pool, the slots permuted between steps and no
    padding: every call is within FLA 0.6.0's own domain (its fused recurrent kernel has no -1 guard and writes
    multi-token [N] calls to the wrong slots)."""
    dims = _dims(size)
    rng = np.random.default_rng(seed + 40)
    calls = []
    for j in range(8):
        xs = tokens(3, 1, dtype, seed + 41 + j, **dims)
        calls.append(_call(xs, rng.permutation(6)[:3]))
    pool = pool_values(6, *dims.values(), seed + 42)
    return SessionScript(f"serving_single_token_steps{_suffix(dtype, size)}", calls, pool, dtype=dtype,
                         mode=DECODE_MODE,
                   regime={"seed": seed}, purpose="single-token steps, slots permuted, no padding (FLA's domain)")


LARGE = 2.0 ** 17  # a power of two: the scaled values stay exact in every input dtype


def large_outputs(dtype="float32", seed=0, size="small"):
    """Three decode steps with queries scaled by 2^17: outputs ``o = scale S^T q`` reach ~1e5, beyond float16's
    65504, while the state (q does not enter it) and the pool stay O(1), exact in every pool dtype; so an fp16
    output buffer beside a float32 state overflows while float32 and bfloat16 outputs do not."""
    dims = _dims(size)
    calls = []
    for j in range(3):
        xs = tokens(2, 1, dtype, seed + 30 + j, **dims)
        xs[0] = xs[0] * LARGE  # q
        calls.append(_call(xs, [0, 1]))
    pool = pool_values(2, *dims.values(), seed + 31)
    return SessionScript(f"serving_large_outputs{_suffix(dtype, size)}", calls, pool, dtype=dtype, mode=DECODE_MODE,
                   regime={"seed": seed}, purpose="outputs beyond float16's range (an fp16 output buffer overflows)")


def family_tokens(B, T, dtype, seed, family, G, *, decay="moderate", size="small"):
    """Six GDN-2 inputs of a ``family`` call with ``G`` value heads per key head: ``q, k [B, T, H, K]``, ``g, b
    [B, T, G H, K]``, ``v, w [B, T, G H, V]`` with ``b = beta 1_K``, ``w = beta 1_V`` (beta: the drawn ``b``'s first
    channel) and, for ``gdn``, ``g`` constant over K (its first channel); values exact in ``dtype``."""
    dims = _dims(size)
    return family_expressed(tokens(B, T, dtype, seed, decay=decay, hv=G * dims["h"], **dims), family)


def family_expressed(xs, family):
    """GDN-2 inputs ``xs`` made expressible in ``family``: ``b = beta 1_K``, ``w = beta 1_V`` (beta: ``b``'s first
    channel) and, for ``gdn``, ``g`` constant over K (its first channel)."""
    q, k, v, g, b, w = xs
    beta = b[..., :1]
    b, w = np.repeat(beta, b.shape[-1], axis=-1), np.repeat(beta, w.shape[-1], axis=-1)
    if family == "gdn":
        g = np.repeat(g[..., :1], g.shape[-1], axis=-1)
    return [q, k, v, g, b, w]


def _family_packed(lengths, dtype, seed, family, G, nan_seqs=(), size="small"):
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    xs = family_tokens(1, int(cu[-1]), dtype, seed, family, G, size=size)
    for n in nan_seqs:
        for x in xs:
            x[0, cu[n]:cu[n + 1]] = np.nan
    return xs, cu


def family_pool_steps(family, G, dtype="float32", seed=0, size="small"):
    """A ``family`` kernel's decode calls with ``G`` value heads per key head on an 8-slot pool: a packed call
    (prefill chunks, an empty sequence, a NaN padding sequence), a batched step with a NaN padding row, a packed call
    of the same sequences in another order; slots 6 (finite) and 7 (NaN) are never addressed."""
    calls = []
    xs, cu = _family_packed([3, 0, 2, 1], dtype, seed + 50, family, G, nan_seqs=(3,), size=size)
    calls.append(_call(xs, [4, 1, 0, -1], cu))
    xs = family_tokens(4, 1, dtype, seed + 51, family, G, size=size)
    for x in xs:
        x[2] = np.nan
    calls.append(_call(xs, [0, 4, -1, 2]))
    xs, cu = _family_packed([1, 2, 3], dtype, seed + 52, family, G, size=size)
    calls.append(_call(xs, [2, 0, 4], cu))
    pool = pool_values(8, *_pool_dims(G, size), seed + 53, nan_slots=(7,))
    return SessionScript(f"serving_{family}_pool_g{G}{_suffix(dtype, size)}", calls, pool, dtype=dtype,
                         mode=DECODE_MODE,
                         regime={"seed": seed, "value_heads_per_key_head": G}, family=family,
                         purpose=f"{family} decode calls on a pool, grouped value heads (G = {G})")


def family_drafts(family, G, dtype="float32", seed=0, size="small", drafts=3):
    """A ``family`` kernel's speculative calls with ``G`` value heads per key head: 3 draft slots for each of 2 live
    rows and a padding row, every accept count over the calls, NaN rejected drafts and draft slots, and a final
    packed call with fewer tokens than draft slots."""
    S, live = drafts, 2
    idx = np.full((live + 1, S), -1, np.int64)
    for n in range(live):
        idx[n] = np.arange(n * S, (n + 1) * S)
    P = live * S + 1  # the last slot is never addressed

    def accepted(c):
        return np.array([1 if c == 0 else (n + c) % S + 1 for n in range(live)] + [1], np.int64)

    calls = []
    for c in range(S):
        xs = family_tokens(live + 1, S, dtype, seed + 60 + c, family, G, size=size)
        nxt = accepted(c + 1)
        for x in xs:
            for n in range(live):
                x[n, nxt[n]:] = np.nan  # drafts the next call rejects
            x[live] = np.nan  # padding row
        calls.append(_call(xs, idx, acc=accepted(c)))
    xs, cu = _family_packed([2, 1, 0], dtype, seed + 60 + S, family, G, size=size)
    calls.append(_call(xs, idx, cu, accepted(S)))
    pool = pool_values(P, *_pool_dims(G, size), seed + 61, nan_slots=[s for n in range(live) for s in idx[n, 1:]])
    return SessionScript(f"serving_{family}_drafts_g{G}{_suffix(dtype, size)}", calls, pool, dtype=dtype,
                         mode=SPECULATIVE_MODE, regime={"seed": seed, "drafts": S, "value_heads_per_key_head": G},
                         family=family,
                         purpose=f"{family} speculative calls, every accept count 1..{S}, grouped value heads "
                                 f"(G = {G})")


def family_long_steps(family, G, dtype="float32", seed=0, size="small", steps=40):
    """A ``family`` kernel's ``steps`` single-token decode calls for 2 sequences (slots 3 and 0) and a NaN padding row,
    the first call a prefill chunk of 5 tokens continuing from each slot: long enough that a replay ring of up to
    ``steps`` entries is folded into its checkpoint (exactly at its threshold for rings of 2, 4, 8, 16 and 32) and a
    slot nobody addresses (1, 2) stays untouched across many calls."""
    calls = []
    xs, cu = _family_packed([5, 5, 2], dtype, seed + 70, family, G, nan_seqs=(2,), size=size)
    calls.append(_call(xs, [3, 0, -1], cu))
    for c in range(steps - 1):
        xs = family_tokens(3, 1, dtype, seed + 71 + c, family, G, size=size)
        for x in xs:
            x[2] = np.nan
        calls.append(_call(xs, [3, 0, -1]))
    pool = pool_values(4, *_pool_dims(G, size), seed + 69)
    return SessionScript(f"serving_{family}_long_steps_g{G}{_suffix(dtype, size)}", calls, pool, dtype=dtype,
                         mode=DECODE_MODE, regime={"seed": seed, "steps": steps, "value_heads_per_key_head": G},
                         family=family, purpose=f"{family} decode over {steps} calls after a prefill chunk: ring "
                                                "flushes and wraps of replay states (G = {G})".replace("{G}", str(G)))


def family_long_drafts(family, G, dtype="float32", seed=0, size="small", drafts=3, windows=12):
    """A ``family`` kernel's ``windows`` speculative calls of ``drafts`` draft slots for 2 live rows and a padding
    row, the accept counts cycling through 1..drafts (NaN rejected drafts): enough windows that a replay ring of 8
    or 16 entries flushes and wraps its circular base several times."""
    S, live = drafts, 2
    idx = np.full((live + 1, S), -1, np.int64)
    for n in range(live):
        idx[n] = np.arange(n * S, (n + 1) * S)

    def accepted(c):
        return np.array([1 if c == 0 else (2 * n + c) % S + 1 for n in range(live)] + [1], np.int64)

    calls = []
    for c in range(windows):
        xs = family_tokens(live + 1, S, dtype, seed + 80 + c, family, G, size=size)
        nxt = accepted(c + 1) if c + 1 < windows else np.full(live + 1, S)  # the last window: every draft kept
        for x in xs:
            for n in range(live):
                x[n, nxt[n]:] = np.nan
            x[live] = np.nan
        calls.append(_call(xs, idx, acc=accepted(c)))
    pool = pool_values(live * S + 1, *_pool_dims(G, size), seed + 79,
                       nan_slots=[s for n in range(live) for s in idx[n, 1:]])
    return SessionScript(f"serving_{family}_long_drafts_g{G}{_suffix(dtype, size)}", calls, pool, dtype=dtype,
                         mode=SPECULATIVE_MODE, regime={"seed": seed, "drafts": S, "windows": windows,
                                                        "value_heads_per_key_head": G}, family=family,
                         purpose=f"{family} speculative windows over {windows} calls: ring flushes and circular "
                                 f"wraps of replay states (G = {G})")


def family_long_horizon(family, dtype="float32", seed=0, *, steps=HORIZON, decay=HORIZON_DECAY, G=2):
    """``steps`` single-token calls of one ``family`` sequence (slot 0 of 2, H key heads, ``G`` value heads each) at
    per-step decay ``decay``: the 4,096-step figure of a 16-bit replay ring (docs/drivers.md); not a validate case."""
    xs = family_tokens(1, steps, dtype, seed, family, G)
    xs[3] = np.full(xs[3].shape, float(round_to(np.log(decay), dtype)))
    calls = [_call([x[:, t:t + 1] for x in xs], np.zeros(1, np.int64)) for t in range(steps)]
    pool = round_to_bfloat16(pool_values(2, G * H, K, V, seed + 7))
    return SessionScript(f"serving_{family}_long_horizon{_suffix(dtype)}", calls, pool, dtype=dtype, mode=DECODE_MODE,
                         regime={"seed": seed, "decay_per_step": decay, "steps": steps}, family=family,
                         purpose=f"{family}: {steps} single-token calls at per-step decay {decay}")


def _pool_dims(G, size):
    """``(G H, K, V)`` of a family session's pool at ``size``."""
    h, k, v = _dims(size).values()
    return G * h, k, v


def _suffix(dtype, size="small"):
    """A session name's suffix: ``_bf16`` for bfloat16 inputs, then ``_<size>`` for a size other than small."""
    return ("" if dtype == "float32" else "_bf16") + ("" if size == "small" else f"_{size}")


# name -> (mode, builder)
RECIPES = {
    "pool_gather_scatter": (DECODE_MODE, pool_gather_scatter),
    "chunked_prefill": (DECODE_MODE, chunked_prefill),
    "speculative_accept": (SPECULATIVE_MODE, speculative_accept),
    "long_horizon": (DECODE_MODE, long_horizon),
    "long_horizon_prefill": (DECODE_MODE, long_horizon_prefill),
    "large_outputs": (DECODE_MODE, large_outputs),
    "single_token_steps": (DECODE_MODE, single_token_steps),
}
QUICK = ("pool_gather_scatter", "chunked_prefill", "speculative_accept")  # the quick set's (the horizons: full only)


# name -> (family, mode, G, builder(dtype, seed)): the family sessions
FAMILY_RECIPES = {
    f"{family}_{kind}": (family, mode, G, functools.partial(build, family, G))
    for family in ("gdn", "kda")
    for kind, mode, G, build in (("pool_steps", DECODE_MODE, 2, family_pool_steps),
                                 ("drafts", SPECULATIVE_MODE, 4, family_drafts),
                                 ("long_steps", DECODE_MODE, 2, family_long_steps),
                                 ("long_drafts", SPECULATIVE_MODE, 2, family_long_drafts))}


def _check_modes(modes):
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise ValueError(f"modes: unknown serving mode(s) {unknown}; expected some of {MODES}")


def family_builders(families, dtypes=("float32", "bfloat16"), seed=0, modes=MODES):
    """The family sessions of ``families`` (some of ``gdn``, ``kda``) for each input dtype, restricted to ``modes``,
    as builders: each ``build(size="small")`` gives the session script at that size (:data:`SIZES`)."""
    _check_modes(modes)
    bad = sorted(set(families) - {f for f, *_ in FAMILY_RECIPES.values()})
    if bad:
        raise ValueError(f"families: no serving sessions for {bad}")
    return [functools.partial(build, dtype, seed) for dtype in dtypes
            for family, mode, _, build in FAMILY_RECIPES.values() if family in families and mode in modes]


def family_sessions(families, dtypes=("float32", "bfloat16"), seed=0, modes=MODES, size="small"):
    """The family sessions of ``families`` (some of ``gdn``, ``kda``) for each input dtype, restricted to
    ``modes``, at ``size``."""
    return [build(size=size) for build in family_builders(families, dtypes, seed, modes)]


def builders(dtypes=("float32", "bfloat16"), seed=0, modes=MODES, only=None):
    """The recipes' sessions for each input dtype (restricted to ``modes`` and to the recipe names in ``only``) as
    builders: each ``build(size="small")`` gives the session script at that size (:data:`SIZES`)."""
    _check_modes(modes)
    if only is not None:
        bad = sorted(set(only) - set(RECIPES))
        if bad:
            raise ValueError(f"only: unknown recipe(s) {bad}; expected some of {sorted(RECIPES)}")
    return [functools.partial(build, dtype, seed) for dtype in dtypes for name, (mode, build) in RECIPES.items()
            if mode in modes and (only is None or name in only)]


def sessions(dtypes=("float32", "bfloat16"), seed=0, modes=MODES, only=None, size="small"):
    """The recipes' session scripts for each input dtype (restricted to ``modes`` and to the recipe names in
    ``only``), at ``size``."""
    return [build(size=size) for build in builders(dtypes, seed, modes, only)]


# --- rejected drafts: NaN in the script, finite values for the kernel's runs -----------------------------------

def rejected_drafts(call, P):
    """``[B, T]``: the rejected draft tokens of a call on a pool of ``P`` slots, i.e. tokens of live sequences whose
    inputs are NaN (the recipes fill the drafts a later call rejects with NaN: the reference never reads them, so
    they are excluded from what is judged)."""
    B, T = call.q.shape[:2]
    live = np.zeros((B, T), bool)
    for s in call.plan(P).sequences:
        if s.live:
            live[s.row, s.start:s.start + s.length] = True
    nan = np.zeros((B, T), bool)
    for x in call.inputs():
        nan |= np.any(np.isnan(x), axis=(2, 3))
    return live & nan


def finite_drafts(calls, P, dtype, family, poisoning):
    """``calls`` (:class:`DecodeCall`) with their rejected drafts (:func:`rejected_drafts`) filled with finite
    tokens, drawn as the recipes draw tokens (valid gates, exact in ``dtype``, expressible in ``family``) from a seed
    of ``poisoning`` (one of :data:`POISONINGS`): two poisonings give every rejected draft other values, so a kernel
    whose accepted results read one moves between them. Padding rows and NaN slots stay NaN (never read)."""
    if poisoning not in POISONINGS:
        raise ValueError(f"poisoning: {poisoning!r} not one of {POISONINGS}")
    out = []
    for i, c in enumerate(calls):
        mask = rejected_drafts(c, P)
        if not mask.any():
            out.append(c)
            continue
        B, T, h, k, v = c.shape
        fill = tokens(B, T, dtype, 7919 * poisoning + 101 * i, h=h, k=k, v=v, hv=c.HV)
        if family != GDN2:
            fill = family_expressed(fill, family)
        xs = [np.where(mask[:, :, None, None], f, x) for x, f in zip(c.inputs(), fill)]
        out.append(dataclasses.replace(c, **dict(zip("qkvgbw", xs))))
    return out
