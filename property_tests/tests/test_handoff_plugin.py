"""The hand-off sessions through the plugin (``property_tests/test_handoff_sessions.py``): which pairs run, which are
skipped and why, and the wrong hand-offs of ``kernels/testing_handoff.py`` failing with findings that name their cause.

The parametrization is checked in-process (:func:`session_params` on a config holding the selected kernels); one
pytest run in a subprocess, as a kernel author runs it, judges a correct Gated DeltaNet pair, a correct KDA pair and
the four mutants at once (``-k`` picks one session of each pair).
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from gdn2_oracle.ci.testing import pytest_run
from gdn2_oracle.oracle import handoff_recipes as recipes
from gdn2_oracle.property_tests.strategies import Kernel, selected_kernel
from gdn2_oracle.property_tests.test_handoff_sessions import session_params

MUTANTS = "gdn2_oracle.kernels.testing_handoff:"


def _config(kernels, prefills=()):
    """A config as the suite's conftest.py leaves it: the selected kernels and prefill kernels, built, with families."""
    built = {name: selected_kernel(name) for name in (*kernels, *prefills)}
    return SimpleNamespace(
        _gdn2_kernels=[Kernel(n, built[n][0]) for n in kernels], _gdn2_families={n: built[n][1] for n in kernels},
        _gdn2_prefills=[Kernel(n, built[n][0]) for n in prefills],
        _gdn2_prefill_families={n: built[n][1] for n in prefills})


def _skips(params):
    return [mark.kwargs["reason"] for p in params for mark in p.marks]


def test_without_a_prefill_each_kernel_is_skipped_naming_the_option():
    reasons = _skips(session_params(_config(["gdn-decode", "gdn-factorized"])))
    assert len(reasons) == 2 and all("--gdn2-prefill NAME" in r for r in reasons), reasons


def test_a_kernel_without_a_state_is_skipped_and_a_pair_of_two_families_too():
    assert "takes no state" in _skips(session_params(_config(["gdn-factorized"], ["gdn-factorized"])))[0]
    (why,) = _skips(session_params(_config(["kda-decode"], ["gdn-factorized"])))
    assert "'gdn-factorized' is a gdn family kernel and 'kda-decode' a kda one" in why, why
    (why,) = _skips(session_params(_config(["decode"], ["gdn-factorized"])))
    assert "'decode' is a gdn2 family kernel" in why, why


def test_each_decode_kernel_runs_every_session_with_each_prefill_in_the_layouts_it_takes():
    params = session_params(_config(["gdn-decode", MUTANTS + "fork_writing_decode"],
                                    ["gdn-factorized", MUTANTS + "transposed_prefill"]))
    assert not _skips(params)
    per_dtype = len(recipes.RECIPES)
    # gdn-decode takes FLA's [V, K] keyword (both layouts); the fork writer does not (its pool is [K, V] only)
    assert len(params) == 2 * 2 * per_dtype * (2 + 1), [p.id for p in params]
    assert {p.values[1].prefill_name for p in params} == {"gdn-factorized", MUTANTS + "transposed_prefill"}
    kda = session_params(_config(["kda-decode"], ["kda-factorized"]))
    assert len(kda) == 2 * 2 * per_dtype and {p.values[1].family for p in kda} == {"kda"}, [p.id for p in kda]
    with pytest.raises(ValueError, match="family"):
        recipes.scripts(family="gdn2")


# (decode kernel, prefill kernel, session) -> the finding its diagnosis names first (None: it passes)
PAIRS = {
    ("gdn-decode", "gdn-factorized", "gdn_pool"): None,
    ("kda-decode", "kda-factorized", "kda_fork"): None,
    ("gdn-decode", MUTANTS + "transposed_prefill", "gdn_pool"): "hand-off-layout",
    ("gdn-decode[state_dtype=bfloat16]", MUTANTS + "bf16_twice_prefill", "gdn_pool"): "hand-off-dtype",
    ("gdn-decode", MUTANTS + "chunk_early_prefill", "gdn_pool"): "hand-off-chunk",
    (MUTANTS + "fork_writing_decode", "gdn-factorized", "gdn_fork"): "fork-write",
}


def _test_id(decode, prefill, session):
    return f"{decode}-{prefill}-handoff_{session}-float32"


# -k picks each pair's session by its id (from the last "=": a -k word cannot hold one)
PICK = " or ".join(_test_id(*pair).rsplit("=", 1)[-1] for pair in PAIRS)


def _section(out, test_id):
    """The failure section of test ``test_id`` in pytest's report (up to the next section)."""
    start = out.index(f"_ test_prefilled_session[{test_id}] _")
    nxt = re.search(r"\n_+ test_prefilled_session\[|\n=+ ", out[start + 1:])
    return out[start:start + 1 + (nxt.start() if nxt else len(out))]


@pytest.mark.slow
def test_plugin_run_fails_each_wrong_hand_off_naming_its_cause(tmp_path):
    decoders = sorted({d for d, _, _ in PAIRS})
    prefills = sorted({p for _, p, _ in PAIRS})
    code, out = pytest_run(tmp_path, "--pyargs", "gdn2_oracle.property_tests.test_handoff_sessions",
                           "--gdn2-kernel", ",".join(decoders), "--gdn2-prefill", ",".join(prefills), "-k", PICK,
                           "-q")
    assert code == 1 and "4 failed, 2 passed" in out, out
    for (decode, prefill, session), kind in PAIRS.items():
        test_id = _test_id(decode, prefill, session)
        if kind is None:
            assert f"FAILED ::test_prefilled_session[{test_id}]" not in out, out
            continue
        text = _section(out, test_id)
        assert f"diagnosis:\n  - {kind}:" in text, text
        assert f"reproduce (case handoff_{session}): gdn2-oracle validate --kernel" in text, text
