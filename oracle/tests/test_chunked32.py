"""The float32 chunked baseline (oracle/chunked32.py): the right algorithm, and the known precision loss.

In float64 it must equal the exact recurrence (so its float32 error is rounding, not a wrong formula);
in float32 it must lose precision exactly where exponents formed as differences of float32 cumulative
sums do (resets, extreme decay) and stay at the float32 recurrence's level elsewhere.
"""

from __future__ import annotations

import numpy as np
import pytest

from gdn2_oracle import oracle
from gdn2_oracle.ci.grading.tolerance import MULTIPLE, metrics, normalised_error, scales
from gdn2_oracle.oracle import RESULTS, chunked32, recurrence


def _results(out):
    """``{name: array}`` of a ``((o, final_state), grads)`` pair."""
    (o, S), g = out
    return {"o": o, "final_state": S, **g._asdict()}


def _run(p, do, dfs, **kw):
    return _results(chunked32.forward_and_vjp(p, do, dfs, **kw))


def _exact(p, do, dfs, dtype=np.float64):
    return _results(recurrence.forward_and_vjp(p, do, dfs, dtype=dtype))


@pytest.mark.parametrize("decay", oracle.DECAYS)
@pytest.mark.parametrize("T,chunk", [(1, 64), (37, 16), (130, 64)])
def test_float64_chunked_algorithm_equals_the_recurrence(decay, T, chunk):
    """Forward and all seven gradients of the chunked algorithm (any chunk, a tail, K != V, an initial
    state, negative-eigenvalue gates) equal the token-by-token recurrence to float64 rounding."""
    p = oracle.make_problem(2, T, 2, 8, 4, decay=decay, gates="negative", initial_state=True, seed=T + 11,
                            precision="float64")
    do, dfs = oracle.random_cotangents(p, 3, "float64")
    got, ref = _run(p, do, dfs, chunk_size=chunk, dtype=np.float64), _exact(p, do, dfs)
    for name in RESULTS:
        assert got[name].dtype == np.float64
        assert normalised_error(got[name], ref[name]) <= 1e-11, name


def _ratios(decay, shape=(1, 300, 1, 16, 16), seed=7):
    """Per result: e_cum / e_rec (err_ratio of float32 chunked32 over the float32 recurrence's), and e_cum."""
    p = oracle.make_problem(*shape, decay=decay, gates="uniform", initial_state=True, seed=seed)
    do, dfs = oracle.random_cotangents(p, seed + 1)
    ref, cum, rec = _exact(p, do, dfs), _run(p, do, dfs), _exact(p, do, dfs, np.float32)
    out = {}
    for name in RESULTS:
        assert cum[name].dtype == np.float32
        s = scales(name, p, ref)
        e_cum, e_rec = metrics(cum[name], ref[name], *s)[0], metrics(rec[name], ref[name], *s)[0]
        out[name] = (e_cum / e_rec, e_cum)
    return out


def test_float32_loses_precision_after_resets():
    """A reset (g ~ -1e3) makes |G| ~ 1e3 within the chunk: ulp(|G|) ~ 6e-5 in every decay factor, so
    err_ratio ~ 1e-5..1e-4 (the first version of our kernels: 3e-5), far over 32 x the recurrence's."""
    r = _ratios("resets")
    for name in ("o", "dq", "dk", "dv", "db", "dw"):
        ratio, e_cum = r[name]
        assert 1e-5 <= e_cum <= 3e-4 and ratio > MULTIPLE["float32"], (name, r[name])


def test_float32_db_loses_precision_under_extreme_decay():
    """Extreme decay (|G| up to ~4000 in a chunk): db, formed through the decayed erase tile, is hit hardest."""
    r = _ratios("extreme")
    assert r["db"][0] > MULTIPLE["float32"], r
    assert r["db"][0] == max(x for x, _ in r.values()), r


@pytest.mark.parametrize("decay", ["none", "weak", "moderate", "mixed"])
def test_float32_is_at_recurrence_level_elsewhere(decay):
    """Where |G| stays small the cumulative sums are accurate: every result within a few x e_rec."""
    r = _ratios(decay)
    assert all(ratio <= 4 for ratio, _ in r.values()), r


def test_unit_lower_inverse_is_the_inverse():
    rng = np.random.default_rng(0)
    T = np.tril(rng.standard_normal((3, 9, 9)), -1) * 0.3
    A = chunked32.unit_lower_inverse(T)
    np.testing.assert_allclose(A @ (np.eye(9) + T), np.broadcast_to(np.eye(9), A.shape), atol=1e-12)


def test_bad_arguments_are_rejected():
    p = oracle.make_problem(1, 5, 1, 4, 4)
    do, dfs = oracle.random_cotangents(p)
    with pytest.raises(ValueError, match="dtype"):
        chunked32.forward_and_vjp(p, do, dfs, dtype=np.float16)
    with pytest.raises(ValueError, match="chunk_size"):
        chunked32.forward_and_vjp(p, do, dfs, chunk_size=0)
    with pytest.raises(ValueError, match="operands"):
        chunked32.forward_and_vjp(p, do, dfs, operands="float16")
    with pytest.raises(ValueError, match="do"):
        chunked32.forward_and_vjp(p, do[:, :2], dfs)
    with pytest.raises(ValueError, match="clip"):
        chunked32.forward_and_vjp(p, do, dfs, clip=0.0)


def test_a_clip_is_its_forward_s_exact_adjoint_and_beyond_every_exponent_no_clip():
    """``clip``: dg and db are the float64 finite differences of the clipped forward (clipped factors constants);
    a clip deeper than every within-chunk exponent changes nothing."""
    p = oracle.make_problem(1, 8, 1, 4, 4, decay="strong", initial_state=True, seed=5, precision="float64")
    do, dfs = oracle.random_cotangents(p, 6, "float64")
    clip = 0.5 * float(-np.min(np.cumsum(p.g, axis=1)))  # clips some pairs, not all

    def loss(**arrays):
        q = oracle.Problem(*(arrays.get(n, getattr(p, n)) for n in ("q", "k", "v", "g", "b", "w")), scale=p.scale,
                           initial_state=p.initial_state)
        (o, S), _ = chunked32.forward_and_vjp(q, do, dfs, dtype=np.float64, clip=clip)
        return float(np.sum(o * do) + np.sum(S * dfs))

    got = _run(p, do, dfs, dtype=np.float64, clip=clip)
    h = 1e-6
    for name in ("g", "b"):
        x = getattr(p, name)
        fd = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            e = np.zeros_like(x)
            e[i] = h
            fd[i] = (loss(**{name: x + e}) - loss(**{name: x - e})) / (2 * h)
        assert normalised_error(got["d" + name], fd) <= 1e-6, name
    plain = _run(p, do, dfs, dtype=np.float64)
    assert normalised_error(got["db"], plain["db"]) > 1e-9  # the clip acts (float64 rounding: ~1e-15)
    deep = _run(p, do, dfs, dtype=np.float64, clip=2 * clip + 1)
    assert all(np.array_equal(deep[n], plain[n]) for n in RESULTS)


def test_bfloat16_operands_lose_bfloat16_precision_in_every_result():
    """``operands="bfloat16"`` rounds every product's operands: each result's error against the exact recurrence
    is of bfloat16's size (between 1/16 and 4 units of 2^-8 relative), while the float32 operands stay near
    float32's; float32 operands are the default, bit for bit."""
    p = oracle.make_problem(1, 130, 2, 16, 8, decay="moderate", initial_state=True, seed=5, precision="float32")
    do, dfs = oracle.random_cotangents(p, 1, "float32")
    ref = _exact(p, do, dfs)
    f32, b16 = _run(p, do, dfs), _run(p, do, dfs, operands="bfloat16")
    same = _run(p, do, dfs, operands=None)
    for name in RESULTS:
        np.testing.assert_array_equal(same[name], f32[name])
        e16, e32 = normalised_error(b16[name], ref[name]), normalised_error(f32[name], ref[name])
        assert 2.0 ** -12 <= e16 <= 2.0 ** -6 and e32 <= 1e-5, (name, e16, e32)


def test_the_modes_pipeline_runs_the_bfloat16_operand_core():
    """``oracle.modes``' core ``chunked32_bf16`` is ``chunked32`` with bfloat16 operands, sequence by sequence."""
    from gdn2_oracle.oracle import modes
    from gdn2_oracle.oracle.call import Call

    p = oracle.make_problem(1, 70, 1, 8, 8, decay="moderate", initial_state=True, seed=2, precision="float32")
    call = Call(*p.inputs(), scale=p.scale, initial_state=p.initial_state)
    got = modes.forward_modes(call, np.float32, core="chunked32_bf16")
    (o, S), _ = chunked32.forward_and_vjp(p, *oracle.random_cotangents(p, 1, "float32"), operands="bfloat16")
    np.testing.assert_allclose(got.o, o, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got.final_state, S, rtol=0, atol=1e-6)
