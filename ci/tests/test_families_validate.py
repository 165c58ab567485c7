"""``validate`` judges KDA and Gated DeltaNet kernels in FLA's signature (ci/grading/families.py,
ci/running/families.py; docs/DESIGN.md §4, "Family kernels"): a correct token-by-token kernel of each family passes the
quick set, each small mutant here fails it, a kernel is judged only on its family's cases, and a kernel in FLA's
signature that does not say its family is a usage error.

The kernels are written here in plain jax.numpy (a ``lax.scan`` over tokens, FLA's signature and flags) so that the
judge is tested against nothing of kernels/.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn2_oracle import oracle
from gdn2_oracle.ci.commands import validate
from gdn2_oracle.ci.commands.output import UsageError
from gdn2_oracle.ci.grading import families as grading
from gdn2_oracle.ci.grading import tolerance
from gdn2_oracle.ci.grading.grades import FAIL, PASS
from gdn2_oracle.ci.running import families as running
from gdn2_oracle.ci.running import serving
from gdn2_oracle.ci.running.cases import FamilyRunCase
from gdn2_oracle.ci.testing import console
from gdn2_oracle.kernels import spec
from gdn2_oracle.oracle import families, family_recipes, recurrence

HERE = __name__  # the CLI resolves "module:attr" specs of this module by this name


def family_kernel(family, mutant=None):
    """A kernel of ``family`` in FLA's signature, token by token in float32; ``mutant``: ``beta_write_only`` (beta
    scales the write, not the erase), ``gva_mod`` (value head ``hv`` reads key head ``hv % H``), ``no_neg_eigval``
    (beta = sigmoid(logits) with allow_neg_eigval too)."""

    def kernel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
               use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False):
        B, T, H, K = q.shape
        HV, V = v.shape[2:]
        f32 = jnp.float32
        q, k, v, g, beta = (x.astype(f32) for x in (q, k, v, g, beta))
        if use_qk_l2norm_in_kernel:
            q, k = (x * jax.lax.rsqrt(jnp.sum(x * x, -1, keepdims=True) + 1e-6) for x in (q, k))
        if use_beta_sigmoid_in_kernel:
            beta = (2.0 if allow_neg_eigval and mutant != "no_neg_eigval" else 1.0) * jax.nn.sigmoid(beta)
        heads = np.arange(HV) % H if mutant == "gva_mod" else np.arange(HV) // (HV // H)
        q, k = q[:, :, heads], k[:, :, heads]
        if family == "gdn":
            g = jnp.broadcast_to(g[..., None], (B, T, HV, K))
        scale = K ** -0.5 if scale is None else scale
        S0 = jnp.zeros((B, HV, K, V), f32) if initial_state is None else initial_state.astype(f32)

        def step(S, x):
            qt, kt, vt, gt, bt = x
            S = S * jnp.exp(gt)[..., None]
            r = jnp.einsum("bhkv,bhk->bhv", S, kt)
            u = bt[..., None] * vt - r if mutant == "beta_write_only" else bt[..., None] * (vt - r)
            S = S + kt[..., :, None] * u[..., None, :]
            return S, scale * jnp.einsum("bhkv,bhk->bhv", S, qt)

        S, o = jax.lax.scan(step, S0, tuple(jnp.swapaxes(x, 0, 1) for x in (q, k, v, g, beta)))
        return jnp.swapaxes(o, 0, 1).astype(v.dtype), (S if output_final_state else None)

    kernel.__name__ = f"{family}_{mutant or 'correct'}"
    return kernel


gdn_correct = family_kernel("gdn")
kda_correct = family_kernel("kda")
gdn_beta_write_only = family_kernel("gdn", "beta_write_only")
kda_gva_mod = family_kernel("kda", "gva_mod")
gdn_no_neg_eigval = family_kernel("gdn", "no_neg_eigval")


def plain_beta_kernel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
    return None


def minimal_gdn(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
    """A GDN kernel that takes no flag: the cases setting one are not run on it."""
    return gdn_correct(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                       output_final_state=output_final_state)


# --- which family a kernel is ---------------------------------------------------------------------------------


def test_kernel_family_from_option_attribute_and_signature():
    assert running.kernel_family(gdn_correct, "gdn") == "gdn"
    assert running.kernel_family(jax.jit(kda_correct), "kda") == "kda"

    def gdn2(q, k, v, g, b, w, *, scale=None, initial_state=None):
        return None

    assert running.kernel_family(gdn2) == "gdn2"
    assert running.kernel_family(lambda *a, **kw: None) == "gdn2"  # no beta in the signature: the plain contract

    def tagged(*a, **kw):
        return None

    tagged.family = "kda"
    import functools

    assert running.kernel_family(functools.partial(tagged, x=1)) == "kda"  # through a partial
    assert running.kernel_family(tagged, "gdn") == "gdn"  # the option wins
    with pytest.raises(ValueError, match="family=kda or family=gdn"):
        running.kernel_family(plain_beta_kernel)
    with pytest.raises(ValueError, match="family: 'gla'"):
        running.kernel_family(gdn_correct, "gla")


def test_a_beta_kernel_without_a_family_is_a_usage_error(cli):
    code, out, err = cli("validate", "--kernel", f"{HERE}:plain_beta_kernel", "--cases", "quick", "--dtype",
                         "float32", "--no-progress")
    assert code == 2
    assert "family=kda or family=gdn" in err and "plain_beta_kernel" in err


# --- the judge --------------------------------------------------------------------------------------------------


def test_reference_is_the_family_oracle_bit_for_bit_with_envelopes():
    for name in ("kda_gva2_mixed_logits", "gdn_gva4_strong_neg_eigval", "gdn_gva2_l2norm_h0", "gdn_gate_softplus",
                 "kda_intermediate"):
        case = grading.FamilyCase.named(name)
        fcall, do, dfs = case.data()
        ref = case.reference()
        want = families.run(fcall, np.float64, do, dfs)
        assert set(ref) == set(case.names()) and set(grading.FAMILY_RESULTS) <= set(ref)
        for n in ref:
            if n != "intermediate_states":
                assert np.array_equal(ref[n], want[n]), (name, n)
        env = case.envelopes()
        assert env["dg"].shape == ref["dg"].shape and np.all(env["dg"] >= 0)
    # without grouped value heads, KDA's envelope is the dense one (tolerance.envelope) of its GDN-2 problem
    fcall, do, dfs = family_recipes.FamilyRecipe("kda", 1, 20, 2, 2, 8, 8, decay="strong", seed=3).build()
    problem = fcall.to_gdn2()
    dense = oracle.named_results(*recurrence.forward_and_vjp(problem, do, dfs, np.float64))
    kda = grading.FamilyCase("kda", "given", "float32", fcall.shape, lambda: (fcall, do, dfs), (), family="kda")
    assert np.allclose(kda.envelopes()["dg"], tolerance.envelope("dg", problem, dense), rtol=1e-14)
    # Gated DeltaNet's scalar dg: the sum over K of the envelope of its GDN-2 problem
    gdn = family_recipes.FamilyRecipe("gdn", 1, 20, 2, 2, 8, 8, decay="strong", seed=3).build()
    case = grading.FamilyCase("gdn", "given", "float32", gdn[0].shape, lambda: gdn, (), family="gdn")
    assert np.allclose(case.envelopes()["dg"], np.sum(tolerance.envelope("dg", gdn[0].to_gdn2(), oracle.named_results(
        *recurrence.forward_and_vjp(gdn[0].to_gdn2(), *gdn[1:], np.float64))), axis=-1), rtol=1e-14)


def test_recipes_rebuild_bit_for_bit_and_cover_the_regimes():
    recipes = [family_recipes.get(n) for n in family_recipes.names("quick")]
    for r in recipes:
        (a, do1, dfs1), (b, do2, dfs2) = r.build(), r.build()
        for n in ("q", "k", "v", "g", "beta"):
            assert np.array_equal(getattr(a, n), getattr(b, n))
        assert np.array_equal(do1, do2) and np.array_equal(dfs1, dfs2)
    for fam in families.MAPPED:
        mine = [r for r in recipes if r.family == fam]
        assert {r.HV // r.H for r in mine} == {2, 4} and min(r.H for r in mine) >= 2
        assert {"weak", "resets", "mixed"} <= {r.decay for r in mine}
        assert {"small", "near_one", "near_two", "logits"} <= {r.beta for r in mine}
        assert any(r.neg_eigval for r in mine) and any(r.qk_l2norm for r in mine)
    with pytest.raises(ValueError, match="neg_eigval"):
        family_recipes.FamilyRecipe("gdn", 1, 4, 1, 1, 4, 4, neg_eigval=True)


@pytest.mark.parametrize("name,kernel,grade", [
    ("gdn_gva2_moderate_h0", gdn_correct, PASS),
    ("gdn_gva2_moderate_h0", gdn_beta_write_only, FAIL),
    ("kda_gva4_weak_beta_one", kda_gva_mod, FAIL),
    ("gdn_gva4_strong_neg_eigval", gdn_no_neg_eigval, FAIL),
])
def test_the_case_grades_a_kernel(name, kernel, grade):
    case = FamilyRunCase.named(name)
    result = case.run(kernel)
    assert result.grade == grade, [v.as_dict() for v in result.verdicts]
    assert case.describe()["family"] == name.split("_")[0]


def test_a_result_breaking_the_contract_is_an_error():
    def wrong_state(q, k, v, g, beta, **kw):
        o, S = gdn_correct(q, k, v, g, beta, **kw)
        return o, S.astype(jnp.bfloat16)

    result = FamilyRunCase.named("gdn_gva2_moderate_h0").run(wrong_state)
    assert result.outcome == "error" and "final_state of dtype bfloat16" in result.error


# --- validate ----------------------------------------------------------------------------------------------------


def run_validate(cli, tmp_path, *kernels, dtype="float32", cases="quick"):
    path = tmp_path / "v.json"
    argv = ["validate", "--cases", cases, "--dtype", dtype, "--no-progress", "--json", path]
    for k in kernels:
        argv += ["--kernel", k]
    code, out, _ = cli(*argv)
    return code, out, json.loads(path.read_text())


def judged_cases(fn, family, cases="quick"):
    """The float32 family cases of a set ``fn`` of ``family`` takes part in: the catalogued recipes whose flags and
    modes it takes, and the projections of GDN-2's dense recipes (no flag, no mode: every kernel takes them)."""
    modes = running.accepted_family_modes(fn, family)
    flags = running.accepted_flags(fn)
    built = {c.name for c in validate.build_cases(cases, ("float32",), families=(family,))}
    catalogued = {n for n in family_recipes.names("quick") if n.startswith(f"{family}_")
                  and family_recipes.get(n).precision == "float32"}
    source = "quick" if cases == "smoke" else cases  # smoke is a part of quick
    projected = set(family_recipes.projections(family, validate.dense_recipes(source, ("float32",), 0)))
    assert projected & built and (cases == "smoke" or projected <= built)
    return ({n for n in catalogued if set(family_recipes.get(n).modes) <= set(modes)
             and set(family_recipes.get(n).flags()) <= set(flags)} | projected) & built


def test_correct_family_kernels_pass_the_quick_set(cli, tmp_path):
    """The quick set (the family QUICK recipes, every mode the kernels take, the projections of GDN-2's goldens and
    generated problems: over a minute a kernel on two cores; release group)."""
    code, out, report = run_validate(cli, tmp_path, f"{HERE}:gdn_correct[family=gdn]",
                                     f"{HERE}:kda_correct[family=kda,output_final_state=True]")
    assert code == 0, out
    assert report["families"] == ["kda", "gdn"]
    gdn, kda = report["kernels"]
    assert (gdn["family"], kda["family"]) == ("gdn", "kda")
    assert gdn["passed"] and kda["passed"]
    assert {c["case"] for c in gdn["cases"]} == judged_cases(gdn_correct, "gdn")
    assert {c["case"] for c in kda["cases"]} == judged_cases(kda_correct, "kda")
    # the dense quick set and the q/k-norm mode (the only mode keyword these kernels take), with a tail and without
    assert {c["case"] for c in gdn["cases"] if c["modes"]} == {"gdn_l2norm", "gdn_l2norm_T128"}
    run = validate.build_cases("quick", ("float32",), families=("gdn", "kda"))
    assert set(gdn["other_family_cases"]) == {c.name for c in run if validate.case_family(c) == "kda"}
    case = gdn["cases"][0]
    assert case["family"] == "gdn" and {v["name"] for v in case["verdicts"]} == set(grading.FAMILY_RESULTS)
    assert set(case) - {"regime"} == {"case", "source", "dtype", "shape", "family", "modes", "passed", "outcome",
                                      "grade", "verdicts", "error", "diagnosis", "seconds"}  # a mode case's + family
    assert "family gdn (FLA's signature)" in out


@pytest.mark.parametrize("kernel,bad", [
    ("gdn_beta_write_only[family=gdn]", None),
    ("kda_gva_mod[family=kda]", None),
    ("gdn_no_neg_eigval[family=gdn]", {"gdn_gva4_strong_neg_eigval"}),
])
def test_wrong_family_kernels_fail(cli, tmp_path, kernel, bad):
    code, out, report = run_validate(cli, tmp_path, f"{HERE}:{kernel}", cases="smoke")
    assert code == 1, out
    [k] = report["kernels"]
    failed = {c["case"] for c in k["cases"] if c["grade"] == FAIL}
    assert failed and (bad is None or failed == bad), failed


def test_kernels_are_judged_only_on_their_family(cli, tmp_path):
    code, out, report = run_validate(cli, tmp_path, "gdn2_oracle.kernels.testing:correct",
                                     f"{HERE}:minimal_gdn[family=gdn]", cases="smoke")
    assert code == 0, out
    assert report["families"] == ["gdn2", "gdn"]
    gdn2, gdn = report["kernels"]
    assert gdn2["family"] == "gdn2" and not any("family" in c for c in gdn2["cases"])
    gdn_cases = {c.name for c in validate.build_cases("smoke", ("float32",), families=("gdn2", "gdn"))
                 if validate.case_family(c) == "gdn"}
    assert set(gdn2["other_family_cases"]) == gdn_cases
    assert {c["case"] for c in gdn2["cases"]}.isdisjoint(gdn2["other_family_cases"])
    # the flag-free kernel is not run on the cases that set a flag or use a call mode
    flagged = {n for n in gdn_cases if n in family_recipes.CATALOGUE and family_recipes.get(n).flags()}
    assert flagged and set(gdn["not_accepted_cases"]) == gdn_cases - judged_cases(minimal_gdn, "gdn", "smoke")
    assert flagged <= set(gdn["not_accepted_cases"])
    # the line says which keyword each group of them needs
    need = {n: sorted(family_recipes.get(n).flags()) for n in flagged}
    for flag in {f for fs in need.values() for f in fs}:
        n = sum(fs == [flag] for fs in need.values())
        assert not n or f"{n} need {flag}" in out, (flag, out)
    assert not any(validate.case_family(c) != "gdn2" for c in validate.build_cases("quick", ("float32",)))


@pytest.mark.parametrize("kernel", ["gdn_read_before_decay", "kda_sigmoid_twice"])
def test_the_suites_family_mutants_fail_validate(cli, tmp_path, kernel):
    """Two of the suite's own family mutants (kernels/testing_families.py; their family is their attribute, so the
    spec needs no option): the erase read taken before the decay, and beta's sigmoid applied twice. On the smoke set,
    a part of quick (so quick fails them too; validate judges each case on its own): 35-40 s a run, not 55-170 s."""
    code, out, report = run_validate(cli, tmp_path, f"gdn2_oracle.kernels.testing_families:{kernel}", cases="smoke")
    assert code == 1, out
    [k] = report["kernels"]
    assert k["family"] == kernel.split("_")[0] and k["n_failed"] >= 1, k["n_failed"]


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_the_dt_bias_mutant_fails_the_gate_cases(cli, tmp_path, family):
    """dt_bias added after the softplus (kernels/testing_families.py) shows only where the softplus gate runs: the
    family's softplus gate case fails (KDA's bounded one passes), judged through the CLI with the gate mode alone."""
    path = tmp_path / "v.json"
    code, out, _ = cli("validate", "--kernel", f"gdn2_oracle.kernels.testing_families:{family}_dt_bias_after_softplus",
                       "--cases", "quick", "--dtype", "float32", "--modes", "gate", "--no-progress", "--json", path)
    assert code == 1, out
    [k] = json.loads(path.read_text())["kernels"]
    failed = {c["case"] for c in k["cases"] if c["grade"] == FAIL}
    softplus = {n for n in family_recipes.names("quick") if n.startswith(f"{family}_")
                and family_recipes.get(n).mode and family_recipes.get(n).structure().gate == "softplus"
                and family_recipes.get(n).precision == "float32"}
    assert softplus and failed == softplus, (failed, softplus)
    assert any("ddt_bias" == v["name"] and not v["passed"] for c in k["cases"] for v in c["verdicts"])


def judged(kernel, tier, dtype):
    """The cases of ``tier`` in ``dtype`` that validate judges ``kernel`` (a registered name) on."""
    fn = spec.get(kernel)
    family = running.kernel_family(fn, None)
    flags = None if family == "gdn2" else running.accepted_flags(fn) + serving.layout_flags(fn)
    cases = validate.build_cases(tier, (dtype,), families=(family,))
    return [c for c in cases if validate.takes_part(c, validate.accepted_modes(fn, family), family, flags)]


@pytest.mark.parametrize("tier", ["smoke", "quick", "full"])
def test_a_family_kernel_is_judged_on_as_many_cases_as_a_gdn2_kernel(tier):
    """Every GDN-2 dense recipe of a tier has a projection per family; with the family's own recipes and its mode
    recipes in both dtypes, a GDN or KDA kernel is judged on at least as many cases as a GDN-2 kernel, per dtype."""
    for dtype in ("float32", "bfloat16"):
        gdn2 = len(judged("factorized", tier, dtype))
        for kernel in ("gdn-factorized", "kda-factorized"):
            assert len(judged(kernel, tier, dtype)) >= gdn2 > 0, (tier, dtype, kernel)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_the_smoke_set_separates_tails_dtypes_and_grouped_heads(family):
    """Per family, smoke has bfloat16 calls, the in-kernel gate at a T that is not a multiple of 64 and at one that
    is, and grouped value heads G = 2 and 4 with more than one key head (hv // G differs from hv % H)."""
    cases = [c for c in validate.build_cases("smoke", families=(family,)) if validate.case_family(c) == family]
    recipes = [c.recipe for c in cases if getattr(c, "recipe", None) is not None]
    assert any(r.precision == "bfloat16" and not r.mode for r in recipes)
    gates = [r for r in recipes if "gate" in r.modes]
    assert {any(n % 64 for n in r.structure().lengths) for r in gates} == {True, False}
    assert {r.HV // r.H for r in recipes if r.H >= 2} >= {2, 4}
    programs = {(c.dtype, c.shape, c.modes, c.flags) for c in cases if not c.name.startswith("serving_")}
    assert len(programs) <= 7, programs  # about as many compiled programs as GDN-2's smoke (6)


def test_a_case_name_without_its_bf16_suffix_is_suggested():
    with pytest.raises(UsageError, match=r"did you mean \['gdn_gva2_moderate_h0_bf16'\]"):
        validate.build_cases("quick", ("bfloat16",), only=["gdn_gva2_moderate_h0"], families=("gdn",))


def test_family_goldens_are_in_the_golden_set():
    cases = validate.build_cases("golden", families=("gdn", "kda"))
    goldens = [c for c in cases if validate.case_family(c) != "gdn2"]
    assert {c.family for c in goldens} == {"gdn", "kda"} and all(c.source == "golden" for c in goldens)
    assert any(c.modes for c in goldens) and any(not c.modes for c in goldens)
    assert not [c for c in validate.build_cases("quick", families=("gdn", "kda"))
                if validate.case_family(c) != "gdn2" and getattr(c, "source", None) == "golden"]


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["gdn-factorized", "kda-factorized"])
def test_our_family_kernels_pass_every_mode_and_the_goldens(tmp_path, kernel):
    """Our chunked GDN / KDA kernels on the quick set in every mode their family takes and on their goldens, through
    the console script: a run of ~100 programs in its own process, as a user runs it, with the suite's shared caches
    and the compilation cache the commands of the suite share (ci.testing.console_env; in a test worker that had loaded
    torch, JAX's compilation-cache write once ended the worker with a segfault: the commands are separate processes)."""
    shared = {n: os.environ[n] for n in ("GDN2_REFERENCE_CACHE", "GDN2_PROGRAM_CACHE") if os.environ.get(n)}
    fn, family = spec.get(kernel), kernel[:3]
    accepted = validate.accepted_modes(fn, family)
    built = {cases: {c.name: c for c in validate.build_cases(cases, families=(family,))}
             for cases in ("quick", "golden")}
    # the golden run: the goldens the quick set does not hold (the quick run judges the others)
    runs = {"quick": set(built["quick"]), "golden": set(built["golden"]) - set(built["quick"])}
    assert runs["golden"]
    for cases, names in runs.items():
        chosen = [a for name in sorted(names) for a in ("--case", name)] if cases == "golden" else []
        path = tmp_path / f"{cases}.json"
        run = console(tmp_path, "validate", "--kernel", kernel, "--cases", cases, *chosen, "--no-progress", "--json",
                      path, timeout=1800, **shared)
        code, out = run.returncode, run.stdout + run.stderr
        assert code == 0, out
        [k] = json.loads(path.read_text())["kernels"]
        assert {c["case"] for c in k["cases"]} | set(k["not_accepted_cases"]) == names, k["not_accepted_cases"]
        not_taken = {n for n in names if not validate.takes_part(built[cases][n], accepted, family)}  # serving: no pool
        assert k["passed"] and set(k["not_accepted_cases"]) == not_taken, k["not_accepted_cases"]
        if cases == "quick":
            modes = {m for c in k["cases"] for m in c.get("modes", [])}
            assert modes == set(running.accepted_family_modes(spec.get(kernel), kernel[:3])), modes


def test_the_standard_sigmoid_derivative_is_precision_not_a_failure():
    """``y (1 - y)``, the sigmoid's derivative of autodiff and of FLA's fused_beta_sigmoid_bwd, cancels for large
    logits: on a one-token call with logits in [2, 6] (found by ``hunt``) it is graded PRECISION (the precision-loss
    bound differentiates the sigmoid the same way), and our kernels' exact derivative passes."""
    from gdn2_oracle.kernels.families import FamilyKernel

    class StandardSigmoid(FamilyKernel):
        def activate_beta(self, beta, sigmoid, neg):
            return (2.0 if neg else 1.0) * jax.nn.sigmoid(beta) if sigmoid else beta

    ours = spec.get("gdn-factorized")
    standard = StandardSigmoid("gdn-standard-sigmoid", "gdn", ours.core)
    recipe = family_recipes.FamilyRecipe("gdn", 1, 1, 1, 1, 16, 16, beta="logits_high", seed=5)
    graded = {}
    for name, fn in (("ours", ours), ("standard", standard)):
        result = FamilyRunCase.from_recipe("one_token_logits_high", recipe).run(fn)
        graded[name] = (result.grade, {v.name for v in result.verdicts if v.grade != PASS})
    assert graded == {"ours": (PASS, set()), "standard": ("PRECISION", {"dbeta"})}, graded


def test_a_forward_only_kernel_is_judged_on_its_forward_results():
    """A kernel that declares it has no backward (``no_backward``: FLA's fused recurrent inference kernels) is run
    forward only and judged on ``o`` and the final state (the same grades); a wrong forward still fails."""
    def forward_only(kernel):
        def fn(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
            return kernel(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                          output_final_state=output_final_state)
        fn.family, fn.no_backward = "gdn", "inference only"
        return fn

    for kernel, grade in ((gdn_correct, PASS), (family_kernel("gdn", "gva_mod"), FAIL)):
        result = FamilyRunCase.named("gdn_gva2_moderate_h0").run(forward_only(kernel))
        assert result.grade == grade and {v.name for v in result.verdicts} == {"o", "final_state"}, result.verdicts
