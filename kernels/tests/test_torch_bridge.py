"""The torch bridge (kernels/torch_bridge.py): exact hand-over, autograd gradients, argument mapping,
contract violations in plain words, and FLA's pure-PyTorch references as peers (kernels/fla_peers.py).

Judged through ``ci.running.harness`` against the float64 oracle or a golden case; the tiny torch kernels,
right and wrong, are in ``gdn2_oracle.kernels.testing_torch``.
"""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest
import torch  # the test environment installs it (Makefile): these tests never skip

from gdn2_oracle import golden, kernels
from gdn2_oracle.ci.running import harness
from gdn2_oracle.ci.testing import without_interpreter_env
from gdn2_oracle.kernels import torch_bridge
from gdn2_oracle.kernels.torch_bridge import TorchContractError
from gdn2_oracle.oracle import RESULTS, Recipe

T = "torch:gdn2_oracle.kernels.testing_torch"
CORRECT = f"{T}:recurrent[output_final_state=True]"
MAPPED = f"{T}:head_major_base2[order=qkvwbg,layout=bhtk,decay_base=2,scale_arg=sm_scale,state_arg=h0]"


def recipe(dtype="float32", **kw):
    """A small problem with an initial state and a custom scale (so every mapping is exercised)."""
    args = dict(decay="moderate", gates="uniform", initial_state=True, precision=dtype, seed=7, scale=0.3)
    args.update(kw)
    return Recipe(1, 9, 2, 8, 4, **args)


def validate(spec, r):
    p, do, dfs = r.build()
    return harness.validate(kernels.get(spec), p, do, dfs, dtype=r.precision)


# --- exact hand-over ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64, "bfloat16"])
def test_arrays_cross_bit_for_bit(dtype):
    specials = np.array([0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, np.nan, 1e-40, 3.0e38, 2.0 ** -130])
    a = np.concatenate([specials, np.random.default_rng(0).standard_normal(54)]).reshape(2, 32)
    a = a.astype(torch_bridge._BF16 if dtype == "bfloat16" else dtype)
    t = torch_bridge.to_torch(a, torch_bridge.resolve_device("cpu"))
    back = torch_bridge.to_numpy(t)
    assert str(t.dtype).endswith(np.dtype(a.dtype).name) and back.dtype == a.dtype
    bits = np.uint16 if dtype == "bfloat16" else {np.float32: np.uint32, np.float64: np.uint64}[dtype]
    np.testing.assert_array_equal(back.view(bits), a.view(bits))


def test_gradients_are_torch_autograd_exactly():
    """The bridge's nine results are bit for bit what torch computes on the same values."""
    from gdn2_oracle.kernels import testing_torch

    p, do, dfs = recipe().build()
    got = harness.kernel_results(kernels.get(CORRECT), p, do, dfs)
    leaves = [torch.tensor(x, dtype=torch.float32, requires_grad=True) for x in (*p.inputs(), p.h0())]
    o, S = testing_torch.recurrent(*leaves[:6], scale=p.scale, initial_state=leaves[6], output_final_state=True)
    grads = torch.autograd.grad([o, S], leaves, [torch.tensor(do, dtype=torch.float32),
                                                  torch.tensor(dfs, dtype=torch.float32)])
    want = dict(zip(RESULTS, [o, S, *grads]))
    for name in RESULTS:
        np.testing.assert_array_equal(got[name], want[name].detach().numpy(), err_msg=name)


# --- a correct kernel, and the mapping options ------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_correct_torch_kernel_matches_the_oracle(dtype):
    report = validate(CORRECT, recipe(dtype, decay="strong", gates="negative"))
    assert report.passed, report.format()
    assert all(v.rule != "non-finite" for v in report.verdicts)


def test_mapping_options_order_layout_base2_keywords():
    """``head_major_base2`` is the correct kernel behind another order, layout, decay base and keywords:
    with the options it passes; drop any one of them and the suite sees it."""
    r = recipe()
    report = validate(MAPPED, r)
    assert report.passed, report.format()
    base_e = MAPPED.replace(",decay_base=2", "")
    assert not validate(base_e, r).passed  # g read as base 2: every decay off by ln 2
    wrong_order = MAPPED.replace("order=qkvwbg", "order=kqvwbg")
    assert not validate(wrong_order, r).passed  # q and k swapped
    with pytest.raises(RuntimeError, match="size of tensor"):
        validate(MAPPED.replace("layout=bhtk,", ""), r)  # [B, T, H, .] read as [B, H, T, .]
    with pytest.raises(ValueError, match=r"does not accept the keyword\(s\) \['scale'\]"):
        validate(MAPPED.replace(",scale_arg=sm_scale", ""), r)  # the kernel has no keyword `scale`: refused when built


def test_pass_through_options_reach_the_kernel():
    """Unknown options are keyword arguments of the torch function: chunk_size reaches FLA's chunked
    reference (16 and 64 give different roundings), output_final_state=False gives no state."""
    r = recipe(decay="strong")
    p, do, dfs = r.build()
    a = harness.kernel_results(kernels.get("fla-gdn2-naive-chunk[chunk_size=4]"), p, do, dfs)
    b = harness.kernel_results(kernels.get("fla-gdn2-naive-chunk[chunk_size=16]"), p, do, dfs)
    assert not np.array_equal(a["dk"], b["dk"])
    with pytest.raises(TorchContractError, match="final_state = None"):
        harness.kernel_results(kernels.get("fla-gdn2-naive-chunk[output_final_state=False]"), p, do, dfs)


@pytest.mark.parametrize("options, needle", [
    ("order=qkv", "order: 'qkv' is not the six letters"),
    ("layout=thbk", "layout: 'thbk' not one of"),
    ("decay_base=10", "decay_base: 10 not one of"),
    ("device='nope'", "device: 'nope' is not a torch device"),
    ("scale_arg=3", "scale_arg: expected a keyword name"),
])
def test_bad_mapping_options_name_the_option(options, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        kernels.get(f"{T}:recurrent[{options}]")


def test_scale_arg_none_accepts_only_the_default_scale():
    fn = kernels.get(f"{T}:recurrent[scale_arg=None,output_final_state=True]")
    assert harness.validate(fn, *recipe(scale=None).build()).passed
    with pytest.raises(ValueError, match=r"scale: the kernel takes no scale"):
        validate(f"{T}:recurrent[scale_arg=None,output_final_state=True]", recipe())


def test_missing_torch_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ValueError, match=r"need PyTorch .*pip install 'gdn2-oracle\[torch\]'"):
        kernels.get(CORRECT)


# --- contract violations, in plain words ----------------------------------------------------

VIOLATIONS = [  # (function, exception, message)
    ("raises", RuntimeError, "this torch kernel always fails"),
    ("three_results", harness.ContractError, "returned 3 results, expected 2 (o, final_state)"),
    ("narrow_output", harness.ContractError, "returned o of shape (1, 9, 2, 3), expected (1, 9, 2, 4)"),
    ("bf16_state", harness.ContractError, "returned final_state of dtype bfloat16, expected float32"),
    ("detached", TorchContractError, "returned o without an autograd graph"),
    ("off_device", TorchContractError, "returned o on device meta, expected cpu"),
]


@pytest.mark.parametrize("name, exc, message", VIOLATIONS, ids=[v[0] for v in VIOLATIONS])
def test_torch_contract_violation_is_named(name, exc, message):
    with pytest.raises(exc) as info:
        validate(f"{T}:{name}[output_final_state=True]", recipe())
    assert message in str(info.value)


def test_missing_final_state_says_which_flag():
    with pytest.raises(TorchContractError, match=r"final_state = None.*output_final_state=True"):
        validate(f"{T}:no_final_state", recipe())


def test_nan_output_fails_as_non_finite():
    report = validate(f"{T}:nan_output[output_final_state=True]", recipe())
    rules = {v.name: v.rule for v in report.verdicts if not v.passed}
    assert rules.get("o") == "non-finite" and "final_state" not in rules


def test_error_raised_on_values_is_one_plain_line(caplog):
    """A kernel raising inside the host callback: KernelError with its own message, no traceback logged."""
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(harness.KernelError) as info:
            validate(f"{T}:rejects_strong_decay[output_final_state=True]", recipe(decay="extreme"))
    assert str(info.value) == "ValueError: g: log-decay below -20 is not supported by this kernel"
    assert "Traceback" not in caplog.text and "pure_callback failed" not in caplog.text
    assert validate(f"{T}:rejects_strong_decay[output_final_state=True]", recipe()).passed


# JAX kernels: the same checks, once, in ci.running.harness.
def _jax_correct(q, k, v, g, b, w, *, scale=None, initial_state=None):
    return kernels.get("pairwise", chunk_size=16)(q, k, v, g, b, w, scale=scale, initial_state=initial_state)


JAX_VIOLATIONS = [
    (lambda *a, **kw: _jax_correct(*a, **kw)[0], "returned one array of shape (1, 9, 2, 4), expected 2 results"),
    (lambda *a, **kw: (*_jax_correct(*a, **kw), None), "returned 3 results, expected 2 (o, final_state)"),
    (lambda *a, **kw: (_jax_correct(*a, **kw)[0][..., :3], _jax_correct(*a, **kw)[1]),
     "returned o of shape (1, 9, 2, 3), expected (1, 9, 2, 4)"),
    (lambda *a, **kw: (_jax_correct(*a, **kw)[0], None), "returned final_state = None, expected an array"),
    (lambda *a, **kw: (_jax_correct(*a, **kw)[0].astype("bfloat16"), _jax_correct(*a, **kw)[1]),
     "returned o of dtype bfloat16, expected float32 (v's dtype)"),
]


@pytest.mark.parametrize("fn, message", JAX_VIOLATIONS, ids=["one", "three", "shape", "none", "dtype"])
def test_jax_contract_violation_is_named(fn, message):
    p, do, dfs = recipe().build()
    with pytest.raises(harness.ContractError) as info:
        harness.kernel_results(fn, p, do, dfs)
    assert message in str(info.value)


# --- FLA's references as peers ----------------------------------------------------------------

def test_fla_references_load_without_importing_fla_or_triton():
    code = ("import sys; from gdn2_oracle import kernels\n"
            "for name in ('fla-gdn2-naive-recurrent', 'fla-gdn2-naive-chunk', 'fla-kda-naive-recurrent', "
            "'fla-kda-naive-chunk'):\n    kernels.get(name)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fla', 'triton')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
    names = set(kernels.names(optional=True))
    assert {"fla-gdn2-naive-recurrent", "fla-kda-naive-recurrent", "fla-gdn2-chunk"} <= names


@pytest.mark.parametrize("name", ["fla-gdn2-naive-recurrent", "fla-gdn2-naive-chunk[chunk_size=16]"])
def test_fla_gdn2_reference_matches_a_golden_case(name):
    gd = golden.load("len_c16_x3_tail")  # T = 53: three chunks of 16 and a tail, strong decay
    report = harness.validate(kernels.get(name), gd.problem(), *gd.cotangents(), ref=gd.reference())
    assert report.passed, report.format()


def test_fla_findings_gdn2_bf16_output_dtype_and_chunk_nan_gradients():
    """The two FLA findings of docs/findings.md, on goldens: the GDN-2 references return o in float32 for
    bf16 inputs; the chunked one gives NaN gradients once a chunk's decay span overflows exp."""
    gd = golden.load("bf16_moderate")
    with pytest.raises(harness.ContractError, match=r"returned o of dtype float32, expected bfloat16"):
        harness.validate(kernels.get("fla-gdn2-naive-recurrent"), gd.problem(), *gd.cotangents(),
                         dtype="bfloat16", ref=gd.reference())
    gd = golden.load("decay_strong")
    report = harness.validate(kernels.get("fla-gdn2-naive-chunk"), gd.problem(), *gd.cotangents(), ref=gd.reference())
    rules = {v.name: v.rule for v in report.verdicts if not v.passed}
    assert rules == dict.fromkeys(("dq", "dk", "dg", "db"), "non-finite"), report.format()


def test_fla_kda_reference_on_kda_golden_case():
    """On b = w = beta * 1 every result but db, dw matches the golden; d beta (returned in db[..., 0])
    equals the sum of the golden's per-channel db and dw."""
    gd = golden.load("kda_strong_h0")
    p, (do, dfs), ref = gd.problem(), gd.cotangents(), gd.reference()
    report = harness.validate(kernels.get("fla-kda-naive-recurrent[signature=gdn2]"), p, do, dfs, ref=ref)
    failed = {v.name for v in report.verdicts if not v.passed}
    assert failed == {"db", "dw"}, report.format()
    got = harness.kernel_results(kernels.get("fla-kda-naive-recurrent[signature=gdn2]"), p, do, dfs)
    dbeta = ref["db"].sum(-1) + ref["dw"].sum(-1)
    np.testing.assert_allclose(got["db"][..., 0], dbeta, rtol=1e-4, atol=1e-5 * np.abs(dbeta).max())
    assert not got["db"][..., 1:].any() and not got["dw"].any()


def test_fla_kda_peer_refuses_cases_outside_kda():
    with pytest.raises(harness.KernelError, match="outside the KDA peer's domain"):
        validate("fla-kda-naive-recurrent[signature=gdn2]", recipe())


@pytest.mark.parametrize("name", ["fla-gdn2-chunk", "fla-kda-chunk"])
def test_fla_triton_kernels_need_cuda(name):
    if torch.cuda.is_available():
        assert kernels.get(name).device.type == "cuda"
    else:
        with pytest.raises(ValueError, match=r"needs a CUDA device; torch.cuda.is_available\(\) is False"):
            kernels.get(name)


def test_a_kernel_that_refuses_all_zero_inputs_is_probed_on_nonzero_ones():
    """The probe (a first call to learn the results' shapes) runs on zeros; a kernel that refuses zeros is
    probed again on nonzero inputs and then judged on the cases' data, with a note saying so."""
    fn = kernels.get("torch:gdn2_oracle.kernels.testing_torch:refuses_zeros[output_final_state=True]")
    report = validate("torch:gdn2_oracle.kernels.testing_torch:refuses_zeros[output_final_state=True]", recipe())
    assert report.passed, report.format()
    p, do, dfs = recipe().build()
    harness.kernel_results(fn, p, do, dfs)
    assert "refuses all-zero inputs" in fn.note


def test_an_unknown_keyword_is_refused_when_the_kernel_is_built():
    """A keyword the torch function's signature cannot take is a usage problem before any case runs."""
    with pytest.raises(ValueError, match=r"does not accept the keyword\(s\) \['bogus'\]"):
        kernels.get("torch:gdn2_oracle.kernels.testing_torch:recurrent[bogus=1]")
    kernels.get("torch:gdn2_oracle.kernels.testing_torch:perturbed[anything=1]")  # **kwargs takes any


# --- family torch kernels: grouped value heads, the scale and state keywords, declared flags ------------------

def recurrent_gdn(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **kwargs):
    """Gated DeltaNet token by token in float64, without grouped value heads (q, k must have v's heads), taking
    every other keyword through ``**kwargs`` and ignoring it."""
    if q.shape[2] != v.shape[2]:
        raise ValueError(f"q has {q.shape[2]} heads, v {v.shape[2]}: no grouped value heads")
    B, T, H, K = q.shape
    S = (torch.zeros(B, H, K, v.shape[-1], dtype=torch.float64) if initial_state is None
         else initial_state.to(torch.float64))
    scale = K ** -0.5 if scale is None else scale
    out = []
    for t in range(T):
        S = S * g[:, t].to(torch.float64).exp()[..., None, None]
        kt, bt = k[:, t].to(torch.float64), beta[:, t].to(torch.float64)[..., None]
        delta = (v[:, t].to(torch.float64) - torch.einsum("bhkv,bhk->bhv", S, kt)) * bt
        S = S + kt[..., :, None] * delta[..., None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t].to(torch.float64) * scale))
    return torch.stack(out, 1).to(v.dtype), S.to(torch.float32)


def renamed_gdn(q, k, v, g, beta, sm_scale=None, h0=None, output_final_state=False):
    """:func:`recurrent_gdn` with the scale and the initial state under other keywords."""
    return recurrent_gdn(q, k, v, g, beta, scale=sm_scale, initial_state=h0)


def family_inputs(H=1, HV=2, seed=3):
    """A small Gated DeltaNet call (B = 1, T = 6, K = V = 4) with ``HV / H`` value heads per key head."""
    r = np.random.default_rng(seed)
    q, k = (r.standard_normal((1, 6, H, 4)).astype(np.float32) for _ in range(2))
    v = r.standard_normal((1, 6, HV, 4)).astype(np.float32)
    g = -r.uniform(0.05, 0.5, (1, 6, HV)).astype(np.float32)
    beta = r.uniform(0.1, 0.9, (1, 6, HV)).astype(np.float32)
    h0 = r.standard_normal((1, HV, 4, 4)).astype(np.float32)
    return (q, k, v, g, beta), h0


def family_oracle(args, **kw):
    """The family oracle's ``(o, final_state)`` in float64."""
    from gdn2_oracle.oracle import families

    return families.forward(families.call("gdn", *args, **kw))


def family(fn, **options):
    return torch_bridge.FamilyTorchKernel(fn, name=fn.__name__, family="gdn", options={"device": "cpu", **options})


def test_gva_repeat_feeds_q_and_k_repeated_to_the_value_heads():
    """``gva=repeat``: value head hv reads key head hv // G (the oracle's grouping), and its note says so; without
    the option the kernel raises on a grouped call."""
    args, h0 = family_inputs(H=2, HV=4)
    kernel = family(recurrent_gdn, gva="repeat")
    o, final = kernel(*args, initial_state=h0, output_final_state=True)
    want_o, want_final = family_oracle(args, initial_state=h0)
    np.testing.assert_allclose(np.asarray(o), want_o, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(final), want_final, rtol=1e-5, atol=1e-5)
    assert "q, k repeated to v's heads (value head hv reads key head hv // G)" in kernel.note
    with pytest.raises(Exception, match="no grouped value heads"):
        family(recurrent_gdn)(*args, output_final_state=True)


def test_gva_none_takes_only_calls_with_as_many_key_as_value_heads():
    kernel = family(recurrent_gdn, gva="none")
    args, _ = family_inputs(H=2, HV=2)
    np.testing.assert_allclose(np.asarray(kernel(*args)[0]), family_oracle(args)[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"^gva: .*HV = 4 value heads over H = 2 key heads"):
        kernel(*family_inputs(H=2, HV=4)[0])
    with pytest.raises(ValueError, match=r"^gva: 'tile' not one of"):
        family(recurrent_gdn, gva="tile")


def test_family_kernels_honour_scale_arg_and_state_arg():
    """The scale and the initial state reach the torch function under ``scale_arg`` / ``state_arg``; with None the
    kernel takes only the default scale and a zero state, and says so by name otherwise."""
    args, h0 = family_inputs(H=1, HV=1)
    kernel = family(renamed_gdn, scale_arg="sm_scale", state_arg="h0")
    o, final = kernel(*args, scale=0.3, initial_state=h0, output_final_state=True)
    want_o, want_final = family_oracle(args, scale=0.3, initial_state=h0)
    np.testing.assert_allclose(np.asarray(o), want_o, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(final), want_final, rtol=1e-5, atol=1e-5)
    bare = family(renamed_gdn, scale_arg=None, state_arg=None)
    np.testing.assert_allclose(np.asarray(bare(*args)[0]), family_oracle(args)[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"^scale: the kernel takes no scale \(scale_arg=None\)"):
        bare(*args, scale=0.3)
    with pytest.raises(ValueError, match=r"^initial_state: the kernel takes no initial state \(state_arg=None\)"):
        bare(*args, initial_state=h0)


def test_declared_flags_replace_what_kwargs_would_claim():
    """Without ``flags=``, FLA's keywords a ``**kwargs`` function takes are hidden (the judge probes them); declared,
    the kernel takes exactly those (the gate's parameters with ``use_gate_in_kernel``), none with ``flags=``."""
    import inspect

    def named(kernel):
        return set(inspect.signature(kernel).parameters)

    assert family(recurrent_gdn).hidden_keywords == torch_bridge.FAMILY_KEYWORDS[:4]
    none = family(recurrent_gdn, flags="")
    assert none.hidden_keywords == () and not named(none) & {*torch_bridge.FAMILY_KEYWORDS, "A_log"}
    gate = family(recurrent_gdn, flags="use_qk_l2norm_in_kernel+use_gate_in_kernel")
    assert named(gate) & {*torch_bridge.FAMILY_KEYWORDS, *torch_bridge.GATE_KEYWORDS} == {
        "use_qk_l2norm_in_kernel", "use_gate_in_kernel", *torch_bridge.GATE_KEYWORDS}
    assert "flags=use_qk_l2norm_in_kernel+use_gate_in_kernel" in gate.note
    with pytest.raises(ValueError, match=r"^flags: \['qk_norm'\] not among FLA's family keywords"):
        family(recurrent_gdn, flags="qk_norm")


# --- interpret=1 on a torch: spec: Triton's interpreter, before or after Triton is imported --------------------

INTERPRETED_FLA = "torch:fla.ops.gated_delta_rule:chunk_gated_delta_rule[family=gdn,interpret=1]"
_INTERPRETED_RUN = """
import sys
import numpy as np
if sys.argv[1] == "after":  # as transformers does when its models load: FLA, and so Triton, compiled
    import triton, fla.ops.gated_delta_rule  # noqa: F401
from gdn2_oracle import kernels
from gdn2_oracle.oracle import families
kernel = kernels.get(sys.argv[3])
r = np.random.default_rng(0)
q, k = (r.standard_normal((1, 20, 1, 16)).astype(np.float32) for _ in range(2))
k = k / np.linalg.norm(k, axis=-1, keepdims=True)
v = r.standard_normal((1, 20, 2, 16)).astype(np.float32)
g, beta = (-r.uniform(0.05, 0.5, (1, 20, 2))).astype(np.float32), r.uniform(0.1, 0.9, (1, 20, 2)).astype(np.float32)
o = np.asarray(kernel(q, k, v, g, beta)[0])
np.save(sys.argv[2], o)
print(kernel.note)
print(float(np.max(np.abs(o - families.forward(families.call("gdn", q, k, v, g, beta))[0]))))
"""


def test_interpret_on_a_torch_spec_is_tritons_interpreter_before_or_after_triton_loads(tmp_path):
    """FLA's Triton chunk kernel by import path with ``interpret=1`` runs in Triton's interpreter in a fresh process
    and in one where FLA and Triton were imported (compiled) before: the same bits, matching the family oracle, and
    the note says which."""
    outs = {}
    # not this worker's TRITON_INTERPRET: a process that inherits it imports Triton interpreted from the start
    env = without_interpreter_env()
    for order in ("before", "after"):
        proc = subprocess.run([sys.executable, "-c", _INTERPRETED_RUN, order, tmp_path / f"{order}.npy",
                               INTERPRETED_FLA], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        note, err = proc.stdout.strip().splitlines()[-2:]
        assert "interpret=1: its Triton kernels run in Triton's interpreter on the CPU" in note
        assert ("its loaded JIT functions were switched to the interpreter" in note) == (order == "after")
        assert float(err) < 1e-5, err
        outs[order] = np.load(tmp_path / f"{order}.npy")
    np.testing.assert_array_equal(outs["before"], outs["after"])
