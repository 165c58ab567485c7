"""Family serving kernels on a state pool (ci/running/serving.py, ci/grading/serving.py; docs/DESIGN.md §2, "Decode
contract (serving)"): ``gdn-decode`` and ``kda-decode`` pass their family sessions (grouped value heads, decode and
speculative) in both pool layouts, and the judge fails a kernel whose value heads read the wrong key head or which
writes ``[K, V]`` states into a ``[V, K]`` pool -- directly and through ``gdn2-oracle validate``.
"""

from __future__ import annotations

import json

import pytest

from gdn2_oracle import kernels
from gdn2_oracle.ci.commands import validate
from gdn2_oracle.ci.grading.grades import FAIL, PASS
from gdn2_oracle.ci.running import serving as running
from gdn2_oracle.kernels import testing_decode
from gdn2_oracle.oracle import serving_recipes

MUTANTS = "gdn2_oracle.kernels.testing_decode"


def _cases(family, dtype):
    return running.family_serving_cases([family], (dtype,))


def _kernel(family):
    return kernels.get(f"{family}-decode")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_family_decode_kernels_pass_their_sessions_in_both_layouts(family, dtype):
    fn = _kernel(family)
    cases = _cases(family, dtype)
    assert {c.v_first for c in cases} == {False, True} and {c.mode for c in cases} == set(serving_recipes.MODES)
    assert {c.shape[1] // serving_recipes.H for c in cases} == {2, 4}  # G = 2 and 4
    for case in cases:
        result = case.run(fn)
        assert result.grade == PASS, (case.name, result.to_dict())
        assert result.to_dict()["family"] == family


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_a_value_head_reading_key_head_hv_mod_h_fails(family):
    fn = testing_decode.family_mutant("gva_modulo", family)
    for case in _cases(family, "float32"):
        result = case.run(fn)
        assert result.grade == FAIL, case.name
        failed = {v["name"] for v in result.to_dict()["verdicts"] if v["grade"] == FAIL}
        assert {"o", "state"} <= failed, (case.name, failed)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_kv_states_in_a_vk_pool_fail_only_in_that_layout(family):
    fn = testing_decode.family_mutant("kv_in_vk_pool", family)
    for case in _cases(family, "float32"):
        result = case.run(fn)
        assert result.grade == (FAIL if case.v_first else PASS), case.name


def test_the_layout_is_judged_only_for_kernels_that_name_it():
    fn = _kernel("gdn")
    assert running.layout_flags(fn) == [running.V_FIRST_KEYWORD]

    def no_layout(q, k, v, g, beta, scale=None, initial_state=None, ssm_state_indices=None, cu_seqlens=None,
                  num_accepted_tokens=None):
        return fn(q, k, v, g, beta, scale=scale, initial_state=initial_state, ssm_state_indices=ssm_state_indices,
                  cu_seqlens=cu_seqlens, num_accepted_tokens=num_accepted_tokens)

    assert running.layout_flags(no_layout) == []
    vk = next(c for c in _cases("gdn", "float32") if c.v_first)
    assert not validate.takes_part(vk, validate.accepted_modes(fn, "gdn"), "gdn", running.layout_flags(no_layout))
    assert validate.takes_part(vk, validate.accepted_modes(fn, "gdn"), "gdn", running.layout_flags(fn))
    # no family attribute, FLA's family signature: run in its session's family
    kv = next(c for c in _cases("gdn", "float32") if not c.v_first)
    assert kv.run(no_layout).grade == PASS
    assert vk.run(no_layout).grade == FAIL  # run anyway, it cannot take the [V, K] pool: an error, not a pass


def test_a_kernel_of_another_family_is_refused():
    kda_case = next(c for c in _cases("kda", "float32") if not c.v_first)
    result = kda_case.run(_kernel("gdn"))
    assert result.grade == FAIL and "family" in result.to_dict()["error"]


def _validate(cli, tmp_path, kernel):
    path = tmp_path / "v.json"
    code, out, _ = cli("validate", "--kernel", kernel, "--modes", "decode,speculative", "--cases", "quick",
                       "--dtype", "float32", "--no-progress", "--json", path)
    return code, out, json.loads(path.read_text())


def test_validate_judges_gdn_decode_on_its_serving_sessions(cli, tmp_path):
    code, out, report = _validate(cli, tmp_path, "gdn-decode")
    assert code == 0, out
    (k,) = report["kernels"]
    names = {c["case"] for c in k["cases"]}
    want = {s.name for s in serving_recipes.family_sessions(["gdn"], ("float32",))}
    assert k["family"] == "gdn" and k["passed"] and names == want | {n + "_vk" for n in want}, names
    assert all(c["family"] == "gdn" for c in k["cases"])


@pytest.mark.parametrize("mutant,failed", [("gdn_gva_modulo", "all"), ("gdn_kv_in_vk_pool", "_vk")])
def test_validate_fails_the_family_serving_mutants(cli, tmp_path, mutant, failed):
    code, out, report = _validate(cli, tmp_path, f"{MUTANTS}:{mutant}")
    assert code != 0, out
    (k,) = report["kernels"]
    bad = {c["case"] for c in k["cases"] if c["grade"] == FAIL}
    assert bad and (len(bad) == len(k["cases"]) if failed == "all" else
                    bad == {c["case"] for c in k["cases"] if c["case"].endswith(failed)}), bad
