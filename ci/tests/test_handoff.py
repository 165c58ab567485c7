"""Hand-off sessions: a prefill kernel's final states handed into a decode kernel's pool (running/handoff_sessions.py).

The correct pair (gdn-factorized prefill, gdn-decode) PASSes every session; each wrong hand-off of
kernels/testing_handoff.py FAILs with a diagnosis naming its side and cause. One compiled prefill and decode kernel
(testing_handoff's) serve every test.
"""

from __future__ import annotations

import numpy as np
import pytest

from gdn2_oracle.ci.grading import handoff_judge as judge
from gdn2_oracle.ci.running.handoff_sessions import HandoffRun
from gdn2_oracle.kernels import testing_handoff as th
from gdn2_oracle.kernels.family_decode import gdn_decode
from gdn2_oracle.oracle import handoff_recipes as recipes
from gdn2_oracle.oracle.serving import round_state


@pytest.fixture(scope="module")
def scripts():
    return {name: build() for name, build in recipes.RECIPES.items()}


@pytest.mark.parametrize("name, v_first", [("pool", False), ("fork", True), ("installed", False)])
def test_correct_pair_passes(scripts, name, v_first):
    run = HandoffRun(th.PREFILL, th.DECODE, scripts[name], v_first=v_first)
    report = run.report
    assert report.passed, report.format()
    names = [v.name for v in report.verdicts]
    assert "hand-off" in names and "request" in names and ("prefill" in names) == (name != "installed")
    # the decode kernel starts from the prefill's states, rounded once to its pool's dtype, at every slot of a fork
    for n, group in enumerate(scripts[name].slots):
        for slot in group:
            np.testing.assert_array_equal(run.decode_run.initial_pool[slot], run.states[n])


def test_installed_state_is_rounded_to_its_storage(scripts):
    script = scripts["installed"]
    states = script.prefill_states(np.float32)
    pool = script.handed_pool(round_state(states, script.installed), "float32")
    assert np.array_equal(round_state(pool, "bfloat16"), pool)
    with pytest.raises(ValueError, match="states"):
        script.handed_pool(states[:1])


BF16_DECODE = gdn_decode("bfloat16")
MUTANTS = [
    (th.transposed_prefill, th.DECODE, "pool", "hand-off-layout", "arrives transposed: [V, K] read as [K, V]"),
    (th.bf16_twice_prefill, BF16_DECODE, "pool", "hand-off-dtype", "rounded twice"),
    (th.chunk_early_prefill, th.DECODE, "pool", "hand-off-chunk", "one prefill chunk early"),
    (th.PREFILL, th.fork_writing_decode, "fork", "fork-write", "a fork writes into the shared slot 0"),
]


@pytest.mark.parametrize("prefill, decoder, name, kind, text", MUTANTS,
                         ids=["transposed", "bf16-twice", "chunk-early", "fork-write"])
def test_wrong_hand_off_fails_naming_its_cause(scripts, prefill, decoder, name, kind, text):
    report = HandoffRun(prefill, decoder, scripts[name]).report
    assert report.grade == "FAIL", report.format()
    first = report.diagnosis[0]
    assert first.kind == kind and text in first.text, report.format()


def test_validate_passes_the_correct_pair_and_names_a_transposed_hand_off(cli):
    argv = ("validate", "--kernel", "gdn-decode", "--modes", recipes.MODE, "--dtype", "float32", "--no-progress")
    code, out, _ = cli(*argv, "--prefill", "gdn-factorized")
    assert code == 0 and "gdn-decode: PASS (6/6 cases pass)" in out, out
    code, out, _ = cli(*argv, "--prefill", "gdn2_oracle.kernels.testing_handoff:transposed_prefill")
    assert code != 0 and "arrives transposed: [V, K] read as [K, V]" in out, out
    code, _, err = cli(*argv)
    assert code == 2 and "needs --prefill" in err, err


def test_a_wrong_store_is_named_per_slot(scripts):
    script = scripts["pool"]
    states = script.prefill_states(np.float32)
    expected = script.handed_pool(states, "bfloat16")
    stored = expected.copy()
    stored[0] = np.swapaxes(expected[0], -1, -2)  # transposed
    stored[1] = round_state(round_state(script.prefill_states()[1], "float16"), "bfloat16")  # rounded twice
    verdict = judge.transfer_verdict(stored, expected, [0, 1])
    found = judge.transfer_findings(verdict, stored, expected, [0, 1])
    assert not verdict.passed and [f.kind for f in found] == ["hand-off-store"] * 2, found
    assert "slot 0 holds transposed" in found[0].text and "slot 1 holds not the prefill's state" in found[1].text


def test_states_in_each_others_slots_are_named(scripts):
    script = scripts["pool"]
    exact, f32 = script.prefill_states(), script.prefill_states(np.float32)
    verdict = judge.prefill_verdict(f32[::-1], exact, f32)
    found = judge.prefill_findings(verdict, f32[::-1], exact, script.chunk_early_states(), script.lengths,
                                   recipes.CHUNK, "float32")
    assert verdict.grade == "FAIL" and [f.kind for f in found] == ["hand-off-slot"], found
