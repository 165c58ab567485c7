"""The NumPy recurrence's fast path (oracle/recurrence.py: (batch, head) groups run token by token with their
state in cache) against its specification ``_spec_run`` (all pairs at once, the plain token-by-token code):
bit for bit, in every working precision, decay regime and shape corner, and however the pairs are grouped."""

from __future__ import annotations

import numpy as np
import pytest

from gdn2_oracle import oracle
from gdn2_oracle.oracle import GRADS, recurrence
from gdn2_oracle.oracle.generate import DECAYS, GATES

SHAPES = [(1, 1, 1, 4, 4), (2, 1, 3, 5, 3), (1, 7, 1, 3, 2), (3, 13, 2, 4, 6), (2, 9, 3, 6, 4), (2, 6, 3, 32, 24)]


def _same_bits(got, want, name):
    """Equal bit for bit: values, NaN positions and signs of zero (a longdouble's padding bytes are not compared)."""
    assert got.dtype == want.dtype and got.shape == want.shape, name
    assert np.array_equal(got, want, equal_nan=True), f"{name}: values differ"
    assert np.array_equal(np.signbit(got), np.signbit(want)), f"{name}: signs differ"


def _both(p, dtype, do=None, dfs=None, every=recurrence.CHECKPOINT_EVERY, outputs=True):
    ar = recurrence.Arith(dtype)
    return (recurrence.run(p, ar, do, dfs, every, outputs), recurrence._spec_run(p, ar, do, dfs, every, outputs))


def _check(got, want):
    o, S, *grads = got
    o_ref, S_ref, *grads_ref = want
    if o_ref is None:
        assert o is None
    else:
        _same_bits(o, o_ref, "o")
    _same_bits(S, S_ref, "final_state")
    for g, g_ref in zip(grads, grads_ref):
        assert set(g) == set(GRADS)
        for name in GRADS:
            _same_bits(g[name], g_ref[name], name)


@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.longdouble])
def test_grouped_path_is_the_spec_bit_for_bit(decay, dtype, monkeypatch):
    for i, shape in enumerate(SHAPES):
        B, T, H, K, V = shape
        # the pairs one at a time, two heads a group, whole batches: every kind of group
        monkeypatch.setattr(recurrence, "GROUP_BYTES", [1, 2 * K * V, 2**20][i % 3] * np.dtype(dtype).itemsize)
        gates = list(GATES)[(i + len(decay)) % len(GATES)]
        p = oracle.make_problem(*shape, decay=decay, gates=gates, initial_state=i % 2 == 0, seed=i)
        do, dfs = oracle.random_cotangents(p, seed=i)
        _check(*_both(p, dtype))
        _check(*_both(p, dtype, do, dfs, every=[64, 1, 4, 5, 3, 4][i]))
        _check(*_both(p, dtype, do, dfs, outputs=False))


def test_grouped_path_keeps_a_transposed_state_layout():
    """A state stored [..., V, K] and handed over transposed (the modes' ``state_v_first``) is computed in that
    layout by both paths, so both call BLAS on the same matrices."""
    p = oracle.make_problem(2, 11, 3, 5, 4, decay="strong", seed=3)
    rng = np.random.default_rng(0)
    h0 = np.ascontiguousarray(rng.standard_normal((2, 3, 4, 5))).swapaxes(-1, -2)
    dfs = np.ascontiguousarray(rng.standard_normal((2, 3, 4, 5))).swapaxes(-1, -2)
    p = p.replace(initial_state=h0)
    do, _ = oracle.random_cotangents(p)
    seq = _TransposedState(p, h0)
    _check(*_both(seq, np.float64, do, dfs, every=4))


class _TransposedState:
    """A problem whose ``h0()`` is a transposed view (as oracle/modes.py hands over a ``[V, K]`` state)."""

    def __init__(self, problem, h0):
        self.shape, self.scale, self._p, self._h0 = problem.shape, problem.scale, problem, h0

    def inputs(self):
        return self._p.inputs()

    def h0(self):
        return self._h0


@pytest.mark.parametrize("B,H,state_bytes,budget", [(8, 6, 8 * 128 * 128, 2**20), (3, 5, 100, 1000),
                                                    (4, 7, 100, 250), (2, 3, 500, 100), (5, 1, 10, 25)])
def test_groups_cover_every_pair_once_and_fit(B, H, state_bytes, budget, monkeypatch):
    monkeypatch.setattr(recurrence, "GROUP_BYTES", budget)
    seen = np.zeros((B, H), int)
    for rows, heads in recurrence._groups(B, H, state_bytes):
        seen[rows, heads] += 1
        n = len(range(B)[rows]) * len(range(H)[heads])
        assert n == 1 or n * state_bytes <= budget
        assert len(range(B)[rows]) == 1 or heads == slice(0, H)  # a group is a view of [B, T, H, ...]
    assert np.all(seen == 1)
