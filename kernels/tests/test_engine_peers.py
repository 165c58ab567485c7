"""vLLM's and SGLang's Triton GDN / KDA kernels from their wheels (kernels/third_party.py, kernels/engine_peers.py).

The loader in this process (no Triton imported, nothing interpreted): a missing wheel's error, the cache folder keyed
by the wheel's hash. The registered kernels in one subprocess (``TRITON_INTERPRET=1`` must be set before Triton is
imported and then holds for the process): the stand-ins present only during a load, each kernel on small family
calls with grouped value heads (test_fla_family_peers.py's ``make_case``: B = 2, T = 50, H = 2, HV = 4, K = V = 16
with an initial state; and two packed sequences) judged against the float64 family oracle by the grading rule, and
vLLM's chunk kernel in bfloat16 (its public entry; the interpreter's bfloat16 fixes) on the same call; SGLang's
ReplaySSM modules load. ``validate --cases smoke`` on SGLang's kernel through the console script. The wheels come
from ``make peers`` ($GDN2_PEERS/wheels): without them these tests skip, except under CI (``CI=true``), where a
missing wheel fails them. In the release group (conftest.py).
"""

from __future__ import annotations

import json
import os
import zipfile

import ml_dtypes
import numpy as np
import pytest

from gdn2_oracle.ci.grading.grades import PASS
from gdn2_oracle.ci.testing import console, interpreted_script, once_per_run
from gdn2_oracle.kernels import third_party
from gdn2_oracle.kernels.engine_peers import PEERS
from gdn2_oracle.kernels.tests.test_fla_family_peers import judged, make_case
from gdn2_oracle.oracle import call_modes

CASES = ("gva", "packed")
BF16_RUN = ("vllm-gdn-chunk", "gva")  # the bfloat16 check: vLLM's public chunk entry (it refuses float32)


def wheels_or_skip():
    """The peers folder when both engines' wheels are in it; else a skip, or under ``CI=true`` a failure."""
    missing = []
    for engine in third_party.WHEELS:
        try:
            third_party.find_wheel(engine)
        except ValueError as exc:
            missing.append(str(exc))
    if missing:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("; ".join(missing))
        pytest.skip("; ".join(missing))
    return third_party.peers_dir()


# --- the loader, in this process ------------------------------------------------------------------------------

def test_a_missing_wheel_names_make_peers_and_the_folder(monkeypatch, tmp_path):
    monkeypatch.setenv(third_party.PEERS_ENV, str(tmp_path))
    for engine in third_party.WHEELS:
        with pytest.raises(ValueError, match=rf"{engine} .*'s wheel .* is not in {tmp_path / 'wheels'}; run `make "
                                             rf"peers`.*{third_party.PEERS_ENV}"):
            third_party.find_wheel(engine)


def test_missing_wheels_skip_here_and_fail_under_ci(monkeypatch, tmp_path):
    monkeypatch.setenv(third_party.PEERS_ENV, str(tmp_path))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="make peers"):
        wheels_or_skip()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="make peers"):
        wheels_or_skip()


def test_the_peers_folder_defaults_to_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(third_party.PEERS_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert third_party.peers_dir() == tmp_path / "gdn2-oracle" / "peers"


def _fake_wheel(path, text):
    """A zip holding one vLLM kernel file with ``text`` and one file outside the kernel folders."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("vllm/third_party/flash_linear_attention/ops/op.py", text)
        archive.writestr("vllm/engine/llm_engine.py", "raise ImportError\n")
    return path


def test_the_wheels_hash_keys_the_extracted_kernel_files(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = _fake_wheel(tmp_path / "a.whl", "x = 1\n")
    second = _fake_wheel(tmp_path / "b.whl", "x = 2\n")
    root = third_party.extract("vllm", first)
    assert root.name == f"vllm-{third_party.wheel_hash(first)[:16]}"
    assert (root / "vllm/third_party/flash_linear_attention/ops/op.py").read_text() == "x = 1\n"
    assert not (root / "vllm/engine").exists()  # only the kernel folders
    other = third_party.extract("vllm", second)
    assert other != root and (other / "vllm/third_party/flash_linear_attention/ops/op.py").read_text() == "x = 2\n"
    assert third_party.extract("vllm", first) == root


def test_an_unknown_engine_is_refused():
    with pytest.raises(ValueError, match=r"engine: 'tgi' not one of \('vllm', 'sglang'\)"):
        third_party.find_wheel("tgi")


# --- the kernels, interpreted in one subprocess ---------------------------------------------------------------------

SCRIPT = r"""
import json, sys
import numpy as np, jax.numpy as jnp, torch
from gdn2_oracle import kernels
from gdn2_oracle.kernels import third_party

spec = json.loads(sys.argv[1])
NAMES = ("q", "k", "v", "g", "beta", "initial_state")
out = {"before": sorted(n for n in sys.modules if n.split(".")[0] in ("vllm", "sglang")), "runs": {}}
for key, run in spec["runs"].items():
    kernel = kernels.get(run["kernel"])
    data = dict(np.load(run["inputs"]))
    kw = {} if run["cu_seqlens"] is None else {"cu_seqlens": np.asarray(run["cu_seqlens"], np.int64)}
    dtype = jnp.bfloat16 if run["bf16"] else jnp.float32
    o, S = kernel(**{n: jnp.asarray(data[n], dtype if n != "initial_state" else jnp.float32) for n in NAMES}, **kw,
                  output_final_state=True)
    np.savez(run["out"], o=np.asarray(o, np.float32), final_state=np.asarray(S, np.float32))
    out["runs"][key] = {"family": kernel.family, "no_backward": kernel.no_backward}
from gdn2_oracle.kernels.engine_peers import sglang_replayssm
decode, fold = sglang_replayssm()
out["replayssm"] = [hasattr(decode, n) for n in ("gdn_replayssm_spec_decode", "commit_gdn_replayssm_spec",
                                                  "commit_gdn_replayssm_circular")]
out["replayssm"].append(hasattr(fold, "commit_gdn_replayssm_fold_all_layers"))
out["after"] = sorted(n for n in sys.modules if n.split(".")[0] in ("vllm", "sglang"))
loaded = third_party.load("vllm", [])
out["loaded"] = sorted(loaded.modules)
out["root"] = str(loaded.root)
print("RESULT " + json.dumps(out))
"""


def _runs():
    """``{key: (kernel, case, bfloat16)}``: every engine kernel on each case, and the bfloat16 run."""
    runs = {f"{name}/{case}": (name, case, False) for name in PEERS for case in CASES}
    runs[f"{BF16_RUN[0]}/{BF16_RUN[1]}/bf16"] = (*BF16_RUN, True)
    return runs


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    """``(findings, {key: results})`` of every engine kernel on its small calls, run in one subprocess once per pytest
    run (ci.testing.once_per_run)."""
    wheels_or_skip()

    def run(root):
        runs = {}
        for i, (key, (name, case, bf16)) in enumerate(_runs().items()):
            x, _, cu, _, _ = make_case(PEERS[name][3], case, seed=40 + i)
            if bf16:  # the values the kernel sees: q, k, v, g, beta rounded to bfloat16
                x = {n: (a if n == "initial_state" else np.asarray(a, ml_dtypes.bfloat16).astype(np.float64))
                     for n, a in x.items()}
            np.savez(root / f"in{i}.npz", **{n: np.asarray(a, np.float32) for n, a in x.items()})
            runs[key] = dict(kernel=name, inputs=str(root / f"in{i}.npz"), out=str(root / f"out{i}.npz"),
                             cu_seqlens=cu, bf16=bf16)
        return interpreted_script(SCRIPT, {"runs": runs}, timeout=900)

    findings, root = once_per_run(tmp_path_factory, "engine_peers", run)
    return findings, {key: dict(np.load(root / f"out{i}.npz")) for i, key in enumerate(_runs())}


@pytest.mark.parametrize("key", list(_runs()))
def test_interpreted_engine_kernel_matches_the_oracle(interpreted, key):
    """o and the final state PASS the grading rule against the float64 family oracle (bfloat16: against the oracle
    on the bfloat16-rounded inputs, within the bfloat16 yardstick); the kernel is inference only."""
    findings, results = interpreted
    name, case, bf16 = _runs()[key]
    family = PEERS[name][3]
    assert findings["runs"][key] == {"family": family, "no_backward": findings["runs"][key]["no_backward"]}
    assert f"{name}: inference only" in findings["runs"][key]["no_backward"]
    seed = 40 + list(_runs()).index(key)
    if bf16:
        _, report = judged_bf16(family, case, seed, results[key])
    else:
        _, report = judged(family, case, seed, results[key], ("o", "final_state"))
    assert report.grade == PASS, report.format()


def judged_bf16(family, case, seed, got):
    """The report of bfloat16 results ``got`` on :func:`make_case`'s call with q, k, v, g, beta rounded to bfloat16,
    judged on o and the final state with the bfloat16 yardstick."""
    from gdn2_oracle.ci.grading.families import FamilyCase
    from gdn2_oracle.ci.grading.modes import compare
    from gdn2_oracle.oracle import families as oracle_families

    x, flags, cu, do, dfs = make_case(family, case, seed)
    x = {n: (a if n == "initial_state" else np.asarray(a, ml_dtypes.bfloat16).astype(np.float64)) for n, a in x.items()}
    fcase = FamilyCase.of(oracle_families.call(family, **x, **flags, cu_seqlens=cu), do, dfs, name=f"{family}/{case}")
    fcase.family = family
    names = ("o", "final_state")
    return names, compare(names, got, fcase.yardstick({n: "bfloat16" for n in names}))


def test_interpreted_stand_ins_live_only_during_a_load(interpreted):
    """No ``vllm`` / ``sglang`` module before or after the loads; the loaded kernel modules are kept by the loader,
    read from the cache folder named after the wheel's hash."""
    findings, _ = interpreted
    assert findings["before"] == [] and findings["after"] == []
    assert "vllm.third_party.flash_linear_attention.ops.chunk" in findings["loaded"]
    assert not any(n in findings["loaded"] for n in ("vllm.triton_utils", "vllm.platforms", "vllm"))
    wheel = third_party.find_wheel("vllm")
    assert findings["root"].endswith(f"vllm-{third_party.wheel_hash(wheel)[:16]}")


def test_interpreted_sglang_replayssm_loads(interpreted):
    """SGLang's GDN ReplaySSM modules load from its wheel with their decode and commit functions."""
    assert interpreted[0]["replayssm"] == [True, True, True, True]


# vLLM's chunk kernel through the console script takes 3.5 min here (2 cores, shared): past this file's budget; its
# kernels are judged above, each on its own calls
@pytest.mark.parametrize("kernel", ["sglang-gdn-fused-recurrent"])
def test_interpreted_validate_smoke_through_the_console_script(tmp_path, kernel):
    """``gdn2-oracle validate --kernel K --cases smoke --dtype float32``: the judged cases are graded (exit 0: PASS or
    PRECISION; none FAIL) and the family notes name the wheel."""
    peers = wheels_or_skip()
    proc = console(tmp_path, "validate", "--kernel", kernel, "--cases", "smoke", "--dtype", "float32",
                   "--no-progress", timeout=900, GDN2_PEERS=str(peers))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert f"{kernel}: " in proc.stdout and ".whl (sha256" in proc.stdout, proc.stdout[-4000:]



SIGMOID_GATING_CASES = ("gdn_gate_softplus_T128", "gdn_gva4_moderate_beta_two")


def test_interpreted_sigmoid_gating_validates_through_its_raw_gates(tmp_path):
    """``validate --kernel vllm-gdn-fused-sigmoid-gating`` on two smoke cases: FLA's in-kernel gate (A_log, dt_bias
    passed through to vLLM's raw gates) PASSes, and a beta near 2 (which ``sigmoid(b)`` cannot express) is outside the
    kernel's domain: not run, listed with the reason (the family's g, beta inverted into raw gates: the interpreted
    calls above); the run PASSes."""
    peers = wheels_or_skip()
    kernel = "vllm-gdn-fused-sigmoid-gating"
    named = [a for c in SIGMOID_GATING_CASES for a in ("--case", c)]
    proc = console(tmp_path, "validate", "--kernel", kernel, "--cases", "smoke", *named, "--dtype", "float32",
                   "--no-progress", "--json", tmp_path / "report.json", timeout=900, GDN2_PEERS=str(peers))
    text = proc.stdout + proc.stderr
    (k,) = json.loads((tmp_path / "report.json").read_text())["kernels"]
    assert {c["case"]: c["grade"] for c in k["cases"]} == {"gdn_gate_softplus_T128": PASS}, text
    [refused] = k["refused_cases"]
    assert refused["case"] == "gdn_gva4_moderate_beta_two", text
    assert "beta = sigmoid(b), which only expresses 0 <= beta <= 1" in refused["reason"], refused
    assert "1 case(s) outside the kernel's domain: beta: vLLM's" in proc.stdout, text
    assert proc.returncode == 0 and "fused_sigmoid_gating.py read from vllm-0.33.0" in proc.stdout, text


POOL_SESSIONS = ("serving_gdn_pool_g2", "serving_gdn_drafts_g4")  # packed prefill rows on slot 0; every accept count


def test_interpreted_vllm_pool_kernel_on_the_serving_sessions(tmp_path):
    """``validate --kernel vllm-gdn-fused-recurrent-pool`` on a gdn decode and a speculative session: o, the written
    states, the untouched slots and the rejected drafts PASS, and padding PASSes by the kernel's own contract (vLLM's
    kernel returns before storing o for a null-block sequence, its ``new_empty`` buffer: ``padding_output =
    "unwritten"``, those outputs not judged); a mutant that drops ``num_accepted_tokens`` FAILs o and the states on the
    speculative session."""
    from gdn2_oracle.kernels.engine_peers import POOL_NAME

    peers = wheels_or_skip()
    mutant = f"{POOL_NAME}[mutant=accepted_ignored]"
    named = [a for c in POOL_SESSIONS for a in ("--case", c)]
    modes = ",".join(call_modes.names("serving"))
    proc = console(tmp_path, "validate", "--kernel", POOL_NAME, "--kernel", mutant, *named, "--modes", modes,
                   "--dtype", "float32", "--no-progress", "--json", tmp_path / "report.json", timeout=900,
                   GDN2_PEERS=str(peers))
    text = proc.stdout[-4000:] + proc.stderr[-4000:]
    kernels = {k["name"]: {c["case"]: {v["name"]: v["grade"] for v in c["verdicts"]} for c in k["cases"]}
               for k in json.loads((tmp_path / "report.json").read_text())["kernels"]}
    judged = kernels[POOL_NAME]
    assert sorted(judged) == sorted(POOL_SESSIONS), text
    for case, grades in judged.items():
        assert set(grades.values()) == {PASS}, (case, grades, text)
    drafts = kernels[mutant]["serving_gdn_drafts_g4"]
    assert drafts["o"] == drafts["state"] == "FAIL", text
    assert kernels[mutant]["serving_gdn_pool_g2"]["o"] == PASS, text  # decode steps take no accept counts
