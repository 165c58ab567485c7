"""Third-party kernels' signatures read honestly: the flag probe (ci/running/flag_probe.py) on a tiny torch kernel,
and transformers' pure-torch Gated DeltaNet / KDA fallbacks judged by name, as a user runs them (the console script
from a folder without the repository on ``sys.path``: our ``kernels/`` would shadow the Hub's ``kernels`` package).

Every PRECISION a transformers kernel draws is checked by an independent float64 token loop
(:func:`float64_loop`) on the inputs ``validate --dump`` wrote.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch  # the test environment installs it (Makefile)

from gdn2_oracle.ci.running import families as family_running
from gdn2_oracle.ci.running import flag_probe
from gdn2_oracle.ci.testing import console
from gdn2_oracle.kernels import torch_bridge

QWEN3_NEXT = "transformers.models.qwen3_next.modeling_qwen3_next"
KIMI = "transformers.models.kimi_linear.modeling_kimi_linear"
GDN_CHUNK = f"torch:{QWEN3_NEXT}:torch_chunk_gated_delta_rule[family=gdn]"
KDA_CHUNK = f"torch:{KIMI}:chunk_kimi_delta_attention[family=kda,gva=repeat]"


def float64_loop(q, k, v, g, beta, scale=None, h0=None):
    """``(o, final_state)`` of a Gated DeltaNet (``g [B, T, HV]``) or KDA (``g [B, T, HV, K]``) call from state ``h0``
    (default zero), token by token in float64, value head ``hv`` reading key head ``hv // G``: independent of the
    oracle."""
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    q, k = (np.repeat(np.asarray(x, np.float64), HV // H, axis=2) for x in (q, k))
    g = np.asarray(g, np.float64)
    g = g if g.ndim == 4 else np.repeat(g[..., None], K, axis=3)
    S = np.zeros((B, HV, K, V)) if h0 is None else np.asarray(h0, np.float64)
    o = np.zeros((B, T, HV, V))
    scale = K ** -0.5 if scale is None else scale
    for t in range(T):
        S = S * np.exp(g[:, t])[..., None]
        delta = (v[:, t] - np.einsum("bhkv,bhk->bhv", S, k[:, t])) * beta[:, t][..., None]
        S = S + k[:, t][..., :, None] * delta[..., None, :]
        o[:, t] = np.einsum("bhkv,bhk->bhv", S, q[:, t] * scale)
    return o, S


def gdn_ignoring_flags(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **kwargs):
    """A correct Gated DeltaNet in torch (no grouped value heads) that takes FLA's flags through ``**kwargs`` and
    ignores them, as transformers' fallbacks do; counts its calls."""
    gdn_ignoring_flags.calls += 1
    q, k, v, g, beta = (x.to(torch.float64) for x in (q, k, v, g, beta))
    S = torch.zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[3], dtype=torch.float64)
    out = []
    for t in range(q.shape[1]):
        S = S * g[:, t].exp()[..., None, None]
        delta = (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t])) * beta[:, t][..., None]
        S = S + k[:, t][..., :, None] * delta[..., None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t] * (q.shape[3] ** -0.5 if scale is None else scale)))
    return torch.stack(out, 1).to(torch.float32), S.to(torch.float32)


gdn_ignoring_flags.calls = 0


def test_the_probe_names_each_flag_a_kwargs_kernel_ignores_and_its_cases_are_not_run():
    """Each FLA keyword taken only through ``**kwargs`` is probed once per kernel object (with and without, where
    the oracle's outputs differ); the ignored ones are named in the notes and leave the accepted flags and modes."""
    kernel = torch_bridge.FamilyTorchKernel(gdn_ignoring_flags, name="kw", family="gdn", options={"device": "cpu"})
    assert kernel.hidden_keywords == ("use_qk_l2norm_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval",
                                      "use_gate_in_kernel")
    notes = flag_probe.notes(kernel)
    assert "kernel kw ignores use_gate_in_kernel (probed: same output with and without it)" in notes[-1]
    assert len(notes) == 4
    calls = gdn_ignoring_flags.calls
    assert family_running.accepted_flags(kernel) == []
    assert "gate" not in family_running.accepted_family_modes(kernel, "gdn")
    assert gdn_ignoring_flags.calls == calls  # probed once per kernel object and keyword
    other = torch_bridge.FamilyTorchKernel(gdn_ignoring_flags, name="kw", family="gdn", options={"device": "cpu"})
    flag_probe.refused(other)
    assert gdn_ignoring_flags.calls > calls  # another object is probed anew (identity, not equality)
    declared = torch_bridge.FamilyTorchKernel(gdn_ignoring_flags, name="kw", family="gdn",
                                              options={"device": "cpu", "flags": ""})
    assert flag_probe.notes(declared) == [] and family_running.accepted_flags(declared) == []


def _validate(tmp_path, spec, *args):
    """``validate`` of ``spec`` run cold from ``tmp_path`` with a JSON report and a dump: ``(report, dump folder)``."""
    proc = console(tmp_path, "validate", "--kernel", spec, "--json", tmp_path / "report.json", "--dump",
                   tmp_path / "dump", "--no-progress", *args, timeout=900)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((tmp_path / "report.json").read_text()), tmp_path / "dump"


def _checked_by_float64_loop(dump):
    """For every dumped case: the float64 loop agrees with the oracle's reference, and the kernel's error in o and the
    final state measured against the loop is the error the judge reported; returns how many cases were checked."""
    cases = sorted(dump.glob("*/*/arrays.npz"))
    for path in cases:
        a = np.load(path)
        verdicts = {v["name"]: v for v in json.loads((path.parent / "verdicts.json").read_text())["verdicts"]}
        h0 = next((a[n] for n in ("input_initial_state", "input_h0") if n in a.files), None)
        o, final = float64_loop(*(a[f"input_{n}"] for n in ("q", "k", "v", "g", "beta")), h0=h0)
        np.testing.assert_allclose(o, a["ref_o"], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(final, a["ref_final_state"], rtol=1e-9, atol=1e-12)
        for name, want in (("o", o), ("final_state", final)):  # max_err: the largest error over the largest value
            err = np.max(np.abs(a[f"got_{name}"] - want)) / np.max(np.abs(want))
            assert err == pytest.approx(verdicts[name]["max_err"], rel=1e-3)
    return len(cases)


def test_transformers_gdn_fallback_draws_no_fail_from_flags_it_cannot_see(tmp_path):
    """``torch_chunk_gated_delta_rule`` by name: the flags it takes through ``**kwargs`` and ignores are named in
    the notes and their cases not run; nothing FAILs; its PRECISION (within-chunk cumulative decays) is confirmed by
    the float64 loop."""
    pytest.importorskip("transformers")
    report, dump = _validate(tmp_path, GDN_CHUNK, "--cases", "smoke")
    k, = report["kernels"]
    assert k["n_failed"] == 0 and k["grade"] in ("PASS", "PRECISION"), k["summary"]
    notes = " ".join(k["notes"])
    assert "ignores use_gate_in_kernel (probed: same output with and without it)" in notes
    assert "ignores use_beta_sigmoid_in_kernel" in notes and "refuses cu_seqlens" in notes
    assert any("beta" in c or "neg_eigval" in c or "gate" in c for c in k["not_accepted_cases"])
    assert _checked_by_float64_loop(dump) == k["n_precision"]


def test_transformers_kda_fallback_is_judged_with_q_k_repeated(tmp_path):
    """``chunk_kimi_delta_attention`` has no grouped value heads: with ``gva=repeat`` every KDA case runs and is
    graded; each PRECISION confirmed by the float64 loop."""
    pytest.importorskip("transformers")
    report, dump = _validate(tmp_path, KDA_CHUNK, "--cases", "smoke", "--dtype", "float32")
    k, = report["kernels"]
    assert k["n_cases"] > 0 and k["n_failed"] == 0 and k["grade"] in ("PASS", "PRECISION"), k["summary"]
    assert any("q, k repeated to v's heads" in n for n in k["notes"])
    assert _checked_by_float64_loop(dump) == k["n_precision"]


def test_gva_none_lists_the_grouped_cases_instead_of_running_them():
    """A kernel without grouped value heads (``gva=none``) takes part in the family cases with ``HV == H`` only."""
    from gdn2_oracle.ci.grading.families import FamilyCase
    from gdn2_oracle.oracle import family_recipes

    kernel = torch_bridge.FamilyTorchKernel(gdn_ignoring_flags, name="g1", family="gdn",
                                            options={"device": "cpu", "gva": "none"})
    recipes = {n: family_recipes.get(n) for n in family_recipes.names() if family_recipes.get(n).family == "gdn"}
    cases = [FamilyCase.from_recipe(n, r) for n, r in recipes.items()]
    cases += [FamilyCase.from_recipe(f"{n}_g1", r.replace(HV=r.H)) for n, r in recipes.items()]
    grouped = {c.name for c in cases if c.shape[3] != c.shape[2]}
    assert grouped and len(grouped) < len(cases)
    assert {c.name for c in cases if not family_running.takes_case(kernel, c)} == grouped
    assert all(family_running.takes_case(gdn_ignoring_flags, c) for c in cases)


def gdn_fixed_scale(q, k, v, g, beta, initial_state=None, output_final_state=False, **kwargs):
    """:func:`gdn_ignoring_flags` at the default scale ``K**-0.5`` whatever ``scale`` it is passed (transformers'
    fallbacks take no scale)."""
    return gdn_ignoring_flags(q, k, v, g, beta, initial_state=initial_state)


def test_a_scale_taken_only_through_kwargs_is_probed_and_custom_scale_cases_are_not_run():
    from gdn2_oracle.ci.grading.families import FamilyCase
    from gdn2_oracle.oracle import family_recipes

    kernel = torch_bridge.FamilyTorchKernel(gdn_fixed_scale, name="fixed", family="gdn", options={"device": "cpu"})
    assert kernel.hidden_keywords[-1] == "scale"
    assert "kernel fixed ignores scale (probed: same output with and without it)" in " ".join(flag_probe.notes(kernel))
    r = next(family_recipes.get(n) for n in family_recipes.names() if family_recipes.get(n).family == "gdn")
    assert family_running.takes_case(kernel, FamilyCase.from_recipe("default", r.replace(scale=None)))
    assert not family_running.takes_case(kernel, FamilyCase.from_recipe("custom", r.replace(scale=0.3)))
    named = torch_bridge.FamilyTorchKernel(gdn_fixed_scale, name="fixed", family="gdn",
                                           options={"device": "cpu", "scale_arg": None})
    assert "scale" not in named.hidden_keywords
    assert not family_running.takes_case(named, FamilyCase.from_recipe("custom", r.replace(scale=0.3)))


def gdn_requires_state(q, k, v, g, beta, initial_state, output_final_state, **kwargs):
    """:func:`gdn_ignoring_flags` with the state keywords required, as transformers' recurrent fallbacks have them."""
    return gdn_ignoring_flags(q, k, v, g, beta, initial_state=initial_state)


def test_the_probe_passes_the_state_a_kernel_requires():
    kernel = torch_bridge.FamilyTorchKernel(gdn_requires_state, name="st", family="gdn", options={"device": "cpu"})
    notes = flag_probe.notes(kernel)
    assert len(notes) == 5 and all("ignores" in n and "could not be probed" not in n for n in notes), notes  # + scale
