"""Self-checks of the replay representation (oracle/replay.py) and the slot map (oracle/replay_slots.py).

The representation folds the same arithmetic as the recurrence in the same order, so in float64 a session run on
it reproduces the pool oracle's outputs and states bit for bit, across flushes, ring wraps and verify windows.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest

from gdn2_oracle.oracle import mp, recurrence, replay, serving, serving_recipes
from gdn2_oracle.oracle.replay_slots import NULL_SLOT, SlotMap

DECODE_RINGS = (1, 3, 64)  # every token a flush (the pool), a small ring, one that never fills
# verify windows of S drafts: rings of 2 S (the smallest a window fits twice in), 2 S + 1 and 64


def _scripts():
    out = serving_recipes.sessions(("float32",), 0, serving_recipes.MODES, serving_recipes.QUICK)
    out += serving_recipes.family_sessions(("gdn", "kda"), ("float32",), 0, serving_recipes.MODES)
    return out


def _pool_chain(script):
    pool = script.pool.astype(np.float64)
    for c in script.calls:
        r = c.apply(pool)
        pool = r.pool
        yield r


def _compare(script, runs):
    """Largest |difference| of a replay chain from the pool oracle's: outputs at finite references, written states."""
    worst = 0.0
    for r, (o, pool) in zip(_pool_chain(script), runs):
        m = np.isfinite(r.o)
        worst = max(worst, float(np.max(np.abs(np.where(m, o - np.where(m, r.o, 0), 0)), initial=0.0)))
        for slot in r.written_slots:
            if np.all(np.isfinite(r.pool[slot])):
                worst = max(worst, float(np.max(np.abs(pool[slot] - r.pool[slot]))))
    return worst


@pytest.mark.parametrize("script", _scripts(), ids=lambda s: s.name)
def test_replay_chain_is_the_pool_chain(script):
    """Every recipe on the replay representation, for rings that flush every token, often, and never: outputs and
    written states equal the pool oracle's bit for bit in float64."""
    if script.mode == serving.SPECULATIVE_MODE:
        S = script.calls[0].state_indices.shape[1]
        rings = (2 * S, 2 * S + 1, 64)
    else:
        rings = DECODE_RINGS
    for L in rings:
        assert _compare(script, replay.chain(script, L)) == 0.0, f"ring {L}"


def test_small_rings_flush_and_wrap():
    """The ring of a small L is folded into the checkpoint (decode at write position L - 1; a verify window that
    would not fit twice), and a verify ring wraps (its base moves): the bit-for-bit test above covers both."""
    H, K, V, L = 1, 2, 2, 3
    rng = np.random.default_rng(0)
    pool = replay.ReplayPool(2, H, H, K, V, L)
    pool.load(1, rng.standard_normal((H, K, V)))

    def tok():
        return {"q": rng.standard_normal((H, K)), "k": rng.standard_normal((H, K)), "v": rng.standard_normal((H, V)),
                "g": -rng.uniform(0, 0.5, (H, K)), "b": np.full((H, K), 0.5), "w": np.full((H, V), 0.5), "scale": 1.0}

    pool.advance(1, [tok() for _ in range(7)])
    assert pool.flushes[1] == 2 and pool.count[1] == 1  # flushes at tokens 3 and 6 (write position 2 = L - 1)
    big = replay.ReplayPool(2, H, H, K, V, 8)
    big.load(1, np.zeros((H, K, V)))
    for a in (2, 2, 2, 1):
        big.verify(1, [tok() for _ in range(2)])
        big.commit(1, a)
    assert big.flushes[1] >= 1 and big.base[1] != 0


def test_closed_form_identity():
    """``S_n = exp(sum g) C + sum_j exp(sum_{i>j} g_i) k_j d_j^T`` (docs/DESIGN.md §1) equals the fold."""
    rng = np.random.default_rng(1)
    HV, H, K, V, L, n = 4, 2, 3, 2, 6, 5
    C = rng.standard_normal((HV, K, V))
    d, k = rng.standard_normal((HV, L, V)), rng.standard_normal((H, L, K))
    g = -rng.uniform(0, 1, (HV, L, K))
    base = 4  # entries at ring positions 4, 5, 0, 1, 2
    pos = (base + np.arange(n)) % L
    G = np.cumsum(g[:, pos], axis=1)  # [HV, n, K] inclusive prefix sums
    heads = np.arange(HV) // (HV // H)
    want = np.exp(G[:, -1])[..., None] * C
    for j in range(n):
        want += np.exp(G[:, -1] - G[:, j])[..., None] * k[heads, pos[j]][..., None] * d[:, pos[j]][:, None, :]
    np.testing.assert_allclose(replay.fold(C, d, k, g, base, n), want, rtol=1e-12, atol=1e-14)


def test_mpmath_representation():
    """The representation in mpmath agrees with the float64 one to float64 rounding, and with mpmath's pool decode."""
    script = serving_recipes.family_drafts("gdn", 4)
    with mpmath.workprec(mp.DEFAULT_PREC):
        runs = list(replay.chain(script, 8, arith=mp.MPArith()))
    pool = script.pool.astype(np.float64)
    for c, (o, vp) in zip(script.calls, runs):
        r = serving.decode_mp(*c.inputs(), state_pool=pool, **c.bookkeeping())
        pool = r.pool
        m = np.isfinite(r.o)
        np.testing.assert_allclose(np.where(m, o, 0), np.where(m, r.o, 0), rtol=0, atol=1e-13)
        for slot in r.written_slots:
            if np.all(np.isfinite(r.pool[slot])):
                np.testing.assert_allclose(vp[slot], r.pool[slot], rtol=0, atol=1e-13)


def test_bf16_storage_costs_a_rounding():
    """bf16 caches and checkpoint: the encoded states differ from the exact ones by bf16 roundings, not more."""
    script = serving_recipes.family_long_steps("gdn", 2)
    exact = _compare(script, replay.chain(script, 3))
    bf16 = _compare(script, replay.chain(script, 3, arith=recurrence.Arith(np.float32), store_dtype="bfloat16"))
    scale = max(float(np.max(np.abs(r.o[np.isfinite(r.o)]))) for r in _pool_chain(script))
    assert exact == 0.0 and 2.0 ** -12 * scale < bf16 < 2.0 ** -4 * scale


def test_rejected_drafts_never_change_the_committed_state():
    """A verify window whose rejected drafts are NaN: for every accept count the committed state is finite and the
    state of the accepted prefix run as decode tokens."""
    H, K, V, S = 2, 3, 2, 3
    rng = np.random.default_rng(2)
    toks = [{"q": rng.standard_normal((H, K)), "k": rng.standard_normal((H, K)), "v": rng.standard_normal((H, V)),
             "g": -rng.uniform(0, 0.5, (H, K)), "b": np.full((H, K), 0.7), "w": np.full((H, V), 0.7),
             "scale": 0.5} for _ in range(S)]
    h0 = rng.standard_normal((H, K, V))
    for a in range(1, S + 1):
        spec, plain = replay.ReplayPool(2, H, H, K, V, 8), replay.ReplayPool(2, H, H, K, V, 64)
        spec.load(1, h0)
        plain.load(1, h0)
        drafts = toks[:a] + [{**t, "v": np.full((H, V), np.nan)} for t in toks[a:]]
        with np.errstate(invalid="ignore"):
            spec.verify(1, drafts)
        spec.commit(1, a)
        plain.advance(1, toks[:a])
        assert np.array_equal(spec.state(1), plain.state(1)), f"accept {a}"


def test_slot_map_slots_and_padding():
    """A call's live sequences each get a replay slot of their own, loaded with their slot's state (none is placed
    yet); padding rows and empty sequences get the null slot."""
    [script] = serving_recipes.sessions(("float32",), 0, (serving.DECODE_MODE,), ("pool_gather_scatter",))
    call = script.calls[0]
    P, HV, K, V = script.pool.shape
    live = [n for n, s in enumerate(call.plan(P).sequences) if s.live]
    m = SlotMap(script.pool)
    plan = m.plan(call, lambda p, ahead: np.zeros((HV, K, V)))
    rows = {r.n: r for r in plan.rows}
    assert all(rows[n].slot != NULL_SLOT for n in live)
    assert all(r.slot == NULL_SLOT for r in plan.rows if r.n not in live)
    assert len({rows[n].slot for n in live}) == len(live) and len(plan.loads) == len(live)


def test_bad_inputs():
    with pytest.raises(ValueError, match="capacity"):
        replay.ReplayPool(2, 2, 2, 3, 3, 0)
    with pytest.raises(ValueError, match="HV"):
        replay.ReplayPool(2, 3, 2, 3, 3, 4)
    with pytest.raises(ValueError, match="store_dtype"):
        replay.ReplayPool(2, 2, 2, 3, 3, 4, store_dtype="int8")
    pool = replay.ReplayPool(2, 2, 2, 3, 3, 4)
    with pytest.raises(ValueError, match="S"):
        pool.load(1, np.zeros((2, 3)))
    with pytest.raises(ValueError, match="slot"):
        pool.state(5)
    with pytest.raises(ValueError, match="n"):
        pool.state(1, 3)
    with pytest.raises(ValueError, match="accepted"):
        pool.commit(1, 1)
    with pytest.raises(ValueError, match="window"):
        pool.verify(1, [{}] * 3)
    m = SlotMap(np.zeros((2, 2, 3, 3)))
    with pytest.raises(ValueError, match="finish"):
        m.finish(lambda p, a: None)
