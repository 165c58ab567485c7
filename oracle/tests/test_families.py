"""Self-checks of oracle/families.py: KDA and Gated DeltaNet as GDN-2 (docs/DESIGN.md §1, "Families").

The family forward equals the GDN-2 oracle on the problem written out by hand; every projected gradient
(beta logits with and without negative eigenvalues, the gates' A_log and dt_bias, the L2 norm) against central
finite differences of the family's float64 forward; the float32 pipeline; bad input; and, when torch and
fla-core are installed, FLA's own PyTorch references (fla-core 0.6.0) differentiated by torch autograd."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from gdn2_oracle.oracle import Call, Problem, families, modes, recurrence, reductions
from gdn2_oracle.oracle.families import FAMILY_GRADS

# Which argument each family gradient belongs to.
GRAD_ARGS = dict(zip(FAMILY_GRADS, ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias")))


def _nerr(got, ref):
    """rms(got - ref) / rms(ref) (0 when both vanish)."""
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    scale = np.sqrt(np.mean(ref ** 2))
    diff = np.sqrt(np.mean((got - ref) ** 2))
    return diff / scale if scale else diff


def _kwargs(name, B, T, H, K, V, *, seed=0, gate=None, sigmoid=False, neg=False, l2norm=False, h0=True, HV=None):
    """Random keyword arguments of a family call; ``gate`` None, "softplus", "bounded" or "bounded_no_A"."""
    rng = np.random.default_rng(seed)
    HV = H if HV is None else HV
    shapes = families.get(name).shapes(B, T, H, HV, K, V)
    kw = dict(q=rng.standard_normal(shapes["q"]), k=rng.standard_normal(shapes["k"]),
              v=rng.standard_normal(shapes["v"]))
    if gate is None:
        kw["g"] = -rng.uniform(0.05, 1.0, shapes["g"])
    else:
        kw.update(g=rng.standard_normal(shapes["g"]) * 1.5, use_gate_in_kernel=True,
                  dt_bias=rng.standard_normal(shapes["dt_bias"]) * 0.5)
        if gate != "bounded_no_A":
            kw["A_log"] = rng.uniform(-1, 0.5, shapes["A_log"])
        if gate != "softplus":
            kw["lower_bound"] = -5.0 if gate == "bounded" else -2.0
    if sigmoid:
        kw.update(beta=rng.standard_normal(shapes["beta"]) * 2, use_beta_sigmoid_in_kernel=True,
                  allow_neg_eigval=neg)
    else:
        kw["beta"] = rng.uniform(0, 1.5, shapes["beta"])
    if l2norm:
        kw["use_qk_l2norm_in_kernel"] = True
    if h0:
        kw["initial_state"] = rng.standard_normal((B, HV, K, V))
    do = rng.standard_normal(shapes["v"])
    dfs = rng.standard_normal((B, HV, K, V))
    return kw, do, dfs


def _loss(name, kw, do, dfs):
    o, S = families.forward(families.call(name, **kw))
    return np.sum(o * do) + np.sum(S * dfs)


# --- the registry ----------------------------------------------------------------------------------------

def test_registry_shapes_follow_fla():
    B, T, H, HV, K, V = 2, 7, 2, 4, 3, 5
    kda = families.get("kda").shapes(B, T, H, HV, K, V)
    gdn = families.get("gdn").shapes(B, T, H, HV, K, V)
    gdn2 = families.get("gdn2").shapes(B, T, H, HV, K, V)
    for s in (kda, gdn, gdn2):
        assert s["q"] == s["k"] == (B, T, H, K) and s["v"] == (B, T, HV, V) and s["A_log"] == (HV,)
    assert kda["g"] == (B, T, HV, K) and kda["beta"] == (B, T, HV) and kda["dt_bias"] == (HV * K,)
    assert gdn["g"] == (B, T, HV) and gdn["beta"] == (B, T, HV) and gdn["dt_bias"] == (HV,)
    assert gdn2["b"] == (B, T, HV, K) and gdn2["w"] == (B, T, HV, V)
    assert "allow_neg_eigval" in families.KDA.flags and "lower_bound" not in families.GDN.flags
    assert set(families.FAMILIES) == {"gdn2", "kda", "gdn"}
    with pytest.raises(ValueError, match="family"):
        families.get("mamba")


# --- forward == the GDN-2 oracle on the mapped problem ------------------------------------------------------

def _softplus(x):
    return np.log1p(np.exp(x))


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _by_hand(name, kw):
    """The GDN-2 problem of a family call, written out with the textbook formulas (no oracle code)."""
    q, k, v, g, beta = (np.asarray(kw[n]) for n in ("q", "k", "v", "g", "beta"))
    B, T, H, K = q.shape
    V = v.shape[-1]
    if kw.get("use_qk_l2norm_in_kernel"):
        q, k = (x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + np.float32(1e-6).item()) for x in (q, k))
    if kw.get("use_beta_sigmoid_in_kernel"):
        beta = (2 if kw.get("allow_neg_eigval") else 1) * _sigmoid(beta)
    if kw.get("use_gate_in_kernel"):
        x = g if kw.get("dt_bias") is None else g + kw["dt_bias"].reshape(g.shape[2:])
        A = np.exp(kw["A_log"]) if kw.get("A_log") is not None else np.ones(H)
        A = A if name == "gdn" else A[:, None]
        g = -A * _softplus(x) if kw.get("lower_bound") is None else kw["lower_bound"] * _sigmoid(A * x)
    if name == "gdn":
        g = np.repeat(g[..., None], K, axis=-1)
    G = v.shape[2] // H  # grouped value heads: value head hv reads key head hv // G
    q, k = (np.repeat(x, G, axis=2) for x in (q, k))
    b = np.repeat(beta[..., None], K, axis=-1)
    w = np.repeat(beta[..., None], V, axis=-1)
    return Problem(q, k, v, g, b, w, initial_state=kw.get("initial_state"))


FORWARD_CASES = {
    "kda_plain": ("kda", {}),
    "kda_sigmoid_neg_softplus_l2": ("kda", dict(sigmoid=True, neg=True, gate="softplus", l2norm=True)),
    "kda_sigmoid_bounded": ("kda", dict(sigmoid=True, gate="bounded")),
    "kda_bounded_no_A": ("kda", dict(gate="bounded_no_A", h0=False)),
    "gdn_plain": ("gdn", {}),
    "gdn_sigmoid_neg_gate_l2": ("gdn", dict(sigmoid=True, neg=True, gate="softplus", l2norm=True)),
    "gdn_sigmoid_gate": ("gdn", dict(sigmoid=True, gate="softplus", h0=False)),
    "kda_gva_sigmoid_bounded": ("kda", dict(HV=4, sigmoid=True, neg=True, gate="bounded")),
    "gdn_gva_sigmoid_gate": ("gdn", dict(HV=6, sigmoid=True, gate="softplus")),
}


@pytest.mark.parametrize("case", list(FORWARD_CASES))
def test_forward_equals_gdn2_oracle_on_mapped_problem(case):
    name, opts = FORWARD_CASES[case]
    kw, _, _ = _kwargs(name, 2, 6, 2, 3, 4, seed=len(case), **opts)
    fcall = families.call(name, **kw)
    problem = fcall.to_gdn2()
    hand = _by_hand(name, kw)  # grouped value heads written out as HV heads of their own
    G = problem.v.shape[2] // problem.q.shape[2]
    for n in ("q", "k", "v", "g", "b", "w"):
        got = np.repeat(getattr(problem, n), G, axis=2) if n in ("q", "k") else getattr(problem, n)
        np.testing.assert_allclose(got, getattr(hand, n), rtol=1e-14, atol=1e-15, err_msg=n)
    o, S = families.forward(fcall)
    o_ref, S_ref = recurrence.forward(hand)
    np.testing.assert_allclose(o, o_ref, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(S, S_ref, rtol=1e-12, atol=1e-13)


def test_plain_calls_equal_the_reductions():
    """Without activations the mapping is oracle.reductions' kda_problem / gated_deltanet_problem, bit for bit."""
    for name, reduce in (("kda", reductions.kda_problem), ("gdn", reductions.gated_deltanet_problem)):
        kw, _, _ = _kwargs(name, 1, 5, 2, 3, 2, seed=3)
        mapped = families.call(name, **kw).to_gdn2()
        ref = reduce(kw["q"], kw["k"], kw["v"], kw["g"], kw["beta"], initial_state=kw["initial_state"])
        for n in ("q", "k", "v", "g", "b", "w", "initial_state"):
            np.testing.assert_array_equal(getattr(mapped, n), getattr(ref, n), err_msg=f"{name}: {n}")


@pytest.mark.parametrize("gate", ["softplus", "bounded", "bounded_no_A"])
def test_kda_gate_is_gdn2_call_gate(gate):
    """KDA's in-kernel gate is chunk_gdn2's (fla/ops/kda/gate.py for both): the family call and the GDN-2 Call
    with gate_in_kernel agree on the outputs and on dg, dA_log, ddt_bias; dbeta = sum db + sum dw."""
    kw, do, dfs = _kwargs("kda", 1, 6, 2, 3, 2, seed=5, gate=gate)
    (o, S), fg = families.forward_and_vjp(families.call("kda", **kw), do, dfs)
    K, V = kw["q"].shape[-1], kw["v"].shape[-1]
    b = np.repeat(kw["beta"][..., None], K, axis=-1)
    w = np.repeat(kw["beta"][..., None], V, axis=-1)
    c = Call(kw["q"], kw["k"], kw["v"], kw["g"], b, w, initial_state=kw["initial_state"], gate_in_kernel=True,
             A_log=kw.get("A_log"), dt_bias=kw["dt_bias"], lower_bound=kw.get("lower_bound"))
    mf, mg = modes.forward_and_vjp_modes(c, do, dfs)
    np.testing.assert_allclose(o, mf.o, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(S, mf.final_state, rtol=1e-13, atol=1e-14)
    for n in ("dq", "dk", "dv", "dg", "dh0", "dA_log", "ddt_bias"):
        ours, ref = getattr(fg, n), getattr(mg, n)
        if ref is None:
            assert ours is None, n
            continue
        np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-13, err_msg=n)
    np.testing.assert_allclose(fg.dbeta, mg.db.sum(-1) + mg.dw.sum(-1), rtol=1e-12, atol=1e-13)


# --- every projected gradient vs central finite differences --------------------------------------------------

FD_CASES = {
    "kda_plain": ("kda", dict(B=2)),
    "kda_logits_neg_softplus_l2": ("kda", dict(sigmoid=True, neg=True, gate="softplus", l2norm=True)),
    "kda_logits_bounded": ("kda", dict(sigmoid=True, neg=False, gate="bounded")),
    "kda_bounded_no_A_no_h0": ("kda", dict(gate="bounded_no_A", h0=False)),
    "gdn_plain": ("gdn", dict(B=2)),
    "gdn_logits_neg_gate_l2": ("gdn", dict(sigmoid=True, neg=True, gate="softplus", l2norm=True)),
    "gdn_logits_gate": ("gdn", dict(sigmoid=True, neg=False, gate="softplus")),
    "kda_gva_logits_neg_bounded_l2": ("kda", dict(HV=4, sigmoid=True, neg=True, gate="bounded", l2norm=True)),
    "gdn_gva_logits_gate": ("gdn", dict(HV=4, sigmoid=True, gate="softplus")),
}


@pytest.mark.parametrize("case", list(FD_CASES))
def test_projected_gradients_match_finite_differences(case):
    name, opts = FD_CASES[case]
    opts = dict(opts)
    kw, do, dfs = _kwargs(name, opts.pop("B", 1), 5, 2, 3, 2, seed=len(case) + 7, **opts)
    fcall = families.call(name, **kw)
    _, grads = families.forward_and_vjp(fcall, do, dfs)
    h = 1e-5
    for gname, arg in GRAD_ARGS.items():
        adj = getattr(grads, gname)
        base = kw.get(arg)
        if base is None and arg == "initial_state":
            base = np.zeros(dfs.shape)
        if base is None:
            assert adj is None, gname
            continue
        assert adj.shape == np.shape(base), gname
        fd = np.empty_like(adj)
        for idx in np.ndindex(adj.shape):
            plus, minus = np.array(base, dtype=np.float64), np.array(base, dtype=np.float64)
            plus[idx] += h
            minus[idx] -= h
            fd[idx] = (_loss(name, {**kw, arg: plus}, do, dfs) - _loss(name, {**kw, arg: minus}, do, dfs)) / (2 * h)
        tol = 5e-9 * (np.abs(adj) + np.max(np.abs(adj)))
        worst = np.max(np.abs(fd - adj))
        assert np.all(np.abs(fd - adj) <= tol), (
            f"{gname}: max |adjoint - finite difference| {worst:.2e} (|adj| max {np.max(np.abs(adj)):.2e})")


def test_neg_eigval_doubles_beta_and_its_gradient():
    """allow_neg_eigval: beta = 2 sigmoid(logits) (an erase eigenvalue 1 - beta |k|^2 down to -1), and the
    logits' gradient is twice the sigmoid's slope times d beta."""
    kw, do, dfs = _kwargs("kda", 1, 4, 2, 3, 2, seed=11, sigmoid=True, neg=True)
    on = families.call("kda", **kw)
    off = families.call("kda", **{**kw, "allow_neg_eigval": False})
    np.testing.assert_allclose(on.to_gdn2().b, 2 * off.to_gdn2().b, rtol=1e-15)
    assert np.max(on.to_gdn2().b) > 1  # beyond the plain delta rule's [0, 1]
    _, g = families.forward_and_vjp(on, do, dfs)
    _, g_plain = recurrence.forward_and_vjp(on.to_gdn2(), do, dfs)
    s = _sigmoid(kw["beta"])
    np.testing.assert_allclose(g.dbeta, 2 * s * (1 - s) * (g_plain.db.sum(-1) + g_plain.dw.sum(-1)),
                               rtol=1e-10, atol=1e-14)


# --- float32: the plain recurrence in the family's own parametrisation -----------------------------------------

@pytest.mark.parametrize("name", ["kda", "gdn"])
def test_float32_pipeline(name):
    kw, do, dfs = _kwargs(name, 1, 16, 2, 4, 3, seed=21, sigmoid=True, neg=True, gate="softplus", l2norm=True)
    fcall = families.call(name, **kw)
    p32 = fcall.to_gdn2(np.float32)
    for n in ("q", "k", "g", "b", "w"):  # activations applied in float32: float32 values, not float64 ones
        x = getattr(p32, n)
        np.testing.assert_array_equal(x, x.astype(np.float32), err_msg=n)
    assert not np.array_equal(p32.b, fcall.to_gdn2().b)
    (o, S), g = families.forward_and_vjp(fcall, do, dfs, np.float32)
    assert o.dtype == S.dtype == np.float32 and all(x.dtype == np.float32 for x in g if x is not None)
    o_rec, S_rec = recurrence.forward(p32, np.float32)
    np.testing.assert_array_equal(o, o_rec)
    np.testing.assert_array_equal(S, S_rec)
    (o64, S64), g64 = families.forward_and_vjp(fcall, do, dfs)
    assert _nerr(o, o64) < 1e-5 and _nerr(S, S64) < 1e-5
    for n in FAMILY_GRADS:
        assert _nerr(getattr(g, n), getattr(g64, n)) < 1e-4, n


# --- bad input --------------------------------------------------------------------------------------------

BAD = [
    ("kda", dict(gv=np.zeros((1, 4, 2, 2))), "gv", "outside GDN-2"),
    ("gdn", dict(gv=np.zeros((1, 4, 2, 2))), "gv", "outside GDN-2"),
    ("gdn", dict(gk=np.zeros((1, 4, 2, 3))), "gk", "kda"),
    ("gdn", dict(use_gate_in_kernel=True, A_log=np.zeros(2), lower_bound=-5.0), "lower_bound", "bounded"),
    ("kda", dict(beta=np.full((1, 4, 2, 2), 0.5)), "beta", "shape"),  # per-value beta (fused_recurrent's)
    ("gdn", dict(beta=np.full((1, 4, 2, 3), 0.5)), "beta", "shape"),
    ("kda", dict(g=-np.ones((1, 4, 2))), "g", "shape"),
    ("gdn", dict(g=-np.ones((1, 4, 2, 3))), "g", "shape"),
    ("kda", dict(g=np.ones((1, 4, 2, 3))), "g", "<= 0"),
    ("kda", dict(k=np.ones((1, 4, 1, 3))), "k", "shape"),
    ("kda", dict(v=np.ones((1, 4, 3, 2))), "v", "multiple"),
    ("kda", dict(allow_neg_eigval=True), "allow_neg_eigval", "use_beta_sigmoid_in_kernel"),
    ("kda", dict(use_beta_sigmoid_in_kernel=1), "use_beta_sigmoid_in_kernel", "bool"),
    ("kda", dict(use_gate_in_kernel=True), "A_log", "required"),
    ("gdn", dict(use_gate_in_kernel=True), "A_log", "required"),
    ("kda", dict(use_gate_in_kernel=True, A_log=np.zeros(3)), "A_log", "shape"),
    ("kda", dict(use_gate_in_kernel=True, A_log=np.zeros(2), dt_bias=np.zeros((2, 3))), "dt_bias", "shape"),
    ("gdn", dict(use_gate_in_kernel=True, A_log=np.zeros(2), dt_bias=np.zeros(6)), "dt_bias", "shape"),
    ("kda", dict(use_gate_in_kernel=True, lower_bound=0.5), "lower_bound", "< 0"),
    ("kda", dict(dt_bias=np.zeros(6)), "dt_bias", "use_gate_in_kernel"),
    ("kda", dict(initial_state=np.zeros((1, 2, 2, 3))), "initial_state", "shape"),
    ("kda", dict(scale=float("nan")), "scale", "finite"),
    ("kda", dict(beta=np.full((1, 4, 2), np.inf)), "beta", "NaN or inf"),
    ("kda", dict(cu_seqlens=np.array([0, 3])), "cu_seqlens", "end at T"),
    ("kda", dict(state_v_first=True, initial_state=np.zeros((1, 2, 3, 2))), "initial_state", r"\[N, HV, V, K\]"),
    ("kda", dict(return_intermediate_states=True), "return_intermediate_states", "not an argument"),
    ("kda", dict(chunk_size=64), "chunk_size", "not a keyword"),
]


@pytest.mark.parametrize("name, change, arg, message", BAD)
def test_bad_input_raises_value_error_naming_argument(name, change, arg, message):
    kw, _, _ = _kwargs(name, 1, 4, 2, 3, 2)
    with pytest.raises(ValueError, match=rf"^{arg}:.*{message}" if message != "<= 0" else rf"^{arg}:.*<= 0"):
        families.call(name, **{**kw, **change})


def test_gdn2_and_unknown_families_are_not_mapped():
    kw, _, _ = _kwargs("kda", 1, 4, 2, 3, 2)
    with pytest.raises(ValueError, match="^family:.*oracle.Problem"):
        families.call("gdn2", **kw)
    with pytest.raises(ValueError, match="^family:"):
        families.call("rwkv7", **kw)


def test_call_holds_private_copies():
    kw, _, _ = _kwargs("gdn", 1, 4, 2, 3, 2, sigmoid=True, gate="softplus")
    fcall = families.call("gdn", **kw)
    before = families.forward(fcall)
    kw["beta"][...] = 0
    kw["A_log"][...] = 3
    after = families.forward(fcall)
    np.testing.assert_array_equal(before[0], after[0])
    with pytest.raises(ValueError):
        fcall.beta[0, 0, 0] = 1.0


# --- FLA's own PyTorch references (fla-core, pinned 0.6.0) ----------------------------------------------------

def _load_file(root, rel, name):
    spec = importlib.util.spec_from_file_location(name, root / rel)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _functions(path, names, namespace):
    """Top-level functions ``names`` of a file, without running its imports (gate.py imports Triton)."""
    tree = ast.parse(path.read_text())
    wanted = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102 - FLA's own reference functions
    return [namespace[n] for n in names]


def _fla_references():
    """FLA's naive recurrences and chunk forms of KDA and GDN and their naive gates, loaded from their files
    (they need torch and einops only; fla's package import would also need Triton)."""
    torch = pytest.importorskip("torch", reason="torch is not importable: no cross-check against FLA")
    import torch.nn.functional as F

    pytest.importorskip("einops", reason="einops is not importable: FLA's naive references need it")
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("fla-core is not installed: no cross-check against FLA's PyTorch references")
    root = Path(list(spec.submodule_search_locations)[0])
    kda = _load_file(root, "ops/kda/naive.py", "_fla_kda_naive")
    gdn = _load_file(root, "ops/gated_delta_rule/naive.py", "_fla_gdn_naive")
    ns = {"torch": torch, "F": F}
    kda_gate, kda_lb_gate = _functions(root / "ops/kda/gate.py", ("naive_kda_gate", "naive_kda_lowerbound_gate"), ns)
    (gdn_gate,) = _functions(root / "ops/gated_delta_rule/gate.py", ("naive_gdn_gate",), ns)
    return torch, dict(kda=(kda.naive_recurrent_kda, kda.naive_chunk_kda, kda_gate, kda_lb_gate),
                       gdn=(gdn.naive_recurrent_gated_delta_rule, gdn.naive_chunk_gated_delta_rule, gdn_gate, None))


FLA_CASES = {
    "kda_plain": ("kda", {}),
    "kda_logits_neg_softplus_l2": ("kda", dict(sigmoid=True, neg=True, gate="softplus", l2norm=True)),
    "kda_logits_bounded": ("kda", dict(sigmoid=True, gate="bounded")),
    "kda_bounded_no_A": ("kda", dict(gate="bounded_no_A")),
    "gdn_plain": ("gdn", {}),
    "gdn_logits_neg_gate_l2": ("gdn", dict(sigmoid=True, neg=True, gate="softplus", l2norm=True)),
    "gdn_logits_gate": ("gdn", dict(sigmoid=True, gate="softplus", h0=False)),
    "kda_gva_logits_bounded": ("kda", dict(HV=4, sigmoid=True, neg=True, gate="bounded")),
}


@pytest.mark.parametrize("case", list(FLA_CASES))
def test_matches_fla_pytorch_reference(case):
    """FLA's naive recurrences compute in float32: agreement to float32 accuracy, every gradient included (the
    beta sigmoid and the L2 norm are Triton-only in FLA, transcribed: ``s * sigmoid(x)``, ``x rsqrt(|x|^2 + eps)``).
    The naive chunk forms (chunk 4) agree on the forward."""
    torch, refs = _fla_references()
    name, opts = FLA_CASES[case]
    recurrent, chunked, gate, lb_gate = refs[name]
    kw, do, dfs = _kwargs(name, 2, 8, 2, 4, 3, seed=len(case) + 31, **opts)
    fcall = families.call(name, **kw)
    (o, S), grads = families.forward_and_vjp(fcall, do, dfs)

    def leaf(x):
        return None if x is None else torch.tensor(np.array(x), dtype=torch.float64, requires_grad=True)

    t = {arg: leaf(kw.get(arg)) for arg in GRAD_ARGS.values()}
    if t["initial_state"] is None:
        t["initial_state"] = leaf(np.zeros(dfs.shape))
    q, k, g, beta = t["q"], t["k"], t["g"], t["beta"]
    if fcall.use_qk_l2norm_in_kernel:  # l2norm_fwd_kernel, transcribed
        q, k = (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + float(np.float32(1e-6))) for x in (q, k))
    if fcall.use_beta_sigmoid_in_kernel:  # fla/ops/common/gate.py: fused_beta_sigmoid_fwd_kernel, transcribed
        beta = fcall.beta_scale * torch.sigmoid(beta)
    if fcall.use_gate_in_kernel:
        if fcall.lower_bound is None:
            g = gate(g, t["A_log"], t["dt_bias"])
        else:
            g = lb_gate(g, t["A_log"], t["dt_bias"], lower_bound=fcall.lower_bound)
    args = (q, k, t["v"], beta, g) if name == "gdn" else (q, k, t["v"], g, beta)  # GDN's naive: beta before g
    o_t, S_t = recurrent(*args, scale=fcall.scale, initial_state=t["initial_state"], output_final_state=True)
    loss = (o_t.double() * torch.tensor(do)).sum() + (S_t.double() * torch.tensor(dfs)).sum()
    loss.backward()
    version = importlib.metadata.version("fla-core")
    assert _nerr(o_t.detach().numpy(), o) < 2e-6, f"o vs fla-core {version}"
    assert _nerr(S_t.detach().numpy(), S) < 2e-6, f"final_state vs fla-core {version}"
    for gname, arg in GRAD_ARGS.items():
        ours = getattr(grads, gname)
        if ours is None:
            assert t[arg] is None, gname
            continue
        err = _nerr(t[arg].grad.numpy(), ours)
        assert err < 2e-6, f"{gname}: {err:.1e} vs fla-core {version}"
    with torch.no_grad():
        chunk_args = tuple(x.detach() for x in (q, k, t["v"], g, beta))
        o_c, S_c = chunked(*chunk_args, scale=fcall.scale, initial_state=t["initial_state"].detach(),
                           output_final_state=True, chunk_size=4)
    assert _nerr(o_c.numpy(), o) < 2e-6, f"o (naive chunk form) vs fla-core {version}"
    assert _nerr(S_c.numpy(), S) < 2e-6, f"final_state (naive chunk form) vs fla-core {version}"
