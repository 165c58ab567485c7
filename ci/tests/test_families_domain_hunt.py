"""``domain`` and ``hunt`` on KDA and Gated DeltaNet kernels in FLA's signature (ci/commands/domain_families.py,
ci/commands/hunt_families.py; docs/domain-and-hunt.md): our family kernels are mapped over decay regime x beta regime
x G and searched on drawn family calls, and grade PASS; a family mutant (kernels/testing_families.py) shows FAIL cells
and is found, shrunk and reproduced; GDN-2-only options are usage errors naming the option.

The grids and shape sets are shrunk in place of ``quick`` and ``FAMILY_CORE`` (one or two compiles a kernel), as
ci/tests/test_domain.py and test_hunt.py do for the GDN-2 ones.
"""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest

from gdn2_oracle import kernels
from gdn2_oracle.ci.commands import domain, hunt, hunt_families
from gdn2_oracle.ci.grading.families import FAMILY_RESULTS
from gdn2_oracle.ci.grading.grades import FAIL, PASS
from gdn2_oracle.oracle.family_recipes import FamilyRecipe

HERE = __name__  # the CLI resolves "module:attr" specs of this module by this name
MUTANTS = "gdn2_oracle.kernels.testing_families"
# Two decay regimes x two beta regimes, G = 2 on H = 2 key heads: one compile a kernel.
TINY = domain.FamilyGrid("quick", decays=("moderate", "resets"), betas=("uniform", "near_two"), groups=(2,),
                         shape=(1, 32, 2, 8, 8))
# One shape with G = 2 on H = 2 key heads, K != V.
SMALL_CORE = (hunt_families.FamilyConfig(1, 17, 2, 4, 8, 16, "float32"),)


def plain_beta_kernel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
    return None


def flagless_gdn(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
    """Our Gated DeltaNet kernel behind a signature that takes none of FLA's flags."""
    return kernels.get("gdn-factorized")(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                         output_final_state=output_final_state)


flagless_gdn.family = "gdn"


def _domain(cli, monkeypatch, tmp_path, kernel, grid=TINY):
    monkeypatch.setitem(domain.FAMILY_GRIDS, "quick", grid)
    monkeypatch.setitem(domain.GRIDS, "quick", None)  # a family kernel never reads the GDN-2 grid
    code, out, err = cli("domain", "--kernel", kernel, "--out", tmp_path, "--no-progress")
    return code, out + err, json.loads((tmp_path / "domain.json").read_text())


def _grades(panel):
    return [{n: r["grade"] for n, r in c["results"].items()} for c in panel["cells"]]


# --- domain ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel, family", [("gdn-factorized", "gdn"),
                                            pytest.param("kda-factorized", "kda", marks=pytest.mark.slow)])
def test_domain_maps_our_family_kernel_and_every_cell_passes(cli, monkeypatch, tmp_path, kernel, family):
    code, out, report = _domain(cli, monkeypatch, tmp_path, kernel)
    assert code == 0 and "domain: no FAIL" in out and f"{kernel} (family {family})" in out, out
    assert report["schema"] == domain.SCHEMA and report["family"] == family
    assert report["results"] == list(FAMILY_RESULTS) and report["not_accepted_flags"] == []
    assert [p["label"] for p in report["panels"]] == ["beta (decay moderate, G=2)", "beta (decay resets, G=2)"]
    for panel in report["panels"]:
        assert panel["family"] == family and [c["value"] for c in panel["cells"]] == ["uniform", "near_two"]
        assert all(g == PASS for grades in _grades(panel) for g in grades.values())
        assert all(set(c["results"]) == set(FAMILY_RESULTS) for c in panel["cells"])
    # each cell names the recipe that rebuilds its call
    cell = report["panels"][1]["cells"][1]
    recipe = FamilyRecipe(**cell["point"])
    assert (recipe.family, recipe.decay, recipe.beta, recipe.HV, recipe.H, recipe.seed) == (
        family, "resets", "near_two", 4, 2, report["seeds"][0])
    fcall = recipe.build()[0]
    assert fcall.beta.min() >= 1.9 and fcall.q.shape == (1, 32, 2, 8) and fcall.v.shape == (1, 32, 4, 8)
    assert f"family {family}: decay regime (moderate, resets) x beta regime, G = 2" in report["summary"]
    assert (tmp_path / "domain.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_domain_shows_a_family_mutants_fail_cells_where_the_bug_is(cli, monkeypatch, tmp_path):
    """kda_gva_modulo (value head hv reads key head hv % H, not hv // G) is right at G = 1 and wrong at G = 2."""
    grid = TINY._replace(decays=("moderate",), groups=(1, 2))
    code, out, report = _domain(cli, monkeypatch, tmp_path, f"{MUTANTS}:kda_gva_modulo", grid)
    assert code == 1 and "domain: FAIL in 2 of 4 cells" in out, out
    at_1, at_2 = report["panels"]
    assert (at_1["label"], at_2["label"]) == ("beta (decay moderate, G=1)", "beta (decay moderate, G=2)")
    assert all(g == PASS for grades in _grades(at_1) for g in grades.values())
    assert all(grades["o"] == FAIL for grades in _grades(at_2))
    [boundary] = report["boundaries"]
    assert boundary["label"] == at_2["label"] and boundary["text"].startswith("every result is FAIL at every beta")


def test_domain_leaves_out_the_beta_columns_whose_flags_a_kernel_does_not_take(cli, monkeypatch, tmp_path):
    grid = TINY._replace(decays=("moderate",), betas=("uniform", "logits", "neg_eigval"))
    code, out, report = _domain(cli, monkeypatch, tmp_path, f"{HERE}:flagless_gdn", grid)
    assert code == 0 and "not swept: the beta regimes that need" in out, out
    assert report["not_accepted_flags"] == ["allow_neg_eigval", "use_beta_sigmoid_in_kernel"]
    [panel] = report["panels"]
    assert [c["value"] for c in panel["cells"]] == ["uniform"]
    assert "Not swept: the beta regimes that need allow_neg_eigval" in report["summary"]


# --- hunt ------------------------------------------------------------------------------------------------------


@pytest.fixture
def small_core(monkeypatch):
    """Draw family calls of one shape only (each new shape and flag set compiles the kernel once)."""
    monkeypatch.setattr(hunt_families, "FAMILY_CORE", SMALL_CORE)


@pytest.mark.slow
@pytest.mark.parametrize("kernel, family", [("gdn-factorized", "gdn"), ("kda-factorized", "kda")])
def test_hunt_on_our_family_kernel_finds_no_fail(cli, small_core, kernel, family):
    code, out, _ = cli("hunt", "--kernel", kernel, "--budget", "3", "--seed", "1", "--no-progress")
    assert code == 0, out
    assert f"{kernel} (family {family}: its family calls), 3 recipes run" in out and "hunt: no FAIL found" in out
    worst = re.search(r"worst error / tolerance reached: (\S+) \((\w+), (\w+)\) on (FamilyRecipe\(.*\))", out)
    assert worst and worst.group(2) in FAMILY_RESULTS and worst.group(3) == PASS, out
    recipe = eval(worst.group(4), {"FamilyRecipe": FamilyRecipe})  # noqa: S307 - the printed recipe
    assert recipe.family == family and (recipe.H, recipe.HV) == (2, 4)


def test_hunt_finds_shrinks_and_reproduces_a_family_mutants_fail(cli, small_core):
    """gdn_gva_modulo: every drawn call has G = 2 on H = 2 key heads, so it fails; shrunk to the simplest regimes, and
    the printed one-liner rebuilds the call and shows the FAIL."""
    kernel = f"{MUTANTS}:gdn_gva_modulo[family=gdn]"
    code, out, _ = cli("hunt", "--kernel", kernel, "--budget", "10", "--seed", "0", "--no-progress")
    assert code == 1 and "hunt: FAIL found" in out, out
    shrunk = eval(re.search(r"shrunk to (FamilyRecipe\(.*\))", out).group(1),  # noqa: S307 - the printed recipe
                  {"FamilyRecipe": FamilyRecipe})
    assert shrunk.family == "gdn" and shrunk.HV > shrunk.H > 1  # where the planted bug fires
    assert (shrunk.decay, shrunk.beta, shrunk.seed, shrunk.initial_state) == ("none", "uniform", 0, False)  # shrunk
    assert "pin it:" not in out and f"rerun:     gdn2-oracle hunt --kernel '{kernel}' --modes" in out
    line = next(x for x in out.splitlines() if x.startswith("reproduce: "))
    source = re.fullmatch(r'reproduce: python -c "(.*)"', line).group(1)
    assert "family=gdn]" not in source and shrunk.call_source() in source  # the kernel as built, the recipe as is
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(source, {})  # noqa: S102 - the printed one-liner, run in-process
    assert re.search(r"^o .* FAIL", printed.getvalue(), re.M), printed.getvalue()


def test_hunt_modes_gate_finds_and_shrinks_a_gate_applied_to_padding(cli):
    """``hunt --modes gate`` on a family kernel draws its gate calls (in a catalogued gate recipe's structure): the
    padded-tail mutant FAILs in the final state with o exact, shrunk to one key and value head at a T that is not a
    multiple of 64, diagnosed as the tail."""
    kernel = f"{MUTANTS}:gdn_padded_tail_gate"
    code, out, _ = cli("hunt", "--kernel", kernel, "--modes", "gate", "--budget", "4", "--seed", "0", "--no-progress")
    assert code == 1 and "hunt: FAIL found" in out and "modes gate" in out, out
    shrunk = eval(re.search(r"shrunk to (FamilyRecipe\(.*\))", out).group(1),  # noqa: S307 - the printed recipe
                  {"FamilyRecipe": FamilyRecipe})
    assert shrunk.mode.startswith("gate") and shrunk.T % 64 and (shrunk.H, shrunk.HV) == (1, 1), shrunk
    assert re.search(r"^o .* PASS", out, re.M) and re.search(r"^final_state .* FAIL", out, re.M), out
    assert "the final state only, when T is not a multiple of 64" in out and "taken early" not in out, out
    assert f"rerun:     gdn2-oracle hunt --kernel {kernel} --modes gate" in out


def test_hunt_draws_a_family_kernels_modes_only_where_the_family_has_their_keywords():
    """gdn has no bounded gate (lower_bound): only the softplus gate recipes are drawn for it; kda gets both."""
    from hypothesis import given, settings

    from gdn2_oracle.oracle import mode_recipes

    def drawn(family):
        modes = set()

        @settings(max_examples=30, database=None, deadline=None)
        @given(recipe=hunt.recipes("core", ("gate",), family=family))
        def collect(recipe):
            modes.add(recipe.mode)

        collect()
        return modes

    names = {family: drawn(family) for family in ("gdn", "kda")}
    assert names["gdn"] and all(mode_recipes.get(n).gate == "softplus" for n in names["gdn"]), names
    assert {mode_recipes.get(n).gate for n in names["kda"]} == {"softplus", "bounded"}, names


def test_hunt_draws_only_the_flags_a_family_kernel_takes():
    """A kernel taking no flag: no logit regime, no negative eigenvalues, no in-kernel q/k norm is drawn."""
    from hypothesis import given, settings

    drawn = []

    @settings(max_examples=60, database=None, deadline=None)
    @given(recipe=hunt.recipes("all", family="gdn", flags=()))
    def collect(recipe):
        drawn.append(recipe)

    collect()
    assert drawn and all(r.flags() == {} and r.family == "gdn" and r.HV % r.H == 0 for r in drawn)
    assert {r.beta for r in drawn} <= {"uniform", "small", "near_one", "near_two"}


# --- options that make no sense for a family kernel ------------------------------------------------------------


@pytest.mark.parametrize("argv, needle", [
    (["domain", "--kernel", "gdn-factorized", "--modes", "varlen,gate"], "--modes varlen,gate: training-call modes"),
    (["hunt", "--kernel", "kda-factorized", "--result", "db"], "--result db: not a result of kernel 'kda-factorized'"),
    (["hunt", "--kernel", "pairwise", "--result", "dbeta"], "--result dbeta: not a result of kernel 'pairwise'"),
    (["domain", "--kernel", f"{HERE}:plain_beta_kernel"], "family=kda or family=gdn"),
    (["hunt", "--kernel", f"{HERE}:plain_beta_kernel"], "family=kda or family=gdn"),
])
def test_gdn2_only_options_are_usage_errors_naming_the_option(cli, monkeypatch, argv, needle):
    monkeypatch.setattr(domain, "evaluate_family", lambda *a, **k: pytest.fail("a cell was evaluated"))
    monkeypatch.setattr(hunt_families, "judge", lambda *a, **k: pytest.fail("a recipe was judged"))
    code, out, err = cli(*argv, "--no-progress")
    assert code == 2 and needle in err and "Traceback" not in out + err, out + err


def test_run_functions_refuse_a_family_kernel_with_gdn2_options():
    fn = kernels.get("gdn-factorized")
    with pytest.raises(ValueError, match="^grid: a gdn kernel is mapped on a FamilyGrid"):
        domain.run_domain(fn, domain.GRIDS["quick"], domain.DomainOptions(family="gdn", show_progress=False))
    with pytest.raises(ValueError, match="^modes: a family kernel"):
        domain.run_domain(fn, TINY, domain.DomainOptions(family="gdn", modes=("dense", "gate")))
    with pytest.raises(ValueError, match="^result: 'dw' not one of"):
        hunt.HuntOptions(result="dw", family="kda")
    with pytest.raises(ValueError, match="^modes: a family kernel is searched on its family calls"):
        hunt.HuntOptions(modes=("dense", "decode"), family="kda")
    assert hunt.HuntOptions(modes=("dense", "gate"), family="kda").modes == ("dense", "gate")  # its training calls


def test_a_family_cell_stopped_by_the_time_limit_fails_every_family_result():
    run = domain.DomainRun(kernels.get("kda-factorized"), TINY, domain.DomainOptions(family="kda", case_timeout=5))
    panel = run.todo[0]
    unit = {"panel": {"cells": []}, "value": panel.values[0], "label": panel.labels[0],
            "point": panel.points[0].fields(), "point_obj": panel.points[0]}
    run.timed_out(unit)
    [cell] = unit["panel"]["cells"]
    assert set(cell["results"]) == set(FAMILY_RESULTS) and all(r["grade"] == FAIL for r in cell["results"].values())
    assert "timed out" in cell["note"]
