"""A kernel judged by its own contract: the cases outside its declared domain (``refuses``) are not run but listed,
and a serving kernel whose contract leaves padding outputs unwritten (``padding_output = "unwritten"``) is not judged
on them, its pool still judged bit for bit.

The domain: ``gdn_refuses_beta_over_one`` (kernels/testing_families.py, the correct kernel inside its domain, as
vLLM's raw-gate kernels refuse beta above 1) passes the family case it takes and lists the beta-near-2 case as not
run; a kernel refusing every call is EMPTY (exit 4); inside a Hypothesis example a refused call rejects the example.
The padding: kernels/testing_decode.py's ``nan_padding`` (NaN o at padding rows) FAILs ``padding`` by default and
passes when it declares ``"unwritten"``; one declaring it whose padding rows write slot 0 still FAILs ``untouched``.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gdn2_oracle.ci.commands.output import EXIT
from gdn2_oracle.ci.grading.grades import EMPTY, FAIL, PASS
from gdn2_oracle.ci.grading.serving import Session
from gdn2_oracle.ci.running import families as family_running
from gdn2_oracle.ci.running import modes
from gdn2_oracle.ci.running import serving as runner
from gdn2_oracle.kernels import testing_decode, testing_families
from gdn2_oracle.oracle import family_recipes
from gdn2_oracle.oracle import serving_recipes as recipes

KERNELS = "gdn2_oracle.kernels.testing_families"
TAKEN, REFUSED = "gdn_gva2_moderate_h0", "gdn_gva4_moderate_beta_two"  # beta in [0, 1]; beta near 2


def _validate(cli, tmp_path, attr):
    """``(exit code, stdout, the kernel's JSON record)`` of validate on the two cases."""
    path = tmp_path / "v.json"
    code, out, _ = cli("validate", "--kernel", f"{KERNELS}:{attr}", "--case", TAKEN, "--case", REFUSED, "--dtype",
                       "float32", "--no-progress", "--json", path)
    (k,) = json.loads(path.read_text())["kernels"]
    return code, out, k


def test_cases_outside_the_kernels_domain_are_listed_not_failed(cli, tmp_path):
    code, out, k = _validate(cli, tmp_path, "gdn_refuses_beta_over_one")
    assert code == EXIT["pass"] and k["grade"] == PASS, out
    assert [c["case"] for c in k["cases"]] == [TAKEN], out
    [refused] = k["refused_cases"]
    assert refused["case"] == REFUSED and refused["reason"].startswith("beta: this kernel takes 0 <= beta <= 1"), k
    assert "1 case(s) outside the kernel's domain: beta:" in out, out


def test_a_kernel_refusing_every_case_is_empty(cli, tmp_path):
    code, out, k = _validate(cli, tmp_path, "gdn_refuses_every_call")
    assert code == EXIT["empty"] and k["grade"] == EMPTY and not k["cases"], out
    assert sorted(r["case"] for r in k["refused_cases"]) == sorted([TAKEN, REFUSED]), k
    assert "2 case(s) outside its own domain" in out, out


def test_a_refused_call_rejects_its_property_example_and_raises_outside_one():
    """Through the family runner the plugin's properties use: the refused example is rejected (not failed), the
    others run; called outside an example, the refusal is a ValueError naming why."""
    fcall, do, dfs = family_recipes.QUICK[REFUSED].build()
    fn = testing_families.gdn_refuses_beta_over_one
    ran = []

    @given(refused=st.booleans())
    @settings(max_examples=6, database=None, deadline=None)
    def prop(refused):
        if refused:
            family_running.family_results(fn, fcall, do, dfs)
        ran.append(refused)

    prop()
    assert ran and not any(ran)
    with pytest.raises(modes.Refused, match="this kernel takes 0 <= beta <= 1"):
        family_running.family_results(fn, fcall, do, dfs)


def _grades(fn, session):
    """``{verdict: (grade, note)}`` of ``fn`` on ``session``."""
    return {v.name: (v.grade, v.note) for v in runner.run_session(fn, session).verdicts}


def test_padding_outputs_are_judged_by_the_kernels_contract():
    session = Session.from_script(recipes.pool_gather_scatter())
    zero = _grades(testing_decode.nan_padding, session)
    assert zero.pop("padding")[0] == FAIL and {g for g, _ in zero.values()} == {PASS}, zero
    unwritten = _grades(testing_decode.nan_padding_unwritten, session)
    assert {g for g, _ in unwritten.values()} == {PASS}, unwritten
    assert unwritten["padding"][1].startswith("not judged: the kernel's contract leaves o unwritten"), unwritten
    writes = _grades(testing_decode.padding_writes_slot0_unwritten, session)
    assert writes["untouched"][0] == FAIL and writes["padding"][0] == PASS, writes
