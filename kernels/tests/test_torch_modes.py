"""FLA ``chunk_gdn2``'s training-call modes through the torch bridge (kernels/torch_bridge.py; docs/DESIGN.md §2,
"Call modes (training)" and "PyTorch kernels").

A ``torch:`` kernel takes FLA's mode keywords where its torch function does (its ``__signature__`` says which, so
``ci.running.modes.accepted_modes`` is honest) and passes them through: ``cu_seqlens`` as a LongTensor, the gate
parameters ``A_log`` / ``dt_bias`` as differentiated inputs. Judged with ``ci.running.modes.validate`` on mode
cases of ``oracle/mode_recipes.py``:

* :func:`modes_recurrent`, a pure-torch float32 recurrence with every mode keyword (here, not in
  ``kernels/testing_torch.py``), in every mode: PASS; its copy with ``A_log`` detached fails ``dA_log``;
* FLA's Triton ``chunk_gdn2`` in Triton's interpreter (``fla-gdn2-chunk[interpret=1]``), on one varlen and one
  gate recipe, in a subprocess (``TRITON_INTERPRET=1`` must not leak into this process: see
  test_fla_interpret.py): PASS or PRECISION of the known kind, never FAIL.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gdn2_oracle.ci.grading.grades import FAIL, PASS, PRECISION  # noqa: E402 - after importorskip
from gdn2_oracle.ci.grading.modes import MODES, ModeCase  # noqa: E402 - after importorskip
from gdn2_oracle.ci.running import modes as running  # noqa: E402 - after importorskip
from gdn2_oracle.ci.testing import interpreted_script, once_per_run  # noqa: E402 - after importorskip
from gdn2_oracle.kernels.torch_bridge import MODE_KEYWORDS, TorchKernel  # noqa: E402 - after importorskip

C = 64  # the chunk the states at chunk starts are taken at (a TorchKernel has no chunk_size: FLA's 64)
EPS = 1e-6  # FLA's l2norm eps, added in float32 inside the square root


def modes_recurrent(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, *, cu_seqlens=None,
                    use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, A_log=None, dt_bias=None,
                    lower_bound=None, state_v_first=False, return_intermediate_states=False, detach_A_log=False):
    """GDN-2 token by token in float32 with FLA chunk_gdn2's mode keywords (docs/DESIGN.md §2): packed sequences
    each from its own state, the in-kernel gate (softplus or bounded form), q/k L2 norm, ``[V, K]`` states and the
    states at the starts of 64-token chunks. ``detach_A_log``: a mutant whose ``dA_log`` is lost."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    q, k, v, g, b, w = (x.float() for x in (q, k, v, g, b, w))
    if use_qk_l2norm_in_kernel:
        q, k = (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + EPS) for x in (q, k))
    if use_gate_in_kernel:
        x = g + (0 if dt_bias is None else dt_bias.float().view(H, K))
        A = 1.0 if A_log is None else (A_log.detach() if detach_A_log else A_log).float().exp()[:, None]
        g = -A * torch.nn.functional.softplus(x) if lower_bound is None else lower_bound * torch.sigmoid(A * x)
    if cu_seqlens is None:
        spans = [(r, 0, T) for r in range(B)]
    else:
        cu = cu_seqlens.tolist()
        spans = [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    if initial_state is None:
        h0 = torch.zeros(len(spans), H, K, V, dtype=torch.float32, device=q.device)
    else:
        h0 = initial_state.float().transpose(-1, -2) if state_v_first else initial_state.float()
    outs, finals, starts = [[] for _ in range(B)], [], [[] for _ in range(B)]
    for n, (r, bos, eos) in enumerate(spans):
        S = h0[n]
        for t in range(bos, eos):
            if (t - bos) % C == 0:
                starts[r].append(S)
            S = S * g[r, t].exp()[..., None]
            read = torch.einsum("hk,hkv->hv", b[r, t] * k[r, t], S)
            S = S + k[r, t][..., None] * (w[r, t] * v[r, t] - read)[:, None, :]
            outs[r].append(scale * torch.einsum("hk,hkv->hv", q[r, t], S))
        finals.append(S)
    o = torch.stack([torch.stack(row) for row in outs]).to(v.dtype)
    final = torch.stack(finals)
    if state_v_first:
        final = final.transpose(-1, -2)
    if not return_intermediate_states:
        return o, (final if output_final_state else None)
    h = torch.stack([torch.stack(row) for row in starts])
    return o, final, (h.transpose(-1, -2) if state_v_first else h)


def mutant_detached_A_log(*args, **kwargs):
    """:func:`modes_recurrent` with ``A_log`` detached: its forward is right, ``dA_log`` comes back zero."""
    return modes_recurrent(*args, detach_A_log=True, **kwargs)


mutant_detached_A_log.__signature__ = inspect.signature(modes_recurrent)


def plain(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False):
    """The dense contract only (FLA's naive references' signature)."""
    return modes_recurrent(q, k, v, g, b, w, scale=scale, initial_state=initial_state,
                           output_final_state=output_final_state)


def varlen_only(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    return modes_recurrent(q, k, v, g, b, w, scale=scale, initial_state=initial_state,
                           output_final_state=output_final_state, cu_seqlens=cu_seqlens)


def bridged(fn, name):
    return TorchKernel(fn, name=name, options={"output_final_state": True, "device": "cpu"})


@pytest.fixture(scope="module")
def kernel():
    return bridged(modes_recurrent, "modes_recurrent")


# --- the signature: only the mode keywords the torch function takes ------------------------------------------


def test_signature_declares_the_mode_keywords_the_torch_function_takes(kernel):
    params = inspect.signature(kernel).parameters
    assert set(MODE_KEYWORDS) <= set(params) and not any(p.kind is p.VAR_KEYWORD for p in params.values())
    assert running.accepted_modes(kernel) == MODES
    assert running.accepted_modes(bridged(plain, "plain")) == ()
    assert running.accepted_modes(bridged(varlen_only, "varlen_only")) == ("varlen",)
    assert running.accepted_modes(bridged(lambda *a, **kw: modes_recurrent(*a, **kw), "anything")) == MODES

    def wrap(inner):  # a pass-through wrapper takes what the function it wraps takes (FLA's peers are such)
        def kernel(*args, **kwargs):
            return inner(*args, **kwargs)
        return kernel

    assert running.accepted_modes(bridged(wrap(plain), "wrapped plain")) == ()
    assert running.accepted_modes(bridged(wrap(varlen_only), "wrapped varlen")) == ("varlen",)
    assert running.accepted_modes(bridged(wrap(modes_recurrent), "wrapped")) == MODES
    base = inspect.signature(bridged(plain, "plain")).parameters
    assert list(base) == ["q", "k", "v", "g", "b", "w", "scale", "initial_state", "check_values"]
    only = TorchKernel(modes_recurrent, name="x", options={"output_final_state": True, "device": "cpu"},
                       mode_keywords=("cu_seqlens",))
    assert running.accepted_modes(only) == ("varlen",)


@pytest.mark.parametrize("factory", ["gdn2_naive_recurrent", "gdn2_naive_chunk", "kda_naive_recurrent",
                                     "kda_naive_chunk"])
def test_fla_naive_references_accept_no_mode(factory):
    """FLA's pure-torch references take the dense call only (the KDA ones, in the GDN-2 contract, behind a
    **kwargs GDN-2 wrapper)."""
    fla_peers = pytest.importorskip("gdn2_oracle.kernels.fla_peers")
    try:
        fn = getattr(fla_peers, factory)(device="cpu", **({"signature": "gdn2"} if "kda" in factory else {}))
    except ValueError as exc:
        pytest.skip(str(exc))
    assert running.accepted_modes(fn) == ()


def _inputs(B=1, T=9, H=2, K=4, V=3, seed=0):
    r = np.random.default_rng(seed)
    q, k, v, b, w = (jnp.asarray(r.standard_normal(s) * 0.5, jnp.float32)
                     for s in ((B, T, H, K), (B, T, H, K), (B, T, H, V), (B, T, H, K), (B, T, H, V)))
    g = jnp.asarray(-r.uniform(0.01, 0.5, (B, T, H, K)), jnp.float32)
    return q, k, v, g, b, w


def test_refusals_name_the_keyword(kernel):
    q, k, v, g, b, w = _inputs()
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['cu_seqlens'\]"):
        bridged(plain, "plain")(q, k, v, g, b, w, cu_seqlens=np.array([0, 9]))
    with pytest.raises(ValueError, match="cu_seqlens: must start at 0 and end at T = 9"):
        kernel(q, k, v, g, b, w, cu_seqlens=np.array([0, 4, 8]))
    q2, k2, v2, g2, b2, w2 = _inputs(B=2)
    with pytest.raises(ValueError, match="cu_seqlens: packed sequences need batch size 1"):
        kernel(q2, k2, v2, g2, b2, w2, cu_seqlens=np.array([0, 4, 9]))
    with pytest.raises(ValueError, match=r"initial_state: shape \(1, 2, 4, 3\) != \(2, 2, 4, 3\)"):
        kernel(q, k, v, g, b, w, cu_seqlens=np.array([0, 4, 9]), initial_state=jnp.zeros((1, 2, 4, 3)))
    with pytest.raises(ValueError, match="A_log: only used with use_gate_in_kernel=True"):
        kernel(q, k, v, g, b, w, A_log=jnp.zeros(2))
    with pytest.raises(ValueError, match=r"dt_bias: shape \(2,\) != \(8,\)"):
        kernel(q, k, v, g, b, w, use_gate_in_kernel=True, A_log=jnp.zeros(2), dt_bias=jnp.zeros(2))
    with pytest.raises(ValueError, match="cu_seqlens: traced"):
        jax.jit(lambda cu: kernel(q, k, v, g, b, w, cu_seqlens=cu))(jnp.array([0, 4, 9]))
    base2 = TorchKernel(modes_recurrent, name="b2", options={"output_final_state": True, "device": "cpu",
                                                             "decay_base": 2})
    with pytest.raises(ValueError, match="use_gate_in_kernel: the kernel takes base-2"):
        base2(q, k, v, g, b, w, use_gate_in_kernel=True, A_log=jnp.zeros(2))


def test_mode_calls_match_the_torch_function_and_its_gradients(kernel):
    """Packed call with the gate: o, final state and all nine gradients equal torch's own, bit for bit."""
    q, k, v, g, b, w = _inputs(T=11, seed=1)
    cu = np.array([0, 3, 3, 11])
    r = np.random.default_rng(5)
    h0 = jnp.asarray(r.standard_normal((3, 2, 3, 4)), jnp.float32)  # [N, H, V, K]
    A_log, dt_bias = jnp.asarray([0.3, 1.2], jnp.float32), jnp.asarray(r.standard_normal(8), jnp.float32)
    kw = dict(use_gate_in_kernel=True, lower_bound=-5.0, state_v_first=True, use_qk_l2norm_in_kernel=True)

    def f(q, k, v, g, b, w, h0, A_log, dt_bias):
        return kernel(q, k, v, g, b, w, initial_state=h0, A_log=A_log, dt_bias=dt_bias, cu_seqlens=cu, **kw)

    args = (q, k, v, g, b, w, h0, A_log, dt_bias)
    (o, S), pullback = jax.vjp(f, *args)
    do, dS = jnp.ones_like(o) * 0.3, jnp.ones_like(S) * -0.2
    grads = pullback((do, dS))
    leaves = [torch.from_numpy(np.array(x)).requires_grad_(True) for x in args]
    to, tS = modes_recurrent(*leaves[:6], initial_state=leaves[6], output_final_state=True, A_log=leaves[7],
                             dt_bias=leaves[8], cu_seqlens=torch.tensor(cu), **kw)
    tgrads = torch.autograd.grad((to, tS), leaves, (torch.from_numpy(np.array(do)), torch.from_numpy(np.array(dS))))
    assert S.shape == (3, 2, 3, 4)
    np.testing.assert_array_equal(np.asarray(o), to.detach().numpy())
    np.testing.assert_array_equal(np.asarray(S), tS.detach().numpy())
    for got, want in zip(grads, tgrads):
        np.testing.assert_array_equal(np.asarray(got), want.numpy())
    assert float(jnp.max(jnp.abs(grads[7]))) > 0 and float(jnp.max(jnp.abs(grads[8]))) > 0  # dA_log, ddt_bias


def test_intermediate_states_are_forward_only(kernel):
    q, k, v, g, b, w = _inputs(T=9)
    o, S, h = kernel(q, k, v, g, b, w, return_intermediate_states=True)
    assert o.shape == (1, 9, 2, 3) and S.shape == (1, 2, 4, 3) and h.shape == (1, 1, 2, 4, 3)
    o, pullback = jax.vjp(lambda q: kernel(q, k, v, g, b, w, return_intermediate_states=True)[0], q)
    with pytest.raises(ValueError, match="return_intermediate_states: forward only"):
        pullback(jnp.ones_like(o))


# --- judged by the oracle, in every mode ------------------------------------------------------------------------

EVERY_MODE = ("varlen_quick", "gate_quick", "gate_softplus_no_dt_bias", "gate_bounded_no_A_log", "l2norm",
              "state_v_first", "intermediate_varlen", "all_modes")


@pytest.mark.parametrize("name", EVERY_MODE)
def test_torch_mode_kernel_passes_every_mode(kernel, name):
    case = ModeCase.named(name)
    assert set(case.modes) <= set(running.accepted_modes(kernel))
    report = running.validate(kernel, case)
    assert report.grade == PASS, [(v.name, v.grade) for v in report.verdicts if not v.passed]


def test_covers_every_mode():
    assert {m for n in EVERY_MODE for m in ModeCase.named(n).modes} == set(MODES)


def test_detached_A_log_fails_dA_log():
    """The gate parameters' gradients do come back from torch: lose dA_log and the judge says so."""
    report = running.validate(bridged(mutant_detached_A_log, "detached"), ModeCase.named("gate_quick"))
    assert report.grade == FAIL
    assert {v.name for v in report.verdicts if not v.passed} == {"dA_log"}


# --- FLA's Triton chunk kernel in Triton's interpreter (a subprocess) -----------------------------------------

FLA = "fla-gdn2-chunk[interpret=1]"
FLA_RECIPES = ("varlen_quick", "gate_quick")
SCRIPT = r"""
import json, sys, time
from gdn2_oracle import kernels
from gdn2_oracle.ci.grading.modes import ModeCase
from gdn2_oracle.ci.running import modes as running

spec = json.loads(sys.argv[1])
fn = kernels.get(spec["kernel"])
out = {"accepted": list(running.accepted_modes(fn)), "cases": {}}
for name in spec["recipes"]:
    t0 = time.perf_counter()
    report = running.validate(fn, ModeCase.named(name))
    out["cases"][name] = {"grade": report.grade, "kinds": sorted({f.kind for f in report.diagnosis}),
                          "over": {v.name: v.grade for v in report.verdicts if not v.passed},
                          "seconds": round(time.perf_counter() - t0, 1)}
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    """Grades of the interpreted FLA chunk kernel on the mode recipes (one subprocess, once per pytest run:
    ci.testing.once_per_run)."""
    pytest.importorskip("gdn2_oracle.kernels.fla_peers")
    import importlib.util

    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("fla") is None:
        pytest.fail("Triton and FLA are needed (make test installs them)")
    spec = {"kernel": FLA, "recipes": FLA_RECIPES}
    return once_per_run(tmp_path_factory, "torch_modes", lambda _: interpreted_script(SCRIPT, spec, 1200))[0]


def test_interpreted_fla_chunk_accepts_every_mode(interpreted):
    assert interpreted["accepted"] == list(MODES)


@pytest.mark.parametrize("name", FLA_RECIPES)
def test_interpreted_fla_chunk_in_modes_matches_the_oracle(interpreted, name):
    """PASS, or PRECISION of the known kind (exponents as differences of float32 cumulative sums); never FAIL."""
    got = interpreted["cases"][name]
    assert got["grade"] in (PASS, PRECISION), got
    if got["grade"] == PRECISION:
        assert got["kinds"] == ["exponent-cancellation"], got
    assert FAIL not in got["over"].values(), got
