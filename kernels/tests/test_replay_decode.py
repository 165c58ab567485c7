"""The replay decode kernel (kernels/replay_decode.py) against a float64 token-by-token GDN recurrence.

The reference is the oracle's own step (``oracle.recurrence.token_step`` with ``b = w = beta`` and ``g`` broadcast
over K, state ``[K, V]``), run in float64 on exactly the tokens the kernel ran (accepted ones only, for speculative
windows). Checked after every call: the outputs of live tokens, the state the replay representation encodes (its
checkpoint and valid ring entries folded in float64, transposed to ``[K, V]``), exact zeros for padding rows and
tokens past a row's length, and bit-identical storage of the slots nobody uses. Padding rows and rejected drafts are
fed NaN, so any read of them shows. Each mutant of the module fails at least one scenario the kernel passes.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from gdn2_oracle.kernels import replay_decode as rd
from gdn2_oracle.oracle.recurrence import read_out, token_step

H, HV, K, V = 2, 4, 16, 8
G = HV // H
P = 4  # slot 0: the null block (padding rows), 1 and 2: live, 3: loaded, never used afterwards
SLOTS = np.array([1, 2, 0], np.int32)  # rows: two live slots and a padding row
SCALE = K**-0.5
S_SPEC = 3
TIGHT = 1e-4  # float32 storage: normalised max error
LOOSE = 0.05  # 16-bit storage: err_ratio


def _f64(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)


def _tokens(rng, lead):
    """Random GDN tokens ``q, k [*lead, H, K]`` (k unit norm), ``v [*lead, HV, V]``, ``g`` in [-0.5, 0], ``beta`` in
    (0, 1) ``[*lead, HV]``, float32."""
    q = rng.standard_normal((*lead, H, K))
    k = rng.standard_normal((*lead, H, K))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((*lead, HV, V))
    g = -0.5 * rng.random((*lead, HV))
    beta = rng.uniform(0.05, 0.95, (*lead, HV))
    return [x.astype(np.float32) for x in (q, k, v, g, beta)]


def _ref_step(S, q, k, v, g, beta):
    """One token in float64 on ``S [HV, K, V]`` (in place): the oracle's step, ``-> o [HV, V]``."""
    qv, kv = (np.repeat(np.asarray(x, np.float64), G, axis=0) for x in (q, k))
    b = np.asarray(beta, np.float64)
    alpha = np.repeat(np.exp(np.asarray(g, np.float64))[:, None], K, axis=1)
    token_step(S, alpha, kv, b[:, None] * np.ones(K), np.asarray(v, np.float64), b[:, None] * np.ones(V),
               np.empty_like(S))
    return read_out(S, qv, SCALE)


def _folded(cache, slot, n, base):
    """The state ``[HV, K, V]`` a slot's checkpoint and ``n`` entries from ring position ``base`` encode (float64,
    entry by entry: each entry decayed by the ones after it)."""
    buf = cache.g.shape[-1]
    S = _f64(cache.checkpoint[slot])  # [HV, V, K]
    d, kc, g = _f64(cache.d[slot]), _f64(cache.k[slot]), _f64(cache.g[slot])
    for c in range(n):
        pos = (base + c) % buf
        kv = np.repeat(kc[:, pos], G, axis=0)
        S = np.exp(g[:, pos])[:, None, None] * S + d[:, pos][:, :, None] * kv[:, None, :]
    return np.swapaxes(S, -1, -2)


def _max_err(got, ref):
    """Normalised max error; inf when anything is NaN or inf."""
    got, ref = np.asarray(got), np.asarray(ref)
    if not np.all(np.isfinite(got)):
        return np.inf
    return float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30))


def _err_ratio(got, ref):
    got, ref = np.asarray(got), np.asarray(ref)
    if not np.all(np.isfinite(got)):
        return np.inf
    return float(np.sqrt(np.mean((got - ref) ** 2)) / max(np.sqrt(np.mean(ref**2)), 1e-30))


def _slot_bytes(cache, slot):
    return [np.asarray(x[slot]).tobytes() for x in cache]


def _loaded(rng, cache):
    """Slots 1..3 loaded with random states; ``-> (cache, {slot: state [HV, K, V] float64 as stored})``."""
    states = (0.5 * rng.standard_normal((3, HV, V, K))).astype(np.float32)
    cache = rd.load(cache, jnp.array([1, 2, 3], jnp.int32), jnp.asarray(states))
    return cache, {s: np.swapaxes(_f64(cache.checkpoint[s]), -1, -2) for s in (1, 2, 3)}


def run_decode(capacity, steps=40, mutant=None, state_dtype="float32", cache_dtype="float32", seed=0):
    """``steps`` decode calls (slot 2 reloaded at step 7, so the rows flush at different steps); ``-> dict`` of the
    worst output error, worst state error, err_ratio of all outputs, the largest padding output, whether the unused
    slots stayed bit-identical and the steps that flushed."""
    rng = np.random.default_rng(seed)
    cache = rd.new_cache(P, H, HV, K, V, capacity, state_dtype=state_dtype, cache_dtype=cache_dtype)
    cache, ref = _loaded(rng, cache)
    keep = {s: _slot_bytes(cache, s) for s in (0, 3)}
    n = {1: 0, 2: 0}
    out = dict(o=0.0, state=0.0, pad=0.0, flushes=0)
    got_all, ref_all = [], []
    for t in range(steps):
        if t == 7:
            state = (0.5 * rng.standard_normal((1, HV, V, K))).astype(np.float32)
            cache = rd.load(cache, jnp.array([2], jnp.int32), jnp.asarray(state))
            ref[2], n[2] = np.swapaxes(_f64(cache.checkpoint[2]), -1, -2), 0
        xs = _tokens(rng, (3,))
        for x in xs:
            x[2] = np.nan  # the padding row
        wp = np.array([n[1], n[2], 0], np.int32)
        o, cache = rd.recurrent_step(*(jnp.asarray(x) for x in xs), cache, jnp.asarray(SLOTS), jnp.asarray(wp),
                             capacity=capacity, mutant=mutant)
        o = _f64(o)
        out["pad"] = max(out["pad"], float(np.max(np.where(np.isnan(o[2]), np.inf, np.abs(o[2])))))
        for row, slot in enumerate(SLOTS[:2]):
            r = _ref_step(ref[slot], *(x[row] for x in xs))
            out["o"] = max(out["o"], _max_err(o[row], r))
            got_all.append(o[row])
            ref_all.append(r)
            out["flushes"] += int(n[slot] == capacity - 1)
            n[slot] = (n[slot] + 1) % capacity
            out["state"] = max(out["state"], _max_err(_folded(cache, slot, n[slot], 0), ref[slot]))
    out["ratio"] = _err_ratio(got_all, ref_all)
    out["untouched"] = all(_slot_bytes(cache, s) == keep[s] for s in (0, 3))
    return out


def _schedule(rng, windows):
    """Accepted counts (1..S, every value for every row) and lengths (acc..S) per window and row ``[windows, 3]``."""
    acc = np.stack([np.resize([1, 2, 3], windows), np.resize([3, 1, 2, 2], windows), np.full(windows, S_SPEC)], 1)
    lengths = np.array([[rng.integers(a, S_SPEC + 1) for a in w] for w in acc])
    lengths[:, 2] = S_SPEC
    return acc.astype(np.int32), lengths.astype(np.int32)


def run_spec(max_cache_len, windows=12, mutant=None, state_dtype="float32", cache_dtype="float32", seed=1):
    """``reset``, then ``windows`` speculative windows with commits between them; rejected drafts, tokens past a
    row's length and the padding row are fed NaN. ``-> dict`` like :func:`run_decode` plus the flush windows and
    whether a window's span wrapped around the ring."""
    rng = np.random.default_rng(seed)
    cache = rd.new_cache(P, H, HV, K, V, max_cache_len, max_spec_len=S_SPEC, state_dtype=state_dtype,
                         cache_dtype=cache_dtype)
    buf = cache.g.shape[-1]
    cache, ref = _loaded(rng, cache)
    keys = dict(max_cache_len=max_cache_len, max_spec_len=S_SPEC)
    slots = jnp.asarray(SLOTS)
    cache = rd.reset(cache, slots, **keys)
    keep = {s: _slot_bytes(cache, s) for s in (0, 3)}
    acc, lengths = _schedule(rng, windows)
    out = dict(o=0.0, state=0.0, pad=0.0, flushes=0, wrapped=False)
    got_all, ref_all = [], []
    for w in range(windows):
        xs = _tokens(rng, (3, S_SPEC))
        for row in range(3):
            for x in xs:
                x[row, acc[w, row]:] = np.nan  # rejected drafts and tokens not run
        for x in xs:
            x[2] = np.nan
        out["flushes"] += int(np.sum(np.asarray(cache.is_flush)[SLOTS[:2]]))
        span = np.asarray(cache.cache_base + cache.write_pos)[SLOTS[:2]] + lengths[w, :2]
        out["wrapped"] |= bool(np.any(span > buf))
        o, cache = rd.spec_decode(*(jnp.asarray(x) for x in xs), cache, slots, jnp.asarray(lengths[w]), **keys,
                                  mutant=mutant)
        o = _f64(o)
        pad = [o[2].ravel()] + [o[row, lengths[w, row]:].ravel() for row in range(2)]
        pad = np.concatenate(pad)
        out["pad"] = max(out["pad"], float(np.max(np.where(np.isnan(pad), np.inf, np.abs(pad)), initial=0.0)))
        for row, slot in enumerate(SLOTS[:2]):
            for s in range(acc[w, row]):
                r = _ref_step(ref[slot], *(x[row, s] for x in xs))
                out["o"] = max(out["o"], _max_err(o[row, s], r))
                got_all.append(o[row, s])
                ref_all.append(r)
        cache = rd.commit(cache, jnp.asarray(acc[w]), slots, **keys, mutant=mutant)
        for slot in SLOTS[:2]:
            n, base = int(cache.write_pos[slot]), int(cache.cache_base[slot])
            out["state"] = max(out["state"], _max_err(_folded(cache, slot, n, base), ref[slot]))
    out["ratio"] = _err_ratio(got_all, ref_all)
    out["untouched"] = all(_slot_bytes(cache, s) == keep[s] for s in (0, 3))
    return out


# --- the kernel -----------------------------------------------------------------------------------------------------


def test_reference_is_the_gdn_recurrence():
    """The oracle's step as used here is ``S_t = alpha S + beta (v - alpha S k) k^T``, ``o = scale S_t q`` per value
    head, key head ``hv // G`` (written out in [V, K] in float64)."""
    rng = np.random.default_rng(5)
    q, k, v, g, beta = (x.astype(np.float64) for x in _tokens(rng, ()))
    S0 = rng.standard_normal((HV, V, K))
    S = np.swapaxes(S0, -1, -2).copy()
    o = _ref_step(S, q, k, v, g, beta)
    for hv in range(HV):
        a, kk, qq = np.exp(g[hv]), k[hv // G], q[hv // G]
        d = beta[hv] * (v[hv] - a * S0[hv] @ kk)
        St = a * S0[hv] + np.outer(d, kk)
        np.testing.assert_allclose(S[hv], St.T, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(o[hv], SCALE * St @ qq, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("capacity", [1, 3, 16])
def test_decode_matches_reference(capacity):
    r = run_decode(capacity)
    assert r["o"] < TIGHT and r["state"] < TIGHT, r
    assert r["pad"] == 0.0 and r["untouched"], r
    # flushes hit at write_pos == capacity - 1: every step with capacity 1; with 3, 13 on slot 1 and 2 + 11 on
    # slot 2 (reloaded at step 7); with 16, 2 + 2
    assert r["flushes"] == {1: 80, 3: 13 + 2 + 11, 16: 2 + 2}[capacity], r


def test_decode_flush_writes_no_entry():
    """A flush step writes ``S_t`` to the checkpoint and leaves the ring alone; a normal step leaves the checkpoint
    alone and writes one entry at ``write_pos``."""
    rng = np.random.default_rng(3)
    cache, _ = _loaded(rng, rd.new_cache(P, H, HV, K, V, 3))
    xs = [jnp.asarray(x) for x in _tokens(rng, (3,))]
    slots = jnp.asarray(SLOTS)
    _, c1 = rd.recurrent_step(*xs, cache, slots, jnp.array([1, 2, 0], jnp.int32), capacity=3)
    ring = (np.asarray(c1.d), np.asarray(c1.k), np.asarray(c1.g))
    before = (np.asarray(cache.d), np.asarray(cache.k), np.asarray(cache.g))
    # row 0 (slot 1, write_pos 1): entry at position 1 only, checkpoint unchanged
    assert np.array_equal(np.asarray(c1.checkpoint[1]), np.asarray(cache.checkpoint[1]))
    changed = [np.flatnonzero(np.any(a[1] != b[1], axis=tuple(i for i in range(a[1].ndim) if i != 1)))
               for a, b in zip(ring, before)]
    assert all(c.tolist() == [1] for c in changed), changed
    # row 1 (slot 2, write_pos 2 = capacity - 1): a flush, the ring of slot 2 bit-identical
    assert not np.array_equal(np.asarray(c1.checkpoint[2]), np.asarray(cache.checkpoint[2]))
    assert all(np.array_equal(a[2], b[2]) for a, b in zip(ring, before))


@pytest.mark.parametrize("max_cache_len", [8, 10])
def test_spec_decode_matches_reference(max_cache_len):
    r = run_spec(max_cache_len)
    assert r["o"] < TIGHT and r["state"] < TIGHT, r
    assert r["pad"] == 0.0 and r["untouched"], r
    assert r["flushes"] >= 3 and r["wrapped"], r  # the scenario reaches flushes and the ring's wrap


def test_commit_and_reset_cursors():
    keys = dict(max_cache_len=8, max_spec_len=S_SPEC)
    cache = rd.reset(rd.new_cache(P, H, HV, K, V, 8, max_spec_len=S_SPEC), jnp.asarray(SLOTS), **keys)
    assert cache.g.shape[-1] == 8 and np.asarray(cache.is_flush).tolist() == [0, 0, 0, 0]
    cache = cache._replace(write_pos=jnp.array([0, 1, 3, 0], jnp.int32), cache_base=jnp.array([0, 6, 6, 0], jnp.int32),
                           is_flush=jnp.array([0, 0, 1, 0], jnp.int32))
    c = rd.commit(cache, jnp.array([2, 3, 1], jnp.int32), jnp.asarray(SLOTS), **keys)
    # slot 1 (verify): write_pos 1 + 2 = 3 -> flush next (3 + 6 > 8); slot 2 (flush): base (6 + 3) mod 8 = 1,
    # write_pos = 3; slot 0 (padding) untouched
    assert np.asarray(c.write_pos).tolist() == [0, 3, 3, 0]
    assert np.asarray(c.cache_base).tolist() == [0, 6, 1, 0]
    assert np.asarray(c.is_flush).tolist() == [0, 1, 1, 0]
    c = rd.reset(c, jnp.array([2, 0], jnp.int32), **keys)
    assert np.asarray(c.write_pos).tolist() == [0, 3, 0, 0] and np.asarray(c.cache_base).tolist() == [0, 6, 0, 0]
    assert np.asarray(c.is_flush).tolist() == [0, 1, 0, 0]
    c = rd.reset(c, jnp.array([2], jnp.int32), max_cache_len=5, max_spec_len=S_SPEC)  # 2 S > 5: flush at once
    assert np.asarray(c.is_flush).tolist() == [0, 1, 1, 0]


def test_new_cache_ring_and_dtypes():
    c = rd.new_cache(2, 1, 2, 4, 3, 10, max_spec_len=4, state_dtype="bfloat16", cache_dtype=jnp.float16)
    assert c.checkpoint.shape == (2, 2, 3, 4) and c.checkpoint.dtype == jnp.bfloat16
    assert c.d.shape == (2, 2, 16, 3) and c.k.shape == (2, 1, 16, 4) and c.d.dtype == jnp.float16
    assert c.g.shape == (2, 2, 16) and c.g.dtype == jnp.float32 and c.write_pos.dtype == jnp.int32
    assert rd.new_cache(1, 1, 1, 2, 2, 10).g.shape == (1, 1, 10)


@pytest.mark.parametrize("dtypes", [("bfloat16", "bfloat16"), ("float16", "bfloat16")])
def test_16bit_caches_stay_close(dtypes):
    r = run_decode(16, steps=64, state_dtype=dtypes[0], cache_dtype=dtypes[1], seed=2)
    assert r["ratio"] < LOOSE and r["pad"] == 0.0 and r["untouched"], r
    assert r["ratio"] > 0.0  # the storage really is rounded


def test_16bit_spec_stays_close():
    r = run_spec(10, windows=16, state_dtype="bfloat16", cache_dtype="bfloat16", seed=4)
    assert r["ratio"] < LOOSE and r["pad"] == 0.0 and r["untouched"], r


# --- the mutants ----------------------------------------------------------------------------------------------------

LARGE = 1e-2


@pytest.mark.parametrize("mutant, capacity", [("late_flush", 3), ("late_flush", 1), ("prefix_decay", 16),
                                              ("key_per_value_head", 16)])
def test_decode_mutant_is_caught(mutant, capacity):
    r = run_decode(capacity, mutant=mutant)
    assert max(r["o"], r["state"]) > LARGE, r


@pytest.mark.parametrize("mutant", ["cursor_all_drafts", "base_not_advanced", "prefix_decay", "key_per_value_head"])
def test_spec_mutant_is_caught(mutant):
    r = run_spec(8, mutant=mutant)
    assert max(r["o"], r["state"]) > LARGE, r


def test_null_block_live_is_caught():
    r = run_decode(3, steps=4, mutant="null_block_live")
    assert r["pad"] > 0.0 and not r["untouched"], r
    r = run_spec(8, windows=2, mutant="null_block_live")
    assert r["pad"] > 0.0 and not r["untouched"], r


def test_mutants_are_all_tested():
    assert set(rd.MUTANTS) == {"late_flush", "cursor_all_drafts", "prefix_decay", "key_per_value_head",
                               "base_not_advanced", "null_block_live"}


# --- bad input ------------------------------------------------------------------------------------------------------


def _bad_calls():
    c = rd.new_cache(P, H, HV, K, V, 8, max_spec_len=S_SPEC)
    rng = np.random.default_rng(0)
    xs = [jnp.asarray(x) for x in _tokens(rng, (3,))]
    ws = [jnp.asarray(x) for x in _tokens(rng, (3, S_SPEC))]
    slots, i3 = jnp.asarray(SLOTS), jnp.zeros(3, jnp.int32)
    keys = dict(max_cache_len=8, max_spec_len=S_SPEC)
    dec = dict(capacity=8)

    def swap(seq, i, x):
        seq = list(seq)
        seq[i] = x
        return seq

    return [
        ("slots", lambda: rd.new_cache(0, H, HV, K, V, 8)),
        ("HV", lambda: rd.new_cache(P, 2, 3, K, V, 8)),
        ("K", lambda: rd.new_cache(P, H, HV, 2.0, V, 8)),
        ("capacity", lambda: rd.new_cache(P, H, HV, K, V, 0)),
        ("capacity", lambda: rd.new_cache(P, H, HV, K, V, 5, max_spec_len=3)),
        ("max_spec_len", lambda: rd.new_cache(P, H, HV, K, V, 8, max_spec_len=-1)),
        ("state_dtype", lambda: rd.new_cache(P, H, HV, K, V, 8, state_dtype="int8")),
        ("cache_dtype", lambda: rd.new_cache(P, H, HV, K, V, 8, cache_dtype="float64")),
        ("cache", lambda: rd.load(tuple(c), slots, jnp.zeros((3, HV, V, K)))),
        ("states", lambda: rd.load(c, slots, jnp.zeros((3, HV, K, V)))),
        ("slots", lambda: rd.load(c, slots.astype(jnp.float32), jnp.zeros((3, HV, V, K)))),
        ("q", lambda: rd.recurrent_step(*swap(xs, 0, xs[0][:, :1]), c, slots, i3, **dec)),
        ("k", lambda: rd.recurrent_step(*swap(xs, 1, xs[1][..., :4]), c, slots, i3, **dec)),
        ("v", lambda: rd.recurrent_step(*swap(xs, 2, xs[2][:, :2]), c, slots, i3, **dec)),
        ("g", lambda: rd.recurrent_step(*swap(xs, 3, xs[3][..., None]), c, slots, i3, **dec)),
        ("beta", lambda: rd.recurrent_step(*swap(xs, 4, xs[4].astype(jnp.int32)), c, slots, i3, **dec)),
        ("slots", lambda: rd.recurrent_step(*xs, c, slots[:2], i3, **dec)),
        ("write_pos", lambda: rd.recurrent_step(*xs, c, slots, i3.astype(jnp.float32), **dec)),
        ("capacity", lambda: rd.recurrent_step(*xs, c, slots, i3, capacity=9)),
        ("capacity", lambda: rd.recurrent_step(*xs, c, slots, i3, capacity=None)),
        ("scale", lambda: rd.recurrent_step(*xs, c, slots, i3, **dec, scale="1")),
        ("mutant", lambda: rd.recurrent_step(*xs, c, slots, i3, **dec, mutant="nope")),
        ("cache", lambda: rd.recurrent_step(*xs, c._replace(k=c.k[:, :, :4]), slots, i3, **dec)),
        ("q", lambda: rd.spec_decode(*xs, c, slots, i3, **keys)),
        ("v", lambda: rd.spec_decode(*swap(ws, 2, ws[2][:, :2]), c, slots, i3, **keys)),
        ("lengths", lambda: rd.spec_decode(*ws, c, slots, i3[:1], **keys)),
        ("max_cache_len", lambda: rd.spec_decode(*ws, c, slots, i3, max_cache_len=9, max_spec_len=S_SPEC)),
        ("max_spec_len", lambda: rd.spec_decode(*ws, c, slots, i3, max_cache_len=8, max_spec_len=0)),
        ("mutant", lambda: rd.spec_decode(*ws, c, slots, i3, **keys, mutant="late")),
        ("num_accepted", lambda: rd.commit(c, i3[:2], slots, **keys)),
        ("slots", lambda: rd.commit(c, i3, slots[:, None], **keys)),
        ("mutant", lambda: rd.commit(c, i3, slots, **keys, mutant=1)),
        ("max_cache_len", lambda: rd.reset(c, slots, max_cache_len=2, max_spec_len=S_SPEC)),
        ("slots", lambda: rd.reset(c, jnp.zeros((0,), jnp.int32), **keys)),
    ]


def test_bad_inputs_raise_naming_the_argument():
    for name, call in _bad_calls():
        with pytest.raises(ValueError, match=rf"^{name}:"):
            call()
