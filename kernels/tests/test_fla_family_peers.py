"""FLA's Triton GDN and KDA kernels as family peers (kernels/fla_peers.py: ``fla-gdn-chunk``,
``fla-gdn-fused-recurrent``, ``fla-kda-chunk``, ``fla-kda-fused-recurrent``), run in Triton's interpreter on the CPU
(``[interpret=1]``, float32) against the family oracle (``oracle.families.forward_and_vjp`` in float64).

Each peer runs on small problems with grouped value heads (H = 2, HV = 4, K = V = 16, T = 50 or 61): plain (B = 2),
with beta logits, negative eigenvalues and the in-kernel q/k norm, with packed sequences (``cu_seqlens``) and with
the in-kernel gate (``A_log``, ``dt_bias``; KDA's bounded gate too). Every result must PASS the grading rule
(ci/grading/rule.py, through the case's yardstick: ``ci.grading.families.FamilyCase``): within ``max(32 e_rec,
2^-20)`` on both metrics, where ``e_rec`` is the error of the oracle's own float32 run (``dg`` and the gate
parameters' gradients, sums of many terms, on their envelopes, as the judge takes them). The fused-recurrent
kernels have no backward in FLA: their ``o`` and final state are judged and their VJP must be refused with the
reason. One case goes through the judge end to end (``ci.running.families.family_results``, ``FamilyCase.judge``).

The interpreted kernels run in one subprocess (``TRITON_INTERPRET=1`` must be set before Triton is imported and
then holds for the whole process; see test_fla_interpret.py), which reads the inputs written here and writes the
kernels' results back; the oracle runs here. Triton and FLA are required (``make test`` installs them): a missing
one fails these tests with the reason, it does not skip them. In the release group (conftest.py).
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from gdn2_oracle import kernels
from gdn2_oracle.ci.grading.families import FamilyCase
from gdn2_oracle.ci.grading.grades import PASS
from gdn2_oracle.ci.grading.modes import compare
from gdn2_oracle.ci.testing import interpreted_script, once_per_run
from gdn2_oracle.kernels.triton_interpret import ENV
from gdn2_oracle.oracle import families as oracle_families

H, HV, K, V = 2, 4, 16, 16
# name -> (family, forward only)
PEERS = {"fla-gdn-chunk": ("gdn", False), "fla-gdn-fused-recurrent": ("gdn", True),
         "fla-kda-chunk": ("kda", False), "fla-kda-fused-recurrent": ("kda", True)}
CASES = ("gva", "flags", "packed", "gate")
KDA_CASES = ("bounded_gate",)  # KDA's gate without A_log: lower_bound * sigmoid(g + dt_bias)
OFFSETS = (0, 23, 61)  # the packed case: two sequences, neither a multiple of a chunk
LOWER_BOUND = -2.0
JUDGED = ("fla-gdn-chunk[interpret=1]", "gdn_gva2_moderate_h0")  # the end-to-end case: kernel, quick recipe


def _f32(x):
    """``x`` rounded to float32, held in float64 (the values the kernel sees, exactly)."""
    return np.asarray(x, np.float32).astype(np.float64)


def make_case(family, case, seed):
    """``(inputs, flags, cu_seqlens, do, dfinal_state)`` of one small family call, every array exact in float32."""
    rng = np.random.default_rng(seed)
    B, T = (1, OFFSETS[-1]) if case == "packed" else (2, 50) if case == "gva" else (1, 50)
    N = len(OFFSETS) - 1 if case == "packed" else B
    q, k = rng.standard_normal((B, T, H, K)), rng.standard_normal((B, T, H, K))
    if case == "flags":  # raw rows of norm ~10^U[-1, 1]: the in-kernel norm changes them
        q, k = (x / np.linalg.norm(x, axis=-1, keepdims=True) * 10.0 ** rng.uniform(-1, 1, (B, T, H, 1))
                for x in (q, k))
    else:
        q, k = (x / np.linalg.norm(x, axis=-1, keepdims=True) for x in (q, k))
    gshape = (B, T, HV, K) if family == "kda" else (B, T, HV)
    x = dict(q=q, k=k, v=rng.standard_normal((B, T, HV, V)), initial_state=rng.standard_normal((N, HV, K, V)))
    flags = {}
    if case in ("gate", "bounded_gate"):  # raw pre-activations; per-token log-decays ~ -0.05 .. -0.5
        x["g"] = rng.normal(-2.0, 1.0, gshape)
        x["dt_bias"] = rng.normal(0.0, 0.5, HV * K if family == "kda" else HV)
        flags["use_gate_in_kernel"] = True
        if case == "gate":
            x["A_log"] = rng.uniform(-1.0, 0.0, HV)
        else:
            x["g"] = rng.normal(-1.0, 1.0, gshape)
            flags["lower_bound"] = LOWER_BOUND
    else:
        x["g"] = -rng.uniform(0.01, 0.3, gshape)
    if case == "flags":
        x["beta"] = 2.0 * rng.standard_normal((B, T, HV))
        flags.update(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True, use_qk_l2norm_in_kernel=True)
    else:
        x["beta"] = rng.uniform(0.0, 1.0, (B, T, HV))
    do, dfs = rng.standard_normal((B, T, HV, V)), rng.standard_normal((N, HV, K, V))
    return ({n: _f32(a) for n, a in x.items()}, flags, OFFSETS if case == "packed" else None, _f32(do), _f32(dfs))


def judged(family, case, seed, got, names=None):
    """The report of results ``got`` on one small family call (:func:`make_case`) judged over ``names`` (default: every
    result of the call) by the grading rule against ``oracle.families``' float64 pipeline, within ``max(32 e_rec,
    2^-20)``, ``e_rec`` the oracle's own float32 run's error (``dg``, ``dA_log``, ``ddt_bias`` on their envelopes)."""
    x, flags, cu, do, dfs = make_case(family, case, seed)
    fc = oracle_families.call(family, **x, **flags, cu_seqlens=None if cu is None else np.asarray(cu))
    fcase = FamilyCase.of(fc, do, dfs, name=f"{family}/{case}")
    fcase.family = family
    names = tuple(fcase.names() if names is None else names)
    return names, compare(names, got, fcase.yardstick({n: "float32" for n in names}))


SCRIPT = r"""
import json, sys, time
import numpy as np, jax, jax.numpy as jnp
from gdn2_oracle import kernels
from gdn2_oracle.ci.grading.families import FamilyCase
from gdn2_oracle.ci.running.families import family_results

spec = json.loads(sys.argv[1])
NAMES = ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias")
GRADS = ("dq", "dk", "dv", "dg", "dbeta", "dh0", "dA_log", "ddt_bias")
out = {"runs": {}}
built = {}
for key, run in spec["runs"].items():
    kernel = built.setdefault(run["kernel"], kernels.get(run["kernel"]))
    data = dict(np.load(run["inputs"]))
    names = [n for n in NAMES if n in data]
    args = [jnp.asarray(data[n], jnp.float32) for n in names]
    kw = dict(run["flags"])
    if run["cu_seqlens"] is not None:
        kw["cu_seqlens"] = np.asarray(run["cu_seqlens"], np.int64)
    f = lambda *a: kernel(**dict(zip(names, a)), **kw, output_final_state=True)
    rec = {"family": getattr(kernel, "family", None), "type": type(kernel).__name__}
    start = time.perf_counter()
    if run["forward_only"]:
        o, S = f(*args)
        results = {"o": o, "final_state": S}
        try:
            jax.vjp(f, *args)[1]((o, S))
            rec["vjp"] = None
        except ValueError as exc:
            rec["vjp"] = str(exc)
    else:
        (o, S), pull = jax.vjp(f, *args)
        grads = pull((jnp.asarray(data["do"], jnp.float32), jnp.asarray(data["dfs"], jnp.float32)))
        results = {"o": o, "final_state": S, **{GRADS[NAMES.index(n)]: d for n, d in zip(names, grads)}}
    rec["seconds"] = time.perf_counter() - start
    np.savez(run["out"], **{n: np.asarray(a) for n, a in results.items()})
    out["runs"][key] = rec

name, recipe = spec["judged"]
case = FamilyCase.named(recipe)
fcall, do, dfs = case.data()
got = family_results(kernels.get(name), fcall, do, dfs, flags=case.flags)
np.savez(spec["judged_out"], **got)

gdn = built["fla-gdn-chunk[interpret=1]"]
try:
    gdn(*(jnp.zeros(s, jnp.bfloat16) for s in ((1, 8, 2, 16), (1, 8, 2, 16), (1, 8, 4, 16), (1, 8, 4), (1, 8, 4))))
    out["bf16"] = None
except ValueError as exc:
    out["bf16"] = str(exc)
gdn2_kda = kernels.get("fla-kda-chunk[interpret=1,signature=gdn2]")
out["gdn2_signature"] = {"type": type(gdn2_kda).__name__, "family": getattr(gdn2_kda, "family", None)}
from gdn2_oracle.ci.running.modes import case_refusal
out["bf16_case"] = [case_refusal(k, FamilyCase.named(recipe, precision=p))
                    for k in (gdn, gdn2_kda) for p in ("float32", "bfloat16")]
print("RESULT " + json.dumps(out))
"""


def _runs():
    """``{key: (peer, case)}``: every peer on every case (the KDA peers on KDA's bounded gate too)."""
    return {f"{peer}/{case}": (peer, case) for peer, (family, _) in PEERS.items()
            for case in CASES + (KDA_CASES if family == "kda" else ())}


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    """``(findings, {key: results}, judged results)`` of the interpreted peers, run in one subprocess once per pytest
    run (ci.testing.once_per_run)."""
    missing = [m for m in ("triton", "fla", "torch") if importlib.util.find_spec(m) is None]
    assert not missing, f"{missing} not installed: these tests need Triton, FLA and torch (make test installs them)"

    def run(root):
        runs = {}
        for i, (key, (peer, case)) in enumerate(_runs().items()):
            family, forward_only = PEERS[peer]
            x, flags, cu, do, dfs = make_case(family, case, seed=10 + i)
            inputs = root / f"in{i}.npz"
            np.savez(inputs, **{n: np.asarray(a, np.float32) for n, a in x.items()}, do=np.float32(do),
                     dfs=np.float32(dfs))
            runs[key] = dict(kernel=f"{peer}[interpret=1]", inputs=str(inputs), out=str(root / f"out{i}.npz"),
                             flags=flags, cu_seqlens=cu, forward_only=forward_only)
        spec = dict(runs=runs, judged=JUDGED, judged_out=str(root / "judged.npz"))
        return interpreted_script(SCRIPT, spec, timeout=1500)

    findings, root = once_per_run(tmp_path_factory, "fla_family_peers", run)
    results = {key: dict(np.load(root / f"out{i}.npz")) for i, key in enumerate(_runs())}
    return findings, results, dict(np.load(root / "judged.npz"))


@pytest.mark.parametrize("key", list(_runs()))
def test_interpreted_family_peer_matches_the_oracle(interpreted, key):
    """o, the final state and (chunk kernels) every gradient, the gate parameters' included, PASS the grading rule
    against the float64 family oracle; a fused-recurrent kernel's VJP is refused with the reason."""
    findings, results, _ = interpreted
    peer, case = _runs()[key]
    family, forward_only = PEERS[peer]
    assert findings["runs"][key]["family"] == family and findings["runs"][key]["type"] == "FamilyTorchKernel"
    if forward_only:
        refusal = findings["runs"][key]["vjp"]
        assert refusal is not None and f"{peer}: forward only" in refusal, refusal
    names, report = judged(family, case, 10 + list(_runs()).index(key), results[key],
                           ("o", "final_state") if forward_only else None)
    assert set(results[key]) == set(names), (sorted(results[key]), names)
    assert report.grade == PASS, report.format()


def test_interpreted_gdn_chunk_passes_the_family_judge(interpreted):
    """``family_results`` + ``FamilyCase.judge`` on a quick recipe (GVA, moderate decay, initial state): PASS."""
    _, _, got = interpreted
    report = FamilyCase.named(JUDGED[1]).judge(got)
    assert report.grade == PASS, report.format()


def test_interpreted_family_peer_refuses_bfloat16_with_the_reason(interpreted):
    refusal = interpreted[0]["bf16"]
    assert refusal is not None and "fla-gdn-chunk[interpret=1] refuses bfloat16" in refusal, refusal
    assert "tl.dot on bfloat16 operands" in refusal, refusal


def test_interpreted_peers_bfloat16_case_is_listed_by_validate_as_outside_its_domain(interpreted):
    """The interpreted peers declare float32 inputs only (``input_dtypes``): validate lists a bfloat16 case as
    refused with the interpreter's reason (not run), a float32 one is run."""
    f32, bf16, f32_gdn2, bf16_gdn2 = interpreted[0]["bf16_case"]
    assert f32 is None and f32_gdn2 is None
    for reason in (bf16, bf16_gdn2):
        assert reason.startswith("bfloat16 inputs: the kernel takes float32 only") and "tl.dot" in reason, reason


def test_interpreted_fla_kda_chunk_keeps_the_gdn2_contract_under_an_option(interpreted):
    assert interpreted[0]["gdn2_signature"] == {"type": "TorchKernel", "family": None}


# --- in this process: nothing here imports triton or sets the variable ------------------------------------

@pytest.mark.parametrize("name", list(PEERS))
def test_compiled_family_peer_needs_cuda_or_the_interpreter(monkeypatch, name):
    monkeypatch.delenv(ENV, raising=False)
    torch = pytest.importorskip("torch", reason="torch is not importable: FLA's kernels cannot run")
    if torch.cuda.is_available():
        assert kernels.get(name).family == PEERS[name][0]
    else:
        with pytest.raises(ValueError, match=rf"needs a CUDA device.*{name}\[interpret=1\] runs it in Triton's "):
            kernels.get(name)
    assert ENV not in os.environ


def test_fla_kda_chunk_signature_option_is_checked():
    with pytest.raises(ValueError, match=r"signature: 'x' not one of \('kda', 'gdn2'\) \(fla-kda-chunk"):
        kernels.get("fla-kda-chunk[signature=x]")
