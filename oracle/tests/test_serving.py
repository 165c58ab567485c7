"""Self-checks of the serving (decode) oracle (oracle/serving.py) against the token-by-token recurrence.

Every identity here is exact arithmetic done in the same order, so float64 results are compared to
1e-13 relative (most are bit-identical); mpmath vs float64 to 1e-13.
"""

from __future__ import annotations

import numpy as np
import pytest

from gdn2_oracle.oracle import Problem, make_problem, recurrence, serving

H, K, V = 2, 4, 3
TIGHT = 1e-13


def _inputs(B, T, seed, decay="moderate", gates="uniform"):
    """Six inputs ``q, k, v, g, b, w`` of shape [B, T, H, dim] (float64 values of float32 numbers)."""
    return [x.copy() for x in make_problem(B, T, H, K, V, decay=decay, gates=gates, seed=seed).inputs()]


def _pool(P, seed, nan_slots=()):
    pool = np.random.default_rng(seed).standard_normal((P, H, K, V))
    pool[list(nan_slots)] = np.nan
    return pool


def _ref(xs, h0):
    """Token-by-token reference of one sequence ``xs`` ([T, H, dim] each) from state ``h0 [H, K, V]``."""
    o, S = recurrence.forward(Problem(*(x[None] for x in xs), initial_state=h0[None]))
    return o[0], S[0]


def _close(got, want, tol=TIGHT):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    err = np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300)
    assert err <= tol, f"normalised max error {err:.3e} > {tol:.0e}"


def _same_bits(a, b):
    """Bit-identical float64 arrays (NaN payloads included)."""
    a, b = np.ascontiguousarray(a, np.float64), np.ascontiguousarray(b, np.float64)
    assert a.shape == b.shape and a.tobytes() == b.tobytes()


def _untouched(new_pool, old_pool, written):
    keep = np.setdiff1d(np.arange(old_pool.shape[0]), written)
    _same_bits(new_pool[keep], old_pool[keep])


# --- batched rows and packed sequences against the recurrence ------------------------------------------------

def test_batched_rows_continue_from_their_slots():
    xs = _inputs(3, 7, seed=1)
    pool = _pool(6, seed=2, nan_slots=(0, 5))
    idx = np.array([3, 1, 4])
    r = serving.decode(*xs, state_pool=pool, state_indices=idx)
    for n, slot in enumerate(idx):
        o, S = _ref([x[n] for x in xs], pool[slot])
        _close(r.o[n], o)
        _close(r.pool[slot], S)
        _close(r.states[n, -1], S)
    assert r.written_slots.tolist() == [1, 3, 4] and r.read_slots.tolist() == [3, 1, 4]
    _untouched(r.pool, pool, r.written_slots)


def test_packed_sequences_padding_and_empty_rows():
    """cu_seqlens with lengths 3, 0, 1, 5, 2; a padding row (-1) fed NaN; an empty row with a valid slot."""
    lengths = [3, 0, 1, 5, 2]
    cu = np.concatenate([[0], np.cumsum(lengths)])
    xs = _inputs(1, cu[-1], seed=3)
    for x in xs:
        x[0, cu[4]:cu[5]] = np.nan  # the padding row's tokens are garbage
    pool = _pool(7, seed=4, nan_slots=(6,))
    idx = np.array([5, 2, 0, 3, -1])
    r = serving.decode(*xs, state_pool=pool, state_indices=idx, cu_seqlens=cu)
    for n in (0, 2, 3):
        o, S = _ref([x[0, cu[n]:cu[n + 1]] for x in xs], pool[idx[n]])
        _close(r.o[0, cu[n]:cu[n + 1]], o)
        _close(r.pool[idx[n]], S)
    assert not np.any(r.o[0, cu[4]:]) and not np.any(r.states[0, cu[4]:])  # padding: outputs 0
    assert r.written_slots.tolist() == [0, 3, 5]  # slot 2 (empty sequence) and slot 6 untouched
    _untouched(r.pool, pool, r.written_slots)


# --- prefill + decode steps == one prefill == token by token, at every split ---------------------------------

def _step_by_step(xs, pool, idx, cu_list):
    """Run consecutive calls; ``cu_list`` gives each call's per-sequence token counts."""
    N = len(idx)
    pos = np.zeros(N, int)
    outs = [[] for _ in range(N)]
    for counts in cu_list:
        cu = np.concatenate([[0], np.cumsum(counts)])
        call = [np.concatenate([x[n, pos[n]:pos[n] + counts[n]] for n in range(N)])[None] for x in xs]
        r = serving.decode(*call, state_pool=pool, state_indices=idx, cu_seqlens=cu)
        _untouched(r.pool, pool, r.written_slots)
        pool = r.pool
        for n in range(N):
            outs[n].append(r.o[0, cu[n]:cu[n + 1]])
        pos += counts
    return [np.concatenate(o) for o in outs], pool


@pytest.mark.parametrize("decay", ["moderate", "strong", "resets"])
def test_prefill_then_decode_at_every_split(decay):
    T = 12
    xs = _inputs(1, T, seed=5, decay=decay)
    pool = _pool(3, seed=6, nan_slots=(0,))
    idx = np.array([2])
    want_o, want_S = _ref([x[0] for x in xs], pool[2])
    one = serving.decode(*xs, state_pool=pool, state_indices=idx)  # one prefill call
    _close(one.o[0], want_o)
    _close(one.pool[2], want_S)
    for split in range(T + 1):
        calls = ([[split]] if split else []) + [[1]] * (T - split)
        o, new_pool = _step_by_step(xs, pool, idx, calls)
        _close(o[0], want_o)
        _close(new_pool[2], want_S)
        _same_bits(new_pool[:2], pool[:2])


def test_packed_sequences_split_differently():
    """Three sequences in one pool, each call advancing each of them by a different number of tokens."""
    T = 9
    xs = _inputs(3, T, seed=7)
    pool = _pool(5, seed=8, nan_slots=(1,))
    idx = np.array([4, 0, 2])
    calls = [[3, 0, 9], [1, 4, 0], [5, 1, 0], [0, 4, 0]]  # totals 9, 9, 9
    o, new_pool = _step_by_step(xs, pool, idx, calls)
    for n, slot in enumerate(idx):
        want_o, want_S = _ref([x[n] for x in xs], pool[slot])
        _close(o[n], want_o)
        _close(new_pool[slot], want_S)
    _same_bits(new_pool[[1, 3]], pool[[1, 3]])


# --- speculative decoding -------------------------------------------------------------------------------------

@pytest.mark.parametrize("a", range(1, 6))
def test_every_accept_count_with_nan_rejected_tokens(a):
    """Call 1 runs 5 draft tokens (those after the first ``a`` are NaN: rejected); call 2 is told ``a`` and
    continues exactly from the state after the accepted prefix; the NaN never reaches it."""
    S_cols, N = 5, 2
    xs = _inputs(N, 2 * S_cols, seed=10 + a)
    first = [x[:, :S_cols].copy() for x in xs]
    for x in first:
        x[0, a:] = np.nan  # sequence 0: a accepted; sequence 1: all 5 accepted
    second = [x[:, S_cols:] for x in xs]
    pool = _pool(12, seed=11, nan_slots=(11,))
    idx = np.array([[0, 1, 2, 3, 4], [9, 8, 7, 6, 5]])
    pool[[0, 9]] = _pool(2, seed=12)  # the committed starting states (column 0, read with a = 1)
    start = pool[[0, 9]].copy()
    r1 = serving.decode(*first, state_pool=pool, state_indices=idx, num_accepted_tokens=np.array([1, 1]))
    assert r1.read_slots.tolist() == [0, 9]
    _untouched(r1.pool, pool, r1.written_slots)
    acc = np.array([a, S_cols])
    committed = serving.committed_state(r1.pool, idx, acc)
    prefix = [_ref([x[0, :a] for x in xs], start[0]), _ref([x[1, :S_cols] for x in xs], start[1])]
    for n in range(N):
        _close(committed[n], prefix[n][1])
        for t in range(acc[n]):  # every accepted draft slot holds the state after its token
            _close(r1.pool[idx[n, t]], _ref([x[n, :t + 1] for x in xs], start[n])[1])
    _close(r1.o[0, :a], prefix[0][0])
    assert np.all(np.isnan(r1.o[0, a:])) and np.all(np.isnan(r1.pool[idx[0, a:]]))
    r2 = serving.decode(*second, state_pool=r1.pool, state_indices=idx, num_accepted_tokens=acc)
    assert r2.read_slots.tolist() == [idx[0, a - 1], idx[1, S_cols - 1]]
    assert np.all(np.isfinite(r2.o)) and np.all(np.isfinite(r2.pool[:11]))
    for n in range(N):
        o, S = _ref([x[n, S_cols:] for x in xs], prefix[n][1])
        _close(r2.o[n], o)
        _close(serving.committed_state(r2.pool, idx, [S_cols, S_cols])[n], S)
    _untouched(r2.pool, r1.pool, r2.written_slots)


def test_speculative_packed_fewer_tokens_than_columns_and_pad_columns():
    """Packed draft rows of 3, 1 and 0 tokens over 4 columns; a -1 column is not written; a padding row."""
    xs = _inputs(1, 4, seed=13)
    cu = np.array([0, 3, 4, 4, 4])
    idx = np.array([[0, -1, 1, 2], [3, 4, 5, 6], [7, 8, 9, 10], [-1, 11, 11, 11]])
    pool = _pool(12, seed=14)
    r = serving.decode(*xs, state_pool=pool, state_indices=idx, cu_seqlens=cu,
                       num_accepted_tokens=np.array([1, 1, 1, 1]))
    assert r.written_slots.tolist() == [0, 1, 3]
    _close(r.pool[0], _ref([x[0, :1] for x in xs], pool[0])[1])
    _close(r.pool[1], _ref([x[0, :3] for x in xs], pool[0])[1])
    _close(r.pool[3], _ref([x[0, 3:4] for x in xs], pool[3])[1])
    _untouched(r.pool, pool, r.written_slots)


def test_later_write_in_a_row_wins():
    xs = _inputs(1, 3, seed=15)
    pool = _pool(2, seed=16)
    r = serving.decode(*xs, state_pool=pool, state_indices=np.array([[0, 1, 1]]))
    _close(r.pool[1], _ref([x[0] for x in xs], pool[0])[1])


# --- repeated calls on one pool -----------------------------------------------------------------------------

def test_repeated_calls_gather_scatter():
    """Eight single-token calls; sequences leave (padding row, NaN inputs) and join; slots move between calls."""
    P, steps = 6, 8
    pool = _pool(P, seed=18, nan_slots=(5,))
    truth = {0: pool[1].copy(), 1: pool[3].copy(), 2: pool[4].copy()}  # sequence id -> exact state
    where = {0: 1, 1: 3, 2: 4}  # sequence id -> slot
    for step in range(steps):
        if step == 4:  # sequence 1 moves from slot 3 to slot 0 (copied by the engine)
            pool = pool.copy()
            pool[0] = pool[3]
            where[1] = 0
        rows = [0, 1, 2, None] if step % 2 else [None, 2, 0, 1]  # None: a padding row
        xs = _inputs(len(rows), 1, seed=100 + step)
        idx = np.array([-1 if s is None else where[s] for s in rows])
        for x, n in ((x, n) for x in xs for n, s in enumerate(rows) if s is None):
            x[n] = np.nan
        r = serving.decode(*xs, state_pool=pool, state_indices=idx)
        for n, s in enumerate(rows):
            if s is None:
                assert not np.any(r.o[n])
                continue
            o, truth[s] = _ref([x[n] for x in xs], truth[s])
            _close(r.o[n], o)
            _close(r.pool[where[s]], truth[s])
        _untouched(r.pool, pool, r.written_slots)
        pool = r.pool
    assert np.all(np.isnan(pool[5]))


# --- the replay identity ----------------------------------------------------------------------------------

def _token_states(xs, h0):
    """States after each token of one sequence (the recurrence over every prefix)."""
    return np.stack([_ref([x[:t + 1] for x in xs], h0)[1] for t in range(xs[0].shape[0])])


@pytest.mark.parametrize("L", [1, 16])
def test_replay_identity(L):
    T = 16
    xs = [x[0] for x in _inputs(1, T, seed=20 + L, decay="strong")]
    h0 = _pool(1, seed=21)[0]
    want = _token_states(xs, h0)
    q, k, v, g, b, w = xs
    buf = serving.ReplayBuffer(h0, L)
    for t in range(T):
        buf.push(k[t], v[t], g[t], b[t], w[t])
        assert buf.end == t + 1 and buf.start == max(0, t + 1 - L)
        for u in range(buf.start, buf.end + 1):
            _close(buf.state_at(u), want[u - 1] if u else h0)
    _close(serving.replay(h0, k, v, g, b, w), want)


def test_replay_wrapping_buffer():
    """Capacity 5 over 23 tokens: the ring wraps four times; every reachable token is reconstructed."""
    T, L = 23, 5
    xs = [x[0] for x in _inputs(1, T, seed=22, decay="resets")]
    h0 = _pool(1, seed=23)[0]
    want = np.concatenate([h0[None], _token_states(xs, h0)])
    _, k, v, g, b, w = xs
    buf = serving.ReplayBuffer(want[3], L, position=3)  # a checkpoint taken after 3 tokens
    for t in range(3, T):
        buf.push(k[t], v[t], g[t], b[t], w[t])
        for u in range(buf.start, buf.end + 1):
            _close(buf.state_at(u), want[u])
    assert (buf.start, buf.end) == (T - L, T)
    with pytest.raises(ValueError, match="^t:"):
        buf.state_at(T - L - 1)
    with pytest.raises(ValueError, match="^t:"):
        buf.state_at(T + 1)


# --- mpmath vs float64, and float32 working precision ----------------------------------------------------------

def test_mpmath_matches_float64():
    xs = _inputs(1, 6, seed=30, decay="mixed")
    for x in xs:
        x[0, 5] = np.nan  # a draft token of sequence 2 that the next call will reject
    pool = _pool(8, seed=31, nan_slots=(7,))
    cu, idx, acc = np.array([0, 2, 5, 6]), np.array([[0, 1, 2], [3, 4, 5], [6, -1, 6]]), np.array([2, 1, 3])
    pool[1], pool[3] = pool[0], pool[4]
    kw = dict(state_pool=pool, state_indices=idx, cu_seqlens=cu, num_accepted_tokens=acc)
    r64 = serving.decode(*xs, **kw)
    rmp = serving.decode_mp(*xs, **kw, prec=96)
    assert r64.written_slots.tolist() == rmp.written_slots.tolist() == [0, 1, 3, 4, 5, 6]
    _close(rmp.o[0, :5], r64.o[0, :5])
    _close(rmp.pool[:6], r64.pool[:6])
    assert max(float(np.nanmax(e)) for e in rmp.errors.values()) < 1e-20
    for r in (r64, rmp):  # the NaN draft's output and state (slot 6) are NaN; slot 7 untouched
        assert np.all(np.isnan(r.o[0, 5])) and np.all(np.isnan(r.pool[6:]))


def test_float32_working_precision():
    xs = _inputs(2, 5, seed=32)
    pool = _pool(3, seed=33).astype(np.float32)
    r32 = serving.decode(*xs, state_pool=pool, state_indices=np.array([2, 0]), dtype=np.float32)
    r64 = serving.decode(*xs, state_pool=pool, state_indices=np.array([2, 0]))
    assert r32.o.dtype == r32.pool.dtype == np.float32
    _close(r32.o, r64.o, 1e-5)
    _close(r32.pool, r64.pool, 1e-5)
    _same_bits(r64.pool[1], pool[1])


# --- bad input: ValueError naming the argument -----------------------------------------------------------------

def _bad_cases():
    xs = _inputs(2, 3, seed=40)
    pool = _pool(4, seed=41)
    ok = dict(state_pool=pool, state_indices=np.array([0, 1]))
    spec = dict(state_pool=pool, state_indices=np.array([[0, 1, 2], [3, -1, -1]]))
    packed = [x.reshape(1, 6, H, -1) for x in xs]
    nan_q = [x.copy() for x in xs]
    nan_q[0][1, 2, 0, 0] = np.nan
    pos_g = [x.copy() for x in xs]
    pos_g[3][0, 0, 0, 0] = 0.5
    nan_pool = pool.copy()
    nan_pool[1, 0, 0, 0] = np.inf
    return [
        ("state_indices", xs, dict(ok, state_indices=np.array([0, 4]))),
        ("state_indices", xs, dict(ok, state_indices=np.array([0, -2]))),
        ("state_indices", xs, dict(ok, state_indices=np.array([1, 1]))),  # two live sequences, one slot
        ("state_indices", xs, dict(ok, state_indices=np.array([0, 1, 2]))),
        ("state_indices", xs, dict(ok, state_indices=np.array([0.0, 1.0]))),
        ("state_indices", xs, dict(spec, state_indices=np.array([[0, 1], [2, 3]]))),  # 3 tokens, 2 columns
        ("state_indices", xs, dict(spec, state_indices=np.array([[0, 1, 2], [3, 2, -1]]))),  # shared slot 2
        ("num_accepted_tokens", xs, dict(spec, num_accepted_tokens=np.array([0, 1]))),
        ("num_accepted_tokens", xs, dict(spec, num_accepted_tokens=np.array([4, 1]))),
        ("num_accepted_tokens", xs, dict(spec, num_accepted_tokens=np.array([1]))),
        ("num_accepted_tokens", xs, dict(ok, num_accepted_tokens=np.array([1, 1]))),
        ("cu_seqlens", xs, dict(ok, cu_seqlens=np.array([0, 3, 6]))),  # B = 2
        ("cu_seqlens", packed, dict(ok, cu_seqlens=np.array([0, 4, 5]))),  # does not end at T
        ("cu_seqlens", packed, dict(ok, cu_seqlens=np.array([0, 4, 2, 6]), state_indices=np.array([0, 1, 2]))),
        ("cu_seqlens", packed, dict(ok, cu_seqlens=np.array([1, 6]), state_indices=np.array([0]))),
        ("state_pool", xs, dict(ok, state_pool=pool[:, :, :3])),
        ("state_pool", xs, dict(ok, state_pool=nan_pool)),  # slot 1 is read
        ("q", nan_q, ok),
        ("g", pos_g, ok),
        ("w", xs[:5] + [xs[5][:, :, :, :2]], ok),
        ("b", xs[:4] + [xs[4][:, :2]] + xs[5:], ok),
        ("scale", xs, dict(ok, scale=float("nan"))),
    ]


@pytest.mark.parametrize("arg,xs,kw", _bad_cases())
def test_bad_inputs_name_the_argument(arg, xs, kw):
    with pytest.raises(ValueError, match=f"^{arg}:"):
        serving.decode(*xs, **kw)


def test_nan_allowed_only_where_never_read():
    xs = _inputs(2, 3, seed=42)
    pool = _pool(4, seed=43, nan_slots=(2, 3))  # unread slots may hold anything
    xs[1][1] = np.nan
    serving.decode(*xs, state_pool=pool, state_indices=np.array([0, -1]))  # padding row: NaN ignored
    serving.decode(*xs, state_pool=pool, state_indices=np.array([[0, 1, -1], [-1, 1, -1]]))  # drafts
    with pytest.raises(ValueError, match="^k:"):
        serving.decode(*xs, state_pool=pool, state_indices=np.array([0, 1]))
    with pytest.raises(ValueError, match="^state_pool:"):
        serving.decode(*xs, state_pool=pool, state_indices=np.array([2, -1]))


def test_replay_bad_inputs():
    h0 = _pool(1, seed=44)[0]
    with pytest.raises(ValueError, match="^capacity:"):
        serving.ReplayBuffer(h0, 0)
    with pytest.raises(ValueError, match="^checkpoint:"):
        serving.ReplayBuffer(np.full_like(h0, np.nan), 2)
    buf = serving.ReplayBuffer(h0, 2)
    kk, vv = np.ones((H, K)), np.ones((H, V))
    with pytest.raises(ValueError, match="^v:"):
        buf.push(kk, np.ones((H, V + 1)), -kk, kk, vv)
    with pytest.raises(ValueError, match="^g:"):
        buf.push(kk, vv, kk, kk, vv)
    with pytest.raises(ValueError, match="^num_accepted_tokens:"):
        serving.committed_state(_pool(4, seed=45), np.array([[0, 1], [2, 3]]), np.array([0, 2]))


# --- stored-state baselines: store_dtype and carry_dtype -----------------------------------------------------------

@pytest.mark.parametrize("fmt", serving.STATE_DTYPES)
def test_store_dtype_rounds_every_stored_state_once(fmt):
    """A speculative call (every token's state stored) with ``store_dtype``: the outputs and the carried states are
    the unrounded float32 run's, bit for bit; each stored state is that state rounded once to the format."""
    xs = _inputs(2, 3, seed=50)
    pool = _pool(7, seed=51).astype(np.float32)
    kw = dict(state_pool=pool, state_indices=np.array([[0, 1, 2], [3, 4, -1]]), num_accepted_tokens=np.array([1, 1]))
    plain = serving.decode(*xs, **kw, dtype=np.float32)
    stored = serving.decode(*xs, **kw, dtype=np.float32, store_dtype=fmt)
    _same_bits(stored.o, plain.o)
    _same_bits(stored.states, plain.states)
    assert stored.pool.dtype == np.float32
    for slot in stored.written_slots:
        _same_bits(stored.pool[slot], serving.round_state(plain.pool[slot], fmt))
    _untouched(stored.pool.astype(np.float64), pool.astype(np.float64), stored.written_slots)


def test_round_state_formats():
    x = np.array([1.0 + 2.0 ** -9, 1.0 + 3 * 2.0 ** -9, 70000.0, np.nan], np.float32)
    b = serving.round_state(x, "bfloat16")
    assert b[0] == 1.0 and b[1] == 1.0 + 2.0 ** -7 and b[2] == 70144.0 and np.isnan(b[3])  # ties to even
    h = serving.round_state(x, "float16")
    assert h[0] == x[0] and np.isinf(h[2]) and np.isnan(h[3])  # exact; beyond float16's range: inf
    _same_bits(serving.round_state(x, "float32"), x)
    with pytest.raises(ValueError, match="^dtype:"):
        serving.round_state(x, "float8")


def test_carry_dtype_rounds_the_running_state_after_every_token():
    """``carry_dtype``: a T-token call's states equal those of T single-token calls each storing the rounded state
    (the state kept in the format inside the loop), its outputs read the rounded states, and it differs from
    rounding only at the store."""
    xs = _inputs(1, 6, seed=52, decay="weak")
    pool = serving.round_state(_pool(2, seed=53), "bfloat16")
    loop = serving.decode(*xs, state_pool=pool, state_indices=np.array([1]), dtype=np.float32, carry_dtype="bfloat16")
    p = pool.astype(np.float32)
    for t in range(6):
        step = serving.decode(*(x[:, t:t + 1] for x in xs), state_pool=p, state_indices=np.array([1]),
                              dtype=np.float32, store_dtype="bfloat16")
        _same_bits(step.pool[1], loop.states[0, t])
        p = step.pool
    S = loop.states[0].astype(np.float64)
    _close(loop.o[0], np.einsum("thkv,thk->thv", S, xs[0][0]) * K ** -0.5, 1e-6)
    _same_bits(p, loop.pool)
    once = serving.decode(*xs, state_pool=pool, state_indices=np.array([1]), dtype=np.float32, store_dtype="bfloat16")
    assert not np.array_equal(once.pool[1], loop.pool[1])


@pytest.mark.parametrize("arg", ["store_dtype", "carry_dtype"])
def test_bad_state_dtype_names_the_argument(arg):
    xs = _inputs(1, 2, seed=54)
    with pytest.raises(ValueError, match=f"^{arg}:"):
        serving.decode(*xs, state_pool=_pool(1, seed=55), state_indices=np.array([0]), **{arg: "float64"})


def test_a_scripted_call_applies_the_oracle_and_a_script_takes_only_serving_modes():
    from gdn2_oracle.oracle import call_modes, serving_recipes

    script = serving_recipes.pool_gather_scatter()
    assert script.mode in call_modes.names("serving") and serving_recipes.QUICK[0] in serving_recipes.RECIPES
    c = script.calls[0]
    direct = serving.decode(*c.inputs(), state_pool=script.pool, **c.bookkeeping())
    applied = c.apply(script.pool)
    assert np.array_equal(applied.o, direct.o) and np.array_equal(applied.pool, direct.pool, equal_nan=True)
    assert c.plan(script.pool.shape[0]).written_slots.tolist() == direct.written_slots.tolist()
    assert serving.SessionScript("s", script.calls, script.pool).mode == call_modes.names("serving")[0]
    with pytest.raises(ValueError, match="^mode:"):
        serving.SessionScript("s", script.calls, script.pool, mode=call_modes.BASE.name)
