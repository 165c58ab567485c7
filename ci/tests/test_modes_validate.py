"""The judge of FLA ``chunk_gdn2``'s training-call modes (ci/grading/modes.py, ci/running/modes.py), ``validate
--modes`` and the mode properties (property_tests/test_modes.py): correct kernels pass, each mutant of
kernels/testing_modes.py is caught -- by the oracle judge that ``validate`` uses and by the property named for it --
and kernels are judged only on the modes their signature accepts.

Small cases only (the quick set's two, the properties' recipes), so each kernel compiles a handful of times.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from gdn2_oracle.ci.commands import validate
from gdn2_oracle.ci.grading import modes as grading
from gdn2_oracle.ci.grading.grades import FAIL, PASS
from gdn2_oracle.ci.grading.modes import ModeCase
from gdn2_oracle.ci.running import modes as running
from gdn2_oracle.ci.running.cases import CallCase
from gdn2_oracle.ci.testing import pytest_run
from gdn2_oracle.kernels import testing_modes
from gdn2_oracle.oracle import mode_recipes
from gdn2_oracle.property_tests import test_modes as props

MUTANTS = "gdn2_oracle.kernels.testing_modes"
PLAIN = "gdn2_oracle.kernels.testing:correct"  # the dense contract only: accepts no mode


# --- which kernels take part in which mode ------------------------------------------------------------------


def test_accepted_modes_follow_the_signature():
    def plain(q, k, v, g, b, w, *, scale=None, initial_state=None):
        return None

    def some(q, k, v, g, b, w, *, scale=None, initial_state=None, cu_seqlens=None, state_v_first=False):
        return None

    def anything(q, k, v, g, b, w, **kwargs):
        return None

    def half_gate(q, k, v, g, b, w, *, use_gate_in_kernel=False, A_log=None):  # no dt_bias / lower_bound
        return None

    assert running.accepted_modes(plain) == ()
    assert running.accepted_modes(some) == ("varlen", "state_v_first")
    assert running.accepted_modes(anything) == grading.MODES
    assert running.accepted_modes(half_gate) == ()
    assert running.accepted_modes(testing_modes.leaky_state) == grading.MODES
    from gdn2_oracle import kernels

    assert running.accepted_modes(kernels.get("pairwise")) == grading.MODES


def test_parse_modes():
    assert grading.parse_modes("gate, varlen") == ("varlen", "gate")
    assert grading.parse_modes("dense") == ("dense",)
    with pytest.raises(ValueError, match="bogus"):
        grading.parse_modes("varlen,bogus")


def test_recipes_rebuild_bit_for_bit_and_use_their_modes():
    for name in mode_recipes.names("full"):
        r = mode_recipes.get(name)
        (c1, do1, dfs1), (c2, do2, dfs2) = r.build(), r.build()
        for a, b in zip(c1.inputs() + (c1.initial_state, c1.A_log, c1.dt_bias, do1, dfs1),
                        c2.inputs() + (c2.initial_state, c2.A_log, c2.dt_bias, do2, dfs2)):
            assert (a is None and b is None) or np.array_equal(a, b), name
        assert grading.call_modes(c1) == r.modes, name
    lengths = mode_recipes.EDGE_LENGTHS
    C = mode_recipes.FLA_CHUNK
    assert {0, 1, C - 1, C, C + 1} <= set(lengths)
    assert max(mode_recipes.LONG_AMONG_SHORT) >= 1024


# --- the judge ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pairwise():
    from gdn2_oracle import kernels

    return kernels.get("pairwise")


@pytest.mark.parametrize("name", ["varlen_quick", "gate_quick"])
def test_a_correct_kernel_passes_the_mode_cases(pairwise, name):
    report = running.validate(pairwise, ModeCase.named(name))
    assert report.grade == PASS, report.format()
    assert [v.name for v in report.verdicts] == list(ModeCase.named(name).names())


def test_result_names_and_envelopes():
    case = ModeCase.named("all_modes")
    assert case.names()[-3:] == ("intermediate_states", "dA_log", "ddt_bias")
    env = case.envelopes()
    assert set(env) == {"dg", "dA_log", "ddt_bias"}
    ref = case.reference()
    for name in env:  # the result's shape, every term by magnitude
        assert env[name].shape == ref[name].shape and np.all(env[name] >= 0), name
    assert all(case.judge({n: np.asarray(x, np.float32) for n, x in ref.items()})[n].note.startswith(
        "judged on envelope") for n in env)


def test_a_perturbed_result_fails_each_extra_result():
    case = ModeCase.named("all_modes")
    ref = case.reference()
    got = {n: np.asarray(x, np.float32) for n, x in ref.items()}
    assert case.judge(got).grade == PASS
    for name in ("intermediate_states", "dA_log", "ddt_bias"):
        bad = dict(got, **{name: (got[name] * (1 + 1e-3)).astype(np.float32)})
        assert case.judge(bad)[name].grade == FAIL, name


# Each mutant, the property recipe it is judged on (by validate's per-case judge, ``run_mode_case``, and by the
# property checks, sharing one compile), and the property checks that catch it.
CAUGHT = [
    ("leaky_state", "varlen", [props.check_packed_alone, props.check_perturbation]),
    ("zero_later_states", "varlen", [props.check_packed_alone]),
    ("final_one_early", "varlen", [props.check_oracle]),
    ("l2norm_eps_outside", "l2norm", [props.check_l2norm_dense]),
    ("lower_bound_outside", "gate_bounded", [props.check_gate_dense]),
]


@pytest.mark.parametrize("mutant,recipe,checks", CAUGHT, ids=[m for m, _, _ in CAUGHT])
def test_each_mutant_is_caught_by_the_judge_and_its_property(mutant, recipe, checks):
    fn = testing_modes.MUTANTS[mutant]
    recipe = props.RECIPES[recipe]
    res = CallCase.from_recipe(recipe_name(recipe), recipe).run(fn)
    assert res.grade == FAIL, res
    for check in checks:
        args = (fn, recipe, 1) if check is props.check_perturbation else (fn, recipe)
        report = check(*args)
        assert report.grade == FAIL, f"{check.__name__}:\n{report.format()}"


def recipe_name(recipe):
    return next(n for n, r in props.RECIPES.items() if r == recipe)


# --- validate --modes ---------------------------------------------------------------------------------------


def test_validate_modes_judges_accepted_modes_and_names_the_rest(cli, tmp_path):
    path = tmp_path / "v.json"
    code, out, _ = cli("validate", "--kernel", "pairwise", "--kernel", PLAIN, "--modes", "varlen,gate",
                       "--cases", "quick", "--dtype", "float32", "--no-progress", "--json", path)
    assert code == 4, out  # the plain kernel judged on no case: EMPTY, never a pass
    report = json.loads(path.read_text())
    assert report["modes"] == ["varlen", "gate"] and report["n_cases"] == 2
    assert [k["grade"] for k in report["kernels"]] == ["PASS", "EMPTY"] and report["outcome"] == "empty"
    ours, plain = report["kernels"]
    assert [c["case"] for c in ours["cases"]] == ["gate_quick", "varlen_quick"]
    assert ours["modes"] == {"judged": ["varlen", "gate"], "not_accepted": []}
    assert ours["cases"][0]["modes"] == ["gate"] and {v["name"] for v in ours["cases"][0]["verdicts"]} >= {
        "dA_log", "ddt_bias"}
    assert plain["cases"] == [] and plain["modes"]["not_accepted"] == ["varlen", "gate"]
    assert sorted(plain["not_accepted_cases"]) == ["gate_quick", "varlen_quick"]
    assert "pairwise: judged on varlen, gate" in out
    assert f"{PLAIN}: judged on no mode case; does not accept varlen, gate" in out


def test_validate_modes_dense_is_the_plain_contract(cli, tmp_path):
    path = tmp_path / "v.json"
    code, out, _ = cli("validate", "--kernel", "pairwise", "--modes", "dense", "--cases", "quick", "--case", "len_1",
                       "--dtype", "float32", "--no-progress", "--json", path)
    assert code == 0, out
    report = json.loads(path.read_text())
    assert report["n_cases"] == 1 and report["modes"] == ["dense"]
    assert "Training-call modes" not in out
    assert validate.build_cases("quick", ("float32",), modes=("dense",)) and not any(
        isinstance(c, ModeCase) for c in validate.build_cases("quick", ("float32",), modes=("dense",)))


def test_validate_catches_a_mutant_with_exit_1(cli):
    code, out, _ = cli("validate", "--kernel", f"{MUTANTS}:leaky_state", "--modes", "varlen", "--cases", "quick",
                       "--dtype", "float32", "--no-progress")
    assert code == 1, out
    assert "varlen_quick" in out and "FAIL" in out


def test_validate_rejects_an_unknown_mode(cli):
    code, _, err = cli("validate", "--modes", "varlen,packed")
    assert code == 2 and "packed" in err


def test_full_set_has_every_mode_and_quick_only_small_ones():
    full = grading.cases("full")
    assert set().union(*(c.modes for c in full)) == set(grading.MODES)
    assert {"float32", "bfloat16"} == {c.dtype for c in full}
    quick = grading.cases("quick")
    assert len(quick) == 2 and all(c.shape[1] <= 200 for c in quick)
    assert {c.source for c in grading.cases("golden")} == {"golden"}  # the mode goldens (golden/tests)


# --- the plugin: mode tests deselected per kernel ------------------------------------------------------------


def test_mode_properties_are_deselected_for_kernels_without_the_mode(tmp_path):
    code, out = pytest_run(tmp_path, "--pyargs", "gdn2_oracle.property_tests.test_modes", "--collect-only", "-q",
                           "--gdn2-kernel", PLAIN)
    assert code == 5, out  # nothing collected: every test needs a mode the plain kernel does not accept
    assert "deselected" in out
    code, out = pytest_run(tmp_path, "--pyargs", "gdn2_oracle.property_tests.test_modes", "--collect-only", "-q",
                           "--gdn2-kernel", "pairwise", "--gdn2-modes", "gate")
    assert code == 0, out
    tests = [ln for ln in out.splitlines() if "::" in ln]
    assert tests and all("gate" in t for t in tests), tests
    code, out = pytest_run(tmp_path, "--pyargs", "gdn2_oracle.property_tests.test_modes", "--collect-only", "-q",
                           "--gdn2-modes", "bogus")
    assert code == 4 and "bogus" in out


def test_a_mode_case_runs_on_the_mesh_validate_was_given():
    """``validate --mesh`` judges a training-call case inside the mesh (a context-parallel kernel shards over it),
    as it does a dense case; before, the mode cases ran on the kernel's default mesh."""
    import jax

    from gdn2_oracle.ci.running.mesh import build_mesh

    seen = []

    def spy(xs, kw):
        seen.append(dict(jax.sharding.get_abstract_mesh().shape))
        return testing_modes.correct(*xs, **kw)

    recipe = props.RECIPES["varlen"]
    case = CallCase.from_recipe(recipe_name(recipe), recipe)
    res = validate.run_case(testing_modes.ModeMutant("mesh_spy", spy), case, build_mesh("seq=1"))
    assert res.outcome == "pass", res
    assert seen and all(shape == {"seq": 1} for shape in seen), seen
