"""``torch:`` kernels through ``gdn2-oracle validate`` and the pytest plugin, and contract violations
reported per case in plain words (torch and JAX kernels alike) while the other cases still run.

validate runs in-process (``ci.cli.main``); the plugin in a subprocess from a temporary directory, as a
kernel author would. The tiny torch kernels are in ``gdn2_oracle.kernels.testing_torch``.
"""

from __future__ import annotations

import json

import pytest

from gdn2_oracle.ci.testing import pytest_run
from gdn2_oracle.kernels import spec as kernel_spec

T = "torch:gdn2_oracle.kernels.testing_torch"
CORRECT = f"{T}:recurrent[output_final_state=True]"
WRONG = f"{T}:perturbed[output_final_state=True]"
TWO_CASES = ["--cases", "golden", "--case", "decay_moderate", "--case", "bf16_moderate", "--no-progress"]



def test_validate_correct_torch_kernel_exits_0(cli):
    code, out, err = cli("validate", "--kernel", CORRECT, *TWO_CASES)
    assert code == 0, out
    assert "overall: PASS" in out and "through the torch bridge" in out  # the note names the bridge


def test_validate_wrong_torch_kernel_exits_1(cli, tmp_path):
    path = tmp_path / "v.json"
    code, out, err = cli("validate", "--kernel", WRONG, "--cases", "golden", "--case", "decay_moderate",
                    "--no-progress", "--json", str(path))
    assert code == 1, out
    [k] = json.loads(path.read_text())["kernels"]
    [case] = k["cases"]  # (1e-3 is inside the bfloat16 tolerance: float32 only)
    assert case["case"] == "decay_moderate" and not case["passed"]
    assert next(v for v in case["verdicts"] if v["name"] == "o")["err_ratio"] > 5e-4  # the 1e-3 perturbation


VIOLATIONS = {  # kernel -> the message its failing cases must show
    "raises": "RuntimeError: this torch kernel always fails",
    "three_results": "ContractError: returned 3 results, expected 2 (o, final_state)",
    "narrow_output": "ContractError: returned o of shape (1, 40, 2, 15), expected (1, 40, 2, 16)",
    "bf16_state": "ContractError: returned final_state of dtype bfloat16, expected float32",
    "detached": "TorchContractError: returned o without an autograd graph",
    "off_device": "TorchContractError: returned o on device meta, expected cpu",
    "rejects_strong_decay": "KernelError: ValueError: g: log-decay below -20 is not supported by this kernel",
}


def test_contract_violations_fail_their_cases_in_plain_words(cli, tmp_path):
    """One run: every violating kernel fails with its message and no traceback; the correct kernel and a
    kernel that fails only on some values still get every other case judged."""
    path = tmp_path / "v.json"
    kernels = [CORRECT, *(f"{T}:{n}[output_final_state=True]" for n in VIOLATIONS), f"{T}:nan_output"
               "[output_final_state=True]"]
    code, out, err = cli("validate", *(a for k in kernels for a in ("--kernel", k)), "--cases", "golden",
                    "--case", "decay_moderate", "--case", "decay_extreme", "--dtype", "float32", "--no-progress",
                    "--json", str(path))
    assert code == 1, out
    assert "Traceback" not in out
    report = {k["spec"]: k for k in json.loads(path.read_text())["kernels"]}
    assert report[CORRECT]["passed"]
    for name, message in VIOLATIONS.items():
        cases = {c["case"]: c for c in report[f"{T}:{name}[output_final_state=True]"]["cases"]}
        failing = ["decay_extreme"] if name == "rejects_strong_decay" else ["decay_moderate", "decay_extreme"]
        for case in failing:
            assert cases[case]["error"].startswith(message), (name, cases[case]["error"])
            assert message in out
        if name == "rejects_strong_decay":
            assert cases["decay_moderate"]["passed"]  # the case it can do is judged, and passes
    nan = report[f"{T}:nan_output[output_final_state=True]"]["cases"]
    assert all(v["rule"] == "non-finite" for c in nan for v in c["verdicts"] if v["name"] == "o")


def _pairwise_returning(transform):
    """A JAX kernel factory: the pairwise kernel with its results passed through ``transform``."""
    def factory():
        base = kernel_spec.get("pairwise", chunk_size=16)
        return lambda *a, **kw: transform(*base(*a, **kw))
    return factory


def test_jax_contract_violations_fail_their_cases_in_plain_words(cli, monkeypatch):
    bad = {"jax-wide-state": (_pairwise_returning(lambda o, s: (o, s[..., :-1])),
                              "ContractError: returned final_state of shape (1, 2, 16, 15), expected (1, 2, 16, 16)"),
           "jax-bf16-state": (_pairwise_returning(lambda o, s: (o, s.astype("bfloat16"))),
                              "ContractError: returned final_state of dtype bfloat16, expected float32"),
           "jax-three": (_pairwise_returning(lambda o, s: (o, s, s)),
                         "ContractError: returned 3 results, expected 2 (o, final_state)")}
    for name, (factory, _) in bad.items():
        monkeypatch.setitem(kernel_spec._REGISTERED, name, factory)
    code, out, err = cli("validate", "--kernel", "pairwise", *(a for n in bad for a in ("--kernel", n)),
                    "--cases", "golden", "--case", "decay_moderate", "--dtype", "float32", "--no-progress")
    assert code == 1 and "Traceback" not in out, out
    assert "pairwise: PASS" in out
    for name, (_, message) in bad.items():
        assert message in out and f"{name}: FAIL" in out, out


# --- the plugin -----------------------------------------------------------------------------

PLUGIN = ["--pyargs", "gdn2_oracle.property_tests"]
SOME_TESTS = ["-k", "test_kernel_matches_golden and len_1 or test_state_carry"]




@pytest.mark.slow
def test_plugin_runs_the_conformance_suite_on_a_torch_kernel(tmp_path):
    code, out = pytest_run(tmp_path, *PLUGIN, "--gdn2-kernel", CORRECT, *SOME_TESTS)
    assert code == 0 and "3 passed" in out, out  # the golden case and the state carry at both splits
    code, out = pytest_run(tmp_path, *PLUGIN, "--gdn2-kernel", WRONG, "-k", "test_kernel_matches_golden and len_1")
    assert code == 1 and "1 failed" in out and "perturbed" in out, out
