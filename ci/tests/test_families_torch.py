"""A Gated DeltaNet and a KDA kernel written elsewhere in PyTorch, token by token in FLA's signature with grouped value
heads (``kernels/torch_bridge.py``: a ``torch:`` spec with ``family=``), pass ``validate --cases quick`` in float32
with no options but ``family`` and ``output_final_state=True``; a wrong one (value head ``hv`` reading key head
``hv % H``) fails. The torch wrapper takes only the keywords the function takes, so the cases it cannot be called on
are listed as not accepted, never run into a TypeError."""

from __future__ import annotations

import json

import pytest

from gdn2_oracle.ci.commands import validate
from gdn2_oracle.kernels import spec
from gdn2_oracle.oracle import family_recipes

torch = pytest.importorskip("torch")  # the [torch] extra; make test installs the CPU build

HERE = __name__


def delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
               use_qk_l2norm_in_kernel=False, heads="group"):
    """FLA's delta rule token by token in float32: ``S = exp(g) S``, ``S += k (beta (v - S^T k))^T``,
    ``o = scale S^T q``; ``g`` per head (``[B, T, HV]``, GDN) or per key channel (``[B, T, HV, K]``, KDA)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = (x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    index = torch.arange(HV) // (HV // H) if heads == "group" else torch.arange(HV) % H
    q, k = q[:, :, index], k[:, :, index]
    decay = g if g.dim() == 4 else g[..., None]
    scale = K ** -0.5 if scale is None else scale
    S = torch.zeros(B, HV, K, V) if initial_state is None else initial_state.float()
    out = []
    for t in range(T):
        S = S * torch.exp(decay[:, t])[..., None]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t]))
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        out.append(scale * torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    return torch.stack(out, 1).to(v.dtype), (S if output_final_state else None)


def wrong_heads(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
    return delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, heads="modulo")


def _validate(cli, tmp_path, kernel, dtype="float32"):
    path = tmp_path / "v.json"
    code, out, _ = cli("validate", "--kernel", kernel, "--cases", "quick", "--dtype", dtype, "--no-progress", "--json",
                       path)
    return code, out, json.loads(path.read_text())["kernels"][0]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_a_torch_family_kernel_written_elsewhere_passes_quick(cli, tmp_path, family):
    kernel = f"torch:{HERE}:delta_rule[family={family},output_final_state=True]"
    code, out, k = _validate(cli, tmp_path, kernel)
    assert code == 0, out
    takes = {"use_qk_l2norm_in_kernel", "l2norm"}  # its only keyword besides the contract's: the q/k norm
    expected = {n for n in family_recipes.names("quick") if n.startswith(f"{family}_")
                and family_recipes.get(n).precision == "float32"
                and set(family_recipes.get(n).flags()) | set(family_recipes.get(n).modes) <= takes}
    expected |= set(family_recipes.projections(family, validate.dense_recipes("quick", ("float32",), 0)))
    assert k["family"] == family and k["passed"] and {c["case"] for c in k["cases"]} == expected, k["n_cases"]
    judged = {c["case"] for c in k["cases"]}
    assert any("gva4" in n for n in judged) and any("gva2" in n for n in judged)
    # the flags and modes it does not take are listed, not run: no case errs
    assert k["not_accepted_cases"] and not [c for c in k["cases"] if c["outcome"] == "error"]


def test_the_torch_wrapper_takes_only_the_keywords_of_the_function():
    fn = spec.get(f"torch:{HERE}:wrong_heads[family=gdn,output_final_state=True]")
    names = set(fn.__signature__.parameters)
    assert {"q", "beta", "initial_state", "output_final_state"} <= names
    assert not {"use_qk_l2norm_in_kernel", "use_gate_in_kernel", "cu_seqlens", "A_log"} & names
    full = spec.get(f"torch:{HERE}:delta_rule[family=kda,output_final_state=True]")
    assert "use_qk_l2norm_in_kernel" in full.__signature__.parameters and full.family == "kda"


def test_a_torch_family_kernel_with_the_wrong_head_map_fails(cli, tmp_path):
    code, out, k = _validate(cli, tmp_path, f"torch:{HERE}:wrong_heads[family=gdn,output_final_state=True]")
    assert code == 1, out
    # every case with grouped value heads over several key heads fails; with G = 1 or H = 1 both maps agree
    grouped = {c["case"] for c in k["cases"] if c["shape"][3] > c["shape"][2] > 1}
    failed = {c["case"] for c in k["cases"] if c["grade"] == "FAIL"}
    assert failed == grouped and grouped, (sorted(failed ^ grouped), k["n_cases"])
