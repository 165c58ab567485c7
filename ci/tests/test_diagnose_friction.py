"""Diagnoses that misled new users, each run on the situation that misled and held to the corrected line
(ci/grading/diagnose.py, docs/judging.md "Diagnoses"): a localiser's "only X differs" agrees with the case's
grade line; a packed call's errors are placed in its sequences; a serving session's in its sequences, slots and
accept counts.
"""

from __future__ import annotations

import numpy as np
import pytest

from gdn2_oracle.ci.commands.validate import case_lines
from gdn2_oracle.ci.grading.case import Case
from gdn2_oracle.ci.grading.grades import PASS
from gdn2_oracle.ci.running import harness
from gdn2_oracle.ci.running.cases import CallCase
from gdn2_oracle.ci.running.serving import serving_cases
from gdn2_oracle.kernels import testing_decode, testing_modes
from gdn2_oracle.kernels import testing_diagnose as buggy
from gdn2_oracle.oracle import Recipe, mode_recipes

SHAPE = (1, 200, 2, 16, 16)


def judge(fn, decay="moderate", gates="uniform", h0=False, dtype="float32", shape=SHAPE, seed=3):
    """The tolerance report of kernel ``fn`` on one generated recipe, judged as ``validate`` judges it."""
    recipe = Recipe(*shape, decay=decay, gates=gates, initial_state=h0, precision=dtype, seed=seed)
    case = Case.from_recipe(f"{decay}_{gates}_{dtype}", recipe)
    problem, do, dfs = case.data()
    return case.judge(harness.kernel_results(fn, problem, do, dfs, dtype=dtype))


# --------------------------------------------------------------------------------------------
# "only X differs" is said only when X is all the grade line counts over tolerance


def test_only_dh0_is_not_claimed_when_other_results_are_over_tolerance():
    """h0 decayed twice under extreme decay: dh0 FAILs and db is PRECISION (over tolerance, within the bound), so
    the grade line reads "2/9 over tolerance"; the diagnosis said "only dh0 differs ... the other gradients too"."""
    report = judge(buggy.h0_decayed_twice, decay="extreme", h0=True)
    off = [v.name for v in report.verdicts if v.grade != PASS]
    assert "dh0" in off and len(off) > 1, report.format()  # the situation: dh0 FAIL beside a PRECISION result
    f = report.diagnosis[0]
    assert f.kind == "initial-state" and f.results == ("dh0",), report.format()
    assert "only dh0 differs" not in f.text and "the other gradients too" not in f.text, f.text
    n = len(report.verdicts)
    assert f"only dh0 exceeds the precision-loss bound ({len(off)}/{n} results over tolerance, " in f.text, f.text
    for name in off:
        assert name in f.text, f.text


def test_only_dh0_differs_where_it_alone_is_over_tolerance():
    """Without h0 the same bug leaves dh0 alone off (dh0 of h0 -> S_1 does not depend on h0's value): there
    "only dh0 differs" is true and still said."""
    report = judge(buggy.h0_decayed_twice, decay="extreme")
    assert [v.name for v in report.verdicts if v.grade != PASS] == ["dh0"], report.format()
    assert report.diagnosis[0].text.startswith("only dh0 differs (o and final_state within tolerance"), report.format()


# --------------------------------------------------------------------------------------------
# a packed call's state carried across a sequence start: named as such, in sequences, not tokens


@pytest.mark.parametrize("mutant,recipe,carried", [
    ("leak_inside_chunk", "varlen_quick", lambda t: t % testing_modes.leak_inside_chunk.chunk_size != 0),
    ("leaky_state", "varlen_edges_no_h0", lambda t: True),
])
def test_a_state_carried_across_a_sequence_start_is_named_in_sequences(mutant, recipe, carried):
    """Was: "logic: O(1) relative error ...; o over tolerance from token 1": no word of sequences or a reset. The
    sequences that fail are those whose start carries the previous state (every one after the first non-empty
    sequence for ``leaky_state``; those starting inside a 64-token chunk for ``leak_inside_chunk``)."""
    r = mode_recipes.get(recipe)
    res = CallCase.from_recipe(recipe, r).run(testing_modes.MUTANTS[mutant])
    f = res.diagnosis_dicts()[0]
    cu = np.asarray(r.cu_seqlens)
    spans = [(n, int(a)) for n, (a, b) in enumerate(zip(cu[:-1], cu[1:])) if b > a]
    expect = [n for i, (n, a) in enumerate(spans) if i > 0 and carried(a)]
    right = [n for n, _ in spans if n not in expect]
    assert f["primary"] and f["kind"] == "sequence-start", f
    assert f["evidence"]["failing"] == expect and f["evidence"]["right"] == right, f
    assert f["evidence"]["first_bad"] == [a for n, a in spans if n in expect], f  # each at its sequence's start
    assert f"o over tolerance in {len(expect)} of the {len(spans)} non-empty sequence(s)" in f["text"], f["text"]
    assert "sequence(s) " + ", ".join(map(str, expect)) in f["text"], f["text"]
    assert "in every failing sequence the errors begin at its first token" in f["text"], f["text"]
    assert "not reset at a sequence start (the previous sequence's state carried across cu_seqlens)" in f["text"]
    assert ("inside a 64-token chunk" in f["text"]) == (mutant == "leak_inside_chunk"), f["text"]
    assert ("wrong row of h0" in f["text"]) == r.initial_state, f["text"]
    lines = case_lines({"name": mutant}, res.to_dict())
    assert lines[1].startswith("      diagnosis sequence-start: o over tolerance in "), lines
    also = [line for line in lines if "o over tolerance from token" in line]  # the onset names its sequence
    assert all(f"the first token of sequence {expect[0]}" in line for line in also), also
    assert not any("jump every" in line for line in lines), lines  # sequence starts are not a period


# --------------------------------------------------------------------------------------------
# a speculative bug named by its call, sequence, slots and accept count


def test_an_accept_count_off_by_one_is_named_by_sequence_slot_and_accept_count():
    """Was: a line beginning "also non-finite: ... from call 0" naming no sequence, slot or accept count. The kernel
    reads idx[n, a_n] (clipped to the last draft) instead of idx[n, a_n - 1]: the first wrong sequence is the first
    live one whose two slots differ."""
    [case] = serving_cases(("float32",), only=("speculative_accept",))
    res = case.run(testing_decode.accept_off_by_one)
    calls = case.session.calls
    wrong = [(c, n) for c, call in enumerate(calls) for n in range(call.state_indices.shape[0])
             if (seq := call.plan(case.session.shape[0]).sequences[n]).live
             and call.state_indices[n, min(int(call.num_accepted_tokens[n]), call.state_indices.shape[1] - 1)]
             != seq.read]
    c, n = wrong[0]
    idx, a = calls[c].state_indices, int(calls[c].num_accepted_tokens[n])
    lines = case_lines({"name": "accept_off_by_one"}, res.to_dict())
    assert lines[1].startswith("      diagnosis "), lines  # the first finding is primary: no line begins "also"
    text = lines[1]
    assert (f"first wrong at call {c}: o of sequence {n} (accept count a_{n} = {a}: must start from slot "
            f"idx[{n}, {a - 1}] = {idx[n, a - 1]}, of draft slots {', '.join(map(str, idx[n]))}), off from its first "
            "token") in text, text
    assert "the slot it reads must be idx[n, a_n - 1]" in text, text
    case.release()
