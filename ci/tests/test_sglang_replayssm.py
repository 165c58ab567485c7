"""SGLang 0.5.23's own GDN ReplaySSM by name (``sglang-gdn-replayssm``, kernels/sglang_replayssm.py,
ci/running/sglang_replay_backend.py).

SGLang's functions read from its wheel (``make peers``) run in Triton's interpreter, in one subprocess
(``TRITON_INTERPRET=1`` must be set before Triton is imported): a decode and a speculative gdn session at the small
size PASS through the replay driver, with SGLang's backend; a wrapped commit that moves the cursor one token past
the accepted ones (release group), and a one-token launch given the next ring slot, FAIL with a diagnosis. In this
process: a missing wheel is a ValueError naming ``make peers``; options are checked by name. ``validate`` by name
on all four sessions through the console script is in the release group (conftest.py). Without the wheels the
session tests skip (under ``CI=true`` they fail: test_engine_peers.py's ``wheels_or_skip``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gdn2_oracle import kernels
from gdn2_oracle.ci.grading.grades import FAIL, PASS
from gdn2_oracle.ci.testing import console
from gdn2_oracle.kernels import third_party
from gdn2_oracle.kernels.sglang_replayssm import NAME
from gdn2_oracle.kernels.tests.test_engine_peers import wheels_or_skip
from gdn2_oracle.kernels.triton_interpret import ENV

SPEC = f"{NAME}[session_size='small',spec_len=3]"  # a ring of 16 (the default): history, flushes and wraps
DECODE, DRAFTS = "serving_gdn_pool_g2", "serving_gdn_drafts_g4"
RUNS = {  # key: (mutant, session)
    "decode": (None, DECODE),
    "speculative": (None, DRAFTS),
    "decode_wrong_ring_slot": ("decode_wrong_ring_slot", DECODE),
}
RELEASE_RUNS = {"commit_extra_token": ("commit_extra_token", DRAFTS)}  # another 15 s: the release group

SCRIPT = r"""
import json, sys
from gdn2_oracle import kernels
from gdn2_oracle.ci.running import serving as running
from gdn2_oracle.ci.running.sglang_replay_backend import SglangReplayBackend

spec, runs = json.loads(sys.argv[1])
cases = {c.name: c for c in running.family_serving_cases(["gdn"], ("float32",)) if not c.v_first}
out = {}
for key, (mutant, session) in runs.items():
    fn = kernels.get(spec if mutant is None else spec[:-1] + f",mutant={mutant!r}]")
    result = cases[session].run(fn)
    out[key] = {"backend": type(running.driver(fn).backend).__name__, "grade": result.grade,
                "verdicts": {v.name: [v.grade, v.note] for v in result.verdicts},
                "diagnosis": [str(f) for f in result.diagnosis]}
print("RESULT " + json.dumps(out))
"""


def judge(runs):
    """``{run key: {backend, grade, verdicts, diagnosis}}`` of ``runs`` (as :data:`RUNS`), judged in one
    subprocess."""
    wheels_or_skip()
    env = {k: v for k, v in os.environ.items() if k != ENV}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps([SPEC, runs])], capture_output=True, text=True,
                          env=env, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def judged():
    """:func:`judge` of :data:`RUNS`."""
    return judge(RUNS)


@pytest.mark.parametrize("key", ["decode", "speculative"])
def test_sglangs_replayssm_passes_a_session_through_its_replay_driver(judged, key):
    run = judged[key]
    assert run["backend"] == "SglangReplayBackend"
    assert run["grade"] == PASS and all(g == PASS for g, _ in run["verdicts"].values()), run


def test_sglangs_verify_window_lets_a_nan_draft_reach_accepted_results(judged):
    """Like vLLM's: the window computed together (the (I + A)^-1 rows) carries a rejected NaN draft into accepted
    tokens; graded on finite drafts, reported as the ``window-nan`` finding."""
    grade, note = judged["speculative"]["verdicts"]["window-nan"]
    assert grade == PASS and "non-finite" in note, note


def test_a_commit_of_one_token_too_many_fails_with_a_diagnosis():
    run = judge(RELEASE_RUNS)["commit_extra_token"]
    assert run["grade"] == FAIL and run["verdicts"]["o"][0] == FAIL, run
    text = "\n".join(run["diagnosis"])
    assert "replay slot" in text and "commit" in text, text


def test_a_launch_on_the_next_ring_slot_fails_with_a_diagnosis(judged):
    run = judged["decode_wrong_ring_slot"]
    assert run["grade"] == FAIL and run["verdicts"]["state"][0] == FAIL, run
    assert any("replay slot" in d for d in run["diagnosis"]), run["diagnosis"]


def test_a_missing_wheel_is_a_valueerror_naming_make_peers(monkeypatch, tmp_path):
    monkeypatch.setenv(third_party.PEERS_ENV, str(tmp_path))
    with pytest.raises(ValueError, match=r"sglang .*run `make peers`"):
        kernels.get(NAME)


@pytest.mark.parametrize("option, message", [
    ("capacity=12", "^capacity: 12 is not a power of two"),
    ("capacity=0", "^capacity"),
    ("spec_len=0", "^spec_len"),
    ("session_size='huge'", "^session_size"),
    ("mutant='nope'", "^mutant"),
])
def test_options_are_checked_by_name(option, message):
    with pytest.raises(ValueError, match=message):
        kernels.get(f"{NAME}[{option}]")


def test_validate_passes_sglangs_replayssm_by_name(tmp_path):
    """``validate --kernel sglang-gdn-replayssm[...] --modes decode,speculative``: the four small gdn sessions PASS."""
    peers = wheels_or_skip()
    proc = console(tmp_path, "validate", "--kernel", SPEC, "--modes", "decode,speculative", "--dtype", "float32",
                   "--no-progress", timeout=900, GDN2_PEERS=str(peers))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert f"{NAME}[session_size=small,spec_len=3]: PASS (4/4 cases pass)" in proc.stdout, proc.stdout[-4000:]
