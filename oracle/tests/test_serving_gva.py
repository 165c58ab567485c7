"""Grouped value heads in the serving oracle (oracle/serving.py): a GVA decode call equals the same call with q, k
repeated to the value heads (docs/DESIGN.md §1, "Grouped value heads"), in float64 and mpmath, and family sessions
(oracle/serving_recipes.py) are GDN-2 sessions their family expresses.
"""

from __future__ import annotations

import numpy as np
import pytest

from gdn2_oracle.oracle import make_problem, serving, serving_recipes

H, K, V = 2, 4, 3


def _inputs(B, T, G, seed):
    """Six GVA inputs: ``q, k [B, T, H, K]``, ``g, b [B, T, G H, K]``, ``v, w [B, T, G H, V]``."""
    return [x.copy() for x in make_problem(B, T, H, K, V, HV=G * H, seed=seed).inputs()]


def _dense(xs, G):
    """The same inputs with q, k repeated to the value heads (head hv reads key head hv // G), by hand."""
    q, k = (np.stack([x[:, :, hv // G] for hv in range(G * H)], axis=2) for x in xs[:2])
    return [q, k, *xs[2:]]


def _pool(P, G, seed):
    return np.random.default_rng(seed).standard_normal((P, G * H, K, V))


def _calls(G):
    """(inputs, keywords) of a batched call with a padding row, a packed call and a speculative call."""
    xs = _inputs(3, 4, G, seed=1)
    packed = _inputs(1, 6, G, seed=2)
    spec = _inputs(2, 3, G, seed=3)
    return [
        (xs, dict(state_indices=np.array([4, -1, 1]))),
        (packed, dict(state_indices=np.array([2, 0, 3]), cu_seqlens=np.array([0, 2, 2, 6]))),
        (spec, dict(state_indices=np.array([[0, 1, 2], [5, -1, 3]]), num_accepted_tokens=np.array([2, 1]))),
    ]


@pytest.mark.parametrize("G", [2, 4])
@pytest.mark.parametrize("which", [0, 1, 2])
def test_gva_decode_is_the_dense_call_with_q_k_repeated(G, which):
    xs, kw = _calls(G)[which]
    pool = _pool(6, G, seed=4)
    got = serving.decode(*xs, state_pool=pool, **kw)
    want = serving.decode(*_dense(xs, G), state_pool=pool, **kw)
    for name in ("o", "pool", "states"):
        assert getattr(got, name).shape == getattr(want, name).shape
        assert getattr(got, name).tobytes() == getattr(want, name).tobytes(), name  # same arithmetic, same order
    assert got.o.shape[2] == G * H


@pytest.mark.parametrize("G", [2, 4])
def test_gva_decode_mp_is_the_dense_call_with_q_k_repeated(G):
    xs, kw = _calls(G)[2]
    pool = _pool(6, G, seed=5)
    got = serving.decode_mp(*xs, state_pool=pool, prec=80, **kw)
    want = serving.decode_mp(*_dense(xs, G), state_pool=pool, prec=80, **kw)
    for name in ("o", "pool", "states"):
        assert np.array_equal(getattr(got, name), getattr(want, name), equal_nan=True), name
    f64 = serving.decode(*xs, state_pool=pool, **kw)
    live = got.written_slots
    err = np.max(np.abs(got.pool[live] - f64.pool[live])) / np.max(np.abs(got.pool[live]))
    assert err < 1e-12, err  # mpmath and float64 agree on the grouped call


def test_a_value_head_reads_its_own_key_head():
    """Changing key head 0 changes exactly value heads 0..G-1."""
    G = 2
    xs, kw = _calls(G)[0]
    pool = _pool(6, G, seed=6)
    a = serving.decode(*xs, state_pool=pool, **kw)
    xs2 = [x.copy() for x in xs]
    xs2[1][:, :, 0] *= 0.5
    b = serving.decode(*xs2, state_pool=pool, **kw)
    changed = np.any(a.o != b.o, axis=(0, 1, 3))
    assert changed.tolist() == [True] * G + [False] * G


def test_gva_shapes_are_checked():
    G = 2
    xs, kw = _calls(G)[0]
    with pytest.raises(ValueError, match="^state_pool:"):
        serving.decode(*xs, state_pool=_pool(6, 1, seed=7), **kw)  # the pool needs the value heads
    bad = [xs[0], xs[1], xs[2][:, :, :3], *xs[3:]]  # 3 value heads over 2 key heads
    with pytest.raises(ValueError, match="^v:"):
        serving.decode(*bad, state_pool=_pool(6, G, seed=7), **kw)
    bad = [xs[0], xs[1], xs[2], xs[3][:, :, :2], *xs[4:]]  # g with the key heads
    with pytest.raises(ValueError, match="^g:"):
        serving.decode(*bad, state_pool=_pool(6, G, seed=7), **kw)


@pytest.mark.parametrize("recipe", sorted(serving_recipes.FAMILY_RECIPES))
def test_family_sessions_are_gdn2_sessions_of_their_family(recipe):
    family, mode, G, build = serving_recipes.FAMILY_RECIPES[recipe]
    s = build("float32", 0)
    assert (s.family, s.mode) == (family, mode)
    assert s.pool.shape[1] == G * serving_recipes.H
    pool = s.pool
    for c in s.calls:
        x = c.family_inputs(family)
        assert x["beta"].shape == c.v.shape[:3]
        assert x["g"].shape == (c.v.shape[:3] if family == "gdn" else c.g.shape)
        pool = c.apply(pool).pool  # the oracle runs it as GDN-2
    assert np.all(np.isfinite(pool[s.calls[-1].plan(pool.shape[0]).written_slots]))


def test_a_session_its_family_cannot_express_is_refused():
    s = serving_recipes.pool_gather_scatter()  # GDN-2's own gates: b, w not one beta
    with pytest.raises(ValueError, match="^b:"):
        serving.SessionScript("x", s.calls, s.pool, family="gdn")
    with pytest.raises(ValueError, match="^family:"):
        s.calls[0].family_inputs("gdn2")
