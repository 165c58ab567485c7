"""The replay representation of decode states: a checkpoint plus a ring of the last tokens' ``(d, k, g)``.

docs/DESIGN.md §1, "Replay states" (ReplaySSM in vLLM keeps a GDN state this way). A slot holds a checkpoint
``C [HV, K, V]`` and the entries of the last ``n`` tokens, each its update vector ``d [HV, V]``, key ``k [H, K]``
(once per key head: value head ``hv`` reads key head ``hv // G``) and log-decay ``g [HV, K]``. It encodes

    S_n = Diag(exp(sum_{j<=n} g_j)) C + sum_j Diag(exp(sum_{j<i<=n} g_i)) k_j d_j^T,

the recurrence's state after those tokens when ``d_j = w_j * v_j - Sbar_j^T (b_j * k_j)`` is the token's ``u``
(``oracle.recurrence.token_step``; for GDN ``d_j = beta_j (v_j - Sbar_j^T k_j)``). :meth:`ReplayPool.state` evaluates
it as the fold ``S <- Diag(exp g_j) S + k_j d_j^T`` from the checkpoint, the recurrence's own arithmetic.

:class:`ReplayPool` is the representation run token by token (float32, float64, longdouble or mpmath), with the
bookkeeping of a ring of ``capacity`` L entries per slot: ``count`` committed entries from ring position ``base``,
and ``drafts`` speculative entries after them. A decode token is appended after the committed ones (folding them all
into the checkpoint first when the ring is full: a *flush*, which moves ``base`` on by ``count``); a verify window
writes its T drafts after them (flushing first when ``count + T > L``) and :meth:`ReplayPool.commit` keeps the
first a. Every output is read from the representation as stored. ``store_dtype`` (bfloat16 / float16) rounds what a
kernel stores in 16 bits (the ``d``, ``k`` caches, and the checkpoint unless ``checkpoint_dtype`` says otherwise; ``g``
stays float32): the baseline of a 16-bit replay buffer's bound (``ci/grading/serving.py``).
"""

from __future__ import annotations

import numbers

import numpy as np

from . import mp, recurrence
from .problem import check_scale
from .replay_slots import NULL_SLOT, SlotMap
from .serving import round_state

CACHE_DTYPES = ("float32", "bfloat16", "float16")


def _count(name, n, lo=0):
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < lo:
        raise ValueError(f"{name}: expected an integer >= {lo}, got {n!r}")
    return int(n)


def fold(S, d, k, g, start, n, ar=None):
    """``S`` advanced by ``n`` ring entries from ring position ``start``: ``S <- Diag(exp g_j) S + k_j d_j^T`` for
    each (the encoded state's sum, entry by entry). One slot: ``S [HV, K, V]``, ``d [HV, L, V]``, ``k [H, L, K]``
    (value head hv reads key head ``hv // (HV // H)``), ``g [HV, L, K]``; returns a new array."""
    ar = ar or recurrence.Arith(np.float64)
    S = ar.array(S).copy()
    HV, L = d.shape[:2]
    heads = np.arange(HV) // (HV // k.shape[0])
    for j in range(int(n)):
        r = (int(start) + j) % L
        S *= ar.exp(ar.array(g[:, r]))[..., :, None]
        S += ar.array(k[heads, r])[..., :, None] * ar.array(d[:, r])[..., None, :]
    return S


class ReplayPool:
    """``slots`` replay slots of ``HV`` value heads over ``H`` key heads, states ``[K, V]``, rings of ``capacity``.

    ``arith``: a ``recurrence.Arith`` (float32 / float64 / longdouble) or ``mp.MPArith`` (mpmath, at the caller's
    ``mpmath.workprec``); ``store_dtype``: None (store exactly) or one of :data:`CACHE_DTYPES`, the caches' and (unless
    ``checkpoint_dtype`` is given) the checkpoint's storage.
    """

    def __init__(self, slots, HV, H, K, V, capacity, *, arith=None, store_dtype=None, checkpoint_dtype=None):
        self.P, self.HV, self.H = _count("slots", slots, 1), _count("HV", HV, 1), _count("H", H, 1)
        self.K, self.V, self.L = _count("K", K, 1), _count("V", V, 1), _count("capacity", capacity, 1)
        if self.HV % self.H:
            raise ValueError(f"HV: {HV} value heads are not a multiple of H = {H} key heads")
        for name, x in (("store_dtype", store_dtype), ("checkpoint_dtype", checkpoint_dtype)):
            if x is not None and x not in CACHE_DTYPES:
                raise ValueError(f"{name}: expected None or one of {CACHE_DTYPES}, got {x!r}")
        self.ar = arith or recurrence.Arith(np.float64)
        self.store_dtype = store_dtype
        self.checkpoint_dtype = checkpoint_dtype or store_dtype
        z = self.ar.array(np.zeros(1))
        self.C = np.zeros((self.P, self.HV, self.K, self.V), dtype=z.dtype)
        self.d = np.zeros((self.P, self.HV, self.L, self.V), dtype=z.dtype)
        self.k = np.zeros((self.P, self.H, self.L, self.K), dtype=z.dtype)
        self.g = np.zeros((self.P, self.HV, self.L, self.K), dtype=z.dtype)
        if z.dtype == object:
            for a in (self.C, self.d, self.k, self.g):
                a[...] = self.ar.array(np.zeros(a.shape))
        self.base = np.zeros(self.P, np.int64)  # ring position of the oldest entry
        self.count = np.zeros(self.P, np.int64)  # committed entries
        self.drafts = np.zeros(self.P, np.int64)  # speculative entries after the committed ones
        self.flushes = np.zeros(self.P, np.int64)
        self._tip = {}  # slot -> (entries, state): the last state encoded, extended entry by entry

    # -- storage --
    def _store(self, x, dtype=None):
        x = self.ar.array(x)
        dtype = dtype or self.store_dtype
        if dtype is None or x.dtype == object:
            return x
        return round_state(x, dtype)

    def _slot(self, p):
        p = _count("slot", p)
        if p >= self.P:
            raise ValueError(f"slot: {p} out of range 0..{self.P - 1}")
        return p

    def load(self, p, S):
        """Start slot ``p`` from state ``S [HV, K, V]``: the checkpoint, an empty ring (a prefill's hand-off)."""
        p = self._slot(p)
        S = np.asarray(S)
        if S.shape != (self.HV, self.K, self.V):
            raise ValueError(f"S: expected shape {(self.HV, self.K, self.V)}, got {S.shape}")
        self.C[p] = self._store(S if S.dtype == object else S.astype(np.float64), self.checkpoint_dtype)
        self.base[p] = self.count[p] = self.drafts[p] = 0
        self._tip.pop(p, None)

    def entries(self, p):
        """Committed plus draft entries of slot ``p``."""
        return int(self.count[p] + self.drafts[p])

    def state(self, p, n=None):
        """The state slot ``p`` encodes after its first ``n`` entries (default: the committed ones), ``[HV, K, V]``."""
        p = self._slot(p)
        n = int(self.count[p]) if n is None else _count("n", n)
        if n > self.entries(p):
            raise ValueError(f"n: slot {p} holds {self.entries(p)} entries, asked for {n}")
        return self._state(p, n)

    def _state(self, p, n):
        m, S = self._tip.get(p, (0, None))
        if S is None or m > n:
            m, S = 0, self.C[p]
        S = fold(S, self.d[p], self.k[p], self.g[p], self.base[p] + m, n - m, self.ar)
        self._tip[p] = (n, S.copy())
        return S

    def flush(self, p):
        """Fold slot ``p``'s committed entries into its checkpoint (the ring's base moves on past them)."""
        p = self._slot(p)
        n = int(self.count[p])
        self.C[p] = self._store(self._state(p, n), self.checkpoint_dtype)
        self.base[p] = (self.base[p] + n) % self.L
        self.count[p] = self.drafts[p] = 0
        self.flushes[p] += 1
        self._tip.pop(p, None)

    def _token(self, p, at, tok):
        """One token on the state slot ``p`` encodes after ``at`` entries: ``(S_t, d_t, o_t)`` in the working
        precision (``d_t`` and ``S_t`` before any storage rounding, as a kernel holds them in registers)."""
        G = self.HV // self.H
        S = self._state(p, at).copy()
        alpha = self.ar.exp(self.ar.array(tok["g"]))
        k_v = np.repeat(self.ar.array(tok["k"]), G, axis=0)
        u = recurrence.token_step(S, alpha, k_v, self.ar.array(tok["b"]), self.ar.array(tok["v"]),
                                  self.ar.array(tok["w"]), np.empty_like(S))
        return S, u, recurrence.read_out(S, self.ar.array(np.repeat(tok["q"], G, axis=0)), tok["scale"])

    def _write(self, p, at, tok, u):
        """Store a token's entry ``(d, k, g)`` at entry index ``at`` of slot ``p``."""
        r = (self.base[p] + at) % self.L
        self.d[p, :, r] = self._store(u)
        self.k[p, :, r] = self._store(tok["k"])
        g = np.asarray(tok["g"])
        self.g[p, :, r] = self.ar.array(g if self.C.dtype == object else round_state(g.astype(np.float64), "float32"))
        m, _ = self._tip.get(p, (0, None))
        if m > at:
            self._tip.pop(p, None)

    def advance(self, p, tokens):
        """Run committed tokens on slot ``p`` (drafts dropped): ``tokens`` is a list of per-token dicts ``q, k [H, K]``,
        ``v, w [HV, V]``, ``g, b [HV, K]``, ``scale``. A token that finds ``L - 1`` entries is a flush: the state
        after it becomes the checkpoint and the ring empties (vLLM's ``write_pos == L - 1``; with ``L = 1`` every
        token). Returns ``o [T, HV, V]``."""
        p = self._slot(p)
        self.drafts[p] = 0
        out = []
        for tok in tokens:
            n = int(self.count[p])
            S, u, o = self._token(p, n, tok)
            if n == self.L - 1:
                self.C[p] = self._store(S, self.checkpoint_dtype)
                self.base[p] = self.count[p] = 0
                self.flushes[p] += 1
                self._tip.pop(p, None)
            else:
                self._write(p, n, tok, u)
                self.count[p] += 1
            out.append(o)
        return np.array(out) if out else np.zeros((0, self.HV, self.V))

    def verify(self, p, tokens, window=None):
        """Write a verify window of draft tokens after slot ``p``'s committed entries; the committed state is
        unchanged until :meth:`commit`. The committed entries are folded into the checkpoint first when ``count +
        2 window > L`` (``window``: the largest window, default ``len(tokens)``; vLLM's early flush). Returns
        ``o [T, HV, V]``."""
        p = self._slot(p)
        T = len(tokens)
        window = T if window is None else _count("window", window, T)
        if 2 * window > self.L:
            raise ValueError(f"window: windows of {window} drafts need a ring of at least {2 * window}, got {self.L}")
        self.drafts[p] = 0
        if self.count[p] + 2 * window > self.L:
            self.flush(p)
        out = []
        for t, tok in enumerate(tokens):
            at = int(self.count[p]) + t
            _, u, o = self._token(p, at, tok)
            self._write(p, at, tok, u)
            self.drafts[p] = t + 1
            out.append(o)
        return np.array(out) if out else np.zeros((0, self.HV, self.V))

    def commit(self, p, accepted):
        """Keep the first ``accepted`` drafts of slot ``p``'s last window (the rest lie past the cursor)."""
        p = self._slot(p)
        a = _count("accepted", accepted)
        if a > self.drafts[p]:
            raise ValueError(f"accepted: slot {p} has {int(self.drafts[p])} drafts, cannot accept {a}")
        self.count[p] += a
        self.drafts[p] = 0


# --- a scripted session on the representation -------------------------------------------------------------------

def tokens_of(call, row, start, length):
    """The per-token dicts of ``length`` tokens of ``call`` (an ``oracle.serving.DecodeCall``) from ``(row,
    start)``: ``q, k [H, K]``, ``v, w [HV, V]``, ``g, b [HV, K]``, ``scale`` (the call's, default ``K^-1/2``)."""
    scale = check_scale(call.scale, call.q.shape[-1])
    names = ("q", "k", "v", "g", "b", "w")
    return [{**{n: x[row, t] for n, x in zip(names, call.inputs())}, "scale": scale}
            for t in range(start, start + length)]


def run_plan(pool, plan, call):
    """Run one call's :class:`oracle.replay_slots.CallPlan` on the :class:`ReplayPool` ``pool``: its commits, its
    loads, then each live row's decode tokens or verify window. Returns ``o [B, T, HV, V]`` (0 at padding rows)."""
    for p, a in plan.commits:
        pool.commit(p, a)
    for p, S in plan.loads:
        pool.load(p, S)
    B, T = call.q.shape[:2]
    o = np.zeros((B, T, pool.HV, pool.V), dtype=pool.C.dtype)
    if o.dtype == object:
        o[...] = pool.ar.array(np.zeros(o.shape))
    for r in plan.rows:
        if r.slot == NULL_SLOT or r.length == 0:
            continue
        toks = tokens_of(call, r.row, r.start, r.length)
        with np.errstate(invalid="ignore", over="ignore"):  # rejected drafts may be NaN
            o[r.row, r.start:r.start + r.length] = (pool.verify(r.slot, toks, call.state_indices.shape[1])
                                                    if r.window else pool.advance(r.slot, toks))
    return o


def chain(script, capacity, *, arith=None, store_dtype=None, checkpoint_dtype=None):
    """Yield ``(o, pool)`` after each call of ``script`` (an ``oracle.serving.SessionScript``) run on a replay
    representation of rings of ``capacity``: ``o [B, T, HV, V]`` and the pool ``[P, HV, K, V]`` the representation
    encodes (``SlotMap.finish``, float64), in the working precision of ``arith`` with ``store_dtype``'s storage."""
    slots = SlotMap(script.pool)
    _, HV, K, V = slots.pool.shape
    H = script.calls[0].q.shape[2]
    n_slots = 1 + sum(len(c.plan(slots.pool.shape[0]).sequences) for c in script.calls)
    pool = ReplayPool(n_slots, HV, H, K, V, capacity, arith=arith, store_dtype=store_dtype,
                      checkpoint_dtype=checkpoint_dtype)

    def state(p, ahead):
        S = pool.state(p, int(pool.count[p]) + ahead)
        return S if S.dtype != object else _to_float64(S)

    for call in script.calls:
        o = run_plan(pool, slots.plan(call, state), call)
        yield (o if o.dtype != object else _to_float64(o)), slots.finish(state)


def trace(script, capacity):
    """Per call of ``script`` run on a replay representation of rings of ``capacity`` (float64), what happened to the
    rings: ``[{n: (replay slot, committed entries before the call, flushes during it, drafts committed before it,
    whether it ran a verify window)}]`` per live sequence n (the bookkeeping a diagnosis places errors by)."""
    slots = SlotMap(script.pool)
    _, HV, K, V = slots.pool.shape
    n_slots = 1 + sum(len(c.plan(slots.pool.shape[0]).sequences) for c in script.calls)
    pool = ReplayPool(n_slots, HV, script.calls[0].q.shape[2], K, V, capacity)

    def state(p, ahead):
        return pool.state(p, int(pool.count[p]) + ahead)

    out = []
    for call in script.calls:
        plan = slots.plan(call, state)
        commits = dict(plan.commits)
        live = [r for r in plan.rows if r.slot != NULL_SLOT and r.length]
        fresh = {p for p, _ in plan.loads}
        for p, a in plan.commits:
            pool.commit(p, a)
        for p, S in plan.loads:
            pool.load(p, S)
        before = {r.slot: (int(pool.count[r.slot]), int(pool.flushes[r.slot])) for r in live}
        with np.errstate(invalid="ignore", over="ignore"):
            run_plan(pool, plan._replace(commits=(), loads=()), call)
        out.append({r.n: (r.slot, -1 if r.slot in fresh else before[r.slot][0],
                          int(pool.flushes[r.slot]) - before[r.slot][1], commits.get(r.slot, 0), r.window)
                    for r in live})
        slots.finish(state)
    return out


def _to_float64(x):
    with np.errstate(invalid="ignore"):  # NaN drafts
        return mp.to_float64(x)
