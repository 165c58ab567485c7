"""Family kernels (kernels/families.py, kernels/gdn_scalar.py), their mutants (kernels/testing_families.py) and
FLA's naive GDN / KDA references as family peers (kernels/fla_peers.py) against a token-by-token JAX recurrence
written here and against the oracle (``oracle.families``, float64)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn2_oracle import kernels
from gdn2_oracle.kernels import testing_families
from gdn2_oracle.kernels.families import FamilyKernel
from gdn2_oracle.oracle import families as oracle_families

NAMES = ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias")
GRADS = ("dq", "dk", "dv", "dg", "dbeta", "dh0", "dA_log", "ddt_bias")
FLOAT32 = 2e-6  # rms-relative agreement of two float32 computations of the same call (measured ~1e-7..8e-7)


def _nerr(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    scale = np.sqrt(np.mean(ref ** 2))
    return float(np.sqrt(np.mean((got - ref) ** 2)) / scale) if scale else float(np.sqrt(np.mean(got ** 2)))


def _case(family, *, G=1, H=2, B=2, T=21, K=5, V=3, sigmoid=False, neg=False, l2=False, gate=False, seed=0):
    """``(arrays, flags, do, dfs)`` of a random family call (float64 arrays)."""
    rng = np.random.default_rng(seed)
    HV = G * H
    gshape = (B, T, HV, K) if family == "kda" else (B, T, HV)
    x = dict(q=rng.standard_normal((B, T, H, K)), k=rng.standard_normal((B, T, H, K)) * 0.7,
             v=rng.standard_normal((B, T, HV, V)), initial_state=rng.standard_normal((B, HV, K, V)))
    x["g"] = rng.standard_normal(gshape) * 1.5 if gate else -rng.uniform(0.05, 1.0, gshape)
    x["beta"] = rng.standard_normal((B, T, HV)) * 2 if sigmoid else rng.uniform(0, 1.2, (B, T, HV))
    flags = dict(use_beta_sigmoid_in_kernel=sigmoid, allow_neg_eigval=neg, use_qk_l2norm_in_kernel=l2,
                 use_gate_in_kernel=gate)
    if gate:
        x["A_log"] = rng.uniform(-1, 0.5, HV)
        x["dt_bias"] = rng.standard_normal(HV * K if family == "kda" else HV) * 0.5
    return x, flags, rng.standard_normal((B, T, HV, V)), rng.standard_normal((B, HV, K, V))


def _oracle(family, x, flags, do, dfs):
    (o, S), grads = oracle_families.forward_and_vjp(oracle_families.call(family, **x, **flags), do, dfs)
    return (o, S), {n: getattr(grads, n) for n in GRADS}


def _run(kernel, x, flags, do, dfs):
    """``((o, final_state), {grad: array})`` of ``kernel`` by ``jax.vjp``, float32."""
    names = [n for n in NAMES if n in x]
    args = [jnp.asarray(x[n], jnp.float32) for n in names]

    def f(*a):
        return kernel(**dict(zip(names, a)), **flags, output_final_state=True)

    out, pull = jax.vjp(f, *args)
    grads = pull((jnp.asarray(do, jnp.float32), jnp.asarray(dfs, jnp.float32)))
    return out, {GRADS[NAMES.index(n)]: g for n, g in zip(names, grads)}


def _plain_recurrence(family, x, flags):
    """Token by token in JAX, written out from docs/DESIGN.md §1 (value head hv reads key head hv // G)."""
    f32 = {n: jnp.asarray(a, jnp.float32) for n, a in x.items()}
    q, k, v, g, beta = (f32[n] for n in ("q", "k", "v", "g", "beta"))
    B, T, H, K = q.shape
    HV = v.shape[2]
    head = np.arange(HV) // (HV // H)
    if flags["use_qk_l2norm_in_kernel"]:
        q, k = (a / jnp.sqrt(jnp.sum(a * a, -1, keepdims=True) + np.float32(1e-6)) for a in (q, k))
    q, k = q[:, :, head], k[:, :, head]
    if flags["use_beta_sigmoid_in_kernel"]:
        beta = (2.0 if flags["allow_neg_eigval"] else 1.0) / (1 + jnp.exp(-beta))
    if family == "gdn":
        g = jnp.broadcast_to(g[..., None], (B, T, HV, K))
    S = f32["initial_state"]
    outs = []
    for t in range(T):
        Sbar = jnp.exp(g[:, t])[..., None] * S
        u = beta[:, t, :, None] * (v[:, t] - jnp.einsum("bhkv,bhk->bhv", Sbar, k[:, t]))
        S = Sbar + k[:, t, ..., None] * u[..., None, :]
        outs.append(K ** -0.5 * jnp.einsum("bhkv,bhk->bhv", S, q[:, t]))
    return jnp.stack(outs, 1), S


FLAG_CASES = {"plain": {}, "sigmoid": dict(sigmoid=True), "neg_l2": dict(sigmoid=True, neg=True, l2=True)}
OURS = ("gdn-factorized", "gdn-pairwise", "kda-factorized", "kda-pairwise", "gdn-scalar")


# make test runs each kernel with beta logits and G = 2; the plain and G = 4 runs (neg eigval, the L2 norm) are in the
# release group (slow): each is a jax.vjp of a chunked kernel compiled on two CPU cores.
@pytest.mark.parametrize(("flags", "G"), [pytest.param("plain", 1, marks=pytest.mark.slow), ("sigmoid", 2),
                                          pytest.param("neg_l2", 4, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", OURS)
def test_family_kernel_matches_plain_recurrence_and_oracle(name, flags, G):
    family = name.split("-")[0]
    kernel = kernels.get(name, chunk_size=16)
    assert kernel.family == family
    x, fl, do, dfs = _case(family, G=G, seed=G, **FLAG_CASES[flags])
    (o, S), grads = _run(kernel, x, fl, do, dfs)
    o_rec, S_rec = _plain_recurrence(family, x, fl)
    assert _nerr(o, o_rec) < FLOAT32 and _nerr(S, S_rec) < FLOAT32
    (o_ref, S_ref), ref = _oracle(family, x, fl, do, dfs)
    assert _nerr(o, o_ref) < FLOAT32 and _nerr(S, S_ref) < FLOAT32
    for n, got in grads.items():
        assert _nerr(got, ref[n]) < FLOAT32, (n, _nerr(got, ref[n]))


@pytest.mark.parametrize("name", ["gdn-factorized", "kda-pairwise", "gdn-scalar"])
def test_family_kernel_in_kernel_gate_gradients(name):
    family = name.split("-")[0]
    x, fl, do, dfs = _case(family, G=2, gate=True, sigmoid=True, seed=5)
    (o, S), grads = _run(kernels.get(name, chunk_size=16), x, fl, do, dfs)
    (o_ref, S_ref), ref = _oracle(family, x, fl, do, dfs)
    assert _nerr(o, o_ref) < FLOAT32 and _nerr(S, S_ref) < FLOAT32
    assert set(grads) == set(GRADS)
    for n, got in grads.items():
        assert _nerr(got, ref[n]) < FLOAT32, (n, _nerr(got, ref[n]))


def test_gdn_scalar_agrees_with_gdn_factorized_at_chunk_64():
    x, fl, do, dfs = _case("gdn", G=2, T=150, K=8, V=4, seed=3)
    x["g"] = x["g"] * 4  # strong decay: exponents over ~300 within a chunk
    a, ga = _run(kernels.get("gdn-scalar"), x, fl, do, dfs)
    b, gb = _run(kernels.get("gdn-factorized"), x, fl, do, dfs)
    for u, w in zip(a, b):
        assert _nerr(u, w) < FLOAT32
    for n in ga:
        assert _nerr(ga[n], gb[n]) < FLOAT32, n


def test_family_kernel_follows_fla_conventions():
    kernel = kernels.get("kda-factorized", chunk_size=16)
    x, fl, _, _ = _case("kda", G=2, seed=1)
    a = {n: jnp.asarray(v, jnp.float32) for n, v in x.items()}
    o, final = kernel(**a, **fl)
    assert final is None and o.shape == x["v"].shape  # no final state unless output_final_state (FLA)
    o16, _ = kernel(**{n: v.astype(jnp.bfloat16) if n != "initial_state" else v for n, v in a.items()}, **fl)
    assert o16.dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="allow_neg_eigval: requires use_beta_sigmoid_in_kernel"):
        kernel(**a, allow_neg_eigval=True)
    with pytest.raises(ValueError, match=r"g: shape .* \(kda\)"):
        kernel(**dict(a, g=a["g"][..., 0]))
    with pytest.raises(ValueError, match="lower_bound: not a keyword of the gdn family"):
        kernels.get("gdn-pairwise")(**dict(a, g=a["g"][..., 0]), use_gate_in_kernel=True, A_log=jnp.zeros(4),
                                     lower_bound=-5.0)
    with pytest.raises(ValueError, match="v: value heads HV = 3"):
        kernel(**dict(a, v=a["v"][:, :, :3], beta=a["beta"][:, :, :3], g=a["g"][:, :, :3],
                      initial_state=a["initial_state"][:, :3]))
    with pytest.raises(ValueError, match="g: log-decay must be <= 0"):
        kernel(**dict(a, g=-a["g"]), check_values=True)


# --- the mutants ------------------------------------------------------------------------------------------------

# Each mutant on a call that reaches its bug.
MUTANT_CASES = {"gva_modulo": dict(G=2), "beta_write_only": {}, "read_before_decay": {},
                "dt_bias_after_softplus": dict(gate=True), "sigmoid_twice": dict(sigmoid=True),
                "no_neg_eigval": dict(sigmoid=True, neg=True), "padded_tail_gate": dict(gate=True)}
# Mutants whose bug only bfloat16 inputs reach (their own test below).
BF16_MUTANTS = ("bf16_decay",)


def test_every_mutant_has_a_case():
    assert set(MUTANT_CASES) | set(BF16_MUTANTS) == set(testing_families.MUTANTS)


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "padded_tail_gate" else n
                                  for n in MUTANT_CASES])  # the padded tail (~45 s): its own test below in make test
def test_mutant_disagrees_with_oracle(name, family):
    kernel = getattr(testing_families, f"{family}_{name}")
    assert isinstance(kernel, FamilyKernel) and kernel.family == family
    x, fl, do, dfs = _case(family, seed=7, **MUTANT_CASES[name])
    (o, S), grads = _run(kernel, x, fl, do, dfs)
    (o_ref, S_ref), ref = _oracle(family, x, fl, do, dfs)
    worst = max([_nerr(o, o_ref), _nerr(S, S_ref)] + [_nerr(g, ref[n]) for n, g in grads.items()])
    assert worst > 1e-2, worst  # float32 rounding is ~1e-7
    clean = {n: v for n, v in MUTANT_CASES.items() if n not in ("beta_write_only", "read_before_decay")}
    if name in clean:  # a call that does not reach the bug is the correct kernel's
        x, fl, do, dfs = _case(family, seed=7)
        (o, S), _ = _run(kernel, x, fl, do, dfs)
        (o_ref, S_ref), _ = _oracle(family, x, fl, do, dfs)
        assert _nerr(o, o_ref) < FLOAT32 and _nerr(S, S_ref) < FLOAT32


def _forward(kernel, x, flags, dtype):
    """``(o, final_state)`` of ``kernel`` with the per-token inputs in ``dtype`` (float64 NumPy)."""
    args = {n: jnp.asarray(a, dtype if n in ("q", "k", "v", "g", "beta") else jnp.float32) for n, a in x.items()}
    o, S = kernel(**args, **flags, output_final_state=True)
    return np.asarray(o, np.float64), np.asarray(S, np.float64)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_bf16_decay_mutant_is_wrong_only_for_bfloat16_inputs(family):
    """The cumulative log-decay kept in bfloat16: float32 inputs give the correct kernel's results bit for bit;
    bfloat16 inputs an error several times the correct kernel's on the same (rounded) inputs against the oracle."""
    mutant, right = getattr(testing_families, f"{family}_bf16_decay"), FamilyKernel("right", family,
                                                                                     testing_families._CORE)
    x, fl, _, _ = _case(family, G=2, T=40, seed=3)
    for a, b in zip(_forward(mutant, x, fl, jnp.float32), _forward(right, x, fl, jnp.float32)):
        assert np.array_equal(a, b)
    x = {n: np.asarray(jnp.asarray(a, jnp.bfloat16), np.float64) if n in ("q", "k", "v", "g", "beta") else a
         for n, a in x.items()}
    (o_ref, S_ref), _ = _oracle(family, x, fl, *_case(family, G=2, T=40, seed=3)[2:])
    (o, S), (o_ok, S_ok) = _forward(mutant, x, fl, jnp.bfloat16), _forward(right, x, fl, jnp.bfloat16)
    assert _nerr(S, S_ref) > 3 * _nerr(S_ok, S_ref) and _nerr(o, o_ref) > 1.5 * _nerr(o_ok, o_ref), (
        _nerr(S, S_ref), _nerr(S_ok, S_ref), _nerr(o, o_ref), _nerr(o_ok, o_ref))


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_padded_tail_gate_mutant_decays_only_the_final_state_of_a_tail(family):
    """The gate applied to padding: at T = 21 o is the correct kernel's and the final state smaller; at T = 64 (no
    padding) both are the correct kernel's."""
    mutant = getattr(testing_families, f"{family}_padded_tail_gate")
    right = FamilyKernel("right", family, testing_families._CORE)
    for T in (21, 64):
        x, fl, _, _ = _case(family, G=2, T=T, gate=True, seed=5)
        (o, S), (o_ok, S_ok) = _forward(mutant, x, fl, jnp.float32), _forward(right, x, fl, jnp.float32)
        assert np.array_equal(o, o_ok)
        if T % 64:
            assert np.sqrt(np.mean(S ** 2)) < 0.9 * np.sqrt(np.mean(S_ok ** 2))
        else:
            assert np.array_equal(S, S_ok)


# --- FLA's naive references as family peers --------------------------------------------------------------------

PEERS = ("fla-gdn-naive-recurrent", "fla-gdn-naive-chunk[chunk_size=16]", "fla-kda-naive-recurrent",
         "fla-kda-naive-chunk[chunk_size=16]")
PEER_CASES = {"plain_gva": dict(G=2), "logits_neg_l2_gate": dict(sigmoid=True, neg=True, l2=True, gate=True, G=2),
              "logits": dict(sigmoid=True)}
SLOW_PEER_CASES = ("plain_gva", "logits")  # make test runs every peer on the case with every flag (release: all)


def _peer(spec):
    pytest.importorskip("torch", reason="torch is not importable: FLA's references cannot run")
    pytest.importorskip("einops", reason="einops is not importable: FLA's naive references need it")
    try:
        return kernels.get(spec, device="cpu")
    except ValueError as exc:
        pytest.skip(f"FLA is unavailable here: {exc}")


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_PEER_CASES else c
                                  for c in PEER_CASES])
@pytest.mark.parametrize("spec", PEERS)
def test_fla_family_peer_matches_oracle(spec, case):
    kernel = _peer(spec)
    family = "gdn" if spec.startswith("fla-gdn") else "kda"
    assert kernel.family == family
    x, fl, do, dfs = _case(family, T=19, seed=11, **PEER_CASES[case])
    (o, S), grads = _run(kernel, x, fl, do, dfs)
    (o_ref, S_ref), ref = _oracle(family, x, fl, do, dfs)
    assert _nerr(o, o_ref) < FLOAT32 and _nerr(S, S_ref) < FLOAT32
    for n, got in grads.items():
        assert _nerr(got, ref[n]) < FLOAT32, (n, _nerr(got, ref[n]))


def test_fla_kda_peer_keeps_the_gdn2_contract_under_an_option():
    kernel = _peer("fla-kda-naive-recurrent[signature=gdn2]")
    assert not hasattr(kernel, "family")
    with pytest.raises(ValueError, match="signature: 'x' not one of"):
        kernels.get("fla-kda-naive-recurrent[signature=x]", device="cpu")
