"""Self-checks of oracle/families_mp.py: a family call (KDA, Gated DeltaNet) in mpmath.

On small grouped-value-head calls of both families with each flag (beta's sigmoid, negative eigenvalues, the
in-kernel log-decay in both forms, the q/k L2 norm): the mpmath results agree with the float64 family oracle
(``oracle.families.forward_and_vjp``) to ~1e-12, their error estimates are negligible, the gradients of the
parameters match central differences of the mpmath forward at 256 bits, and bad cotangents are refused."""

from __future__ import annotations

from types import SimpleNamespace

import mpmath
import numpy as np
import pytest

from gdn2_oracle.oracle import families, families_mp, mp

# (family, G = HV / H, flags): each flag alone and all together, in both families.
CALLS = [
    ("gdn", 2, {}),
    ("gdn", 4, {"sigmoid": True}),
    ("gdn", 2, {"sigmoid": True, "neg": True}),
    ("gdn", 4, {"decay_form": "softplus"}),
    ("gdn", 2, {"unit_rows": True}),
    ("gdn", 4, {"sigmoid": True, "neg": True, "decay_form": "softplus", "unit_rows": True}),
    ("kda", 2, {}),
    ("kda", 4, {"sigmoid": True}),
    ("kda", 2, {"sigmoid": True, "neg": True}),
    ("kda", 2, {"decay_form": "softplus"}),
    ("kda", 4, {"decay_form": "bounded"}),
    ("kda", 2, {"decay_form": "bounded_no_A"}),
    ("kda", 2, {"unit_rows": True}),
    ("kda", 4, {"sigmoid": True, "neg": True, "decay_form": "bounded", "unit_rows": True}),
]
IDS = [f"{f}-G{G}-{'+'.join(flags) or 'plain'}" for f, G, flags in CALLS]


def family_call(family, G, *, sigmoid=False, neg=False, decay_form=None, unit_rows=False, seed=0,
                B=2, T=5, H=1, K=4, V=3):
    """``(fcall, do, dfinal_state)``: a small random call of ``family`` with ``HV = G H`` value heads;
    ``decay_form``: None (a given log-decay), ``softplus``, ``bounded`` or ``bounded_no_A`` (no A_log)."""
    rng = np.random.default_rng(seed)
    HV = G * H
    shapes = families.get(family).shapes(B, T, H, HV, K, V)
    kw = dict(q=rng.standard_normal(shapes["q"]), k=rng.standard_normal(shapes["k"]),
              v=rng.standard_normal(shapes["v"]), initial_state=rng.standard_normal((B, HV, K, V)),
              use_qk_l2norm_in_kernel=unit_rows)
    if decay_form is None:
        kw["g"] = -rng.uniform(0.05, 1.0, shapes["g"])
    else:
        kw.update(g=1.5 * rng.standard_normal(shapes["g"]), use_gate_in_kernel=True,
                  dt_bias=0.5 * rng.standard_normal(shapes["dt_bias"]))
        if decay_form != "bounded_no_A":
            kw["A_log"] = rng.uniform(-1.0, 0.5, shapes["A_log"])
        if decay_form != "softplus":
            kw["lower_bound"] = -5.0 if decay_form == "bounded" else -2.0
    if sigmoid:
        kw.update(beta=2.0 * rng.standard_normal(shapes["beta"]), use_beta_sigmoid_in_kernel=True,
                  allow_neg_eigval=neg)
    else:
        kw["beta"] = rng.uniform(0.0, 1.5, shapes["beta"])
    fcall = families.call(family, **kw)
    return fcall, rng.standard_normal(shapes["v"]), rng.standard_normal((B, HV, K, V))


def _by_name(outputs, grads):
    both = {"o": outputs[0], "final_state": outputs[1], **grads._asdict()}
    return {n: a for n, a in both.items() if n != "errors" and a is not None}


@pytest.mark.parametrize("family, G, flags", CALLS, ids=IDS)
def test_the_mpmath_family_call_agrees_with_the_float64_one(family, G, flags):
    fcall, do, dfs = family_call(family, G, **flags)
    fwd, grads = families_mp.forward_and_vjp(fcall, do, dfs)
    got = _by_name(fwd, grads)
    ref = _by_name(*families.forward_and_vjp(fcall, do, dfs, np.float64))
    assert set(got) == set(ref)
    assert ("dA_log" in got) == (fcall.A_log is not None) and ("ddt_bias" in got) == (fcall.dt_bias is not None)
    for n, r in ref.items():
        assert got[n].shape == r.shape and got[n].dtype == np.float64, n
        err = float(np.max(np.abs(got[n] - r))) / float(np.max(np.abs(got[n])))
        assert err <= 1e-12, f"{n}: relative error {err:.2e} against the float64 family oracle"
    errors = {**fwd.errors, **grads.errors}
    assert set(errors) == set(got)
    bound = 2.0 ** -(mp.DEFAULT_PREC - 64)  # 192 of the 256 bits kept, far more than float64's 53
    for n, e in errors.items():
        assert e.shape == got[n].shape, n
        assert float(np.max(e)) <= bound * float(np.max(np.abs(got[n]))), f"{n}: estimate {np.max(e):.2e}"


def test_the_forward_alone_is_the_forward_of_the_full_run():
    fcall, do, dfs = family_call("kda", 2, sigmoid=True, decay_form="bounded", unit_rows=True)
    alone = families_mp.forward(fcall)
    full, _ = families_mp.forward_and_vjp(fcall, do, dfs)
    np.testing.assert_array_equal(alone.o, full.o)
    np.testing.assert_array_equal(alone.final_state, full.final_state)
    assert set(alone.errors) == {"o", "final_state"}


def _loss(fcall, do, dfs, prec, overrides):
    """``sum(o do) + sum(S_T dS_T)`` of the mpmath forward at ``prec`` bits (an mpf)."""
    out = families_mp.run_mpf(fcall, prec, overrides=overrides)
    with mpmath.workprec(prec):
        return np.sum(out["o"] * mp.MPArith().array(do)) + np.sum(out["final_state"] * mp.MPArith().array(dfs))


@pytest.mark.parametrize("family, flags", [
    ("gdn", {"sigmoid": True, "neg": True, "decay_form": "softplus", "unit_rows": True}),
    ("kda", {"sigmoid": True, "neg": True, "decay_form": "bounded", "unit_rows": True}),
], ids=["gdn", "kda"])
def test_the_gradients_match_central_differences_at_high_precision(family, flags):
    """Independent of the float64 oracle: ``(L(x + h) - L(x - h)) / 2h`` at 256 bits with ``h = 2^-80`` (error
    ``O(h^2)``) against the mpmath gradient, for one entry of every differentiated argument."""
    fcall, do, dfs = family_call(family, 2, T=3, **flags)
    prec, h = 256, mpmath.mpf(2) ** -80
    grads = families_mp.run_mpf(fcall, prec, do, dfs)
    for arg, grad in (("q", "dq"), ("k", "dk"), ("v", "dv"), ("g", "dg"), ("beta", "dbeta"), ("A_log", "dA_log"),
                      ("dt_bias", "ddt_bias")):
        x0 = mp.MPArith().array(getattr(fcall, arg))
        idx = (0,) * x0.ndim if arg in ("A_log", "dt_bias") else (1,) + (0,) * (x0.ndim - 1)
        sides = []
        for sign in (1, -1):
            x = x0.copy()
            with mpmath.workprec(prec):
                x[idx] = x[idx] + sign * h
            sides.append(_loss(fcall, do, dfs, prec, {arg: x}))
        with mpmath.workprec(prec):
            fd = (sides[0] - sides[1]) / (2 * h)
            err = abs(fd - grads[grad][idx])
        assert err <= mpmath.mpf(10) ** -40 * max(1, abs(fd)), f"{grad}{idx}: {fd} vs {grads[grad][idx]}"


def test_bad_cotangents_and_precision_name_the_argument():
    fcall, do, dfs = family_call("gdn", 2)
    with pytest.raises(ValueError, match="^do: shape"):
        families_mp.forward_and_vjp(fcall, do[:, :, :1], dfs)
    with pytest.raises(ValueError, match="^dfinal_state: shape"):
        families_mp.forward_and_vjp(fcall, do, dfs[..., :1])
    with pytest.raises(ValueError, match="^prec"):
        families_mp.forward(fcall, prec=20)


def test_a_call_with_packed_sequences_or_chunk_states_is_refused():
    """The mpmath family call runs ``[B, T]`` tokens with ``[K, V]`` states: a call with another structure is a
    ValueError naming what it has (read from the call's fields, whichever of them the call has)."""
    fcall, _, _ = family_call("kda", 2)
    families_mp.check_unpacked(fcall)  # a call of B rows of T tokens passes
    packed = SimpleNamespace(cu_seqlens=np.array([0, 2, 5]), intermediate_chunk_size=None)
    with pytest.raises(ValueError, match="^fcall: cu_seqlens: not supported"):
        families_mp.check_unpacked(packed)
    chunks = SimpleNamespace(cu_seqlens=None, intermediate_chunk_size=64, call_keywords=())
    with pytest.raises(ValueError, match="^fcall: intermediate_chunk_size"):
        families_mp.check_unpacked(chunks)
